"""Talking to Slurm, from any place: the slurmrestd client (per OpenAPI version), its typed models and errors,
the ``scontrol`` fallback, what MuxFlow asks of Slurm (``spec``), and the signed plan a placement carries to its
node (``plan``: the dispatcher writes it, the Prolog, TaskProlog, Epilog and node agent read it).

The dispatcher and pick-up that use it on the scheduler host are in ``executors.scheduler.slurm``. See docs/SLURM.md
for transports, authentication and what was verified live.
"""

from executors.slurm.api import API_VERSIONS, DEFAULT_API_VERSION, ApiVersion, api_version
from executors.slurm.client import SlurmApi, SlurmNotFound, SlurmRestClient
from executors.slurm.errors import (
    PayloadError,
    SlurmAuthError,
    SlurmError,
    SlurmErrorEntry,
    SlurmRestError,
    SlurmTransportError,
    SlurmUnsupported,
)
from executors.slurm.models import ControllerPing, Job, Node, Partition, SlurmVersion, SubmitResult
from executors.slurm.settings import SlurmRestSettings
from executors.slurm.spec import BatchJob, JobSignal, JobUpdate

__all__ = [
    "API_VERSIONS", "DEFAULT_API_VERSION", "ApiVersion", "ControllerPing", "Job", "JobSignal", "BatchJob",
    "JobUpdate", "Node", "Partition", "PayloadError", "SlurmApi", "SlurmAuthError", "SlurmError",
    "SlurmErrorEntry", "SlurmNotFound", "SlurmRestClient", "SlurmRestError", "SlurmRestSettings",
    "SlurmTransportError", "SlurmUnsupported", "SlurmVersion", "SubmitResult", "api_version",
]
