"""The dense reference round: every (GPU, job) pair through the predictor, then Kuhn–Munkres.

This is the paper's Algorithm 1 as written — O(GPUs × jobs) predictions and a
dense ``linear_sum_assignment`` — kept as the oracle that
:func:`scheduler_core.round.plan_round` must equal and as the benchmark
baseline. Features are built per pair with array indexing (no Python loop per
pair), and the feasibility rules are those of
:mod:`scheduler_core.pair_weights`, written out again per pair.
"""

from __future__ import annotations

import time

import numpy as np

from scheduler_core.domain import GpuHealth, RoundResult
from scheduler_core.dynamic_sm import offline_sm_pct
from scheduler_core.features import N_FEATURES, OFFLINE_SLICE, ONLINE_SLICE, SM_COLUMN, offline_vector, online_vector
from scheduler_core.matching import max_weight_matching
from scheduler_core.pair_weights import eligible_gpus, keeps_share, mem_quota_bytes, share_levels

PAIRS_PER_BATCH = 1_000_000


def dense_weights(gpus, jobs, predictors, cfg):
    """(eligible GPUs, n×m tput, n×m slowdown, n×m feasible, n×m penalised weights, n×m share, quota).

    With share fallback levels (``cfg.sm.fallback_levels``) each pair takes the
    level with the best feasible predicted throughput (the first on ties).
    """
    elig = eligible_gpus(gpus, predictors)
    n, m = len(elig), len(jobs)
    sm = offline_sm_pct(np.array([g.forecast_sm_pct for g in elig], dtype=float), cfg.sm) if n else np.zeros(0, int)
    levels = share_levels(sm, cfg.sm) if n else np.zeros((1, 0), dtype=np.int64)
    quota = np.array([mem_quota_bytes(g, cfg) for g in elig], dtype=np.int64)
    best_w = np.full((n, m), -np.inf)
    tput = np.zeros((n, m))
    slow = np.ones((n, m))
    pct = np.broadcast_to(sm[:, None], (n, m)).copy()
    for sm_l in levels:
        t_l, s_l, f_l = _dense_level(elig, jobs, predictors, cfg, sm_l, quota)
        cand = np.where(f_l, t_l, -np.inf)
        better = cand > best_w
        best_w = np.where(better, cand, best_w)
        tput = np.where(better, t_l, tput)
        slow = np.where(better, s_l, slow)
        pct = np.where(better, sm_l[:, None], pct)
    feasible = np.isfinite(best_w)
    if levels.shape[0] == 1:  # one level: the predictions of every pair, feasible or not
        tput, slow = t_l, s_l
    adjusted = tput.copy()
    if cfg.migration_penalty > 0:
        pos = {g.gpu_id: i for i, g in enumerate(elig)}
        for j, job in enumerate(jobs):
            if job.current_gpu_id is not None:
                mask = np.ones(n, dtype=bool)
                here = pos.get(job.current_gpu_id)
                if here is not None:
                    mask[here] = False
                adjusted[mask, j] -= cfg.migration_penalty
    return elig, tput, slow, feasible, adjusted, pct, quota


