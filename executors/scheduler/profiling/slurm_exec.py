"""MuxFlow's own reference workloads on the Slurm ``profile`` partition, through slurmrestd (co-location sampling).

Each run is one batch job with a whole GPU of the run's type (``--gres=gpu:<type>:1``, or
``--gres=gpu:1`` on a node of that type where the nodes have one gres Type per GPU:
sampling controls the GPU's sharing itself), a time limit a minute above the run's bound, output
into the run directory, and the run's key in its comment (``muxflow-profile-run=<run directory>``),
by which a run submitted just before a crash is found again instead of being submitted twice.

The client this executor is given acts as the unprivileged reference account (``slurm_reference_jwt_file``):
the runs are MuxFlow's code, but never run with MuxFlow's identity. Users' jobs are not run here: they are
profiled in their own Slurm jobs (:mod:`executors.scheduler.profiling.windows`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from executors.scheduler.profiling.runs import (
    PHASE_FINISHED,
    PHASE_PENDING,
    PHASE_RUNNING,
    ExecStatus,
    ExecutorError,
    ExecutorUnavailable,
    RunSpec,
)
from executors.scheduler.slurm.sync import view_of
from executors.slurm.client import SlurmNotFound
from executors.slurm.errors import SlurmError
from executors.slurm.models import PENDING, Node
from executors.slurm.retry import Retry, SlurmUnavailable
from executors.slurm.spec import BatchJob
from scheduler_core.jobs.sync import ClusterView

log = logging.getLogger(__name__)
_RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED"})


def call_slurm(retry: Retry, what: str, fn):
    """``fn()`` under ``retry``, its failures in the executors' terms: Slurm away for the whole deadline is
    :class:`ExecutorUnavailable` (try later, nothing is lost), a refusal :class:`ExecutorError`; a job Slurm does
    not know is left as :class:`SlurmNotFound` for the caller to decide."""
    try:
        return retry.call(what, fn)
    except SlurmUnavailable as exc:
        raise ExecutorUnavailable(str(exc)) from exc
    except SlurmNotFound:
        raise
    except SlurmError as exc:
        raise ExecutorError(f"{what}: {exc}") from exc


def whole_gpu_request(nodes: list[Node], partition: str, model: str) -> tuple[str, str | None]:
    """``(--gres, node list)`` for one whole GPU of ``model`` in ``partition``.

    ``gpu:<model>:1`` where a node of the partition has the classic ``gpu:<model>:<n>``. Where
    every such node has one gres Type per GPU (``gpu:t4g0:1,…``; docs/SLURM.md) no GPU has the
    Type ``<model>``: then ``gpu:1`` on the usable node of that model with the most GPUs free.
    """
    of_model = [n for n in nodes if partition in n.partitions and n.gpu_type == model]
    if not of_model or any(not n.per_gpu_types for n in of_model):
        return f"gpu:{model}:1", None
    best = max(of_model, key=lambda n: (n.usable, len(n.gpus) - n.gres_in_use("gpu"), n.name))
    return "gpu:1", best.name


class SlurmProfileExecutor:
    kind = "slurm"
    persistent = True

    def __init__(self, client, partition: str = "profile", retry_deadline_s: float = 30.0,
                 environment: Mapping[str, str] | None = None, report_owner: int | None = None):
        self.client = client
        # the uid the runs' reports must belong to (the reference account's): a shared run directory's other files
        # are not the run's
        self.report_owner = report_owner
        self.partition = partition
        self.retry = Retry(retry_deadline_s)
        self.environment = dict(environment or {"PATH": "/usr/local/bin:/usr/bin:/bin"})

    def _call(self, what: str, fn):
        return call_slurm(self.retry, what, fn)

    def submit(self, spec: RunSpec) -> int:
        nodes = self._call(f"list the {self.partition} partition's nodes", self.client.list_nodes)
        gres, nodelist = whole_gpu_request(nodes, self.partition, spec.gpu_type)
        job = BatchJob(
            name=spec.name, script=spec.script, partition=self.partition, environment=self.environment,
            working_dir=str(spec.run_dir), gres_per_node=gres, nodelist=nodelist, requeue=False,
            stdout_path=str(spec.run_dir / "slurm-%j.out"), stderr_path=str(spec.run_dir / "slurm-%j.out"),
            time_limit_min=max(1, math.ceil(spec.time_limit_s / 60.0)), comment=spec.key,
        )
        res = self._call(f"submit {spec.name} to {self.partition}", lambda: self.client.submit(job))
        log.info("submitted %s as Slurm job %s", spec.name, res.job_id)
        return int(res.job_id)

    def find(self, spec: RunSpec) -> int | None:
        jobs = self._call("list Slurm jobs", self.client.list_jobs)
        for j in jobs:
            if j.name == spec.name and (j.comment or "").strip() == spec.key:
                return int(j.job_id)
        return None

    def status(self, handle: int) -> ExecStatus:
        try:
            j = self._call(f"read Slurm job {handle}", lambda: self.client.get_job(handle))
        except SlurmNotFound:  # purged from slurmctld's memory (MinJobAge): it has ended
            return ExecStatus(PHASE_FINISHED, state="UNKNOWN (purged)")
        node = j.nodes[0] if j.nodes else None
        if j.state == PENDING:
            return ExecStatus(PHASE_PENDING, None, None, j.state)
        if j.state in _RUNNING_STATES:
            return ExecStatus(PHASE_RUNNING, j.start_time_utc, node, j.state)
        return ExecStatus(PHASE_FINISHED, j.start_time_utc, node, j.state, j.exit_code)

    def cancel(self, handle: int) -> None:
        try:
            self._call(f"cancel Slurm job {handle}", lambda: self.client.cancel(handle))
        except SlurmNotFound:
            pass

    def cluster_views(self, slurm_job_ids: list[int]) -> dict[int, ClusterView]:
        """One job listing: each job as the job-state sync reads it (absent: purged, or never there)."""
        by_id = {j.job_id: j for j in self._call("list Slurm jobs", self.client.list_jobs)}
        return {sid: view_of(by_id.get(sid)) for sid in slurm_job_ids}
