"""Store queries about profiling (docs/DESIGN.md §3 step 2, paper §6): solo profiling runs and the profiles they
leave, co-location sampling runs and the samples they measure.

Each function takes the caller's session, so the caller's transaction is the boundary.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from executors.store import models as m

# A run that has not ended: submitted to its executor, or running there.
OPEN_RUN_STATES = ("submitted", "running")
# Profiles measured by a profiling run; another job of the same type may take them over.
REUSABLE_METHODS = ("nvml", "simulated-metrics")


def open_profiling_runs(s: Session, job_ids: list[int] | None = None) -> list[m.ProfilingRun]:
    """Profiling runs not ended yet, oldest first (only those of ``job_ids`` when given)."""
    q = select(m.ProfilingRun).where(m.ProfilingRun.state.in_(OPEN_RUN_STATES))
    if job_ids is not None:
        q = q.where(m.ProfilingRun.job_id.in_(job_ids))
    return list(s.scalars(q.order_by(m.ProfilingRun.id)))


def done_profiling_runs(s: Session, job_id: int) -> list[m.ProfilingRun]:
    """The job's profiling runs that ended well."""
    return list(s.scalars(select(m.ProfilingRun).where(m.ProfilingRun.job_id == job_id,
                                                       m.ProfilingRun.state == "done")))


def profiled_gpu_types(s: Session, job_id: int) -> set[str]:
    """The GPU types the job has a stored profile on."""
    return set(s.scalars(select(m.JobProfile.gpu_type).where(m.JobProfile.job_id == job_id)))


def profiling_gpu_types(s: Session, job_id: int) -> set[str]:
    """The GPU types the job has an open profiling run on."""
    return set(s.scalars(select(m.ProfilingRun.gpu_type).where(m.ProfilingRun.job_id == job_id,
                                                               m.ProfilingRun.state.in_(OPEN_RUN_STATES))))


def profile_on(s: Session, job_id: int, gpu_type: str) -> m.JobProfile | None:
    """The job's profile on a GPU type, if it has one."""
    return s.scalars(select(m.JobProfile).where(m.JobProfile.job_id == job_id,
                                                m.JobProfile.gpu_type == gpu_type)).first()


def reusable_profile(s: Session, job_type: str, gpu_type: str, not_job_id: int) -> m.JobProfile | None:
    """The newest measured profile on ``gpu_type`` of another job labelled ``job_type``."""
    return s.scalars(
        select(m.JobProfile).join(m.OfflineJob, m.OfflineJob.id == m.JobProfile.job_id)
        .where(m.OfflineJob.job_type == job_type, m.JobProfile.gpu_type == gpu_type,
               m.JobProfile.method.in_(REUSABLE_METHODS), m.JobProfile.job_id != not_job_id)
        .order_by(m.JobProfile.profiled_utc.desc(), m.JobProfile.id.desc()).limit(1)).first()


def profile_counts(s: Session) -> dict[tuple[str, str], int]:
    """Stored profiles per (method, source)."""
    q = select(m.JobProfile.method, m.JobProfile.source, func.count()).group_by(m.JobProfile.method,
                                                                                m.JobProfile.source)
    return {(meth, src): n for meth, src, n in s.execute(q)}


def open_sampling_runs(s: Session) -> list[m.SamplingRun]:
    """Sampling runs not ended yet, oldest first."""
    return list(s.scalars(select(m.SamplingRun).where(m.SamplingRun.state.in_(OPEN_RUN_STATES))
                          .order_by(m.SamplingRun.id)))


def measured_sample_counts(s: Session, gpu_types: list[str]) -> dict[tuple[str, str, str], dict[int, int]]:
    """Samples measured (not simulated) per (GPU type, service, job type), by SM percentage."""
    c = m.ColocationSample
    q = (select(c.gpu_type, c.service_name, c.job_type, c.sm_pct, func.count())
         .where(c.method != "simulated", c.gpu_type.in_(gpu_types))
         .group_by(c.gpu_type, c.service_name, c.job_type, c.sm_pct))
    out: dict[tuple[str, str, str], dict[int, int]] = {}
    for g, svc, job, sm, n in s.execute(q):
        out.setdefault((g, svc, job), {})[int(round(sm))] = int(n)
    return out


def recent_runs(s: Session, kind: type[m.RunRecord], since_utc: dt.datetime | None = None,
                limit: int = 200) -> list:
    """The newest ``limit`` runs of a kind (:class:`~executors.store.models.ProfilingRun` or
    :class:`~executors.store.models.SamplingRun`; those finished since ``since_utc`` when given), oldest first."""
    q = select(kind).order_by(kind.id.desc()).limit(limit)
    if since_utc is not None:
        q = q.where(kind.finished_utc >= since_utc)
    return list(s.scalars(q))[::-1]


def record_window_report(s: Session, run_id: int, slurm_job_id: int, node: str, gpu_index: int,
                         started_utc: dt.datetime, report: dict) -> bool:
    """The node agent's report of a profiling window, into its run's row: only while the run is open and belongs
    to that Slurm job (a late report of a closed window changes nothing). Whether it was written."""
    run = s.get(m.ProfilingRun, run_id)
    if run is None or run.state not in OPEN_RUN_STATES or run.slurm_job_id != slurm_job_id:
        return False
    run.report = report
    run.node, run.gpu_index = node, gpu_index
    run.started_utc = run.started_utc or started_utc
    if run.state == "submitted":
        run.state = "running"
    return True


MEM_HEADROOM = 1.1  # a job's undeclared GPU memory: its profiled peak, plus this much room to grow


def measured_mem_need(s: Session, job_id: int) -> int:
    """GPU memory for a job that declared none: the largest peak its profiles measured, plus headroom, in whole MiB."""
    peak = s.scalar(select(func.max(m.JobProfile.mem_used_bytes)).where(m.JobProfile.job_id == job_id)) or 0.0
    mib = 2**20
    return max(mib, int(-(-peak * MEM_HEADROOM // mib)) * mib)
