"""Optimality certificate of a matching, independent of the solver that found it (LP duality).

Given GPU duals ``u`` and job duals ``v``, weak duality bounds every matching
M' of the graph::

    Σ_{(i,j)∈M'} w[i,j]  ≤  Σ_i u⁺_i + Σ_j v⁺_j + Σ_j e_j,
    e_j = max(0, max_i (w[i,j] − u⁺_i) − v⁺_j)        (the duals' violation at job j)

so ``gap_bound = that sum − value(M)`` bounds how far M is from the optimum.
It is zero exactly when the duals are feasible (``u, v ≥ 0``,
``u_i + v_j ≥ w[i,j]`` on every pair) and complementary to M (equality on the
matched pairs, zero dual on unmatched vertices) — the Kuhn–Munkres optimality
conditions. The check visits every feasible pair, by class
(:func:`~scheduler_core.matching.grouped_weights.best_reduced`), and sums with
``math.fsum`` so that rounding cannot hide a gap.

:func:`duals_from_matching` builds the smallest such duals for a given
matching by Bellman–Ford style relaxation; they exist only if the matching is
optimal, so any matching (e.g. from ``linear_sum_assignment``) can be
certified without trusting its solver.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduler_core.matching.grouped_weights import GroupedWeights, best_reduced

DEFAULT_GAP_TOL = 1e-6


@dataclass(frozen=True)
class Certificate:
    ok: bool
    value: float  # total weight of the matching
    dual_bound: float  # ≥ the optimum of every matching
    gap_bound: float  # optimum − value ≤ gap_bound
    max_violation: float  # max over pairs of w − u − v (≤ 0 for feasible duals)
    pairs_checked: int
    reason: str = ""

    def as_dict(self) -> dict:
        return {
            "ok": self.ok, "value": self.value, "dual_bound": self.dual_bound, "gap_bound": self.gap_bound,
            "max_violation": self.max_violation, "pairs_checked": self.pairs_checked, "reason": self.reason,
        }


def _structure_error(problem: GroupedWeights, pairs: np.ndarray) -> str:
    n, m = problem.n_gpus, problem.n_jobs
    if pairs.size == 0:
        return ""
    i, j = pairs[:, 0], pairs[:, 1]
    if i.min() < 0 or i.max() >= n or j.min() < 0 or j.max() >= m:
        return "a pair indexes outside the graph"
    if np.unique(i).size != i.size:
        return "a GPU is matched twice"
    if np.unique(j).size != j.size:
        return "a job is matched twice"
    w = problem.weights_at(i, j)
    bad = ~(w > 0)
    if bad.any():
        k = int(np.argmax(bad))
        return f"pair (gpu {int(i[k])}, job {int(j[k])}) is infeasible or worthless (weight {w[k]!r})"
    return ""


def certify(
    problem: GroupedWeights,
    pairs: Sequence[tuple[int, int]] | np.ndarray,
    gpu_duals: np.ndarray,
    job_duals: np.ndarray,
    gap_tol: float = DEFAULT_GAP_TOL,
) -> Certificate:
    """Check a matching against duals on every pair; ``ok`` iff valid and within ``gap_tol`` of optimal."""
    arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    u = np.asarray(gpu_duals, dtype=np.float64).reshape(-1)
    v = np.asarray(job_duals, dtype=np.float64).reshape(-1)
    if u.shape[0] != problem.n_gpus or v.shape[0] != problem.n_jobs:
        raise ValueError(f"need {problem.n_gpus} GPU and {problem.n_jobs} job duals, got {u.shape[0]} and {v.shape[0]}")
    pairs_checked = problem.feasible_pair_count()
    reason = _structure_error(problem, arr)
    if reason:
        return Certificate(False, math.nan, math.nan, math.inf, math.nan, pairs_checked, reason)
    if not (np.all(np.isfinite(u)) and np.all(np.isfinite(v))):
        return Certificate(False, math.nan, math.nan, math.inf, math.nan, pairs_checked, "duals must be finite")
    value = math.fsum(problem.weights_at(arr[:, 0], arr[:, 1]).tolist()) if arr.size else 0.0
    up, vp = np.maximum(u, 0.0), np.maximum(v, 0.0)
    best, _ = best_reduced(problem, up)
    viol = best - vp  # −inf for a job without any feasible pair
    excess = np.maximum(viol, 0.0)
    dual_bound = math.fsum(up.tolist()) + math.fsum(vp.tolist()) + math.fsum(excess.tolist())
    gap = dual_bound - value
    finite = viol[np.isfinite(viol)]
    max_viol = float(finite.max()) if finite.size else -math.inf
    ok = gap <= gap_tol
    why = "" if ok else f"duality gap bound {gap:.3g} exceeds {gap_tol:.3g} (max dual violation {max_viol:.3g})"
    return Certificate(ok, value, dual_bound, gap, max_viol, pairs_checked, why)


def duals_from_matching(
    problem: GroupedWeights,
    pairs: Sequence[tuple[int, int]] | np.ndarray,
    max_iter: int | None = None,
    tol: float = 1e-13,
) -> tuple[np.ndarray, np.ndarray]:
    """Smallest duals complementary to ``pairs``: v_j = max(0, max_i w[i,j] − u_i), u_i = w[i,M(i)] − v_M(i).

    Relaxation from v = 0 reaches them in at most |M| + 1 rounds when the
    matching is optimal; otherwise there is an improving cycle or path, the
    rounds stop at ``max_iter`` and :func:`certify` rejects what comes out.
    """
    arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    n, m = problem.n_gpus, problem.n_jobs
    v = np.zeros(m)
    u = np.zeros(n)
    if arr.size == 0:
        return u, v
    gi, jj = arr[:, 0], arr[:, 1]
    w_m = problem.weights_at(gi, jj)
    limit = (arr.shape[0] + 2) if max_iter is None else max_iter
    for _ in range(limit):
        u[gi] = w_m - v[jj]
        best, _ = best_reduced(problem, u, jj)
        new = np.maximum(best, 0.0)
        # Rounding can creep around a zero-weight cycle (ties) by an ulp per round.
        if np.all(new <= v[jj] + tol):
            break
        v[jj] = np.maximum(v[jj], new)
    u[gi] = w_m - v[jj]
    return u, v
