"""Shared pieces of the profiling tests: a store with GPU types and jobs, a fake Slurm-like executor."""

from __future__ import annotations

import datetime as dt
import itertools
import json
from dataclasses import dataclass

from sqlalchemy import select

from executors.node.profiling.probe import PROBE_FILE
from executors.scheduler.profiling.runs import (
    PHASE_FINISHED,
    PHASE_PENDING,
    PHASE_RUNNING,
    ExecStatus,
    ExecutorUnavailable,
    JobScript,
    RunSpec,
)
from executors.scheduler.submission import JobSpec, submit
from executors.store import models as m
from executors.store import repo
from executors.store.db import Store
from scheduler_core.gpu_specs import get_spec
from scheduler_core.jobs.sync import ClusterView, Seen

GOOD_PROBE = {
    "exit_code": 0, "killed_at_deadline": False, "terminated": False, "elapsed_s": 9.5,
    "iteration_report": {"iterations": 20, "total_iterations": 22, "final": True, "mean_s": 0.05, "p50_s": 0.05,
                         "p95_s": 0.06, "stopped_by": "iterations"},
    "metrics": {"source": "simulated", "gpu_util_pct": 93.0, "sm_activity_pct": 61.0, "sm_occupancy_pct": 35.0,
                "mem_used_bytes": 3.1e9, "mem_total_bytes": 16e9, "mem_bw_util_pct": 44.0, "sm_clock_mhz": 1450.0},
    "metrics_source": "simulated", "model_iter_time_s": 0.21, "device": "cpu (x86_64; no GPU)",
}


def add_gpu_types(store: Store, *names: str) -> None:
    with store.session() as s:
        for n in names:
            repo.upsert_gpu_type(s, get_spec(n))


def add_job(store: Store, name: str, command: str, job_type: str = "ResNet-18 (batch size 16)",
            gpu_types: tuple[str, ...] = ("t4",)) -> int:
    with store.session() as s:
        return submit(s, JobSpec(name=name, command=command, job_type=job_type, mem_bytes=10**9,
                                 allowed_gpu_types=gpu_types, checkpoint_dir=f"/ckpt/{name}", total_steps=1000),
                      None).id


def set_slurm_id(store: Store, job_id: int, slurm_job_id: int) -> None:
    """The job came from ``sbatch`` (picked up from Slurm)."""
    with store.session() as s:
        s.get(m.OfflineJob, job_id).slurm_job_id = slurm_job_id


def job_state(store: Store, job_id: int) -> tuple[str, str | None]:
    with store.session() as s:
        j = s.get(m.OfflineJob, job_id)
        return j.state, j.state_reason


def runs_of(store: Store, job_id: int) -> list[m.ProfilingRun]:
    with store.session() as s:
        rows = list(s.scalars(select(m.ProfilingRun).where(m.ProfilingRun.job_id == job_id)
                              .order_by(m.ProfilingRun.id)))
        s.expunge_all()
        return rows


class FakeClock:
    def __init__(self) -> None:
        self.t = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += dt.timedelta(seconds=seconds)


@dataclass
class FakeJob:
    spec: RunSpec
    phase: str = PHASE_PENDING
    started: dt.datetime | None = None
    state: str = "PENDING"
    exit_code: int | None = None
    cancelled: bool = False


class FakeSlurm:
    """A Slurm-like executor whose jobs the test moves along (persistent handles, found by key)."""

    kind = "slurm"
    persistent = True

    def __init__(self, clock: FakeClock):
        self.clock = clock
        self.jobs: dict[int, FakeJob] = {}
        self.unavailable = False
        self._ids = itertools.count(500)
        self.user_jobs: dict[int, ClusterView] = {}  # the profiled jobs' own Slurm jobs (default: held, pending)

    def submit(self, spec: RunSpec) -> int:
        if self.unavailable:
            raise ExecutorUnavailable("slurmctld down (fake)")
        h = next(self._ids)
        self.jobs[h] = FakeJob(spec)
        return h

    def find(self, spec: RunSpec) -> int | None:
        if self.unavailable:
            raise ExecutorUnavailable("slurmctld down (fake)")
        return next((h for h, j in self.jobs.items() if j.spec.key == spec.key), None)

    def status(self, handle: int) -> ExecStatus:
        if self.unavailable:
            raise ExecutorUnavailable("slurmctld down (fake)")
        j = self.jobs[handle]
        return ExecStatus(j.phase, j.started, "fake-node" if j.started else None, j.state, j.exit_code)

    def cancel(self, handle: int) -> None:
        j = self.jobs[handle]
        j.cancelled, j.phase, j.state = True, PHASE_FINISHED, "CANCELLED"

    def job_script(self, slurm_job_id: int | None, command: str) -> JobScript:
        return JobScript("#!/bin/sh\n" + command + "\n", "/tmp")

    def cluster_views(self, slurm_job_ids: list[int]) -> dict[int, ClusterView]:
        if self.unavailable:
            raise ExecutorUnavailable("slurmctld down (fake)")
        return {sid: self.user_jobs.get(sid, ClusterView(Seen.HELD, "PENDING: JobHeldAdmin")) for sid in slurm_job_ids}

    # -- what the test does to a job --
    def start(self, handle: int) -> None:
        j = self.jobs[handle]
        j.phase, j.state, j.started = PHASE_RUNNING, "RUNNING", self.clock()

    def finish(self, handle: int, probe: dict | None, state: str = "COMPLETED", exit_code: int = 0) -> None:
        j = self.jobs[handle]
        if probe is not None:
            (j.spec.run_dir / PROBE_FILE).write_text(json.dumps(probe))
        j.phase, j.state, j.exit_code = PHASE_FINISHED, state, exit_code
        j.started = j.started or self.clock()

    def handle_of(self, job_id: int, gpu_type: str) -> int:
        return next(h for h, j in self.jobs.items() if j.spec.name == f"mxprof-j{job_id}-{gpu_type}")