def _dense_level(elig, jobs, predictors, cfg, sm, quota):
    """Every pair's prediction and feasibility with each GPU at share ``sm``."""
    n, m = len(elig), len(jobs)
    tput = np.zeros((n, m))
    slow = np.ones((n, m))
    feasible = np.zeros((n, m), dtype=bool)
    for gtype, model in predictors.items():
        rows = np.array([i for i, g in enumerate(elig) if g.gpu_type == gtype], dtype=np.int64)
        cols = np.array([j for j, job in enumerate(jobs) if gtype in job.allowed_gpu_types and gtype in job.profiles],
                        dtype=np.int64)
        if not rows.size or not cols.size:
            continue
        on = np.stack([online_vector(elig[i].online, elig[i].memory_bytes, elig[i].max_sm_clock_mhz) for i in rows])
        specs = {(elig[i].memory_bytes, elig[i].max_sm_clock_mhz) for i in rows}
        off = {s: np.stack([offline_vector(jobs[j].profiles[gtype], *s) for j in cols]) for s in specs}
        spec_of = [(elig[i].memory_bytes, elig[i].max_sm_clock_mhz) for i in rows]
        lo = getattr(model, "accept_lo", None)
        hi = getattr(model, "accept_hi", None)
        per = max(1, PAIRS_PER_BATCH // cols.size)
        for start in range(0, rows.size, per):
            r_loc = np.arange(start, min(rows.size, start + per))
            x = np.empty((r_loc.size * cols.size, N_FEATURES))
            x[:, ONLINE_SLICE] = np.repeat(on[r_loc], cols.size, axis=0)
            x[:, SM_COLUMN] = np.repeat(sm[rows[r_loc]], cols.size)
            for q, rl in enumerate(r_loc):
                x[q * cols.size : (q + 1) * cols.size, OFFLINE_SLICE] = off[spec_of[rl]]
            ok = np.ones(x.shape[0], dtype=bool)
            if lo is not None and hi is not None:
                with np.errstate(invalid="ignore"):
                    ok = (np.isfinite(x) & (x >= lo) & (x <= hi)).all(axis=1)
            t_hat = np.zeros(x.shape[0])
            s_hat = np.ones(x.shape[0])
            if ok.any():
                t_hat[ok], s_hat[ok] = model.predict(x[ok])
            t_hat[~ok] = 0.0  # not accepted: infeasible
            blk = np.ix_(rows[r_loc], cols)
            tput[blk] = t_hat.reshape(r_loc.size, cols.size)
            slow[blk] = s_hat.reshape(r_loc.size, cols.size)
    job_mem = np.array([job.mem_bytes for job in jobs], dtype=np.int64)
    job_cur = np.array([-1 if job.current_gpu_id is None else job.current_gpu_id for job in jobs], dtype=np.int64)
    type_ok = {t: np.array([t in job.allowed_gpu_types and t in job.profiles for job in jobs], dtype=bool)
               for t in {g.gpu_type for g in elig}}
    for i, g in enumerate(elig):
        allowed = type_ok[g.gpu_type] & (job_mem <= quota[i])
        if g.health != GpuHealth.HEALTHY:
            allowed &= job_cur == g.gpu_id
            allowed &= np.array([keeps_share(job, int(sm[i]), cfg) for job in jobs], dtype=bool)
        feasible[i] = allowed & (slow[i] - 1.0 <= g.slowdown_allowance) & (tput[i] > 0)
    return tput, slow, feasible


def plan_round_dense(gpus, jobs, predictors, cfg=None) -> RoundResult:
    """Algorithm 1 on the dense matrix; same plan semantics as :func:`scheduler_core.round.plan_round`."""
    from scheduler_core.round import RoundConfig, diff_plan

    cfg = cfg if cfg is not None else RoundConfig()
    t0 = time.perf_counter()
    elig, tput, slow, feasible, adjusted, pct, quota = dense_weights(gpus, jobs, predictors, cfg)
    t_pred = time.perf_counter()
    match = max_weight_matching(adjusted, feasible)
    t_match = time.perf_counter()
    pairs = sorted(match.pairs)
    i = np.array([p[0] for p in pairs], dtype=np.int64)
    j = np.array([p[1] for p in pairs], dtype=np.int64)
    placements, actions = diff_plan(elig, jobs, pairs, pct[i, j], quota, tput[i, j], slow[i, j], cfg)
    t_end = time.perf_counter()
    return RoundResult(
        placements=placements,
        actions=actions,
        objective=float(sum(p.predicted_norm_tput for p in placements)),
        gpus_considered=len(elig),
        jobs_considered=len(jobs),
        feasible_pairs=int(feasible.sum()),
        timings_s={"prediction": t_pred - t0, "matching": t_match - t_pred, "plan": t_end - t_match,
                   "total": t_end - t0},
        matching_objective=match.total,
    )
