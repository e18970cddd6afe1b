"""Maximum-weight bipartite matching between GPUs and offline jobs (paper §5, Alg. 1).

Rectangular, with infeasible pairs and unmatched vertices allowed. Solved with
SciPy's Jonker–Volgenant ``linear_sum_assignment`` (an exact assignment solver
in the Kuhn–Munkres family). Because every feasible weight is positive and an
infeasible pair is given weight 0, a maximum-weight *assignment* of size
min(n, m) contains a maximum-weight *matching*: dropping its zero-weight and
infeasible edges loses nothing.

This dense form needs the whole GPUs × jobs matrix; rounds use the grouped,
certified solver of :mod:`scheduler_core.matching.assignment` and keep this one as the
baseline (:mod:`scheduler_core.round.dense`) and as its fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment


@dataclass(frozen=True)
class Matching:
    pairs: list[tuple[int, int]]  # (row, col) indices into the weight matrix
    total: float


def max_weight_matching(weights: np.ndarray, feasible: np.ndarray) -> Matching:
    """Optimal matching of rows (GPUs) to columns (jobs) using only feasible, positive edges."""
    w = np.asarray(weights, dtype=float)
    ok = np.asarray(feasible, dtype=bool)
    if w.shape != ok.shape or w.ndim != 2:
        raise ValueError(f"weights {w.shape} and feasibility {ok.shape} must be equal 2-D shapes")
    if w.size == 0:
        return Matching([], 0.0)
    if not np.all(np.isfinite(w[ok])):
        raise ValueError("feasible edges must have finite weights")
    usable = ok & (w > 0)
    masked = np.where(usable, w, 0.0)
    rows, cols = linear_sum_assignment(masked, maximize=True)
    pairs = [(int(r), int(c)) for r, c in zip(rows, cols) if usable[r, c]]
    return Matching(pairs, float(sum(masked[r, c] for r, c in pairs)))
