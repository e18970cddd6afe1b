"""Runs one scheduling round against the store and a cluster, and books what the cluster reports.

The same code path serves the simulated cluster and (later) Slurm: snapshot
from the store → ``scheduler_core.round.plan_round`` → round and placements
stored → each action logged as intent, sent, then logged with its result
(an action key makes a repeated dispatch a no-op) → job states moved.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

import numpy as np
from sqlalchemy import select

from executors.cluster import Cluster, IntervalReport
from executors.store import models as m
from executors.store import repo
from executors.store.db import Store
from executors.store.jobs import transition
from scheduler_core.domain import (
    Action,
    GpuCandidate,
    GpuHealth,
    JobCandidate,
    JobState,
    OnlineFeatures,
    PlanAction,
    RoundResult,
)
from scheduler_core.forecast import ForecastPolicy, forecast_next
from scheduler_core.round import RoundConfig, plan_round, snapshot

log = logging.getLogger(__name__)

HISTORY = dt.timedelta(hours=25)
FEATURE_WINDOW_MIN = 15


@dataclass
class RoundOutcome:
    round_id: int
    window_start_utc: dt.datetime
    result: RoundResult
    dispatched: int
    failed: int


def _gpu_candidates(s, now: dt.datetime, running: dict, policy: ForecastPolicy) -> list[GpuCandidate]:
    rows = s.execute(
        select(m.Gpu, m.GpuType, m.OnlineService)
        .join(m.GpuType, m.Gpu.gpu_type == m.GpuType.name)
        .join(m.ServiceInstance, m.ServiceInstance.gpu_id == m.Gpu.id)
        .join(m.OnlineService, m.OnlineService.id == m.ServiceInstance.service_id)
        .order_by(m.Gpu.id)
    ).all()
    series = repo.recent_online_series(s, [g.id for g, _, _ in rows], now - HISTORY)
    on_gpu = {r.gpu_id: r for r in running.values()}
    out = []
    for gpu, gtype, svc in rows:
        ser = series[gpu.id]
        recent = {k: v[-FEATURE_WINDOW_MIN:] for k, v in ser.items()}
        if recent["sm"].size == 0 or not np.isfinite(recent["sm"]).any():
            log.warning("GPU %s has no recent online metrics; left out of this round", gpu.id)
            continue
        mean = {k: float(np.nanmean(v)) if np.isfinite(v).any() else 0.0 for k, v in recent.items()}
        fc_sm = forecast_next(ser["sm"], policy)
        current = on_gpu.get(gpu.id)
        out.append(
            GpuCandidate(
                gpu_id=gpu.id, gpu_type=gtype.name, memory_bytes=gtype.memory_bytes,
                max_sm_clock_mhz=gtype.max_sm_clock_mhz, health=GpuHealth(gpu.health), service_name=svc.name,
                online=OnlineFeatures(
                    gpu_util_pct=mean["gpu_util"], sm_activity_pct=fc_sm, sm_occupancy_pct=0.55 * fc_sm,
                    mem_used_bytes=mean["mem"], mem_bw_util_pct=mean["bw"], latency_ms=mean["latency"],
                    qps=mean["qps"], sm_clock_mhz=mean["clock"],
                ),
                forecast_sm_pct=fc_sm,
                forecast_mem_bytes=float(np.nanmax(ser["mem"])),
                slowdown_allowance=svc.slowdown_allowance,
                current_job_id=current.job_id if current else None,
                current_sm_pct=current.sm_pct if current else None,
            )
        )
    return out


def _job_candidates(s, running: dict) -> list[JobCandidate]:
    jobs = repo.jobs_in_states(s, [JobState.PENDING, JobState.RUNNING])
    profiles = repo.profiles_by_job(s, [j.id for j in jobs])
    out = []
    for j in jobs:
        if j.id not in profiles:
            continue
        cur = running.get(j.id)
        out.append(
            JobCandidate(
                job_id=j.id, mem_bytes=j.mem_bytes, allowed_gpu_types=frozenset(j.allowed_gpu_types),
                profiles=profiles[j.id], priority=j.priority,
                current_gpu_id=cur.gpu_id if cur else None, current_sm_pct=cur.sm_pct if cur else None,
            )
        )
    return out


def plan_and_record(
    store: Store, cluster: Cluster, window_start: dt.datetime, cfg: RoundConfig,
    policy: ForecastPolicy = ForecastPolicy(),
) -> tuple[int, RoundResult]:
    running = cluster.running()
    with store.session() as s:
        gpus = _gpu_candidates(s, window_start, running, policy)
        jobs = _job_candidates(s, running)
        predictors = repo.load_predictors(s)
        if not predictors:
            raise RuntimeError("no promoted speed predictor in the store: train one first (muxflow train)")
        result = plan_round(gpus, jobs, predictors, cfg)
        action_of = {a.job_id: a.action.value for a in result.actions if a.action != Action.EVICT}
        pending = sum(1 for j in jobs if j.current_gpu_id is None)
        rnd = repo.record_round(
            s, window_start, result, snapshot(gpus, jobs), cluster.simulated, pending, action_of
        )
        return rnd.id, result


def _action_key(round_id: int, a: PlanAction) -> str:
    return f"r{round_id}:{a.action.value}:j{a.job_id}:g{a.gpu_id}:p{a.sm_pct}"


def dispatch_round(store: Store, cluster: Cluster, round_id: int, result: RoundResult, now: dt.datetime) -> tuple[int, int]:
    """Send the plan once: every intent stored first, then the cluster call, then each result.

    Actions already marked done or failed under their key are not sent again,
    so re-running a dispatch after a crash completes it without duplicates.
    """
    todo: list[tuple[str, PlanAction]] = []
    with store.session() as s:
        for act in result.actions:
            key = _action_key(round_id, act)
            row = s.scalars(select(m.DispatchLog).where(m.DispatchLog.action_key == key)).first()
            if row is None:
                s.add(m.DispatchLog(
                    round_id=round_id, action_key=key, action=act.action.value, job_id=act.job_id,
                    gpu_id=act.gpu_id, payload={"sm_pct": act.sm_pct, "from_gpu_id": act.from_gpu_id},
                ))
            elif row.status in ("done", "failed"):
                continue
            todo.append((key, act))
    results = cluster.dispatch([a for _, a in todo], now) if todo else []
    still_running = cluster.running()
    ok_n = failed_n = 0
    with store.session() as s:
        for (key, act), res in zip(todo, results):
            row = s.scalars(select(m.DispatchLog).where(m.DispatchLog.action_key == key)).one()
            row.status, row.error, row.updated_utc = ("done", None, now) if res.ok else ("failed", res.detail, now)
            if res.ok:
                _book_action(s, act, now)
            elif act.action == Action.MIGRATE and act.job_id not in still_running:
                transition(s, act.job_id, JobState.MIGRATING, "checkpoint for move", at_utc=now)
                transition(s, act.job_id, JobState.PENDING, f"restart failed: {res.detail}", at_utc=now)
            ok_n += res.ok
            failed_n += not res.ok
        rnd = s.get(m.SchedulingRound, round_id)
        rnd.status, rnd.finished_utc = "dispatched", now
    return ok_n, failed_n


def _book_action(s, act: PlanAction, now: dt.datetime) -> None:
    if act.action == Action.START:
        transition(s, act.job_id, JobState.RUNNING, f"placed on GPU {act.gpu_id} at {act.sm_pct}% SM", at_utc=now)
    elif act.action == Action.MIGRATE:
        transition(s, act.job_id, JobState.MIGRATING, f"checkpoint for move to GPU {act.gpu_id}", at_utc=now)
        transition(s, act.job_id, JobState.RUNNING, f"restarted on GPU {act.gpu_id} at {act.sm_pct}% SM", at_utc=now)
    elif act.action == Action.EVICT:
        transition(s, act.job_id, JobState.EVICTED, "not in this round's plan", at_utc=now)
        transition(s, act.job_id, JobState.PENDING, "requeued after plan eviction", at_utc=now)


def book_interval(store: Store, report: IntervalReport, round_id: int | None, source: str, now: dt.datetime) -> None:
    """Persist what the cluster observed: metrics, executions, evictions, completions, health."""
    with store.session() as s:
        repo.write_metrics(s, report.metrics, source)
        repo.write_executions(s, report.executions, round_id, source)
        repo.write_evictions(s, report.evictions, source)
        for job_id, (steps, ckpt) in report.progress.items():
            job = s.get(m.OfflineJob, job_id)
            job.steps_done, job.checkpoint_step = min(steps, job.total_steps), min(ckpt, job.total_steps)
        for ev in report.evictions:
            transition(s, ev.job_id, JobState.EVICTED, ev.reason, at_utc=ev.at_utc)
            transition(s, ev.job_id, JobState.PENDING, "requeued after SysMonitor eviction", at_utc=ev.at_utc)
        for job_id, at in report.completed.items():
            transition(s, job_id, JobState.DONE, "all steps done", at_utc=at)
        repo.set_gpu_health(s, report.health, now)
