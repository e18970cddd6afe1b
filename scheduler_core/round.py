"""One scheduling round (paper Alg. 1, DESIGN §3.5).

healthy GPUs + forecast load → dynamic SM % per GPU → predicted normalized
throughput and online slowdown for every feasible (GPU, job) pair →
maximum-weight matching → plan → diff against what runs now.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from scheduler_core.domain import (
    Action,
    GpuCandidate,
    GpuHealth,
    JobCandidate,
    OfflineFeatures,
    OnlineFeatures,
    PlanAction,
    PlannedPlacement,
    RoundResult,
)
from scheduler_core.dynamic_sm import SmPolicy, offline_sm_pct
from scheduler_core.features import offline_vector, online_vector, pair_matrix
from scheduler_core.matching import max_weight_matching
from scheduler_core.predictor import SpeedPredictor


@dataclass(frozen=True)
class RoundConfig:
    sm: SmPolicy = field(default_factory=SmPolicy)
    # xCUDA's memory quota for offline work: a share of device memory (paper §6: 40 %),
    # never more than what the online service is forecast to leave free.
    mem_quota_frac: float = 0.4
    mem_reserve_bytes: int = 512 * 1024**2
    # Subtracted from the weight of moving a running job to another GPU. 0 = paper.
    migration_penalty: float = 0.0
    # A kept job whose MPS share exceeds the planned one by more than this is
    # restarted in place with the planned share.
    resize_threshold_pct: int = 15


def mem_quota_bytes(gpu: GpuCandidate, cfg: RoundConfig) -> int:
    free = gpu.memory_bytes - gpu.forecast_mem_bytes - cfg.mem_reserve_bytes
    return int(max(0.0, min(cfg.mem_quota_frac * gpu.memory_bytes, free)))


def plan_round(
    gpus: list[GpuCandidate],
    jobs: list[JobCandidate],
    predictors: dict[str, SpeedPredictor],
    cfg: RoundConfig = RoundConfig(),
) -> RoundResult:
    t0 = time.perf_counter()
    # New work only goes to Healthy GPUs (paper §4.1); a job already running on
    # an Unhealthy GPU may stay there (only Overlimit evicts).
    healthy = [
        g
        for g in gpus
        if g.gpu_type in predictors
        and (g.health == GpuHealth.HEALTHY or (g.health == GpuHealth.UNHEALTHY and g.current_job_id is not None))
    ]
    n, m = len(healthy), len(jobs)
    weights = np.zeros((n, m))
    feasible = np.zeros((n, m), dtype=bool)
    slowdown = np.ones((n, m))
    sm = offline_sm_pct(np.array([g.forecast_sm_pct for g in healthy]), cfg.sm) if n else np.zeros(0, int)
    quotas = np.array([mem_quota_bytes(g, cfg) for g in healthy], dtype=float)

    # Static feasibility: type allowed, profile known, memory fits the quota.
    rows, cols = [], []
    for i, g in enumerate(healthy):
        for j, job in enumerate(jobs):
            if g.health != GpuHealth.HEALTHY and job.current_gpu_id != g.gpu_id:
                continue
            if (
                g.gpu_type in job.allowed_gpu_types
                and g.gpu_type in job.profiles
                and job.mem_bytes <= quotas[i]
            ):
                rows.append(i)
                cols.append(j)
    t_feas = time.perf_counter()

    # Batched prediction per GPU type (one MLP each).
    rows_a, cols_a = np.array(rows, dtype=int), np.array(cols, dtype=int)
    for gtype, model in predictors.items():
        sel = np.array([healthy[i].gpu_type == gtype for i in rows_a], dtype=bool)
        if not sel.any():
            continue
        r, c = rows_a[sel], cols_a[sel]
        on = np.stack(
            [online_vector(healthy[i].online, healthy[i].memory_bytes, healthy[i].max_sm_clock_mhz) for i in r]
        )
        off = np.stack(
            [
                offline_vector(jobs[j].profiles[gtype], healthy[i].memory_bytes, healthy[i].max_sm_clock_mhz)
                for i, j in zip(r, c)
            ]
        )
        tput, slow = model.predict(pair_matrix(on, off, sm[r]))
        weights[r, c] = tput
        slowdown[r, c] = slow
        allowance = np.array([healthy[i].slowdown_allowance for i in r])
        feasible[r, c] = (slow - 1.0 <= allowance) & (tput > 0)
    t_pred = time.perf_counter()

    adjusted = weights.copy()
    if cfg.migration_penalty > 0:
        gpu_pos = {g.gpu_id: i for i, g in enumerate(healthy)}
        for j, job in enumerate(jobs):
            if job.current_gpu_id is not None:
                here = gpu_pos.get(job.current_gpu_id)
                mask = np.ones(n, dtype=bool)
                if here is not None:
                    mask[here] = False
                adjusted[mask, j] -= cfg.migration_penalty
    match = max_weight_matching(adjusted, feasible)
    t_match = time.perf_counter()

    placements: list[PlannedPlacement] = []
    actions: list[PlanAction] = []
    matched_jobs = set()
    for i, j in match.pairs:
        g, job = healthy[i], jobs[j]
        matched_jobs.add(job.job_id)
        pct = int(sm[i])
        if job.current_gpu_id is None:
            action = Action.START
        elif job.current_gpu_id != g.gpu_id:
            action = Action.MIGRATE
        elif job.current_sm_pct is not None and job.current_sm_pct - pct <= cfg.resize_threshold_pct:
            # An MPS share is fixed for the life of a process: keep the running one
            # unless it now exceeds the planned share by more than the threshold
            # (then the online service needs the SMs back).
            action, pct = Action.KEEP, job.current_sm_pct
        else:
            action = Action.MIGRATE  # same GPU, restarted with the smaller MPS share
        placements.append(
            PlannedPlacement(job.job_id, g.gpu_id, pct, int(quotas[i]), float(weights[i, j]), float(slowdown[i, j]))
        )
        actions.append(PlanAction(action, job.job_id, g.gpu_id, job.current_gpu_id, pct))
    for job in jobs:
        if job.current_gpu_id is not None and job.job_id not in matched_jobs:
            actions.append(PlanAction(Action.EVICT, job.job_id, None, job.current_gpu_id, None))

    return RoundResult(
        placements=placements,
        actions=actions,
        objective=float(sum(p.predicted_norm_tput for p in placements)),
        gpus_considered=n,
        jobs_considered=m,
        feasible_pairs=int(feasible.sum()),
        timings_s={
            "feasibility": t_feas - t0,
            "prediction": t_pred - t_feas,
            "matching": t_match - t_pred,
            "total": time.perf_counter() - t0,
        },
    )


def snapshot(gpus: list[GpuCandidate], jobs: list[JobCandidate]) -> dict:
    """JSON-able round inputs, so a stored round can be re-planned exactly."""

    def gpu_dict(g: GpuCandidate) -> dict:
        d = asdict(g)
        d["health"] = g.health.value
        return d

    def job_dict(j: JobCandidate) -> dict:
        d = asdict(j)
        d["allowed_gpu_types"] = sorted(j.allowed_gpu_types)
        return d

    return {"gpus": [gpu_dict(g) for g in gpus], "jobs": [job_dict(j) for j in jobs]}


def from_snapshot(snap: dict) -> tuple[list[GpuCandidate], list[JobCandidate]]:
    gpus = []
    for d in snap["gpus"]:
        d = dict(d)
        d["health"] = GpuHealth(d["health"])
        d["online"] = OnlineFeatures(**d["online"])
        gpus.append(GpuCandidate(**d))
    jobs = []
    for d in snap["jobs"]:
        d = dict(d)
        d["allowed_gpu_types"] = frozenset(d["allowed_gpu_types"])
        d["profiles"] = {k: OfflineFeatures(**v) for k, v in d["profiles"].items()}
        jobs.append(JobCandidate(**d))
    return gpus, jobs
