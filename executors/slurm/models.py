"""Typed views of the slurmrestd responses MuxFlow reads, the same for every API version.

Parsers from a response to these types live with each version in
:mod:`executors.slurm.api`; only the fields the dispatcher and the dev cluster
use are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from executors.slurm.hostlist import Gres, gres_count, parse_gres, split_per_gpu_type

PENDING = "PENDING"
RUNNING = "RUNNING"
# States a job never leaves (unless requeued by an operator).
FINISHED_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
                             "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"})
# Node base states in which slurmd answers and the node can take work.
USABLE_NODE_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
_BAD_NODE_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED", "NOT_RESPONDING", "FAIL", "MAINTENANCE",
                             "POWERED_DOWN", "POWERING_DOWN", "REBOOT_REQUESTED"})


def epoch_to_utc(value: object) -> datetime | None:
    """Slurm timestamps: seconds since the epoch, 0 or absent meaning unset."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return datetime.fromtimestamp(value, tz=UTC)


@dataclass(frozen=True)
class SlurmVersion:
    """Who answered: the OpenAPI plugin and the Slurm release behind it."""

    plugin: str
    release: str


@dataclass(frozen=True)
class Job:
    job_id: int
    name: str
    state: str
    state_reason: str
    partition: str
    user_name: str
    nodes: tuple[str, ...]
    required_nodes: tuple[str, ...]
    gres_per_node: str
    priority: int | None
    requeue: bool
    restart_count: int
    exit_code: int | None
    comment: str
    working_dir: str
    submit_time_utc: datetime | None
    start_time_utc: datetime | None
    end_time_utc: datetime | None
    state_flags: tuple[str, ...] = ()
    admin_comment: str = ""  # MuxFlow's plan (docs/SLURM.md "Users cannot change the plan")
    array_job_id: int = 0  # the job array it belongs to (0: none); a pending array is one record of all its tasks
    array_tasks: str = ""  # the pending array's task ids ("0-2"), or the task id of one task
    het_job_id: int = 0  # the heterogeneous job's leader (0: none); each component is a job record
    node_count: int | None = None  # nodes asked for (pending) or allocated

    @property
    def held(self) -> bool:
        """Pending with priority 0 (``--hold``, ``scontrol hold``/``requeuehold``)."""
        return self.state == PENDING and self.priority == 0

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def mps_pct(self) -> int:
        """The job's MPS share of one GPU, in percent (``--gres=mps:<pct>`` with Count=100 per GPU)."""
        return gres_count(self.gres_per_node, "mps")

    @property
    def mps_share_type(self) -> str | None:
        """The gres Type of the job's MPS share (``mps:t4g2:40`` → ``t4g2``: the GPU it names), None if untyped."""
        types = {g.type for g in parse_gres(self.gres_per_node) if g.name == "mps"}
        return types.pop() if len(types) == 1 else None


@dataclass(frozen=True)
class NodeGpu:
    """One GPU of a node as Slurm configures it.

    ``share_type`` is the gres Type that names this GPU alone (``t4g2``, docs/SLURM.md "One gres
    Type per GPU"): a share asked as ``mps:<share_type>:<pct>`` is accounted on this GPU. None
    where the node's GPUs share one Type (``gpu:t4:4``): Slurm then picks the GPU of a share itself.
    """

    index: int
    model: str
    share_type: str | None = None


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    hostname: str
    state: str
    state_flags: tuple[str, ...]
    partitions: tuple[str, ...]
    gres: tuple[Gres, ...]
    gres_used: tuple[Gres, ...]
    cpus: int
    alloc_cpus: int
    reason: str

    @property
    def usable(self) -> bool:
        return self.state in USABLE_NODE_STATES and not (set(self.state_flags) & _BAD_NODE_FLAGS)

    def gres_total(self, name: str) -> int:
        return sum(g.count for g in self.gres if g.name == name)

    def gres_in_use(self, name: str) -> int:
        return sum(g.count for g in self.gres_used if g.name == name)

    @property
    def gpus(self) -> tuple[NodeGpu, ...]:
        """The node's GPUs by Slurm index; () where they are untyped or of several models.

        Detected per node: one ``gpu`` entry of count 1 per GPU, each Type ``<model>g<index>`` of
        one model, is the per-GPU layout (its ``mps`` entries of the same Types name the GPUs);
        anything else with a single Type (``gpu:t4:4``) is a node whose GPUs Slurm picks itself.
        """
        gpu = [g for g in self.gres if g.name == "gpu"]
        split = [split_per_gpu_type(g.type) for g in gpu]
        models = {s[0] for s in split if s}
        indices = {s[1] for s in split if s}
        if gpu and all(split) and all(g.count == 1 for g in gpu) and len(models) == 1 and len(indices) == len(gpu):
            shared = {g.type for g in self.gres if g.name == "mps" and g.type}
            model = models.pop()
            return tuple(NodeGpu(i, model, t if t in shared else None)
                         for i, t in sorted((s[1], g.type) for s, g in zip(split, gpu)))
        types = {g.type for g in gpu}
        if len(types) == 1 and None not in types:
            model = types.pop()
            return tuple(NodeGpu(i, model, None) for i in range(self.gres_total("gpu")))
        return ()

    @property
    def per_gpu_types(self) -> bool:
        """Whether the node's GPUs have one gres Type each (``gpu:t4g0:1,…``): ``--gres=gpu:<model>:1``
        matches none of them then; a whole GPU is asked as ``gpu:1`` on the node."""
        gpus = self.gpus
        return bool(gpus) and {g.type for g in self.gres if g.name == "gpu"} != {gpus[0].model}

    @property
    def gpu_type(self) -> str | None:
        """The model of the node's GPUs (``t4``, also for per-GPU Types ``t4g0``…), None if not one model."""
        models = {g.model for g in self.gpus}
        return models.pop() if len(models) == 1 else None

    def gpu(self, index: int) -> NodeGpu | None:
        return next((g for g in self.gpus if g.index == index), None)


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...]
    state: str
    total_nodes: int
    total_cpus: int


@dataclass(frozen=True)
class ControllerPing:
    hostname: str
    up: bool
    mode: str


@dataclass(frozen=True)
class SubmitResult:
    job_id: int
    # Informational entries slurmrestd put in ``errors``/``warnings`` (e.g. "Job is in held state").
    notes: tuple[str, ...] = ()
    job_submit_user_msg: str = ""
