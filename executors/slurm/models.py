"""Typed views of the slurmrestd responses MuxFlow reads, the same for every API version.

Parsers from a response to these types live with each version in
:mod:`executors.slurm.api`; only the fields the dispatcher and the dev cluster
use are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from executors.slurm.hostlist import Gres, gres_count

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
    def gpu_type(self) -> str | None:
        types = {g.type for g in self.gres if g.name == "gpu" and g.type}
        return types.pop() if len(types) == 1 else None


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
