"""Reference workloads: online inference services and offline training jobs of four families —
ResNet-18 (``cnn``), ResNet-50 (``resnet50``, offline only), a transformer encoder, an
embedding-heavy recommender — defined in code with random weights (docs/WORKLOADS.md).
``serve`` runs a service at a QPS recording per-request latency (open-loop arrivals); ``train``
a training job on the checkpoint/restart runtime helper. Used for demos, solo profiling,
co-location sampling and the GPU tests.
"""

from executors.job.workloads.models import (
    FAMILIES,
    JOB_FAMILIES,
    SERVICE_FAMILIES,
    SIZES,
    WorkloadSize,
    reference_job_types,
    workload_size,
)

__all__ = ["FAMILIES", "JOB_FAMILIES", "SERVICE_FAMILIES", "SIZES", "WorkloadSize", "reference_job_types",
           "workload_size"]
