"""Inside a user's job, with that user's identity and nothing of MuxFlow's: the runtime helper an offline job
imports (``runtime/``: checkpoint on signal, resume, iteration timing, profiling mode, and the
``sitecustomize`` hook the TaskProlog puts on the job's path) and the reference workloads (``workloads/``)."""
