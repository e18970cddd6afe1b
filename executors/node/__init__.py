"""Node agent (docs/DESIGN.md §3 step 8, paper §4.1–4.2): GPU monitor, SysMonitor loop, error detector.

- ``sampler``  — ``GpuSampler`` protocol; ``NvmlSampler`` (nvidia-ml-py) and ``SimulatedSampler``
- ``ring``     — fixed-capacity numpy ring buffer of raw samples (minutes at ms resolution)
- ``aggregate``— per-minute ``MetricRow`` aggregation with coverage
- ``evictor``  — ``Evictor`` protocol: callback (simulated) and Slurm requeue
- ``detector`` — fatal XIDs, MPS server crash and hang; ``MpsControl`` protocol
- ``agent``    — the per-node loop tying them together, and the store writer

Also on the node: ``slurm/`` (the Prolog, TaskProlog and Epilog slurmd runs as root around every job) and
``xcuda/`` (the ``LD_PRELOAD`` library the TaskProlog puts in an offline job, and its Python controls).
"""
