"""Exact matching when jobs do not group: a profile per job, 10,000 classes × 20,000 GPUs (paper §5, Alg. 1).

:mod:`scheduler_core.matching.assignment` solves the matching as a transportation LP
between a few hundred nodes (job classes) and the GPUs. When every job is
profiled separately each job is its own class, the LP has 10,000 nodes and
column generation needs dozens of rounds (docs/BENCHMARKS.md: 612 s). Here:

1. **Prices from groups.** Classes whose weight rows look alike (a random
   projection of the rows, then k-means) form at most ``group_count`` groups;
   each group's row is its members' mean (−inf wherever a member is
   infeasible). The grouped LP on those few hundred nodes gives GPU prices and
   which GPUs each group would get.
2. **Candidate arcs** per job: the GPUs its group got (its best
   ``group_arcs`` of them), its best ``top_arcs`` GPUs at the group prices, and
   its own GPU if it runs.
3. **Exact on the arcs, priced on every pair.** The assignment on the arcs — a
   min-cost flow (OR-Tools' cost-scaling push-relabel; SciPy's LAPJVsp when
   OR-Tools cannot take it), each job with a zero-weight way out so that every job
   can stay unplaced — is optimal there; its duals come from the matching by
   relaxation (:func:`sparse_duals`). Every pair is then priced by class
   (:func:`~scheduler_core.matching.grouped_weights.best_reduced`); a job with a pair of
   positive reduced weight gets its best ``add_arcs`` GPUs at the new prices
   and the arcs are solved again, until no pair prices positive: the duals are
   then feasible on the whole graph and the matching is optimal (LP duality).

:func:`~scheduler_core.matching.certificate.certify` checks the result as for every
matching; if ``max_rounds`` is reached first the certificate still bounds how
far the matching is from the optimum.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import min_weight_full_bipartite_matching

from scheduler_core.matching.grouped_weights import GroupedWeights, best_reduced


def _top_per_class(base: np.ndarray, u: np.ndarray, classes: np.ndarray, count: int,
                   chunk: int = 32) -> dict[int, np.ndarray]:
    """Per class: its ``count`` best GPUs by (weight − u), feasible ones only."""
    out: dict[int, np.ndarray] = {}
    n = base.shape[1]
    count = min(count, n)
    if count <= 0 or n == 0:
        return {int(k): np.zeros(0, dtype=np.int64) for k in classes}
    for start in range(0, classes.size, chunk):
        ks = classes[start : start + chunk]
        red = base[ks].astype(np.float64) - u
        part = np.argpartition(-red, count - 1, axis=1)[:, :count] if count < n else np.tile(np.arange(n), (ks.size, 1))
        for r, k in enumerate(ks):
            p = part[r]
            out[int(k)] = p[np.isfinite(red[r, p])]
    return out


def _groups(base: np.ndarray, count: int, seed: int = 0, iters: int = 8) -> np.ndarray:
    """(classes,) group of each class: k-means on a random projection of the weight rows (deterministic)."""
    import torch

    k_count, n = base.shape
    count = min(count, k_count)
    rng = np.random.default_rng(seed)
    r = torch.from_numpy((rng.normal(size=(n, 32)) / math.sqrt(max(1, n))).astype(np.float32))
    proj = np.zeros((k_count, 32))
    for start in range(0, k_count, 512):
        rows = np.nan_to_num(np.asarray(base[start : start + 512], dtype=np.float32), neginf=-1.0)
        proj[start : start + 512] = torch.matmul(torch.from_numpy(rows), r).numpy()
    cen = proj[rng.choice(k_count, count, replace=False)]
    assign = np.zeros(k_count, dtype=np.int64)
    for _ in range(iters):
        d = (proj**2).sum(1)[:, None] - 2.0 * proj @ cen.T + (cen**2).sum(1)[None, :]
        assign = d.argmin(1)
        sums = np.zeros_like(cen)
        np.add.at(sums, assign, proj)
        sizes = np.bincount(assign, minlength=count)
        live = sizes > 0
        cen[live] = sums[live] / sizes[live, None]
    _, assign = np.unique(assign, return_inverse=True)
    return assign.reshape(-1)


def _group_rows(base: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Each group's mean row; −inf where any member is infeasible (a group may not take what one member cannot)."""
    g_count, n = int(group.max()) + 1, base.shape[1]
    rows = np.full((g_count, n), -np.inf)
    order = np.argsort(group, kind="stable")
    bounds = np.searchsorted(group[order], np.arange(g_count + 1))
    for g in range(g_count):
        members = order[bounds[g] : bounds[g + 1]]
        if members.size:
            blk = base[members].astype(np.float64)
            rows[g] = blk.mean(axis=0)  # −inf wherever a member is −inf
    return rows


