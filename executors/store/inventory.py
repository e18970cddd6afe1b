"""The cluster's inventory in the store: nodes and GPUs, online services and their replicas, and the counters
the Dagster sensors watch."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from executors.store import models as m
from scheduler_core.domain import JobState
from scheduler_core.online.latency_budget import DEFAULT_SLOWDOWN_BUDGET


class InventoryError(ValueError):
    """A registration the store cannot take; the message names the field (``name: …``, ``gpu-ids: …``)."""


def node_kinds(s: Session) -> set[bool]:
    """{True} for a simulated cluster, {False} for a real one, both for a store that mixes them, {} for none."""
    return set(s.scalars(select(m.Node.simulated).distinct()))


def node_count(s: Session) -> int:
    return s.scalar(select(func.count()).select_from(m.Node)) or 0


def gpu_type_memory(s: Session) -> dict[str, int]:
    """The cluster's GPU types and the memory of one GPU of each (what a submission is validated against)."""
    return dict(s.execute(select(m.GpuType.name, m.GpuType.memory_bytes)).all())


def online_services(s: Session, *, by: str = "name") -> list[m.OnlineService]:
    """Every online service, ordered by ``name`` or by ``id`` (registration order)."""
    key = {"name": m.OnlineService.name, "id": m.OnlineService.id}[by]
    return list(s.scalars(select(m.OnlineService).order_by(key)))


def served_gpus(s: Session) -> list[tuple[m.Gpu, m.GpuType, m.OnlineService, m.ServiceInstance]]:
    """Every GPU that hosts an online replica, with its type, service and replica, by GPU id."""
    return [tuple(r) for r in s.execute(
        select(m.Gpu, m.GpuType, m.OnlineService, m.ServiceInstance)
        .join(m.GpuType, m.Gpu.gpu_type == m.GpuType.name)
        .join(m.ServiceInstance, m.ServiceInstance.gpu_id == m.Gpu.id)
        .join(m.OnlineService, m.OnlineService.id == m.ServiceInstance.service_id)
        .order_by(m.Gpu.id)).all()]


def gpus(s: Session) -> list[m.Gpu]:
    """Every GPU, by id."""
    return list(s.scalars(select(m.Gpu).order_by(m.Gpu.id)))


def gpus_by_id(s: Session, gpu_ids) -> list[m.Gpu]:
    """These GPUs (those that exist), by id."""
    return list(s.scalars(select(m.Gpu).where(m.Gpu.id.in_(list(gpu_ids))).order_by(m.Gpu.id)))


def gpu_locations(s: Session, gpu_ids: list[int] | None = None) -> dict[int, tuple[str, int]]:
    """GPU id → (node name, GPU index) for every GPU, or for those of ``gpu_ids`` that exist."""
    q = select(m.Gpu.id, m.Node.name, m.Gpu.gpu_index).join(m.Node, m.Gpu.node_id == m.Node.id)
    if gpu_ids is not None:
        q = q.where(m.Gpu.id.in_(gpu_ids))
    return {g: (node, index) for g, node, index in s.execute(q)}


def gpu_health_by_node(s: Session) -> list[tuple[int, str, str, str]]:
    """(GPU id, node name, health, who set it) of every GPU."""
    return [tuple(r) for r in s.execute(select(m.Gpu.id, m.Node.name, m.Gpu.health, m.Gpu.health_source)
                                        .join(m.Node, m.Gpu.node_id == m.Node.id))]


def node_named(s: Session, name: str) -> m.Node | None:
    return s.scalars(select(m.Node).where(m.Node.name == name)).first()


def node_names(s: Session) -> list[str]:
    return list(s.scalars(select(m.Node.name).order_by(m.Node.name)))


def node_gpus(s: Session, node_id: int) -> list[tuple[m.Gpu, m.GpuType]]:
    """The node's GPUs with their types, by index."""
    return [tuple(r) for r in s.execute(
        select(m.Gpu, m.GpuType).join(m.GpuType, m.GpuType.name == m.Gpu.gpu_type)
        .where(m.Gpu.node_id == node_id).order_by(m.Gpu.gpu_index))]


def replicas_on(s: Session, gpu_ids: list[int]) -> list[tuple[int, str | None, m.OnlineService]]:
    """(GPU id, metrics endpoint, service) of the online replica on each of these GPUs that hosts one."""
    return [tuple(r) for r in s.execute(
        select(m.ServiceInstance.gpu_id, m.ServiceInstance.metrics_url, m.OnlineService)
        .join(m.OnlineService, m.OnlineService.id == m.ServiceInstance.service_id)
        .where(m.ServiceInstance.gpu_id.in_(gpu_ids)))]


