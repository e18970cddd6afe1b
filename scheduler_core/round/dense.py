"""The dense reference round: every (GPU slot, job) pair through the predictor, then Kuhn–Munkres.

This is the paper's Algorithm 1 as written — O(GPUs × jobs) predictions and a
dense ``linear_sum_assignment`` — kept as the oracle that
:func:`scheduler_core.round.plan.plan_round` must equal and as the benchmark
baseline. Features are built per pair with array indexing (no Python loop per
pair), and the feasibility rules are those of
:mod:`scheduler_core.round.weights` and :mod:`scheduler_core.round.slots`, written out
again per pair. A GPU split into several slots is several columns (its
b-matching as a matching); the slot layout is the round's rule
(:func:`~scheduler_core.round.slots.slot_counts`).
"""

from __future__ import annotations

import time

import numpy as np

from scheduler_core.domain import GpuHealth, RoundResult
from scheduler_core.jobs.run_as import may_share
from scheduler_core.matching.dense import max_weight_matching
from scheduler_core.online.dynamic_sm import offline_sm_pct
from scheduler_core.prediction.features import (
    N_FEATURES,
    OFFLINE_SLICE,
    ONLINE_SLICE,
    SM_COLUMN,
    offline_vector,
    online_vector,
)
from scheduler_core.round.plan import RoundConfig, diff_plan
from scheduler_core.round.slots import (
    SlotLayout,
    keeps_share,
    running_per_gpu,
    slot_counts,
    slot_shares,
    worthwhile_splits,
)
from scheduler_core.round.weights import derated, eligible_gpus, mem_quota_bytes, share_levels, slo_allowance

PAIRS_PER_BATCH = 1_000_000


def dense_weights(gpus, jobs, predictors, cfg, counts=None):
    """(GPU of each slot, c×m tput, c×m slowdown, c×m feasible, c×m penalised weights, c×m share, slot quota).

    With share fallback levels (``cfg.sm.fallback_levels``) each pair takes the
    first level — the largest share — at which it is feasible. On a
    slot of a GPU split ``b`` ways the throughput is predicted at the slot's share
    and multiplied by ``corunner_efficiency^(b−1)``, the slowdown is predicted at
    the GPU's whole offline share and must stay within ``allowance / b``, and the
    memory quota is the GPU's ``/ b``. A split that does not pay is undone
    (:func:`scheduler_core.round.slots.worthwhile_splits`); ``counts`` forces the slots per GPU.
    """
    elig = eligible_gpus(gpus, predictors)
    n, m = len(elig), len(jobs)
    sm = offline_sm_pct(np.array([g.forecast_sm_pct for g in elig], dtype=float), cfg.sm) if n else np.zeros(0, int)
    levels = share_levels(sm, cfg.sm) if n else np.zeros((1, 0), dtype=np.int64)
    quota = np.array([mem_quota_bytes(g, cfg) for g in elig], dtype=np.int64)
    if counts is None:
        counts = slot_counts(elig, jobs, levels[0], quota, cfg)
        if (counts > 1).any():
            split = dense_weights(gpus, jobs, predictors, cfg, counts)
            alone = dense_weights(gpus, jobs, predictors, cfg, np.ones_like(counts))
            first = SlotLayout.of(counts).first
            best_slot = np.max(np.where(split[3], split[1], -np.inf)[first], axis=1, initial=-np.inf)
            best_alone = np.max(np.where(alone[3], alone[1], -np.inf), axis=1, initial=-np.inf)
            worth = worthwhile_splits(counts, running_per_gpu(elig, jobs), best_slot, best_alone)
            return dense_weights(gpus, jobs, predictors, cfg, worth)
    layout = SlotLayout.of(counts)
    slot_pct, slow_pct = slot_shares(levels, layout, cfg.sm.min_pct)
    slot_gpus = [elig[i] for i in layout.gpu]
    c = len(slot_gpus)
    slot_quota = quota[layout.gpu] // layout.count
    derate = cfg.corunner_efficiency ** (layout.count - 1).astype(float)
    homes = _home_slots(elig, jobs, layout)
    best_w = np.full((c, m), -np.inf)
    tput = np.zeros((c, m))
    slow = np.ones((c, m))
    pct = np.broadcast_to(slot_pct[0][:, None], (c, m)).copy()
    for li in range(levels.shape[0]):
        t_l, s_l, f_l = _dense_level(slot_gpus, layout, jobs, predictors, cfg, slot_pct[li], slow_pct[li],
                                     slot_quota, derate, homes)
        cand = np.where(f_l, t_l, -np.inf)
        better = np.isfinite(cand) & np.isneginf(best_w)
        best_w = np.where(better, cand, best_w)
        tput = np.where(better, t_l, tput)
        slow = np.where(better, s_l, slow)
        pct = np.where(better, slot_pct[li][:, None], pct)
    feasible = np.isfinite(best_w)
    if levels.shape[0] == 1:  # one level: the predictions of every pair, feasible or not
        tput, slow = t_l, s_l
    adjusted = tput.copy()
    if cfg.migration_penalty > 0:
        for j, job in enumerate(jobs):
            if job.current_gpu_id is not None:
                mask = np.ones(c, dtype=bool)
                if homes[j] >= 0:
                    mask[homes[j]] = False
                adjusted[mask, j] -= cfg.migration_penalty
    return slot_gpus, tput, slow, feasible, adjusted, pct, slot_quota


