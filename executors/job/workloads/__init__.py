"""Reference workloads: online inference services and offline training jobs of three
families — a ResNet-style CNN, a transformer encoder, an embedding-heavy recommender — defined in
code with random weights. ``serve`` runs a service at a QPS recording per-request latency
(open-loop arrivals); ``train`` a training job on the checkpoint/restart runtime helper.
Used for demos, solo profiling, co-location sampling and the GPU tests.
"""

from executors.job.workloads.models import FAMILIES, SIZES, WorkloadSize, reference_job_types, workload_size

__all__ = ["FAMILIES", "SIZES", "WorkloadSize", "reference_job_types", "workload_size"]
