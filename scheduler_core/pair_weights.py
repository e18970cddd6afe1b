"""The round's bipartite graph: predicted weight and feasibility of every (GPU, job) pair (paper §5–6).

Nothing here loops over pairs. A pair's prediction depends only on

- the GPU's *input row*: its type's spec (memory, max clock), its online
  features and its offline SM percentage (dynamic SM, §4.3), and
- the job's *profile* on that GPU type,

so the predictor runs once per distinct (input row, profile) combination —
about GPUs × job types instead of GPUs × jobs — and jobs are grouped into
classes (same memory need, same allowed types, same profiles) whose weights
are one row of a :class:`~scheduler_core.grouped_weights.GroupedWeights`.
De-duplication is exact (equal inputs, equal outputs); no feature is rounded.

Feasibility (DESIGN §3.5, issue "Feasibility"): a pair is infeasible when the
GPU is not Healthy (a running job may stay on an Unhealthy GPU as it runs —
only Overlimit evicts, §4.1 — but is not restarted there with a smaller
share), the job's memory exceeds the GPU's offline quota, the
GPU type is not allowed for the job or it has no profile there, the predicted
online slowdown exceeds the service's allowance, the predicted throughput is
0, or the predictor does not accept the features (NaN, out of range).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from scheduler_core.domain import GpuCandidate, GpuHealth, JobCandidate, OfflineFeatures
from scheduler_core.dynamic_sm import offline_sm_pct
from scheduler_core.features import N_FEATURES, OFFLINE_SLICE, ONLINE_SLICE, SM_COLUMN, offline_vector, online_vector
from scheduler_core.grouped_weights import GroupedWeights

# Largest pair matrix handed to one predict call (rows); above it, chunks.
PREDICT_BATCH_ROWS = 500_000


def mem_quota_bytes(gpu: GpuCandidate, cfg) -> int:
    free = gpu.memory_bytes - gpu.forecast_mem_bytes - cfg.mem_reserve_bytes
    return int(max(0.0, min(cfg.mem_quota_frac * gpu.memory_bytes, free)))


def keeps_share(job: JobCandidate, planned_pct: int, cfg) -> bool:
    """Whether a job staying on its GPU keeps its running MPS share (else it is restarted with the planned one)."""
    return job.current_sm_pct is not None and job.current_sm_pct - planned_pct <= cfg.resize_threshold_pct


def eligible_gpus(gpus: list[GpuCandidate], predictors: dict) -> list[GpuCandidate]:
    """GPUs a round considers: a predictor for their type, and Healthy or Unhealthy-with-a-job."""
    return [
        g
        for g in gpus
        if g.gpu_type in predictors
        and (g.health == GpuHealth.HEALTHY or (g.health == GpuHealth.UNHEALTHY and g.current_job_id is not None))
    ]


@dataclass(frozen=True, eq=False)
class _TypeTable:
    """Predictions for one GPU type: rows = distinct GPU input rows, columns = distinct profiles."""

    tput: np.ndarray  # (rows, profiles); NaN where the predictor does not accept the pair
    slowdown: np.ndarray


@dataclass(eq=False)
class RoundGraph:
    gpus: list[GpuCandidate]  # eligible GPUs, the graph's rows
    jobs: list[JobCandidate]
    weights: GroupedWeights  # penalised weights used by the matching
    sm_levels: np.ndarray  # (levels, n) MPS share per GPU at each level; level 0 = the dynamic share
    class_level: np.ndarray  # (classes, n) the level a class's weight on a GPU was predicted at
    home_level: np.ndarray  # (m,) the level of a running job's weight at its home
    quota: np.ndarray  # (n,) offline memory quota per GPU
    gpu_type_idx: np.ndarray  # (n,) index into types
    gpu_rows: np.ndarray  # (levels, n) row of each GPU at each share level in its type's table
    class_profile: np.ndarray  # (classes, types) column in the type's table, −1 = none
    types: list[str]
    tables: list[_TypeTable]  # per type, over the distinct (input row, share) of every level
    stats: dict = field(default_factory=dict)

    @property
    def sm_pct(self) -> np.ndarray:
        """(n,) the dynamic share of each GPU (level 0)."""
        return self.sm_levels[0]

    def pair_levels(self, gpu_idx: np.ndarray, job_idx: np.ndarray) -> np.ndarray:
        gi = np.asarray(gpu_idx, dtype=np.int64)
        ji = np.asarray(job_idx, dtype=np.int64)
        at_home = gi == self.weights.home[ji]
        return np.where(at_home, self.home_level[ji], self.class_level[self.weights.job_class[ji], gi])

    def pair_pct(self, gpu_idx: np.ndarray, job_idx: np.ndarray) -> np.ndarray:
        """MPS share of aligned (GPU, job) pairs: the level their weight was predicted at."""
        gi = np.asarray(gpu_idx, dtype=np.int64)
        return self.sm_levels[self.pair_levels(gi, job_idx), gi]

    def predicted(self, gpu_idx: np.ndarray, job_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(normalized throughput, online slowdown) of aligned pairs at their share, as predicted (no penalty)."""
        gi = np.asarray(gpu_idx, dtype=np.int64)
        ji = np.asarray(job_idx, dtype=np.int64)
        lv = self.pair_levels(gi, ji)
        tput = np.full(gi.shape, np.nan)
        slow = np.full(gi.shape, np.nan)
        for li in np.unique(lv):
            sel = lv == li
            tput[sel], slow[sel] = _lookup(self.tables, self.gpu_type_idx, self.gpu_rows[li],
                                           self.class_profile, self.weights.job_class[ji[sel]], gi[sel])
        return tput, slow