def sparse_duals(m: int, n: int, arc_j: np.ndarray, arc_i: np.ndarray, arc_w: np.ndarray, job_gpu: np.ndarray,
                 tol: float = 1e-13) -> tuple[np.ndarray, np.ndarray, int]:
    """Smallest duals complementary to ``job_gpu`` on the arcs (relaxation from v = 0, as
    :func:`~scheduler_core.matching.certificate.duals_from_matching` does on every pair): (u, v, rounds)."""
    order = np.argsort(arc_j, kind="stable")
    arc_j, arc_i, arc_w = arc_j[order], arc_i[order], arc_w[order]
    starts = np.searchsorted(arc_j, np.arange(m))
    nonempty = np.diff(np.r_[starts, arc_j.size]) > 0
    matched = np.flatnonzero(job_gpu >= 0)
    gpu_m = job_gpu[matched]
    keys = arc_j * n + arc_i
    w_m = arc_w[np.searchsorted(keys, matched * n + gpu_m)] if matched.size else np.zeros(0)
    v = np.zeros(m)
    u = np.zeros(n)
    rounds = 0
    for rounds in range(1, m + 3):
        u[:] = 0.0
        u[gpu_m] = w_m - v[matched]
        best = np.full(m, -np.inf)
        if arc_j.size:
            best[nonempty] = np.maximum.reduceat(arc_w - u[arc_i], starts[nonempty])
        new = np.maximum(best, 0.0)
        if np.all(new <= v + tol):
            break
        v = np.maximum(v, new)
    u[:] = 0.0
    u[gpu_m] = w_m - v[matched]
    return u, v, rounds


# Arc weights as integers for the min-cost-flow solver: w × 2^40, exact for float32 weights ≥ 2^-16 and within
# 2^-41 of any other weight; the solver's cost scaling multiplies costs by about its node count (< 2^22 nodes here).
FLOW_COST_SCALE = float(1 << 40)
FLOW_MAX_NODES = 1 << 22