def _home_slots(elig, jobs, layout) -> np.ndarray:
    """(m,) the slot column of each running job on its GPU: the r-th of the GPU's running jobs takes its r-th slot."""
    pos = {g.gpu_id: i for i, g in enumerate(elig)}
    counts = np.bincount(layout.gpu, minlength=len(elig)) if len(elig) else np.zeros(0, dtype=np.int64)
    used = np.zeros(len(elig), dtype=np.int64)
    out = np.full(len(jobs), -1, dtype=np.int64)
    for j, job in enumerate(jobs):
        i = pos.get(job.current_gpu_id) if job.current_gpu_id is not None else None
        if i is not None and used[i] < counts[i]:
            out[j] = layout.first[i] + used[i]
            used[i] += 1
    return out


def _predict_all(slot_gpus, jobs, predictors, share):
    """Every (slot, job) pair at each slot's ``share`` through its type's predictor: (tput, slowdown, accepted)."""
    c, m = len(slot_gpus), len(jobs)
    tput = np.zeros((c, m))
    slow = np.ones((c, m))
    accepted = np.zeros((c, m), dtype=bool)
    for gtype, model in predictors.items():
        rows = np.array([i for i, g in enumerate(slot_gpus) if g.gpu_type == gtype and share[i] >= 0], dtype=np.int64)
        cols = np.array([j for j, job in enumerate(jobs) if gtype in job.allowed_gpu_types and gtype in job.profiles],
                        dtype=np.int64)
        if not rows.size or not cols.size:
            continue
        g_rows = [slot_gpus[i] for i in rows]
        on = np.stack([online_vector(g.online, g.memory_bytes, g.max_sm_clock_mhz) for g in g_rows])
        specs = {(g.memory_bytes, g.max_sm_clock_mhz) for g in g_rows}
        off = {s: np.stack([offline_vector(jobs[j].profiles[gtype], *s) for j in cols]) for s in specs}
        spec_of = [(g.memory_bytes, g.max_sm_clock_mhz) for g in g_rows]
        lo = getattr(model, "accept_lo", None)
        hi = getattr(model, "accept_hi", None)
        per = max(1, PAIRS_PER_BATCH // cols.size)
        for start in range(0, rows.size, per):
            r_loc = np.arange(start, min(rows.size, start + per))
            x = np.empty((r_loc.size * cols.size, N_FEATURES))
            x[:, ONLINE_SLICE] = np.repeat(on[r_loc], cols.size, axis=0)
            x[:, SM_COLUMN] = np.repeat(share[rows[r_loc]], cols.size)
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
            accepted[blk] = ok.reshape(r_loc.size, cols.size)
    return tput, slow, accepted


def _dense_level(slot_gpus, layout, jobs, predictors, cfg, share, slow_share, slot_quota, derate, homes):
    """Every pair's prediction and feasibility with each slot at ``share`` (its slowdown at ``slow_share``)."""
    c = len(slot_gpus)
    tput, _slow_t, ok_t = _predict_all(slot_gpus, jobs, predictors, share)
    if np.array_equal(share, slow_share):
        slow, ok_s = _slow_t, ok_t
    else:
        _t, slow, ok_s = _predict_all(slot_gpus, jobs, predictors, slow_share)
    tput = np.where(ok_t & ok_s, tput, 0.0)
    tput = derated(tput, derate[:, None])
    feasible = np.zeros(tput.shape, dtype=bool)
    job_mem = np.array([job.mem_bytes for job in jobs], dtype=np.int64)
    type_ok = {t: np.array([t in job.allowed_gpu_types and t in job.profiles for job in jobs], dtype=bool)
               for t in {g.gpu_type for g in slot_gpus}}
    for ci in range(c):
        g = slot_gpus[ci]
        b = int(layout.count[ci])
        allowed = type_ok[g.gpu_type] & (job_mem <= slot_quota[ci]) & (share[ci] >= 0) & (slow_share[ci] >= 0)
        allowed &= np.array([may_share(g.run_as_user, job.run_as_user) for job in jobs], dtype=bool)
        if g.health != GpuHealth.HEALTHY:
            allowed &= homes == ci
            allowed &= np.array([keeps_share(job, int(share[ci]), cfg, b) for job in jobs], dtype=bool)
        feasible[ci] = allowed & (slow[ci] - 1.0 <= slo_allowance(g) / b) & (tput[ci] > 0)
    return tput, slow, feasible


def plan_round_dense(gpus, jobs, predictors, cfg=None) -> RoundResult:
    """Algorithm 1 on the dense matrix; same plan semantics as :func:`scheduler_core.round.plan.plan_round`."""
    cfg = cfg if cfg is not None else RoundConfig()
    t0 = time.perf_counter()
    slot_gpus, tput, slow, feasible, adjusted, pct, slot_quota = dense_weights(gpus, jobs, predictors, cfg)
    t_pred = time.perf_counter()
    match = max_weight_matching(adjusted, feasible)
    t_match = time.perf_counter()
    pairs = sorted(match.pairs)
    i = np.array([p[0] for p in pairs], dtype=np.int64)
    j = np.array([p[1] for p in pairs], dtype=np.int64)
    elig = eligible_gpus(gpus, predictors)
    pos = {g.gpu_id: k for k, g in enumerate(elig)}
    gpu_pairs = [(pos[slot_gpus[a].gpu_id], b) for a, b in pairs]
    per_gpu = np.bincount([pos[g.gpu_id] for g in slot_gpus], minlength=len(elig)) if slot_gpus else np.zeros(0, int)
    slots_on = np.array([per_gpu[pos[slot_gpus[a].gpu_id]] for a, _ in pairs], dtype=np.int64)
    placements, actions = diff_plan(elig, jobs, gpu_pairs, pct[i, j], slot_quota[i], tput[i, j], slow[i, j], cfg,
                                    slots_on)
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
