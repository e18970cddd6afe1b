"""Predictions of a round, per GPU type: distinct GPU input rows × distinct job profiles (paper §5–6).

A pair's prediction depends only on the GPU's *input row* — its type's spec
(memory, max clock), its online features and the offline SM share — and the
job's profile on that type. So each type gets one table over (distinct rows) ×
(distinct profiles), in one of two forms:

- :class:`DenseTable` (the paper's MLP): every accepted (row, profile) predicted
  once, in one predict call per type;
- :class:`EmbeddedTable` (a factorized predictor): one embedding per row and
  per profile; a block of pairs is a matrix product (:meth:`EmbeddedTable.block`),
  so the round evaluates every pair without a per-pair network pass even when
  every job has its own profile.

- :class:`MlpTable` (the paper's MLP, when rows × profiles is too many to
  predict up front: a profile per job at production scale): the first layer's
  part of every row and every profile (:class:`~scheduler_core.prediction.nets.MlpPairs`);
  a pair is predicted only when the round asks for it — only pairs that are
  feasible by memory and health, and at a lower share level only if no higher
  level was feasible — and nothing is stored per pair.

All answer the same two questions: :meth:`fill` (a rows × profiles block, or
the pairs of a mask in it) and :meth:`at` (aligned pairs), bit-equal to the
predictor's ``predict`` on them; NaN marks a pair the predictor does not accept
(a feature outside its range). De-duplication is exact: no feature is rounded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from scheduler_core.domain import OfflineFeatures
from scheduler_core.prediction.features import N_FEATURES, OFFLINE_SLICE, ONLINE_SLICE, SM_COLUMN, offline_vector
from scheduler_core.prediction.nets import finish, finish_into, gpu_sides, job_sides

# Largest pair matrix handed to one predict call (rows); above it, chunks.
PREDICT_BATCH_ROWS = 500_000
# An MLP's type table is predicted up front (DenseTable) up to this many (row, profile) pairs; above it the
# round predicts only the pairs it needs (MlpTable): a profile per job at 20,000 GPUs is ~220 M pairs a type.
DENSE_TABLE_MAX_PAIRS = 1 << 24


@dataclass(frozen=True, eq=False)
class DenseTable:
    """Every (row, profile) predicted; NaN where the predictor does not accept the pair."""

    tput: np.ndarray  # (rows, profiles)
    slowdown: np.ndarray

    @property
    def float32_exact(self) -> bool:
        """Whether every prediction is a float32 number (the MLP's are; a test stub's need not be)."""
        with np.errstate(invalid="ignore"):
            return all(bool(np.all((a.astype(np.float32) == a) | np.isnan(a))) for a in (self.tput, self.slowdown))

    def at(self, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.tput[rows, cols], self.slowdown[rows, cols]

    def prepare(self, cols: np.ndarray):
        """What :meth:`fill` needs of the profile columns ``cols`` (computed once per type)."""
        return np.asarray(cols, dtype=np.int64)

    def fill(self, rows: np.ndarray, cols, t32: np.ndarray, s32: np.ndarray, mask: np.ndarray | None = None) -> None:
        """(tput, slowdown) of rows × prepared columns into blocks of shape (len(rows), len(cols)) (every pair;
        ``mask`` names the pairs the caller needs, as for :meth:`MlpTable.fill`)."""
        t32[...] = self.tput[np.ix_(rows, cols)]
        s32[...] = self.slowdown[np.ix_(rows, cols)]


@dataclass(frozen=True, eq=False)
class EmbeddedTable:
    """Embeddings of every row and profile of a factorized predictor; pairs computed on demand.

    Each output of a pair is one dot product of a row's side and a profile's side
    (:func:`~scheduler_core.prediction.nets.gpu_sides`, ``job_sides``). A profile's
    features are normalised by the GPU's spec (memory, clock), so a type whose GPUs
    differ in spec keeps one profile embedding per spec; a row meets its own spec's.
    """

    d: int  # the predictor's embed_dim
    row_t: np.ndarray  # (rows, d + 2) float64
    row_s: np.ndarray
    row_spec: np.ndarray  # (rows,) spec of each row
    prof: dict  # spec → (job side t, job side s), each (profiles, d + 2)
    row_ok: np.ndarray  # (rows,) the predictor accepts the row's features
    prof_ok: np.ndarray  # (profiles,) … and the profile's (under every spec of the type)
    float32_exact = True  # finish() rounds every prediction to float32

    def at(self, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Aligned pairs, as the predictor's ``predict`` computes them (row by row)."""
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        t, s = np.empty(rows.shape), np.empty(rows.shape)
        spec = self.row_spec[rows]
        for sp, (bt, bs) in self.prof.items():
            sel = spec == sp
            if sel.any():
                r, c = rows[sel], cols[sel]
                t[sel], s[sel] = finish(np.einsum("ij,ij->i", self.row_t[r], bt[c]),
                                        np.einsum("ij,ij->i", self.row_s[r], bs[c]))
        bad = ~(self.row_ok[rows] & self.prof_ok[cols])
        t[bad], s[bad] = np.nan, np.nan
        return t, s

    def prepare(self, cols: np.ndarray):
        cols = np.asarray(cols, dtype=np.int64)
        sides = {sp: (np.ascontiguousarray(bt[cols].T), np.ascontiguousarray(bs[cols].T))
                 for sp, (bt, bs) in self.prof.items()}
        return sides, ~self.prof_ok[cols]

    def fill(self, rows: np.ndarray, prepared, t32: np.ndarray, s32: np.ndarray,
             mask: np.ndarray | None = None) -> None:
        """Two matrix products per spec (every pair of the block: they cost less than picking out ``mask``'s), finished to float32 in place (:func:`~scheduler_core.prediction.nets.finish_into`).

        The products run in torch on the caller's thread count: the round keeps it at one (``one_torch_thread``)
        (with shapes this thin, a second BLAS thread costs more than it brings on a busy host).
        """
        import torch


        sides, bad_c = prepared
        rows = np.asarray(rows, dtype=np.int64)
        spec = self.row_spec[rows]
        for sp, (bt_T, bs_T) in sides.items():
            sel = np.flatnonzero(spec == sp)
            if not sel.size:
                continue
            r = rows[sel]
            raw_t = torch.matmul(torch.from_numpy(self.row_t[r]), torch.from_numpy(bt_T)).numpy()
            raw_s = torch.matmul(torch.from_numpy(self.row_s[r]), torch.from_numpy(bs_T)).numpy()
            if sel.size == rows.size:
                finish_into(raw_t, raw_s, t32, s32)
            else:
                a, b = np.empty(raw_t.shape, np.float32), np.empty(raw_s.shape, np.float32)
                finish_into(raw_t, raw_s, a, b)
                t32[sel], s32[sel] = a, b
        bad_r = ~self.row_ok[rows]
        if bad_r.any():
            t32[bad_r], s32[bad_r] = np.nan, np.nan
        if bad_c.any():
            t32[:, bad_c], s32[:, bad_c] = np.nan, np.nan


