"""The shape every slurmrestd OpenAPI version implements: paths, payload builders, parsers.

Builders and parsers are pure functions of plain data, so each version is
tested against golden request bodies and captured (or schema-derived)
responses without a running Slurm.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from datetime import datetime
from collections.abc import Callable
from typing import Any, ClassVar

from executors.slurm.errors import SlurmErrorEntry
from executors.slurm.hostlist import expand_hostlist, parse_gres
from executors.slurm.models import ControllerPing, Job, Node, Partition, SlurmVersion, SubmitResult, epoch_to_utc
from executors.slurm.spec import BatchJob, JobUpdate, signal_name


class ApiVersion(ABC):
    """One slurmrestd OpenAPI plugin version (``v0.0.38`` …)."""

    name: ClassVar[str]
    # True when the builders were checked against a live slurmrestd of this
    # version; False when they follow the published schema only.
    verified_live: ClassVar[bool]
    # Whether slurmrestd of this version can requeue a job itself.
    supports_requeue: ClassVar[bool] = False
    # Whether a job update can set the admin comment (else the client's scontrol fallback does).

    def __init__(self, clock: Callable[[], float] = time.time):
        # Only for versions that must send "now" as a number (v0.0.40 begin_time).
        self.clock = clock

    @property
    def prefix(self) -> str:
        return f"/slurm/{self.name}"

    # -- paths ---------------------------------------------------------------
    def ping_path(self) -> str:
        return f"{self.prefix}/ping"

    def diag_path(self) -> str:
        return f"{self.prefix}/diag"

    def submit_path(self) -> str:
        return f"{self.prefix}/job/submit"

    def job_path(self, job_id: int) -> str:
        return f"{self.prefix}/job/{int(job_id)}"

    def jobs_path(self) -> str:
        return f"{self.prefix}/jobs"

    def nodes_path(self) -> str:
        return f"{self.prefix}/nodes"

    def node_path(self, name: str) -> str:
        return f"{self.prefix}/node/{name}"

    def partitions_path(self) -> str:
        return f"{self.prefix}/partitions"

    def partition_path(self, name: str) -> str:
        return f"{self.prefix}/partition/{name}"

    # -- requests ------------------------------------------------------------
    @abstractmethod
    def build_submit(self, spec: BatchJob) -> dict[str, Any]:
        """The JSON body of ``POST {prefix}/job/submit``."""

    @abstractmethod
    def build_update(self, update: JobUpdate) -> dict[str, Any]:
        """The JSON body of ``POST {prefix}/job/{id}``."""

    def cancel_params(self, signal: str | None) -> dict[str, str]:
        """Query parameters of ``DELETE {prefix}/job/{id}``: no signal cancels the job (SIGKILL).

        The same in every version supported so far (v0.0.38, v0.0.40).
        """
        return {} if signal is None else {"signal": signal_name(signal)}

    # -- responses -----------------------------------------------------------
    @staticmethod
    def parse_errors(body: dict[str, Any]) -> list[SlurmErrorEntry]:
        """The same in every version (also read before the version is known: the OpenAPI document's errors)."""
        return [SlurmErrorEntry.parse(e) for e in body.get("errors") or []]

    @staticmethod
    def parse_warnings(body: dict[str, Any]) -> list[SlurmErrorEntry]:
        return [SlurmErrorEntry.parse(e) for e in body.get("warnings") or []]

    def parse_version(self, body: dict[str, Any]) -> SlurmVersion:
        meta = body.get("meta") or {}
        plugin = meta.get("plugin") or {}
        slurm = meta.get("Slurm") or meta.get("slurm") or {}
        return SlurmVersion(plugin=str(plugin.get("type") or plugin.get("name") or ""),
                            release=str(slurm.get("release") or ""))

    def parse_submit(self, body: dict[str, Any]) -> SubmitResult:
        notes = tuple(str(e) for e in self.parse_errors(body) + self.parse_warnings(body))
        return SubmitResult(job_id=int(body["job_id"]), notes=notes,
                            job_submit_user_msg=str(body.get("job_submit_user_msg") or ""))

    # -- field shapes that differ between versions (the field mapping below is shared) --
    def job_state(self, raw: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
        """(state, flags) of a job record."""
        return as_str(raw.get("job_state")).upper(), ()

    def node_state(self, raw: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
        """(state, flags) of a node record."""
        return as_str(raw.get("state")).upper(), tuple(str(f).upper() for f in raw.get("state_flags") or ())

    def hosts(self, value: Any) -> tuple[str, ...]:
        return expand_hostlist(value)

    def exit_code(self, value: Any) -> int | None:
        """The job's exit code from Slurm's wait status (v0.0.38 serves the raw status: exit 4 reads 1024); a job
        killed by a signal gets minus the signal's number, as Python's ``subprocess`` reports it."""
        status = as_int(value)
        if status is None or status < 0:
            return status
        return -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF

    def timestamp(self, value: Any) -> datetime | None:
        return epoch_to_utc(value)

    def parse_job(self, raw: dict[str, Any]) -> Job:
        state, flags = self.job_state(raw)
        return Job(
            job_id=int(raw["job_id"]),
            name=as_str(raw.get("name")),
            state=state,
            state_flags=flags,
            state_reason=as_str(raw.get("state_reason")),
            partition=as_str(raw.get("partition")),
            user_name=as_str(raw.get("user_name")),
            nodes=self.hosts(raw.get("nodes")),
            required_nodes=self.hosts(raw.get("required_nodes")),
            gres_per_node=as_str(raw.get("tres_per_node")),
            priority=as_int(raw.get("priority")),
            requeue=bool(raw.get("requeue")),
            restart_count=as_int(raw.get("restart_cnt"), 0) or 0,
            exit_code=self.exit_code(raw.get("exit_code")),
            comment=as_str(raw.get("comment")),
            admin_comment=as_str(raw.get("admin_comment")),
            working_dir=as_str(raw.get("current_working_directory")),
            submit_time_utc=self.timestamp(raw.get("submit_time")),
            start_time_utc=self.timestamp(raw.get("start_time")),
            end_time_utc=self.timestamp(raw.get("end_time")),
            array_job_id=as_int(raw.get("array_job_id"), 0) or 0,
            array_tasks=as_str(raw.get("array_task_string")) or as_str(as_int(raw.get("array_task_id"))),
            het_job_id=as_int(raw.get("het_job_id"), 0) or 0,
            node_count=as_int(raw.get("node_count")),
        )

    def parse_node(self, raw: dict[str, Any]) -> Node:
        state, flags = self.node_state(raw)
        return Node(
            name=as_str(raw.get("name")),
            address=as_str(raw.get("address")),
            hostname=as_str(raw.get("hostname")),
            state=state,
            state_flags=flags,
            partitions=tuple(raw.get("partitions") or ()),
            gres=parse_gres(raw.get("gres")),
            gres_used=parse_gres(raw.get("gres_used")),
            cpus=as_int(raw.get("cpus"), 0) or 0,
            alloc_cpus=as_int(raw.get("alloc_cpus"), 0) or 0,
            reason=as_str(raw.get("reason")),
        )

    @abstractmethod
    def parse_partition(self, raw: dict[str, Any]) -> Partition: ...

    @abstractmethod
    def parse_ping(self, raw: dict[str, Any]) -> ControllerPing: ...

    def parse_jobs(self, body: dict[str, Any]) -> list[Job]:
        return [self.parse_job(j) for j in body.get("jobs") or []]

    def parse_nodes(self, body: dict[str, Any]) -> list[Node]:
        return [self.parse_node(n) for n in body.get("nodes") or []]

    def parse_partitions(self, body: dict[str, Any]) -> list[Partition]:
        return [self.parse_partition(p) for p in body.get("partitions") or []]

    def parse_pings(self, body: dict[str, Any]) -> list[ControllerPing]:
        return [self.parse_ping(p) for p in body.get("pings") or []]


def as_int(value: Any, default: int | None = None) -> int | None:
    """An integer from a plain number or a ``{"set", "infinite", "number"}`` record (v0.0.39+)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite", False):
            return default
        value = value.get("number")
    if isinstance(value, bool) or value is None:
        return default
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return default


def as_str(value: Any) -> str:
    return "" if value is None else str(value)
