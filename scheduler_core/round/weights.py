"""The round's bipartite graph: predicted weight and feasibility of every (GPU slot, job) pair (paper §5–6).

Nothing here loops over pairs. Predictions come per GPU type from
:mod:`scheduler_core.prediction.pair_tables` — once per distinct (GPU input row, profile),
or, with a factorized predictor, as matrix products of per-row embeddings — and
jobs are grouped into classes (same memory need, same allowed types, same
profiles) whose weights are one row of a
:class:`~scheduler_core.matching.grouped_weights.GroupedWeights`. Columns are *slots*:
one per GPU, or several on a GPU that hosts several offline jobs
(:mod:`scheduler_core.round.slots`).

Feasibility (docs/DESIGN.md §3.5): a pair is infeasible when the GPU is not Healthy (a
running job may stay on an Unhealthy GPU as it runs — only Overlimit evicts,
§4.1 — but is not restarted there with a smaller share), the job's memory
exceeds the slot's quota, the GPU type is not allowed for the job or it has no
profile there, the predicted online slowdown exceeds the slot's budget, the
predicted throughput is 0, or the predictor does not accept the features (NaN,
out of range). The online budget is the service's: the smaller of its slowdown
allowance and what its p99 latency SLO leaves at the forecast load
(:func:`slo_allowance`), split between a GPU's slots.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import numpy as np

from scheduler_core.domain import GpuCandidate, GpuHealth, JobCandidate
from scheduler_core.online.dynamic_sm import offline_sm_pct
from scheduler_core.prediction.features import online_vector
from scheduler_core.matching.grouped_weights import GroupedWeights
from scheduler_core.prediction.pair_tables import EmbeddedTable, MlpTable, profile_index, type_tables
from scheduler_core.jobs.run_as import class_user, gpu_users, mask_classes
from scheduler_core.round.slots import (
    SlotLayout,
    keeps_share,
    running_per_gpu,
    slot_counts,
    slot_shares,
    worthwhile_splits,
)

__all__ = ["RoundGraph", "build_graph", "eligible_gpus", "keeps_share", "mem_quota_bytes", "share_levels",
           "slo_allowance"]

# Largest block of (slot columns × job classes) weighed at once.
BLOCK_PAIRS = 1 << 18


def mem_quota_bytes(gpu: GpuCandidate, cfg) -> int:
    free = gpu.memory_bytes - gpu.forecast_mem_bytes - cfg.mem_reserve_bytes
    return int(max(0.0, min(cfg.mem_quota_frac * gpu.memory_bytes, free)))


def slo_allowance(gpu: GpuCandidate) -> float:
    """The online slowdown the GPU's service tolerates this round.

    Its slowdown allowance, and — when the service declares a p99 latency SLO
    and the round knows its replica's p99 alone at the forecast load
    (:mod:`scheduler_core.online.latency_model`) — no more than the SLO leaves:
    ``SLO / p99_alone − 1`` (negative: the replica misses its SLO even alone,
    so no pair is feasible there).
    """
    allowance = gpu.slowdown_allowance
    if gpu.latency_slo_ms is not None and gpu.forecast_p99_ms is not None and gpu.forecast_p99_ms > 0:
        allowance = min(allowance, gpu.latency_slo_ms / gpu.forecast_p99_ms - 1.0)
    return float(allowance)


def eligible_gpus(gpus: list[GpuCandidate], predictors: dict) -> list[GpuCandidate]:
    """GPUs a round considers: a predictor for their type, and Healthy or Unhealthy-with-a-job."""
    return [
        g
        for g in gpus
        if g.gpu_type in predictors
        and (g.health == GpuHealth.HEALTHY or (g.health == GpuHealth.UNHEALTHY and g.current_job_id is not None))
    ]


@dataclass(eq=False)
class RoundGraph:
    gpus: list[GpuCandidate]  # eligible GPUs
    jobs: list[JobCandidate]
    weights: GroupedWeights  # penalised weights used by the matching; columns = slots
    layout: SlotLayout  # the slot columns and their GPUs
    sm_levels: np.ndarray  # (levels, n) one-job MPS share of each GPU at each level; level 0 = the dynamic share
    slot_pct: np.ndarray  # (levels, c) MPS share of each slot at each level (−1: none)
    class_level: np.ndarray  # (classes, c) the level a class's weight on a slot was predicted at
    home_level: np.ndarray  # (m,) the level of a running job's weight at its home slot
    quota: np.ndarray  # (n,) offline memory quota per GPU
    slot_quota: np.ndarray  # (c,) memory quota per slot
    gpu_type_idx: np.ndarray  # (n,) index into types
    gpu_rows: np.ndarray  # (levels, n) row of each GPU's one-job share at each level in its type's table
    tput_rows: np.ndarray  # (levels, c) row of each slot's throughput input (−1: none)
    slow_rows: np.ndarray  # (levels, c) row of each slot's slowdown input
    derate: np.ndarray  # (c,) throughput factor for the slot's co-runners
    class_profile: np.ndarray  # (classes, types) column in the type's table, −1 = none
    types: list[str]
    tables: list  # per type: DenseTable, MlpTable or EmbeddedTable
    stats: dict = field(default_factory=dict)

    @property
    def sm_pct(self) -> np.ndarray:
        """(n,) the dynamic share of each GPU (level 0)."""
        return self.sm_levels[0]

    def pair_levels(self, slot_idx: np.ndarray, job_idx: np.ndarray) -> np.ndarray:
        ci = np.asarray(slot_idx, dtype=np.int64)
        ji = np.asarray(job_idx, dtype=np.int64)
        at_home = ci == self.weights.home[ji]
        return np.where(at_home, self.home_level[ji], self.class_level[self.weights.job_class[ji], ci])

    def pair_pct(self, slot_idx: np.ndarray, job_idx: np.ndarray) -> np.ndarray:
        """MPS share of aligned (slot, job) pairs: the level their weight was predicted at."""
        ci = np.asarray(slot_idx, dtype=np.int64)
        return self.slot_pct[self.pair_levels(ci, job_idx), ci]

    def predicted(self, slot_idx: np.ndarray, job_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(normalized throughput, online slowdown) of aligned pairs as their weight was computed (no penalty).

        On a slot of a shared GPU the throughput carries the co-runner factor and the
        slowdown is the job's part of the GPU's (its predicted slowdown at the whole offline share).
        """
        ci = np.asarray(slot_idx, dtype=np.int64)
        ji = np.asarray(job_idx, dtype=np.int64)
        lv = self.pair_levels(ci, ji)
        cls = self.weights.job_class[ji]
        tput, _ = self._lookup(self.tput_rows[lv, ci], cls, ci)
        _, slow = self._lookup(self.slow_rows[lv, ci], cls, ci)
        return derated(tput, self.derate[ci]), slow

    def _lookup(self, rows: np.ndarray, classes: np.ndarray, slot_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tput = np.full(rows.shape, np.nan)
        slow = np.full(rows.shape, np.nan)
        t_of = self.gpu_type_idx[self.layout.gpu[slot_idx]]
        for t, table in enumerate(self.tables):
            cols = self.class_profile[classes, t]
            sel = np.flatnonzero((t_of == t) & (cols >= 0) & (rows >= 0))
            if sel.size:
                tput[sel], slow[sel] = table.at(rows[sel], cols[sel])
        return tput, slow


def derated(tput: np.ndarray, derate: np.ndarray) -> np.ndarray:
    """Throughput × co-runner factor, at float32 precision (the predictions' own) where the factor is not 1."""
    tput = np.asarray(tput, dtype=np.float64)
    factor = np.broadcast_to(np.asarray(derate, dtype=np.float64), tput.shape)
    scaled = (tput * factor).astype(np.float32).astype(np.float64)
    return np.where(factor == 1.0, tput, scaled)


def _class_key(job: JobCandidate, types: set[str]) -> tuple:
    usable = sorted(t for t in job.allowed_gpu_types if t in job.profiles and t in types)
    return (job.mem_bytes, tuple(usable), tuple(job.profiles[t] for t in usable))


def build_graph(gpus: list[GpuCandidate], jobs: list[JobCandidate], predictors: dict, cfg) -> RoundGraph:
    """Predict and check every pair, by distinct inputs, and group jobs into classes."""
    t0 = time.perf_counter()
    elig = eligible_gpus(gpus, predictors)
    n, m = len(elig), len(jobs)
    types = sorted({g.gpu_type for g in elig})
    type_pos = {t: i for i, t in enumerate(types)}
    sm = offline_sm_pct(np.array([g.forecast_sm_pct for g in elig], dtype=float), cfg.sm) if n else np.zeros(0, int)
    quota = np.array([mem_quota_bytes(g, cfg) for g in elig], dtype=np.int64)
    healthy = np.array([g.health == GpuHealth.HEALTHY for g in elig], dtype=bool)
    allowance = np.array([slo_allowance(g) for g in elig], dtype=float)
    gpu_type_idx = np.array([type_pos[g.gpu_type] for g in elig], dtype=np.int64)
    spec_key: dict[tuple, int] = {}
    gpu_spec = np.array([spec_key.setdefault((g.gpu_type, g.memory_bytes, g.max_sm_clock_mhz), len(spec_key))
                         for g in elig], dtype=np.int64)
    on = (np.stack([online_vector(g.online, g.memory_bytes, g.max_sm_clock_mhz) for g in elig])
          if n else np.zeros((0, 8)))

    # Job classes (and the user they run as, scheduler_core.jobs.run_as) and the distinct profiles per GPU type.
    users = gpu_users(elig)
    class_of: dict[tuple, int] = {}
    job_class = np.array([class_of.setdefault((*_class_key(j, set(types)), class_user(j.run_as_user, users)),
                                              len(class_of)) for j in jobs], dtype=np.int64)
    class_keys = list(class_of)
    n_cls = len(class_keys)
    profiles, class_profile = profile_index(types, [key[:3] for key in class_keys])
    class_mem = np.array([key[0] for key in class_keys], dtype=np.int64).reshape(-1)

    # Shares: the one-job levels of every GPU, the slots of GPUs split between several jobs.
    levels = share_levels(sm, cfg.sm) if n else np.zeros((1, 0), dtype=np.int64)
    n_levels = levels.shape[0]
    stats = {"gpus_out_of_range": 0, "profiles_out_of_range": 0, "predicted_pairs": 0, "distinct_gpu_rows": 0}

    def weigh(counts: np.ndarray) -> _Weighed:
        return _weigh(SlotLayout.of(counts), levels, cfg, types, gpu_type_idx, gpu_spec, list(spec_key), on, quota,
                      allowance, healthy, profiles, class_profile, class_mem, [key[3] for key in class_keys], elig,
                      predictors, stats)

    t_weigh = time.perf_counter()
    counts = slot_counts(elig, jobs, levels[0], quota, cfg)
    w = weigh(counts)
    t_predict = w.t_predict
    if (counts > 1).any():
        alone = weigh(np.ones_like(counts))
        t_predict += alone.t_predict
        best_slot = np.max(w.base[:, w.layout.first], axis=0, initial=-np.inf)
        best_alone = np.max(alone.base, axis=0, initial=-np.inf)
        worth = worthwhile_splits(counts, running_per_gpu(elig, jobs), best_slot, best_alone)
        stats["gpus_split_undone"] = int((worth != counts).sum())
        if (worth != counts).any():
            counts = worth
            w = alone if not (counts > 1).any() else weigh(counts)
            t_predict += 0.0 if w is alone else w.t_predict
    layout, slot_pct, gpu_rows, base, class_level, tables = (w.layout, w.slot_pct, w.gpu_rows, w.base, w.class_level,
                                                             w.tables)
    tput_rows, slow_rows, derate, slot_quota = w.tput_rows, w.slow_rows, w.derate, w.slot_quota
    slot_allowance, slot_healthy, user_mask = w.slot_allowance, w.slot_healthy, w.user_mask
    g_of = layout.gpu

    home, home_w, home_level, penalty = _homes(elig, jobs, layout, base, class_level, job_class, class_mem,
                                               slot_pct, tput_rows, slow_rows, derate, slot_quota, slot_allowance,
                                               slot_healthy, class_profile, gpu_type_idx, tables, cfg)
    if user_mask.any():  # a running job whose user may not share its GPU cannot stay there either
        at = np.flatnonzero(home >= 0)
        home_w[at[user_mask[job_class[at], home[at]]]] = -np.inf
    weights = GroupedWeights(base, job_class, home, home_w, penalty)
    stats.update({"gpus": n, "jobs": m, "classes": n_cls, "types": len(types), "share_levels": int(n_levels),
                  "slots": layout.n_slots, "gpus_split": int((np.bincount(g_of, minlength=n) > 1).sum()) if n else 0,
                  "distinct_profiles": int(sum(len(p) for p in profiles)),
                  "timings_s": {"features": t_weigh - t0, "prediction": t_predict,
                                "feasibility": time.perf_counter() - t_weigh - t_predict}})
    return RoundGraph(elig, jobs, weights, layout, levels, slot_pct, class_level, home_level, quota, slot_quota,
                      gpu_type_idx, gpu_rows, tput_rows, slow_rows, derate, class_profile, types, tables, stats)


@dataclass(frozen=True, eq=False)
class _Weighed:
    """One slot layout's predictions and weights (see :func:`build_graph`)."""

    layout: SlotLayout
    slot_pct: np.ndarray
    gpu_rows: np.ndarray
    tput_rows: np.ndarray
    slow_rows: np.ndarray
    derate: np.ndarray
    slot_quota: np.ndarray
    slot_allowance: np.ndarray
    slot_healthy: np.ndarray
    base: np.ndarray
    class_level: np.ndarray
    user_mask: np.ndarray  # (classes × slots) pairs whose users may not share the GPU (base −inf there)
    tables: list
    t_predict: float


def _weigh(layout, levels, cfg, types, gpu_type_idx, gpu_spec, specs, on, quota, allowance, healthy, profiles,
           class_profile, class_mem, class_users, elig, predictors, stats) -> _Weighed:
    """Predict the (slot, class) pairs of one slot layout and keep each pair's weight at its largest feasible share."""
    n, n_levels, n_cls = levels.shape[1], levels.shape[0], class_profile.shape[0]
    slot_pct, slow_pct = slot_shares(levels, layout, cfg.sm.min_pct)
    multi = layout.count > 1
    split_share = np.full(n, -1, dtype=np.int64)
    split_share[layout.gpu[multi]] = slot_pct[0, multi]
    shares = np.vstack([levels, split_share[None, :]]) if multi.any() else levels
    tables, rows_by_share, t_predict = type_tables(types, gpu_type_idx, gpu_spec, specs, on, shares,
                                                   profiles, predictors, stats)
    if any(isinstance(t, EmbeddedTable) for t in tables):
        from scheduler_core.prediction.predictor import one_torch_thread
        threads = one_torch_thread()
    else:
        threads = contextlib.nullcontext()
    gpu_rows = rows_by_share[:n_levels]
    g_of = layout.gpu
    tput_rows = np.where(slot_pct >= 0, gpu_rows[:, g_of], -1)
    slow_rows = tput_rows.copy()
    if multi.any():
        tput_rows[0, multi] = np.where(slot_pct[0, multi] >= 0, rows_by_share[n_levels, g_of[multi]], -1)
        slow_rows[0, multi] = np.where(slow_pct[0, multi] >= 0, gpu_rows[0, g_of[multi]], -1)
    derate = cfg.corunner_efficiency ** (layout.count - 1).astype(float)
    slot_quota = quota[g_of] // layout.count
    slot_allowance = allowance[g_of] / layout.count
    slot_healthy = healthy[g_of]
    with threads:  # thin matrix products: one BLAS thread (see EmbeddedTable.fill)
        base, class_level, t_blocks = _class_weights(
            tables, types, gpu_type_idx[g_of], class_profile, class_mem, tput_rows, slow_rows, derate, slot_quota,
            slot_allowance, slot_healthy, n_cls)
    user_mask = mask_classes(base, class_users, g_of, elig)
    stats["predicted_pairs"] += int(sum(t.evaluated[0] for t in tables if isinstance(t, MlpTable)))
    return _Weighed(layout, slot_pct, gpu_rows, tput_rows, slow_rows, derate, slot_quota, slot_allowance,
                    slot_healthy, base, class_level, user_mask, tables, t_predict + t_blocks)


def slowdown_limit32(budget: np.ndarray) -> np.ndarray:
    """Per budget ``a``, the largest float32 ``y`` with ``y − 1 ≤ a`` (in float64).

    Predictions are float32 numbers, so ``slowdown − 1 ≤ a`` is exactly ``slowdown ≤ limit``: one
    float32 comparison per pair instead of a float64 subtraction and comparison.
    """
    a = np.asarray(budget, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        y = (1.0 + a).astype(np.float32)
        for _ in range(3):
            too_big = y.astype(np.float64) - 1.0 > a
            y = np.where(too_big, np.nextafter(y, np.float32(-np.inf)), y)
        for _ in range(3):
            up = np.nextafter(y, np.float32(np.inf))
            y = np.where(up.astype(np.float64) - 1.0 <= a, up, y)
    return np.where(np.isnan(a), np.float32(-np.inf), y).astype(np.float32)


def _class_weights(tables, types, slot_type, class_profile, class_mem, tput_rows, slow_rows, derate, slot_quota,
                   slot_allowance, slot_healthy, n_cls):
    """(classes × slots) feasible weight at the largest feasible share level, the level, and the seconds predicting.

    A slot's weight for a class is its predicted throughput (× co-runner factor) at the
    first share level — the largest share — at which the pair is feasible: the fallback
    levels exist for pairs the dynamic share cannot take (paper §4.3), and a pair is only
    predicted at a level if no higher one was feasible (nor at all if the job does not fit
    the slot's memory or the GPU is not Healthy). Blocks of slots × classes small enough to stay
    in cache, with buffers reused across blocks: at 20,000 GPUs × 10,000 profiles this is
    a few hundred million pairs per share level.
    """
    n_levels, c = tput_rows.shape
    # Float32 when every prediction is a float32 number (half the memory, exact comparisons against
    # slowdown_limit32); float64 for a predictor whose outputs are not (test stubs).
    f32 = all(t.float32_exact for t in tables)
    dt = np.float32 if f32 else np.float64
    base = np.full((n_cls, c), -np.inf, dtype=dt)
    level = np.zeros((n_cls, c), dtype=np.int8)
    limit = slowdown_limit32(slot_allowance) if f32 else 1.0 + np.asarray(slot_allowance, dtype=np.float64)
    fresh = fresh_rows(tput_rows, slow_rows)
    t_blocks = 0.0
    neg_inf = dt(-np.inf)
    for ti in range(len(types)):
        ks = np.flatnonzero(class_profile[:, ti] >= 0)
        slots = np.flatnonzero(slot_type == ti)
        if not ks.size or not slots.size:
            continue
        t = time.perf_counter()
        prepared = tables[ti].prepare(class_profile[ks, ti])
        t_blocks += time.perf_counter() - t
        mem_k = class_mem[ks]
        step = int(max(8, min(slots.size, BLOCK_PAIRS // ks.size)))
        if isinstance(tables[ti], MlpTable):
            t_blocks += _on_demand_blocks(tables[ti], prepared, ks, slots, step, mem_k, tput_rows, slow_rows, fresh,
                                          derate, slot_quota, slot_healthy, limit if f32 else None, slot_allowance,
                                          base, level)
            continue
        shape = (step, ks.size)
        t32, s32, t2, s2 = (np.empty(shape, dt) for _ in range(4))
        ok, tmp = np.empty(shape, bool), np.empty(shape, bool)
        best, best_lv = np.empty(shape, dt), np.empty(shape, np.int8)
        for start in range(0, slots.size, step):
            sl_idx = slots[start : start + step]
            r = sl_idx.size
            bt, blv, bt32, bs32, bok, btmp = best[:r], best_lv[:r], t32[:r], s32[:r], ok[:r], tmp[:r]
            bt.fill(neg_inf)
            blv.fill(0)
            fits = (mem_k[None, :] <= slot_quota[sl_idx, None]) & slot_healthy[sl_idx, None]
            for li in range(n_levels):
                tr, sr = tput_rows[li, sl_idx], slow_rows[li, sl_idx]
                have = fresh[li, sl_idx]
                # Only pairs that fit and have no feasible higher level are predicted at this one.
                need = fits & have[:, None]
                if li:
                    need &= np.isneginf(bt)
                if not need.any():
                    continue
                t = time.perf_counter()
                tables[ti].fill(np.where(have, tr, 0), prepared, bt32, bs32, need)
                other = np.flatnonzero(have & (tr != sr))  # slots of split GPUs: slowdown at the whole share
                if other.size:
                    tables[ti].fill(sr[other], prepared, t2[: other.size], s2[: other.size], need[other])
                    bs32[other] = s2[: other.size]
                t_blocks += time.perf_counter() - t
                d = derate[sl_idx]
                if np.any(d != 1.0):
                    bt32[...] = derated(bt32, d[:, None])
                if f32:
                    np.less_equal(bs32, limit[sl_idx, None], out=bok)
                else:  # the dense reference's own arithmetic: slowdown − 1 ≤ budget
                    np.less_equal(bs32 - 1.0, slot_allowance[sl_idx, None], out=bok)
                np.greater(bt32, 0.0, out=btmp)
                bok &= btmp
                bok &= need
                np.copyto(bt, bt32, where=bok)
                blv[bok] = li
            base[np.ix_(ks, sl_idx)] = bt.T
            level[np.ix_(ks, sl_idx)] = blv.T
    return base, level, t_blocks


def _on_demand_blocks(table: MlpTable, cols: np.ndarray, ks: np.ndarray, slots: np.ndarray, step: int,
                      mem_k: np.ndarray, tput_rows, slow_rows, fresh, derate, slot_quota, slot_healthy, limit,
                      slot_allowance, base: np.ndarray, level: np.ndarray) -> float:
    """:func:`_class_weights` for a table that predicts pairs when asked: the same weights and levels.

    Per block of slots, the dynamic share (level 0) is one grid of predictions, every class
    on every slot (nearly every pair fits); the pairs that fit (memory, health) and are not
    feasible there are a flat list, and each fallback level predicts those still without a
    feasible level and keeps those it finds feasible. Returns the seconds spent predicting.
    """
    t_pred = 0.0
    n_levels = tput_rows.shape[0]
    n_k = ks.size
    for start in range(0, slots.size, step):
        sl_idx = slots[start : start + step]
        fits = (mem_k[None, :] <= slot_quota[sl_idx, None]) & slot_healthy[sl_idx, None]
        d_blk = derate[sl_idx]
        lim_blk = limit[sl_idx] if limit is not None else None

        def feasible(tput, slow, at):  # ``at``: local slot of each value (broadcastable)
            if lim_blk is not None:
                ok = slow <= lim_blk[at]
            else:  # float64 weights (another type's predictor is not float32): the dense reference's arithmetic
                ok = slow.astype(np.float64) - 1.0 <= slot_allowance[sl_idx][at]
            return ok & (tput > 0)

        # Level 0, the dynamic share: nearly every pair fits, so the whole block is one grid of predictions.
        tr_blk, sr_blk = tput_rows[0, sl_idx], slow_rows[0, sl_idx]
        have = (tr_blk >= 0) & (sr_blk >= 0)
        open_ = fits & have[:, None]
        t = time.perf_counter()
        if have.all():
            tput, slow = table.grid(tr_blk, cols)
        else:
            tput = np.full(fits.shape, np.nan, dtype=np.float32)
            slow = np.full(fits.shape, np.nan, dtype=np.float32)
            hv = np.flatnonzero(have)
            if hv.size:
                tput[hv], slow[hv] = table.grid(tr_blk[hv], cols)
        split = np.flatnonzero(have & (tr_blk != sr_blk))  # slots of split GPUs: slowdown at the whole share
        if split.size:
            slow[split] = table.grid(sr_blk[split], cols)[1]
        t_pred += time.perf_counter() - t
        if np.any(d_blk != 1.0):
            tput = derated(tput, d_blk[:, None])
        ok = open_ & feasible(tput, slow, np.arange(sl_idx.size)[:, None])
        w = tput.astype(base.dtype, copy=False).reshape(-1)
        w[~ok.reshape(-1)] = -np.inf
        lv = np.zeros(fits.size, dtype=np.int8)
        # The fallback levels: the pairs that fit and are not feasible yet, as a flat list (slot-major).
        q = np.flatnonzero(fits & ~ok)
        qi = q // n_k
        qk = q - qi * n_k
        for li in range(1, n_levels):
            if not q.size:
                break
            tr_blk, sr_blk = tput_rows[li, sl_idx], slow_rows[li, sl_idx]
            row_here = fresh[li, sl_idx]
            if row_here.all():
                here = None
                eq, ei, ek = q, qi, qk
            else:  # slots without a (new) row at this level: their pairs wait for the next one
                here = row_here[qi]
                eq, ei, ek = q[here], qi[here], qk[here]
            tr = tr_blk[ei]
            t = time.perf_counter()
            tput, slow = table.pairs(tr, cols[ek])
            if (tr_blk != sr_blk).any():
                split = np.flatnonzero(tr != sr_blk[ei])
                slow[split] = table.pairs(sr_blk[ei[split]], cols[ek[split]])[1]
            t_pred += time.perf_counter() - t
            if np.any(d_blk != 1.0):
                tput = derated(tput, d_blk[ei]).astype(base.dtype)
            ok = feasible(tput, slow, ei)
            w[eq[ok]] = tput[ok]
            lv[eq[ok]] = li
            if here is None:
                rest = ~ok
            else:
                rest = np.ones(q.size, dtype=bool)
                rest[np.flatnonzero(here)[ok]] = False
            q, qi, qk = q[rest], qi[rest], qk[rest]
        base[np.ix_(ks, sl_idx)] = w.reshape(fits.shape).T
        level[np.ix_(ks, sl_idx)] = lv.reshape(fits.shape).T
    return t_pred


def _homes(elig, jobs, layout, base, class_level, job_class, class_mem, slot_pct, tput_rows, slow_rows, derate,
           slot_quota, slot_allowance, slot_healthy, class_profile, gpu_type_idx, tables, cfg):
    """Running jobs: their home slot, their weight there, its level, and the migration penalty.

    On a Healthy GPU a job's home weight is its class's weight on that slot. On an
    Unhealthy GPU no new work may start, so the class row is −inf there; the job may
    still stay as it runs, at a level where it keeps its share (a restart would be new work).
    """
    m = len(jobs)
    pos = {g.gpu_id: i for i, g in enumerate(elig)}
    home = np.full(m, -1, dtype=np.int64)
    home_w = np.full(m, -np.inf)
    home_level = np.zeros(m, dtype=np.int8)
    penalty = np.zeros(m)
    used = np.zeros(len(elig), dtype=np.int64)
    counts = np.bincount(layout.gpu, minlength=len(elig)) if len(elig) else np.zeros(0, dtype=np.int64)
    for j, job in enumerate(jobs):
        if job.current_gpu_id is None:
            continue
        penalty[j] = cfg.migration_penalty
        i = pos.get(job.current_gpu_id)
        if i is None or used[i] >= counts[i]:
            continue
        home[j] = layout.first[i] + used[i]
        used[i] += 1
    has = np.flatnonzero(home >= 0)
    if not has.size:
        return home, home_w, home_level, penalty
    hc, kc = home[has], job_class[has]
    good = slot_healthy[hc]
    home_w[has[good]] = base[kc[good], hc[good]]
    home_level[has[good]] = class_level[kc[good], hc[good]]
    rest = has[~good]
    if rest.size:
        hc, kc = home[rest], job_class[rest]
        b = layout.count[hc]
        for li in range(slot_pct.shape[0]):
            rows_t, rows_s = tput_rows[li, hc], slow_rows[li, hc]
            tp = np.full(rest.size, np.nan)
            sw = np.full(rest.size, np.nan)
            t_of = gpu_type_idx[layout.gpu[hc]]
            for t, table in enumerate(tables):
                cols = class_profile[kc, t]
                sel = np.flatnonzero((t_of == t) & (cols >= 0) & (rows_t >= 0) & (rows_s >= 0))
                if sel.size:
                    tp[sel], _ = table.at(rows_t[sel], cols[sel])
                    _, sw[sel] = table.at(rows_s[sel], cols[sel])
            tp = derated(tp, derate[hc])
            keep = np.array([keeps_share(jobs[j], int(slot_pct[li, c]), cfg, int(bb))
                             for j, c, bb in zip(rest, hc, b)], dtype=bool)
            with np.errstate(invalid="ignore"):
                ok = (sw - 1.0 <= slot_allowance[hc]) & (tp > 0) & (class_mem[kc] <= slot_quota[hc]) & keep
            ok &= slot_pct[li, hc] >= 0
            cand = np.where(ok, tp, -np.inf)
            better = np.isfinite(cand) & np.isneginf(home_w[rest])  # the largest share that keeps it feasible
            home_w[rest] = np.where(better, cand, home_w[rest])
            home_level[rest] = np.where(better, li, home_level[rest])
    return home, home_w, home_level, penalty


def fresh_rows(tput_rows: np.ndarray, slow_rows: np.ndarray) -> np.ndarray:
    """(levels × slots) whether a slot has prediction rows at a level that differ from the level above.

    A slot whose share at a level is the one above's (the levels clipped at ``min_pct``) gives the same
    predictions there: its pairs still without a feasible level were infeasible at that share, so a round
    does not predict them again.
    """
    out = (tput_rows >= 0) & (slow_rows >= 0)
    out[1:] &= (tput_rows[1:] != tput_rows[:-1]) | (slow_rows[1:] != slow_rows[:-1])
    return out


def share_levels(sm: np.ndarray, policy) -> np.ndarray:
    """(levels × GPUs) MPS shares a round may give one job: the dynamic share, then ``fallback_levels`` smaller ones.

    Level 0 is the dynamic share (paper §4.3). Each further level is
    ``fallback_step_pct`` lower, never below ``min_pct``: a job whose predicted
    online slowdown is over the allowance at the dynamic share may still fit
    at a smaller one (a fixed share has no levels).
    """
    sm = np.asarray(sm, dtype=np.int64)
    n_levels = 1 if policy.fixed_pct is not None else 1 + policy.fallback_levels
    steps = np.arange(n_levels, dtype=np.int64)[:, None] * policy.fallback_step_pct
    return np.maximum(policy.min_pct, sm[None, :] - steps)
