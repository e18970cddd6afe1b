"""A stateful fake of the slurmrestd client (the :class:`executors.slurm.client.SlurmApi` calls MuxFlow makes).

Jobs live in a dict; submit holds offline jobs the way job_submit.lua does, updates
apply node list / partition / GRES / comment / hold, cancel finishes a job. Every call is
recorded in ``calls`` so tests can count what was sent. ``down`` makes every call
fail as if slurmctld did not answer. Nodes have one gres Type per GPU (``gpu:t4g0:1,…,mps:t4g0:100,…``)
as the dev cluster's do, except those named in ``untyped`` (``gpu:t4:4,mps:400``). GRES updates follow
Slurm 22.05 (checked on the dev cluster): an untyped share becomes a typed one only after
:meth:`clear_gres`; a job that once had a typed share never gets an untyped one again; what Slurm would
get wrong silently (another Type added next to a job's old one, a typed request cleared — slurmctld
then crashes) fails the test.
"""

from __future__ import annotations

import datetime as dt
import os
import pwd
from collections.abc import Callable, Collection
from dataclasses import replace
from pathlib import Path

from executors.slurm.client import SlurmNotFound
from executors.slurm.errors import SlurmErrorEntry, SlurmRestError, SlurmTransportError
from executors.slurm.hostlist import parse_gres, per_gpu_type
from executors.slurm.models import Job, Node, SubmitResult
from executors.slurm.spec import BatchJob, JobUpdate

from executors.store.db import Store
from executors.store.migrate import upgrade

PLAN_KEY = bytes(range(32))  # the tests' plan key (executors.slurm.plan)
USER = pwd.getpwuid(os.geteuid()).pw_name  # the fake jobs' owner: whoever runs the tests (owns their files)


def make_job(job_id: int, *, comment: str = "", admin_comment: str = "", gres: str = "gres:mps:30",
             partition: str = "offline", held: bool = True, name: str | None = None, state: str = "PENDING") -> Job:
    return Job(job_id=job_id, name=name or f"job{job_id}", state=state,
               state_reason="JobHeldUser" if held else "None", partition=partition, user_name=USER, nodes=(),
               required_nodes=(), gres_per_node=gres, priority=0 if held else 100, requeue=True, restart_count=0,
               exit_code=None, comment=comment, working_dir="/home/u", submit_time_utc=None, start_time_utc=None,
               end_time_utc=None, admin_comment=admin_comment)


