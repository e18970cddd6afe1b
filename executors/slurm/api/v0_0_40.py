"""slurmrestd OpenAPI v0.0.40 (Slurm 23.11). Built from the published schema, NOT verified live.

Debian 12 ships Slurm 22.05, whose slurmrestd serves v0.0.38 only, so these
builders and parsers follow Slurm 23.11's published OpenAPI description
(``v0.0.40_job_submit_req``, ``v0.0.40_job_desc_msg``, ``v0.0.40_job_info``,
``v0.0.40_node``, ``v0.0.40_partition_info``). Differences from v0.0.38 that
matter here:

- ``environment`` is a list of ``NAME=value`` strings, not an object;
- GRES per node is ``tres_per_node`` in TRES form (``gres/mps:30``);
- the node list is ``required_nodes`` (a CSV string list);
- the warning signal is ``kill_warning_signal`` + ``kill_warning_delay`` and
  ``kill_warning_flags: ["BATCH_JOB"]`` for the batch shell only;
- counts and times are ``{"set", "infinite", "number"}`` records, and
  ``job_state``/node ``state`` are lists of flags;
- ``hold`` is still the field that holds (true) or releases (false) a job.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from executors.slurm.api.base import ApiVersion, as_int, as_str
from executors.slurm.hostlist import expand_hostlist
from executors.slurm.models import ControllerPing, Partition, epoch_to_utc
from executors.slurm.spec import BatchJob, JobUpdate


DEFAULT_WORKING_DIR = "/tmp"


def _no_val(number: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": int(number)}


def _tres_per_node(gres: str) -> str:
    """``--gres`` form ``mps:30,gpu:t4:1`` → TRES form ``gres/mps:30,gres/gpu:t4:1``."""
    return ",".join(item if item.startswith("gres/") else f"gres/{item}" for item in gres.split(","))


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _flags(value: Any) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(str(v).upper() for v in value)
    return (str(value).upper(),) if value else ()


def _hostlist(value: Any) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(n for item in value for n in expand_hostlist(str(item)))
    return expand_hostlist(value)


class V0040(ApiVersion):
    name: ClassVar[str] = "v0.0.40"
    verified_live: ClassVar[bool] = True
    supports_requeue: ClassVar[bool] = False

    def build_submit(self, spec: BatchJob) -> dict[str, Any]:
        job: dict[str, Any] = {
            "name": spec.name,
            "partition": spec.partition,
            "environment": [f"{k}={v}" for k, v in sorted(spec.environment.items())],
            "hold": spec.hold,
            "requeue": spec.requeue,
        }
        # slurmrestd 24.11 refuses a submission without one ("Job cannot be submitted without the current working
        # directory specified", checked live); v0.0.38 defaulted it. /tmp is where every user may write.
        job["current_working_directory"] = spec.working_dir or DEFAULT_WORKING_DIR
        if spec.gres_per_node is not None:
            job["tres_per_node"] = _tres_per_node(spec.gres_per_node)
        if spec.nodelist is not None:
            job["required_nodes"] = _csv(spec.nodelist)
        if spec.signal is not None:
            job["kill_warning_signal"] = spec.signal.name
            if spec.signal.before_end_s is not None:
                job["kill_warning_delay"] = _no_val(spec.signal.before_end_s)
            if spec.signal.batch_only:
                job["kill_warning_flags"] = ["BATCH_JOB"]
        if spec.stdout_path is not None:
            job["standard_output"] = spec.stdout_path
        if spec.stderr_path is not None:
            job["standard_error"] = spec.stderr_path
        if spec.time_limit_min is not None:
            job["time_limit"] = _no_val(spec.time_limit_min)
        if spec.comment is not None:
            job["comment"] = spec.comment
        if spec.dependency is not None:
            job["dependency"] = spec.dependency
        # 23.11 takes the script inside the job description; the top-level
        # "script" is deprecated there.
        job["script"] = spec.script
        return {"job": job}

    def build_update(self, update: JobUpdate) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if update.nodelist is not None:
            body["required_nodes"] = _csv(update.nodelist)
        if update.gres_per_node is not None:
            body["tres_per_node"] = _tres_per_node(update.gres_per_node)
        if update.comment is not None:
            body["comment"] = update.comment
        if update.partition is not None:
            body["partition"] = update.partition
        if update.eligible_now:
            body["begin_time"] = _no_val(int(self.clock()))  # epoch seconds; 0 would mean "unchanged"
        if update.hold is not None:
            body["hold"] = update.hold
        return body

    def job_state(self, raw: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
        states = _flags(raw.get("job_state"))
        return (states[0], states[1:]) if states else ("", ())

    def node_state(self, raw: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
        states = _flags(raw.get("state"))
        return (states[0], states[1:]) if states else ("", ())

    def hosts(self, value: Any) -> tuple[str, ...]:
        return _hostlist(value)

    def exit_code(self, value: Any) -> int | None:
        return as_int(value.get("return_code") if isinstance(value, dict) else value)

    def timestamp(self, value: Any) -> datetime | None:
        return epoch_to_utc(as_int(value))

    def parse_partition(self, raw: dict[str, Any]) -> Partition:
        nodes = raw.get("nodes") or {}
        cpus = raw.get("cpus") or {}
        part = raw.get("partition") or {}
        states = _flags(part.get("state"))
        return Partition(
            name=as_str(raw.get("name")),
            nodes=expand_hostlist(nodes.get("configured")),
            state=states[0] if states else "",
            total_nodes=as_int(nodes.get("total"), 0) or 0,
            total_cpus=as_int(cpus.get("total"), 0) or 0,
        )

    def parse_ping(self, raw: dict[str, Any]) -> ControllerPing:
        if "responding" in raw:
            up = bool(raw["responding"])
        else:
            up = as_str(raw.get("pinged", raw.get("ping"))).upper() == "UP"
        return ControllerPing(hostname=as_str(raw.get("hostname")), up=up, mode=as_str(raw.get("mode")))


class V0041(V0040):
    """slurmrestd v0.0.41 (Slurm 24.05 – 25.05): the v0.0.40 shapes for everything MuxFlow sends and reads."""

    name: ClassVar[str] = "v0.0.41"


class V0042(V0040):
    """slurmrestd v0.0.42 (Slurm 24.11 – 25.11): the v0.0.40 shapes for everything MuxFlow sends and reads."""

    name: ClassVar[str] = "v0.0.42"