@dataclass(frozen=True, eq=False)
class MlpTable:
    """An MLP's (row, profile) pairs, predicted only when asked for (:meth:`fill` with a mask, :meth:`at`).

    Holds the first layer's part of each distinct row and of each profile (per
    GPU spec: a profile's features are normalised by the GPU's memory and clock);
    :meth:`MlpPairs.pairs <scheduler_core.prediction.nets.MlpPairs.pairs>` runs the
    rest of the network on exactly the pairs asked for. ``evaluated[0]`` counts them.
    """

    kernel: object  # MlpPairs
    row_part: np.ndarray  # (rows, hidden) float32
    row_spec: np.ndarray  # (rows,)
    prof_part: dict  # spec → (profiles, hidden) float32
    row_ok: np.ndarray
    prof_ok: np.ndarray
    evaluated: np.ndarray  # (1,) int64: pairs predicted so far
    float32_exact = True

    def pairs(self, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """float32 (tput, slowdown) of aligned pairs; NaN where the predictor does not accept one.

        The outputs' ranges are applied in float32, which gives :func:`~scheduler_core.prediction.nets.finish`'s
        numbers exactly (a clip is exact, and ``s + 1`` of a float32 ``s ≥ 0`` rounds once either way).
        """
        if len(self.prof_part) == 1 and self.row_ok.all() and self.prof_ok.all():  # (checked in O(rows + profiles))
            (part,) = self.prof_part.values()
            t, s = self.kernel.pairs(self.row_part, part, rows, cols)
            self.evaluated[0] += rows.size
        else:
            good = self.row_ok[rows] & self.prof_ok[cols]
            t = np.full(rows.shape, np.nan, dtype=np.float32)
            s = np.full(rows.shape, np.nan, dtype=np.float32)
            spec = self.row_spec[rows]
            for sp, part in self.prof_part.items():
                sel = np.flatnonzero(good & (spec == sp))
                if sel.size:
                    t[sel], s[sel] = self.kernel.pairs(self.row_part, part, rows[sel], cols[sel])
            self.evaluated[0] += int(np.count_nonzero(good))
        np.clip(t, 0.0, 1.0, out=t)
        np.maximum(s, 0.0, out=s)
        s += 1.0
        return t, s

    def grid(self, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """float32 (tput, slowdown) of every (row, col), shape (len(rows), len(cols)); NaN where not accepted."""
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        t = s = None  # the kernel's own grids when one spec covers the block, else NaN-filled ones

        def nan_grids():
            return (np.full((rows.size, cols.size), np.nan, dtype=np.float32),
                    np.full((rows.size, cols.size), np.nan, dtype=np.float32))

        good_c = np.flatnonzero(self.prof_ok[cols])
        spec = self.row_spec[rows]
        for sp, part in self.prof_part.items():
            good_r = np.flatnonzero(self.row_ok[rows] & (spec == sp))
            if not good_r.size or not good_c.size:
                continue
            gt, gs = self.kernel.grid(self.row_part[rows[good_r]], part[cols[good_c]])
            self.evaluated[0] += good_r.size * good_c.size
            if good_r.size == rows.size and good_c.size == cols.size:
                t, s = gt, gs
                continue
            if t is None:
                t, s = nan_grids()
            t[np.ix_(good_r, good_c)], s[np.ix_(good_r, good_c)] = gt, gs
        if t is None:
            t, s = nan_grids()
        np.clip(t, 0.0, 1.0, out=t)
        np.maximum(s, 0.0, out=s)
        s += 1.0
        return t, s

    def at(self, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t, s = self.pairs(np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64))
        return t.astype(np.float64), s.astype(np.float64)

    def prepare(self, cols: np.ndarray):
        return np.asarray(cols, dtype=np.int64)

    def fill(self, rows: np.ndarray, cols, t32: np.ndarray, s32: np.ndarray, mask: np.ndarray | None = None) -> None:
        """The pairs of ``mask`` (rows × cols, None: all) into ``t32``/``s32``; the others are left as they are."""
        rows = np.asarray(rows, dtype=np.int64)
        if mask is None:
            t32[...], s32[...] = self.grid(rows, cols)
            return
        ri, ci = np.nonzero(mask)
        if ri.size:
            t32[ri, ci], s32[ri, ci] = self.pairs(rows[ri], cols[ci])


def accept_bounds(model) -> tuple[np.ndarray, np.ndarray]:
    lo = getattr(model, "accept_lo", None)
    hi = getattr(model, "accept_hi", None)
    if lo is None or hi is None:  # a predictor without a declared range (test stubs): finite values only
        return np.full(N_FEATURES, -np.inf), np.full(N_FEATURES, np.inf)
    return np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)


def in_bounds(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return (np.isfinite(x) & (x >= lo) & (x <= hi)).all(axis=1)


def type_tables(types, gpu_type_idx, gpu_spec, specs, on, shares, profiles, predictors, stats):
    """Per GPU type, the table over the distinct (spec, online row, share) of every share in ``shares``.

    ``shares``: (S, n) MPS shares each GPU is predicted at (share levels, slot
    shares); −1 = none. Returns (tables by type, (S × n) row of each GPU at
    each share (−1 = none), prediction seconds).
    """
    n_sh, n = shares.shape
    gpu_rows = np.full((n_sh, n), -1, dtype=np.int64)
    tables: list = []
    t_predict = 0.0
    for ti, gtype in enumerate(types):
        model = predictors[gtype]
        lo, hi = accept_bounds(model)
        idx = np.flatnonzero(gpu_type_idx == ti)
        used = shares[:, idx] >= 0
        key = np.vstack([np.column_stack([gpu_spec[idx].astype(float), on[idx], sh[idx].astype(float)])
                         for sh in shares])
        flat_used = used.reshape(-1)
        uniq, inv = np.unique(key[flat_used], axis=0, return_inverse=True)
        rows_of = np.full(flat_used.size, -1, dtype=np.int64)
        rows_of[flat_used] = inv.reshape(-1)
        gpu_rows[:, idx] = rows_of.reshape(n_sh, idx.size)
        row_spec = uniq[:, 0].astype(np.int64)
        row_on, row_sm = uniq[:, 1:9], uniq[:, 9]
        on_ok = in_bounds(np.column_stack([row_on, row_sm]),
                          np.r_[lo[ONLINE_SLICE], lo[SM_COLUMN]], np.r_[hi[ONLINE_SLICE], hi[SM_COLUMN]])
        prof_list = list(profiles[ti])
        n_rows, n_prof = uniq.shape[0], len(prof_list)
        stats["distinct_gpu_rows"] += n_rows
        # A GPU is out of range when its input at its first share (the dynamic one) is.
        first = gpu_rows[0, idx]
        stats["gpus_out_of_range"] += int((~on_ok[first[first >= 0]]).sum())
        # Offline vectors depend on the GPU spec (memory and clock normalise them).
        off: dict[int, np.ndarray] = {}
        prof_ok = np.ones(n_prof, dtype=bool)
        for s in np.unique(row_spec):
            _t, mem_b, clk = specs[s]
            off[s] = (np.stack([offline_vector(p, mem_b, clk) for p in prof_list]) if n_prof
                      else np.zeros((0, 7)))
            prof_ok &= in_bounds(off[s], lo[OFFLINE_SLICE], hi[OFFLINE_SLICE])
        stats["profiles_out_of_range"] += int((~prof_ok).sum())
        t_start = time.perf_counter()
        kernel = _mlp_kernel(model)
        if getattr(model, "factorized", False) and n_rows and n_prof:
            tables.append(_embedded(model, row_on, row_sm, row_spec, off, on_ok, prof_ok))
            stats["predicted_pairs"] += int(on_ok.sum()) * int(prof_ok.sum())
            stats["embedded_rows"] = stats.get("embedded_rows", 0) + n_rows + n_prof * len(off)
        elif kernel is not None and n_rows * n_prof > DENSE_TABLE_MAX_PAIRS:
            # the pairs are counted in stats["predicted_pairs"] as the round predicts them (pair_weights)
            tables.append(MlpTable(kernel, kernel.gpu_part(np.column_stack([row_on, row_sm])), row_spec,
                                   {int(sp): kernel.job_part(off[int(sp)]) for sp in np.unique(row_spec)},
                                   on_ok, prof_ok, np.zeros(1, dtype=np.int64)))
            stats["lazy_tables"] = stats.get("lazy_tables", 0) + 1
        else:
            tput = np.full((n_rows, n_prof), np.nan)
            slow = np.full((n_rows, n_prof), np.nan)
            good_rows, good_prof = np.flatnonzero(on_ok), np.flatnonzero(prof_ok)
            _predict_table(model, row_on, row_sm, row_spec, off, good_rows, good_prof, tput, slow)
            stats["predicted_pairs"] += good_rows.size * good_prof.size
            tables.append(DenseTable(tput, slow))
        t_predict += time.perf_counter() - t_start
    return tables, gpu_rows, t_predict


def _mlp_kernel(model):
    """The predictor's MLP pair kernel, or None (a factorized predictor, a test stub)."""
    if getattr(model, "factorized", True):
        return None
    try:
        return model.pair_kernel
    except (AttributeError, TypeError):
        return None


def _embedded(model, row_on, row_sm, row_spec, off, on_ok, prof_ok) -> EmbeddedTable:
    d = model.cfg.embed_dim
    row_t, row_s = gpu_sides(model.embed_gpu(np.column_stack([row_on, row_sm])), d)
    prof = {int(sp): job_sides(model.embed_job(off[int(sp)]), d) for sp in np.unique(row_spec)}
    return EmbeddedTable(d, row_t, row_s, row_spec, prof, on_ok, prof_ok)


def _predict_table(model, row_on, row_sm, row_spec, off, good_rows, good_prof, tput, slow) -> None:
    """Fill ``tput``/``slow`` at (good_rows × good_prof): through the MLP's pair kernel where the model has one
    (each row's and each profile's first-layer part once), else one predict call per batch of pairs."""
    if not good_rows.size or not good_prof.size:
        return
    kernel = _mlp_kernel(model)
    if kernel is not None:
        from scheduler_core.prediction.nets import finish

        a = kernel.gpu_part(np.column_stack([row_on, row_sm]))
        parts = {int(s): kernel.job_part(off[int(s)]) for s in np.unique(row_spec[good_rows])}
    per_batch = max(1, PREDICT_BATCH_ROWS // good_prof.size)
    for start in range(0, good_rows.size, per_batch):
        rows = good_rows[start : start + per_batch]
        r, p = np.repeat(rows, good_prof.size), np.tile(good_prof, rows.size)
        if kernel is not None:
            for s in np.unique(row_spec[rows]):
                sel = row_spec[r] == s
                raw_t, raw_s = kernel.pairs(a, parts[int(s)], r[sel], p[sel])
                tput[r[sel], p[sel]], slow[r[sel], p[sel]] = finish(raw_t.astype(np.float64), raw_s.astype(np.float64))
            continue
        x = np.empty((r.size, N_FEATURES))
        x[:, ONLINE_SLICE] = row_on[r]
        x[:, SM_COLUMN] = row_sm[r]
        for s in np.unique(row_spec[rows]):
            sel = row_spec[r] == s
            x[sel, OFFLINE_SLICE] = off[s][p[sel]]
        t_hat, s_hat = model.predict(x)
        tput[r, p] = t_hat
        slow[r, p] = s_hat


def profile_index(types: list[str], class_keys: list[tuple]) -> tuple[list[dict[OfflineFeatures, int]], np.ndarray]:
    """Distinct profiles per GPU type and each class's column in its type's table (−1 = none)."""
    type_pos = {t: i for i, t in enumerate(types)}
    profiles: list[dict[OfflineFeatures, int]] = [{} for _ in types]
    class_profile = np.full((len(class_keys), len(types)), -1, dtype=np.int64)
    for k, (_mem, usable, profs) in enumerate(class_keys):
        for t, prof in zip(usable, profs):
            ti = type_pos[t]
            class_profile[k, ti] = profiles[ti].setdefault(prof, len(profiles[ti]))
    return profiles, class_profile
