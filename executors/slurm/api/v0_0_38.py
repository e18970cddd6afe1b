"""slurmrestd OpenAPI v0.0.38 (Slurm 22.05, Debian 12). Verified against a live slurmrestd.

Field names were checked on the dev cluster (tests/live/) and against the
schema it serves (tests/executors/slurm/data/openapi_v0.0.38.json). Three
things differ from that schema, all verified live:

- the node list of a job is ``nodelist``; the schema does not list it, and the
  ``required_nodes`` key that the job *responses* use is refused on input
  ("Disabled key");
- ``signal`` accepts ``USR1@60`` but not the batch-shell form ``B:USR1@60``;
- ``begin_time`` is typed integer but only time strings (``"now"``) parse.

Release is ``{"hold": false}`` in a job update, and ``{"begin_time": "now"}``
lifts the two-minute delay Slurm puts on a requeued job; cancel with a signal is
``DELETE /job/{id}?signal=USR1`` and reaches the batch shell too. There is no
requeue endpoint (see :meth:`executors.slurm.client.SlurmRestClient.requeue`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from executors.slurm.api.base import ApiVersion, as_int, as_str
from executors.slurm.errors import PayloadError
from executors.slurm.hostlist import expand_hostlist
from executors.slurm.models import ControllerPing, Partition
from executors.slurm.spec import BatchJob, JobUpdate


class V0038(ApiVersion):
    name: ClassVar[str] = "v0.0.38"
    verified_live: ClassVar[bool] = True
    supports_requeue: ClassVar[bool] = False

    def build_submit(self, spec: BatchJob) -> dict[str, Any]:
        job: dict[str, Any] = {
            "name": spec.name,
            "partition": spec.partition,
            "environment": dict(sorted(spec.environment.items())),
            "hold": spec.hold,
            "requeue": spec.requeue,
        }
        if spec.working_dir is not None:
            job["current_working_directory"] = spec.working_dir
        if spec.gres_per_node is not None:
            job["gres"] = spec.gres_per_node
        if spec.nodelist is not None:
            job["nodelist"] = spec.nodelist
        if spec.signal is not None:
            if spec.signal.batch_only:
                raise PayloadError("signal: v0.0.38 cannot send a warning signal to the batch shell only "
                                   "(its parser rejects 'B:'); drop batch_only (the job's steps and, on "
                                   "cancel with a signal, the batch shell receive it)")
            job["signal"] = spec.signal.name + (f"@{spec.signal.before_end_s}"
                                                if spec.signal.before_end_s is not None else "")
        if spec.stdout_path is not None:
            job["standard_output"] = spec.stdout_path
        if spec.stderr_path is not None:
            job["standard_error"] = spec.stderr_path
        if spec.time_limit_min is not None:
            job["time_limit"] = spec.time_limit_min
        if spec.comment is not None:
            job["comment"] = spec.comment
        if spec.dependency is not None:
            job["dependency"] = spec.dependency
        return {"script": spec.script, "job": job}

    def build_update(self, update: JobUpdate) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if update.nodelist is not None:
            body["nodelist"] = update.nodelist
        if update.gres_per_node is not None:
            body["gres"] = update.gres_per_node
        if update.comment is not None:
            body["comment"] = update.comment
        if update.partition is not None:
            body["partition"] = update.partition
        if update.eligible_now:
            body["begin_time"] = "now"  # a time string as for `sbatch --begin`; epoch numbers are refused
        if update.hold is not None:
            body["hold"] = update.hold
        return body

    def parse_partition(self, raw: dict[str, Any]) -> Partition:
        return Partition(
            name=as_str(raw.get("name")),
            nodes=expand_hostlist(raw.get("nodes")),
            state=as_str(raw.get("state")).upper(),
            total_nodes=as_int(raw.get("total_nodes"), 0) or 0,
            total_cpus=as_int(raw.get("total_cpus"), 0) or 0,
        )

    def parse_ping(self, raw: dict[str, Any]) -> ControllerPing:
        return ControllerPing(hostname=as_str(raw.get("hostname")),
                              up=as_str(raw.get("ping")).upper() == "UP",
                              mode=as_str(raw.get("mode")))