def _lookup(tables, gpu_type_idx, gpu_row, class_profile, classes, gpu_idx) -> tuple[np.ndarray, np.ndarray]:
    gi = np.asarray(gpu_idx, dtype=np.int64)
    tput = np.full(gi.shape, np.nan)
    slow = np.full(gi.shape, np.nan)
    t_of = gpu_type_idx[gi]
    for t, table in enumerate(tables):
        sel = np.flatnonzero(t_of == t)
        cols = class_profile[classes[sel], t]
        sel, cols = sel[cols >= 0], cols[cols >= 0]
        if sel.size:
            rows = gpu_row[gi[sel]]
            tput[sel] = table.tput[rows, cols]
            slow[sel] = table.slowdown[rows, cols]
    return tput, slow


def _class_key(job: JobCandidate, types: set[str]) -> tuple:
    usable = sorted(t for t in job.allowed_gpu_types if t in job.profiles and t in types)
    return (job.mem_bytes, tuple(usable), tuple(job.profiles[t] for t in usable))


def _accept_bounds(model) -> tuple[np.ndarray, np.ndarray]:
    lo = getattr(model, "accept_lo", None)
    hi = getattr(model, "accept_hi", None)
    if lo is None or hi is None:  # a predictor without a declared range (test stubs): finite values only
        return np.full(N_FEATURES, -np.inf), np.full(N_FEATURES, np.inf)
    return np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)