class FakeClock:
    """Time that passes only when something sleeps (a retry's clock and sleep; Slurm's wall clock)."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


class FakeSlurm:
    def __init__(self, jobs: list[Job] = (), nodes: dict[str, tuple[str, int]] | None = None,
                 untyped: Collection[str] = (), clock: Callable[[], float] | None = None,
                 partitions: tuple[str, ...] = ("offline", "profile")):
        self.jobs: dict[int, Job] = {j.job_id: j for j in jobs}
        self.partitions = partitions
        self.gres_used: dict[str, str] = {}  # node -> its GRES in use, as Slurm lists it
        # Slurm's wall clock: with one, a requeue sets the job's submit time to it, as slurmctld does
        self.clock = clock
        self.nodes = nodes if nodes is not None else {"mx-t4-1": ("t4", 4), "mx-a10-1": ("a10", 4)}
        self.untyped = set(untyped)
        # jobs Slurm remembers as having had a typed GRES
        self.typed_once = {j.job_id for j in self.jobs.values() if any(g.type for g in parse_gres(j.gres_per_node))}
        self.calls: list[tuple] = []
        self.down = False
        self.closed = False
        self._next = max(self.jobs, default=100) + 1

    def _call(self, *what) -> None:
        self.calls.append(what)
        if self.down:
            raise SlurmTransportError("slurmrestd at unix:/fake.sock: connection refused")

    def _job(self, job_id: int) -> Job:
        if job_id not in self.jobs:
            raise SlurmNotFound("GET", f"/job/{job_id}", 500, [SlurmErrorEntry(message="Invalid job id specified",
                                                                                number=2017)])
        return self.jobs[job_id]

    # -- the client API ---------------------------------------------------------------
    def submit(self, spec: BatchJob) -> SubmitResult:
        self._call("submit", spec.name)
        job_id, self._next = self._next, self._next + 1
        self.jobs[job_id] = make_job(job_id, comment=spec.comment or "", name=spec.name, partition=spec.partition,
                                     gres=f"gres:{spec.gres_per_node}" if spec.gres_per_node else "",
                                     held=spec.hold or spec.partition == "offline")
        return SubmitResult(job_id)

    def list_jobs(self) -> list[Job]:
        self._call("list_jobs")
        return list(self.jobs.values())

    def get_job(self, job_id: int) -> Job:
        self._call("get_job", job_id)
        return self._job(job_id)

    def update_job(self, job_id: int, update: JobUpdate) -> None:
        self._call("update_job", job_id, update)
        j = self._job(job_id)
        changes: dict = {}
        if update.nodelist is not None:
            changes["required_nodes"] = (update.nodelist,)
        if update.gres_per_node is not None:
            old = {g.type for g in parse_gres(j.gres_per_node)}
            new = {g.type for g in parse_gres(update.gres_per_node)}
            typed = new != {None}
            if (typed and None in old) or (not typed and (old - {None} or job_id in self.typed_once)):
                raise SlurmRestError("POST", f"/job/{job_id}", 500, [SlurmErrorEntry(
                    message="Invalid GRES specification (with and without type identification)", number=2119)])
            assert not (old - {None} - new), f"Slurm 22.05 would add {new} next to job {job_id}'s {old}"
            if typed:
                self.typed_once.add(job_id)
            changes["gres_per_node"] = f"gres:{update.gres_per_node}"
        if update.comment is not None:
            changes["comment"] = update.comment
        if update.partition is not None:
            changes["partition"] = update.partition
        if update.hold is not None:
            changes["priority"] = 0 if update.hold else 100
            changes["state_reason"] = "JobHeldUser" if update.hold else "None"
        if update.eligible_now and j.state_reason == "BeginTime":  # a begin time to come is now
            changes.setdefault("state_reason", "None")
        self.jobs[job_id] = replace(j, **changes)

    def clear_gres(self, job_id: int) -> None:
        self._call("clear_gres", job_id)
        assert job_id not in self.typed_once, f"clearing typed job {job_id}'s request crashes slurmctld 22.05"
        self.jobs[job_id] = replace(self._job(job_id), gres_per_node="")

    def hold(self, job_id: int) -> None:
        self.update_job(job_id, JobUpdate(hold=True))

    def cancel(self, job_id: int, signal: str | None = None) -> None:
        self._call("cancel", job_id, signal)
        j = self._job(job_id)
        if j.het_job_id and j.het_job_id != job_id:  # as slurmctld 22.05 answers (dev cluster)
            raise SlurmRestError("DELETE", f"/job/{job_id}", 500, [SlurmErrorEntry(
                message="Operation not permitted on individual component of heterogeneous job", number=2108)])
        if signal is None:
            for other in [o for o in self.jobs.values() if o.job_id == job_id or (j.het_job_id and
                                                                                o.het_job_id == j.het_job_id)]:
                self.jobs[other.job_id] = replace(other, state="CANCELLED")

    def requeue(self, job_id: int, hold: bool = True) -> None:
        self._call("requeue", job_id, hold)
        submitted = self._job(job_id).submit_time_utc
        if self.clock is not None:
            submitted = dt.datetime.fromtimestamp(self.clock(), tz=dt.UTC)
        job = self._job(job_id)
        self.jobs[job_id] = replace(job, state="PENDING", priority=0 if hold else 100, nodes=(),
                                    submit_time_utc=submitted, restart_count=job.restart_count + 1)

    def node_gres(self, name: str) -> str:
        model, k = self.nodes[name]
        if name in self.untyped:
            return f"gpu:{model}:{k},mps:{100 * k}"
        types = [per_gpu_type(model, i) for i in range(k)]
        return ",".join([f"gpu:{t}:1" for t in types] + [f"mps:{t}:100" for t in types])

    def list_nodes(self) -> list[Node]:
        self._call("list_nodes")
        return [Node(name=n, address="", hostname=n, state="IDLE", state_flags=(), partitions=self.partitions,
                     gres=parse_gres(self.node_gres(n)), gres_used=parse_gres(self.gres_used.get(n)), cpus=8,
                     alloc_cpus=0, reason="")
                for n in self.nodes]

    def close(self) -> None:
        self.closed = True

    # -- for assertions ---------------------------------------------------------------
    def sent(self, kind: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == kind]


def store_with_fake_nodes(tmp_path: Path, fake: FakeSlurm | None = None) -> Store:
    """A migrated SQLite store whose nodes and GPUs are the fake cluster's (as ``register-nodes`` records them)."""
    from executors.scheduler.slurm.backend import register_slurm_nodes

    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    store = Store(url)
    register_slurm_nodes(store, fake or FakeSlurm())
    return store
