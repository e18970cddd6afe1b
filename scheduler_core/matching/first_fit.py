"""First-fit placement: the matching-free ablation of MuxFlow (paper §7.4, MuxFlow-M).

Same graph as the maximum-weight matching (:mod:`scheduler_core.matching.grouped_weights`):
a pair is placeable only where its weight is positive, i.e. the speed
predictor says the online service stays within its slowdown allowance and the
memory quota holds. What first-fit drops is the optimisation: running jobs stay
where they are while that is still feasible; then jobs in queue order (the
order of the round's job list: priority, then submission) each take the first
free GPU, in GPU order, that can host them — at the GPU's dynamic MPS share if
any free GPU admits the job there, else at the first smaller fallback share that
does (``levels``: the share level of each class on each GPU). No throughput is
compared, so no optimality certificate exists.
"""

from __future__ import annotations

import time

import numpy as np

from scheduler_core.matching.grouped_weights import GroupedWeights


def first_fit(problem: GroupedWeights, order: np.ndarray | None = None,
              levels: np.ndarray | None = None) -> tuple[list[tuple[int, int]], float, dict]:
    """(pairs sorted by GPU, total weight, stats).

    ``order``: job indices in queue order (default: as given); ``levels``: (classes × GPUs)
    share level of each class's weight (0 = the dynamic share; default: all 0).
    """
    t0 = time.perf_counter()
    n, m = problem.n_gpus, problem.n_jobs
    free = np.ones(n, dtype=bool)
    placed = np.zeros(m, dtype=bool)
    pairs: list[tuple[int, int]] = []
    # 1. Running jobs keep their GPU where staying is feasible.
    for j in np.flatnonzero(problem.home >= 0):
        h = int(problem.home[j])
        if problem.home_weight[j] > 0 and free[h]:
            free[h], placed[j] = False, True
            pairs.append((h, int(j)))
    # 2. Everyone else, in queue order, takes the first free feasible GPU.
    queue = np.arange(m) if order is None else np.asarray(order, dtype=np.int64)
    ok_by_class = problem.base > 0  # (classes, GPUs)
    for j in queue:
        if placed[j]:
            continue
        if not free.any():
            break
        row = ok_by_class[problem.job_class[j]] & free
        if problem.penalty[j] > 0:
            row &= (problem.base[problem.job_class[j]] - problem.penalty[j]) > 0
        h = int(problem.home[j])
        if h >= 0:
            row[h] = free[h] and problem.home_weight[j] > 0
        if not row.any():
            continue
        if levels is not None:
            lv = levels[problem.job_class[j]]
            best = int(lv[row].min())
            row &= lv == best
        i = int(np.argmax(row))
        free[i], placed[j] = False, True
        pairs.append((i, int(j)))
    pairs.sort()
    total = float(problem.weights_at(np.array([p[0] for p in pairs], dtype=np.int64),
                                     np.array([p[1] for p in pairs], dtype=np.int64)).sum()) if pairs else 0.0
    return pairs, total, {"method": "first_fit", "first_fit_s": round(time.perf_counter() - t0, 4)}