def replica_users(s: Session, gpu_ids: list[int]) -> dict[int, str | None]:
    """GPU id → the user the online replica on it runs as (None: not registered), for the GPUs that host one."""
    return dict(s.execute(select(m.ServiceInstance.gpu_id, m.ServiceInstance.run_as_user)
                          .where(m.ServiceInstance.gpu_id.in_(gpu_ids))).all())


def gpu_inventory(s: Session) -> list[tuple[str, bool, int, str, str, str | None]]:
    """(node, simulated, GPU index, GPU type, health, online service) for every GPU, by node and index."""
    return [tuple(r) for r in s.execute(
        select(m.Node.name, m.Node.simulated, m.Gpu.gpu_index, m.Gpu.gpu_type, m.Gpu.health, m.OnlineService.name)
        .join(m.Gpu, m.Gpu.node_id == m.Node.id)
        .outerjoin(m.ServiceInstance, m.ServiceInstance.gpu_id == m.Gpu.id)
        .outerjoin(m.OnlineService, m.OnlineService.id == m.ServiceInstance.service_id)
        .order_by(m.Node.name, m.Gpu.gpu_index))]


@dataclass(frozen=True)
class ServiceRegistration:
    name: str
    family: str
    qps_min: float
    qps_max: float
    peak_hour_utc: float
    latency_slo_ms: float
    slowdown_allowance: float
    mem_bytes: int
    slowdown_budget: float | None = DEFAULT_SLOWDOWN_BUDGET  # scheduler_core.online.latency_budget; None: flat


def register_online_service(s: Session, spec: ServiceRegistration, gpu_ids: list[int], metrics_urls: dict[int, str],
                            run_as_user: str | None = None) -> int:
    """An online service with one replica on each of ``gpu_ids`` (and its endpoint where given); its id.

    ``run_as_user``: the user the replicas run as (only that user's offline jobs share their GPUs,
    ``scheduler_core.jobs.run_as``). Refuses a name in use, an unknown GPU, a GPU that already hosts a
    service and a user name that cannot be one (:class:`InventoryError`); nothing is written then.
    """
    if run_as_user is not None:
        check_user_name(run_as_user)
    if s.scalar(select(m.OnlineService.id).where(m.OnlineService.name == spec.name)) is not None:
        raise InventoryError(f"name: service {spec.name!r} already exists")
    found = set(s.scalars(select(m.Gpu.id).where(m.Gpu.id.in_(gpu_ids))))
    missing = [i for i in gpu_ids if i not in found]
    if missing:
        raise InventoryError(f"gpu-ids: unknown GPU id(s) {missing}")
    taken = sorted(s.scalars(select(m.ServiceInstance.gpu_id).where(m.ServiceInstance.gpu_id.in_(gpu_ids))))
    if taken:
        raise InventoryError(f"gpu-ids: GPU(s) {taken} already host an online service")
    svc = m.OnlineService(name=spec.name, model_family=spec.family, qps_min=spec.qps_min, qps_max=spec.qps_max,
                          peak_hour_utc=spec.peak_hour_utc, latency_slo_ms=spec.latency_slo_ms,
                          slowdown_allowance=spec.slowdown_allowance, slowdown_budget=spec.slowdown_budget,
                          mem_bytes=spec.mem_bytes)
    s.add(svc)
    s.flush()
    for i in gpu_ids:
        s.add(m.ServiceInstance(service_id=svc.id, gpu_id=i, metrics_url=metrics_urls.get(i), run_as_user=run_as_user))
    return svc.id


# What Slurm, useradd and MPS can take as a user name: no separators, no whitespace, not numeric only.
_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.@-]*\$?")


def check_user_name(name: str) -> str:
    """``name`` if it can be a user's name, else :class:`InventoryError` naming the field ``run-as``."""
    if not name or len(name) > 64 or not _USER_NAME.fullmatch(name):
        raise InventoryError(f"run-as: {name!r} is not a user name (letters, digits, '_', '.', '@', '-'; "
                             "not starting with a digit or '-'; at most 64 characters)")
    return name


def newest_job_id(s: Session, state: JobState) -> int | None:
    """The newest (highest) id of the jobs in ``state`` (the submission sensor's cursor)."""
    return s.scalar(select(func.max(m.OfflineJob.id)).where(m.OfflineJob.state == JobState(state).value))