def _assign(problem: GroupedWeights, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Optimal matching on the arcs ``keys`` (job * n + gpu): (job → GPU or −1, arc jobs, arc GPUs, arc weights)."""
    n, m = problem.n_gpus, problem.n_jobs
    arc_j, arc_i = keys // max(1, n), keys % max(1, n)
    w = problem.weights_at(arc_i, arc_j)
    keep = w > 0
    arc_j, arc_i, w = arc_j[keep], arc_i[keep], w[keep]
    job_gpu = np.full(m, -1, dtype=np.int64)
    if m == 0 or not w.size:
        return job_gpu, arc_j, arc_i, w
    matched = _assign_flow(n, m, arc_j, arc_i, w)
    if matched is None:
        matched = _assign_lapjvsp(n, m, arc_j, arc_i, w)
    return matched, arc_j, arc_i, w


def _assign_flow(n: int, m: int, arc_j: np.ndarray, arc_i: np.ndarray, w: np.ndarray) -> np.ndarray | None:
    """Maximum-weight matching on the arcs as a min-cost flow (OR-Tools' cost-scaling push-relabel): source → each
    job → its GPUs (cost −w) or its way out (cost 0) → sink. None if the solver is missing or does not solve it."""
    try:
        from ortools.graph.python import min_cost_flow
    except ImportError:  # pragma: no cover - a dependency of the project; LAPJVsp below still solves it
        return None
    if n + m + 2 > FLOW_MAX_NODES or float(np.max(np.abs(w))) > 4.0:
        return None
    src, snk = n + m, n + m + 1
    gpu0 = m  # GPU i is node m + i
    flow = min_cost_flow.SimpleMinCostFlow()
    tails = np.concatenate([np.full(m, src), arc_j, np.arange(m), gpu0 + np.arange(n)]).astype(np.int32)
    heads = np.concatenate([np.arange(m), gpu0 + arc_i, np.full(m, snk), np.full(n, snk)]).astype(np.int32)
    costs = np.concatenate([np.zeros(m), -np.rint(w * FLOW_COST_SCALE), np.zeros(m + n)]).astype(np.int64)
    arcs = flow.add_arcs_with_capacity_and_unit_cost(tails, heads, np.ones(tails.size, dtype=np.int64), costs)
    flow.set_node_supply(src, m)
    flow.set_node_supply(snk, -m)
    if flow.solve() != flow.OPTIMAL:
        return None
    used = np.flatnonzero(flow.flows(arcs[m : m + arc_j.size]) > 0)
    job_gpu = np.full(m, -1, dtype=np.int64)
    job_gpu[arc_j[used]] = arc_i[used]
    return job_gpu


def _assign_lapjvsp(n: int, m: int, arc_j: np.ndarray, arc_i: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The same matching with SciPy's LAPJVsp (slower by an order of magnitude on a round's arcs)."""
    job_gpu = np.full(m, -1, dtype=np.int64)
    # Minimise Σ (c − w) over a full matching of the jobs, each with a way out (its own column) at c.
    c = 1.0 + float(w.max())
    rows = np.concatenate([arc_j, np.arange(m)])
    cols = np.concatenate([arc_i, n + np.arange(m)])
    cost = np.concatenate([c - w, np.full(m, c)])
    mat = sp.csr_matrix((cost, (rows, cols)), shape=(m, n + m))
    r_ind, c_ind = min_weight_full_bipartite_matching(mat)
    real = c_ind < n
    job_gpu[r_ind[real]] = c_ind[real]
    return job_gpu


def _arcs_of(problem: GroupedWeights, jobs: np.ndarray, u: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(arc jobs, arc GPUs): each of ``jobs``'s best ``count`` GPUs at prices ``u`` (by class)."""
    if not jobs.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    k_of = problem.job_class[jobs]
    top = _top_per_class(problem.base, u, np.unique(k_of), count)
    sizes = np.array([top[int(k)].size for k in k_of], dtype=np.int64)
    return np.repeat(jobs, sizes), np.concatenate([top[int(k)] for k in k_of])


def _start_from_groups(problem: GroupedWeights, cfg, group_solver) -> tuple[np.ndarray, np.ndarray, dict]:
    """Arcs (job * n + gpu) from the grouped LP's prices and plan (steps 1–2 of the module docstring)."""
    n, m = problem.n_gpus, problem.n_jobs
    base = problem.base
    t0 = time.perf_counter()
    group = _groups(base, cfg.sparse_groups)
    job_group = group[problem.job_class]
    g_problem = GroupedWeights(_group_rows(base, group), job_group, np.full(m, -1), np.full(m, -np.inf),
                               problem.penalty)
    t1 = time.perf_counter()
    u0, got = group_solver(g_problem)
    t2 = time.perf_counter()
    arc_j, arc_i = [], []
    by_group = {int(g): np.flatnonzero(got == g) for g in np.unique(job_group)}
    for k in np.unique(problem.job_class):
        members = np.flatnonzero(problem.job_class == k)
        gpus = by_group.get(int(group[k]), np.zeros(0, dtype=np.int64))
        if gpus.size > cfg.sparse_group_arcs:
            red = base[k, gpus].astype(np.float64) - u0[gpus]
            gpus = gpus[np.argpartition(-red, cfg.sparse_group_arcs - 1)[: cfg.sparse_group_arcs]]
        arc_j.append(np.repeat(members, gpus.size))
        arc_i.append(np.tile(gpus, members.size))
    tj, ti = _arcs_of(problem, np.arange(m), u0, cfg.sparse_top_arcs)
    keys = np.concatenate(arc_j + [tj]) * max(1, n) + np.concatenate(arc_i + [ti])
    return keys, u0, {"start": "groups", "groups": int(group.max()) + 1 if group.size else 0,
                      "groups_s": t1 - t0, "group_prices_s": t2 - t1, "arcs_s": time.perf_counter() - t2}


def _start_from_parts(problem: GroupedWeights, cfg, group_solver) -> tuple[np.ndarray, np.ndarray, dict]:
    """Arcs from solving random parts of the problem (POP, Narayanan et al. SOSP'21) and joining them.

    Jobs and GPUs are split at random into parts of about ``sparse_part_jobs`` jobs (a running
    job goes with its GPU); each part is solved like the whole. Their matchings together are a
    good matching of the whole, their prices an approximate price of every GPU: each job's best
    GPUs at those prices and its part's GPU are the arcs of the first round on the whole.
    """
    n, m = problem.n_gpus, problem.n_jobs
    t0 = time.perf_counter()
    parts = -(-m // cfg.sparse_part_jobs)
    rng = np.random.default_rng(0)
    gpu_part = rng.integers(parts, size=n)
    job_part = rng.integers(parts, size=m)
    homed = problem.home >= 0
    job_part[homed] = gpu_part[problem.home[homed]]
    u = np.zeros(n)
    got = np.full(m, -1, dtype=np.int64)
    # A part is solved from its groups, never split again: parts are uneven (running jobs go with their GPUs),
    # and a part holding every job would otherwise be split the same way for ever.
    part_cfg = replace(cfg, sparse_part_jobs=max(m, cfg.sparse_part_jobs))
    for q in range(parts):
        gq, jq = np.flatnonzero(gpu_part == q), np.flatnonzero(job_part == q)
        if not gq.size or not jq.size:
            continue
        cls, inv = np.unique(problem.job_class[jq], return_inverse=True)
        pos = np.full(n, -1, dtype=np.int64)
        pos[gq] = np.arange(gq.size)
        home = np.where(homed[jq], pos[np.maximum(problem.home[jq], 0)], -1)
        sub = GroupedWeights(problem.base[np.ix_(cls, gq)], inv.reshape(-1), home,
                             np.where(home >= 0, problem.home_weight[jq], -np.inf), problem.penalty[jq])
        pairs, u_q, _v, _stats = solve_sparse(sub, part_cfg, group_solver)
        u[gq] = u_q
        for i, j in pairs:
            got[jq[j]] = gq[i]
    t1 = time.perf_counter()
    tj, ti = _arcs_of(problem, np.arange(m), u, cfg.sparse_top_arcs_join)
    matched = np.flatnonzero(got >= 0)
    keys = np.concatenate([tj, matched]) * max(1, n) + np.concatenate([ti, got[matched]])
    return keys, u, {"start": "parts", "parts": parts, "parts_s": t1 - t0, "arcs_s": time.perf_counter() - t1}


def solve_sparse(problem: GroupedWeights, cfg, group_solver) -> tuple[list[tuple[int, int]], np.ndarray, np.ndarray,
                                                                         dict]:
    """(pairs (gpu, job), GPU duals, job duals, stats) of a maximum-weight matching; see the module docstring.

    ``group_solver(GroupedWeights) → (GPU prices, group of each GPU or −1)`` solves the grouped
    problem of alike classes (the LP of :mod:`scheduler_core.matching.assignment`).
    """
    t0 = time.perf_counter()
    n, m = problem.n_gpus, problem.n_jobs
    if m > cfg.sparse_part_jobs:
        keys, u, stats = _start_from_parts(problem, cfg, group_solver)
    else:
        keys, u, stats = _start_from_groups(problem, cfg, group_solver)
    has = np.flatnonzero(problem.home >= 0)
    keys = np.unique(np.concatenate([keys, has * max(1, n) + problem.home[has]])) if m else np.zeros(0, np.int64)
    # 3. Exact on the arcs, priced on every pair.
    history, converged = [], False
    job_gpu = np.full(m, -1, dtype=np.int64)
    v = np.zeros(m)
    solve_s = duals_s = price_s = 0.0
    for _ in range(cfg.max_rounds):
        t = time.perf_counter()
        job_gpu, aj, ai, w = _assign(problem, keys)
        t1 = time.perf_counter()
        u, v, relax_rounds = sparse_duals(m, n, aj, ai, w, job_gpu)
        t2 = time.perf_counter()
        best, arg = best_reduced(problem, u) if m else (np.zeros(0), np.zeros(0, np.int64))
        viol = np.flatnonzero(best - v > cfg.price_tol)
        solve_s, duals_s, price_s = solve_s + t1 - t, duals_s + t2 - t1, price_s + time.perf_counter() - t2
        # The certificate's bound with these duals (weak duality; certify() computes it again, independently).
        up, vp = np.maximum(u, 0.0), np.maximum(v, 0.0)
        placed = np.flatnonzero(job_gpu >= 0)
        value = math.fsum(problem.weights_at(job_gpu[placed], placed).tolist())
        gap = math.fsum(up.tolist()) + math.fsum(vp.tolist()) + math.fsum(np.maximum(best - vp, 0.0).tolist()) - value
        history.append({"arcs": int(w.size), "violating_jobs": int(viol.size), "relaxation_rounds": relax_rounds,
                        "gap_bound": gap, "assign_s": round(t1 - t, 3)})
        if viol.size == 0:
            converged = True
            break
        if gap <= cfg.sparse_gap_rel * max(value, 0.0):
            break  # within the stated bound: the certificate carries it
        nj, ni = _arcs_of(problem, viol, u, cfg.sparse_add_arcs)
        keys = np.union1d(keys, np.concatenate([nj, viol]) * max(1, n) + np.concatenate([ni, arg[viol]]))
    pairs = sorted((int(job_gpu[j]), int(j)) for j in np.flatnonzero(job_gpu >= 0))
    stats.update({"method": "sparse", "rounds": len(history), "converged": converged,
                  "lp_arcs": history[-1]["arcs"] if history else 0, "assign_s": solve_s, "duals_s": duals_s,
                  "pricing_s": price_s, "history": history})
    return pairs, u, v, stats
