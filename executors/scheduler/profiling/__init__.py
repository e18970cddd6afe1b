"""Real profiling (paper §6, docs/DESIGN.md §3 step 2): solo profiles of new offline jobs and
co-location samples, measured by running workloads on the ``profile`` partition.

- :mod:`.solo` — the solo profiler (controller): a dry run of each new job per GPU type.
- :mod:`.outcome` — the probe's report → the profile, or why profiling failed.
- :mod:`.sampling` — the sampling controller: plan (``scheduler_core.prediction.sampling_plan``) → runs → samples.
- :mod:`.runs`, :mod:`.slurm_exec`, :mod:`.local` — where the runs execute: Slurm, or this machine.
- :mod:`.backend` — the Slurm backend's ``profile_new_jobs`` / ``collect_samples``.
- :mod:`.settings` — ``MUXFLOW_PROFILING_*`` / ``MUXFLOW_SAMPLING_*``.

What runs on the profile node inside those jobs (the probe, the co-location harness, their GPU metrics) is in
``executors.node.profiling``.
"""