def jobs_in_state(s: Session, state: JobState) -> int:
    return s.scalar(select(func.count()).select_from(m.OfflineJob)
                    .where(m.OfflineJob.state == JobState(state).value)) or 0


def newest_transition_id(s: Session) -> int:
    """The newest job transition's id (0 before any)."""
    return s.scalar(select(func.max(m.JobTransition.id))) or 0


def newest_fill_event(s: Session, after_id: int | None, since_utc: dt.datetime) -> int | None:
    """The newest job transition that can make a fill worthwhile: a GPU freed (a placed or running job done,
    failed or held again) or a job waiting (PENDING: profiled, requeued). After transition ``after_id``, or
    when None, after ``since_utc`` (the round's dispatch: what its own dispatch moved, at that instant, the
    round has planned already); None if there is none."""
    t = m.JobTransition
    freed = (t.to_state == JobState.DONE.value) | (
        (t.to_state == JobState.FAILED.value) & t.from_state.in_([JobState.PLACED.value, JobState.RUNNING.value]))
    waits = t.to_state == JobState.PENDING.value  # held again after its placement (a GPU freed) included
    q = select(func.max(t.id)).where(freed | waits)
    q = q.where(t.id > after_id) if after_id is not None else q.where(t.at_utc > since_utc)
    return s.scalar(q)


def newest_eviction_id(s: Session) -> int | None:
    """The newest eviction's id (the eviction sensor's cursor)."""
    return s.scalar(select(func.max(m.Eviction.id)))


def listed_jobs(s: Session, states: list[str] | None = None) -> list[m.OfflineJob]:
    """Offline jobs by id, only those in ``states`` when given (``muxflow jobs list``)."""
    q = select(m.OfflineJob).order_by(m.OfflineJob.id)
    if states:
        q = q.where(m.OfflineJob.state.in_([JobState(x.upper()).value for x in states]))
    return list(s.scalars(q))


def imported_slurm_ids(s: Session) -> set[int]:
    """The Slurm job ids the store has imported (to tell held submissions not picked up yet)."""
    return set(s.scalars(select(m.OfflineJob.slurm_job_id).where(m.OfflineJob.slurm_job_id.is_not(None))))


@dataclass(frozen=True)
class JobHistory:
    """One offline job's life as the store has it (``muxflow jobs show``): its row, profiles, state changes,
    placements with their round's window and GPU, evictions and executions, each in order."""

    job: m.OfflineJob
    profiles: list[m.JobProfile]
    transitions: list[m.JobTransition]
    placements: list[tuple[m.Placement, dt.datetime, str, int]]  # (placement, round window, node, GPU index)
    evictions: list[tuple[m.Eviction, str, int]]  # (eviction, node, GPU index)
    executions: list[m.JobExecution]


def job_history(s: Session, job_id: int | None = None, slurm_job_id: int | None = None) -> JobHistory | None:
    """The history of the job with this store id or Slurm job id (None: no such job)."""
    q = select(m.OfflineJob)
    job = s.scalars(q.where(m.OfflineJob.id == job_id) if job_id is not None
                    else q.where(m.OfflineJob.slurm_job_id == slurm_job_id)).first()
    if job is None:
        return None
    where = {g.id: (g.node.name, g.gpu_index) for g in s.scalars(select(m.Gpu))}
    placed = s.execute(select(m.Placement, m.SchedulingRound.window_start_utc)
                       .join(m.SchedulingRound, m.SchedulingRound.id == m.Placement.round_id)
                       .where(m.Placement.job_id == job.id).order_by(m.Placement.round_id)).all()
    evictions = s.scalars(select(m.Eviction).where(m.Eviction.job_id == job.id).order_by(m.Eviction.at_utc))
    return JobHistory(
        job=job,
        profiles=list(s.scalars(select(m.JobProfile).where(m.JobProfile.job_id == job.id)
                                .order_by(m.JobProfile.gpu_type))),
        transitions=list(s.scalars(select(m.JobTransition).where(m.JobTransition.job_id == job.id)
                                   .order_by(m.JobTransition.id))),
        placements=[(p, at, *where.get(p.gpu_id, ("?", -1))) for p, at in placed],
        evictions=[(e, *where.get(e.gpu_id, ("?", -1))) for e in evictions],
        executions=list(s.scalars(select(m.JobExecution).where(m.JobExecution.job_id == job.id)
                                  .order_by(m.JobExecution.start_utc))),
    )