def _in_bounds(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return (np.isfinite(x) & (x >= lo) & (x <= hi)).all(axis=1)


def build_graph(gpus: list[GpuCandidate], jobs: list[JobCandidate], predictors: dict, cfg) -> RoundGraph:
    """Predict and check every pair, by distinct inputs, and group jobs into classes."""
    t0 = time.perf_counter()
    t_predict = 0.0
    elig = eligible_gpus(gpus, predictors)
    n, m = len(elig), len(jobs)
    types = sorted({g.gpu_type for g in elig})
    type_pos = {t: i for i, t in enumerate(types)}
    sm = offline_sm_pct(np.array([g.forecast_sm_pct for g in elig], dtype=float), cfg.sm) if n else np.zeros(0, int)
    quota = np.array([mem_quota_bytes(g, cfg) for g in elig], dtype=np.int64)
    healthy = np.array([g.health == GpuHealth.HEALTHY for g in elig], dtype=bool)
    allowance = np.array([g.slowdown_allowance for g in elig], dtype=float)
    gpu_type_idx = np.array([type_pos[g.gpu_type] for g in elig], dtype=np.int64)
    spec_key = {}
    gpu_spec = np.array([spec_key.setdefault((g.gpu_type, g.memory_bytes, g.max_sm_clock_mhz), len(spec_key))
                         for g in elig], dtype=np.int64)
    specs = list(spec_key)
    on = (np.stack([online_vector(g.online, g.memory_bytes, g.max_sm_clock_mhz) for g in elig])
          if n else np.zeros((0, 8)))

    # Job classes and the distinct profiles per GPU type.
    class_of: dict[tuple, int] = {}
    job_class = np.array([class_of.setdefault(_class_key(j, set(types)), len(class_of)) for j in jobs], dtype=np.int64)
    class_keys = list(class_of)
    n_cls = len(class_keys)
    profiles: list[dict[OfflineFeatures, int]] = [{} for _ in types]
    class_profile = np.full((n_cls, len(types)), -1, dtype=np.int64)
    class_mem = np.array([key[0] for key in class_keys], dtype=np.int64).reshape(-1)
    for k, (_mem, usable, profs) in enumerate(class_keys):
        for t, prof in zip(usable, profs):
            ti = type_pos[t]
            class_profile[k, ti] = profiles[ti].setdefault(prof, len(profiles[ti]))

    stats = {"gpus_out_of_range": 0, "profiles_out_of_range": 0, "predicted_pairs": 0, "distinct_gpu_rows": 0}
    levels = share_levels(sm, cfg.sm) if n else np.zeros((1, 0), dtype=np.int64)
    # One table per GPU type over the distinct (input row, share) of every level: one predict call per type.
    tables, gpu_rows, t_predict = _type_tables(types, gpu_type_idx, gpu_spec, specs, on, levels, profiles,
                                               predictors, stats)

    t_tables = time.perf_counter()
    # Class rows: base[k, i] = the best predicted throughput over the GPU's share levels
    # where the pair is feasible at that level; level[k, i] says which level.
    base = np.full((n_cls, n), -np.inf)
    level = np.zeros((n_cls, n), dtype=np.int8)
    for li in range(levels.shape[0]):
        gpu_row = gpu_rows[li]
        for ti in range(len(types)):
            idx = np.flatnonzero(gpu_type_idx == ti)
            ks = np.flatnonzero(class_profile[:, ti] >= 0)
            if not idx.size or not ks.size:
                continue
            rows, cols = gpu_row[idx], class_profile[ks, ti]
            tp = tables[ti].tput[np.ix_(rows, cols)]  # (gpus of type, classes)
            sl = tables[ti].slowdown[np.ix_(rows, cols)]
            with np.errstate(invalid="ignore"):
                feasible_pred = (sl - 1.0 <= allowance[idx, None]) & (tp > 0)
            ok = (
                feasible_pred
                & (class_mem[ks][None, :] <= quota[idx, None])
                & healthy[idx, None]
            )
            cand = np.where(ok, tp, -np.inf).T  # (classes, gpus of type)
            cur = base[np.ix_(ks, idx)]
            better = cand > cur
            base[np.ix_(ks, idx)] = np.where(better, cand, cur)
            level[np.ix_(ks, idx)] = np.where(better, li, level[np.ix_(ks, idx)])

    # Running jobs: where they are (their home) and the migration penalty.
    pos = {g.gpu_id: i for i, g in enumerate(elig)}
    home = np.full(m, -1, dtype=np.int64)
    home_w = np.full(m, -np.inf)
    home_level = np.zeros(m, dtype=np.int8)
    penalty = np.zeros(m)
    for j, job in enumerate(jobs):
        if job.current_gpu_id is None:
            continue
        penalty[j] = cfg.migration_penalty
        i = pos.get(job.current_gpu_id)
        if i is None:
            continue
        home[j] = i
    has = np.flatnonzero(home >= 0)
    if has.size:
        hi_ = home[has]
        for li in range(levels.shape[0]):
            tp, sl = _lookup(tables, gpu_type_idx, gpu_rows[li], class_profile, job_class[has], hi_)
            with np.errstate(invalid="ignore"):  # NaN: no profile for the type, or not accepted
                ok = (sl - 1.0 <= allowance[hi_]) & (tp > 0) & (class_mem[job_class[has]] <= quota[hi_])
            # On a GPU that is not Healthy a job may only stay as it runs: a restart with a
            # smaller share (see round.diff_plan) would be new work there.
            ok &= healthy[hi_] | np.array([keeps_share(jobs[j], int(levels[li, i]), cfg) for j, i in zip(has, hi_)],
                                          dtype=bool)
            cand = np.where(ok, tp, -np.inf)
            better = cand > home_w[has]
            home_w[has] = np.where(better, cand, home_w[has])
            home_level[has] = np.where(better, li, home_level[has])
    weights = GroupedWeights(base, job_class, home, home_w, penalty)
    stats.update({"gpus": n, "jobs": m, "classes": n_cls, "types": len(types), "share_levels": int(levels.shape[0]),
                  "distinct_profiles": int(sum(len(p) for p in profiles)),
                  "timings_s": {"features": t_tables - t0 - t_predict, "prediction": t_predict,
                                "feasibility": time.perf_counter() - t_tables}})
    return RoundGraph(elig, jobs, weights, levels, level, home_level, quota, gpu_type_idx, gpu_rows, class_profile,
                      types, tables, stats)


def share_levels(sm: np.ndarray, policy) -> np.ndarray:
    """(levels × GPUs) MPS shares a round may give: the dynamic share, then ``fallback_levels`` smaller ones.

    Level 0 is the dynamic share (paper §4.3). Each further level is
    ``fallback_step_pct`` lower, never below ``min_pct``: a job whose predicted
    online slowdown is over the allowance at the dynamic share may still fit
    at a smaller one (a fixed share has no levels).
    """
    sm = np.asarray(sm, dtype=np.int64)
    n_levels = 1 if policy.fixed_pct is not None else 1 + policy.fallback_levels
    steps = np.arange(n_levels, dtype=np.int64)[:, None] * policy.fallback_step_pct
    return np.maximum(policy.min_pct, sm[None, :] - steps)


def _type_tables(types, gpu_type_idx, gpu_spec, specs, on, levels, profiles, predictors, stats):
    """Per GPU type, predictions for each distinct (GPU input row, share) × profile over all share levels.

    Returns (tables by type, (levels × n) row of each GPU at each level, prediction seconds).
    """
    n_levels, n = levels.shape
    gpu_rows = np.zeros((n_levels, n), dtype=np.int64)
    tables: list[_TypeTable] = []
    t_predict = 0.0
    for ti, gtype in enumerate(types):
        model = predictors[gtype]
        lo, hi = _accept_bounds(model)
        idx = np.flatnonzero(gpu_type_idx == ti)
        key = np.vstack([np.column_stack([gpu_spec[idx].astype(float), on[idx], lv[idx].astype(float)])
                         for lv in levels])
        uniq, inv = np.unique(key, axis=0, return_inverse=True)
        gpu_rows[:, idx] = inv.reshape(n_levels, idx.size)
        row_spec = uniq[:, 0].astype(np.int64)
        row_on, row_sm = uniq[:, 1:9], uniq[:, 9]
        on_ok = _in_bounds(np.column_stack([row_on, row_sm]),
                           np.r_[lo[ONLINE_SLICE], lo[SM_COLUMN]], np.r_[hi[ONLINE_SLICE], hi[SM_COLUMN]])
        prof_list = list(profiles[ti])
        n_rows, n_prof = uniq.shape[0], len(prof_list)
        tput = np.full((n_rows, n_prof), np.nan)
        slow = np.full((n_rows, n_prof), np.nan)
        stats["distinct_gpu_rows"] += n_rows
        # A GPU is out of range when its input at the dynamic share (level 0) is.
        stats["gpus_out_of_range"] += int((~on_ok[gpu_rows[0, idx]]).sum())
        if n_rows and n_prof:
            # Offline vectors depend on the GPU spec (memory and clock normalise them).
            off = {}
            prof_ok = np.ones(n_prof, dtype=bool)
            for s in np.unique(row_spec):
                _t, mem_b, clk = specs[s]
                off[s] = np.stack([offline_vector(p, mem_b, clk) for p in prof_list])
                prof_ok &= _in_bounds(off[s], lo[OFFLINE_SLICE], hi[OFFLINE_SLICE])
            stats["profiles_out_of_range"] += int((~prof_ok).sum())
            good_rows, good_prof = np.flatnonzero(on_ok), np.flatnonzero(prof_ok)
            t_start = time.perf_counter()
            _predict_table(model, row_on, row_sm, row_spec, off, good_rows, good_prof, tput, slow)
            t_predict += time.perf_counter() - t_start
            stats["predicted_pairs"] += good_rows.size * good_prof.size
        tables.append(_TypeTable(tput, slow))
    return tables, gpu_rows, t_predict


def _predict_table(model, row_on, row_sm, row_spec, off, good_rows, good_prof, tput, slow) -> None:
    """Fill ``tput``/``slow`` at (good_rows × good_prof) with one predict call per batch of pairs."""
    if not good_rows.size or not good_prof.size:
        return
    per_batch = max(1, PREDICT_BATCH_ROWS // good_prof.size)
    for start in range(0, good_rows.size, per_batch):
        rows = good_rows[start : start + per_batch]
        r, p = np.repeat(rows, good_prof.size), np.tile(good_prof, rows.size)
        x = np.empty((r.size, N_FEATURES))
        x[:, ONLINE_SLICE] = row_on[r]
        x[:, SM_COLUMN] = row_sm[r]
        for s in np.unique(row_spec[rows]):
            sel = row_spec[r] == s
            x[sel, OFFLINE_SLICE] = off[s][p[sel]]
        t_hat, s_hat = model.predict(x)
        tput[r, p] = t_hat
        slow[r, p] = s_hat
