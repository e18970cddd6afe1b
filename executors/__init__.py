"""Everything that touches the world outside the pure core, grouped by where it runs (docs/ARCHITECTURE.md
"What runs where"):

- ``scheduler/`` — the scheduler host: the round runner, the Slurm REST backend and dispatcher, job pick-up
  and state sync, profiling orchestration, the scheduler's metrics;
- ``node/``      — every GPU node: the node agent (GPU monitor, SysMonitor, eviction), the Slurm Prolog,
  TaskProlog and Epilog (``node/slurm/``), and xCUDA, the ``LD_PRELOAD`` library the TaskProlog puts in a
  job (``node/xcuda/``);
- ``job/``       — inside a user's job, as that user: the runtime helper (checkpoint, resume, timing) and the
  reference workloads;
- ``dev/``       — development tools: the multi-node Slurm dev cluster, and the benchmarks that span places;
- ``simulated/`` — the in-process stand-in for Slurm nodes and GPUs that ``make run`` and the simulator use.

Shared by the places above: ``store/`` (the feature store: every SQL statement), ``data/`` (the bundled
measurements and the calibrated workload catalog built from them, for real and simulated code alike),
``cluster`` (the interface the round runner dispatches through), ``metrics_http`` and ``machine``.
"""
