"""Exact maximum-weight matching on grouped weights, certified (paper §5, Alg. 1, at 20,000 GPUs).

Kuhn–Munkres on the full graph is O(|V|³) and needs the dense weight matrix;
the paper reports minutes for thousands of workloads. This solver uses the
structure of a round instead:

1. **Nodes.** Jobs of one class with the same migration penalty are
   interchangeable except at their own GPUs, so they form one node with a
   supply (how many of them) and a few per-GPU *home* weights. The matching
   becomes a transportation problem between a few hundred nodes and the GPUs.
2. **Prices.** An auction between nodes and GPUs (Bertsekas, with
   ε = ``auction_eps``) gives approximate prices in about a second; they pick
   the candidate arcs — each node's best GPUs, each GPU's best node, and the
   auction's own plan.
3. **Column generation.** Solve the transportation LP (HiGHS interior point
   with crossover: a vertex, hence integral, because the constraint matrix is
   totally unimodular) over the candidates. Its duals price *every* pair, by
   class (:func:`~scheduler_core.matching.grouped_weights.best_reduced`); arcs with
   positive reduced weight join and the LP is solved again, until none is
   left. Then the duals are feasible on the whole graph: the matching is
   optimal (LP duality).
4. **Certificate.** The job-level matching and duals are checked by
   :func:`~scheduler_core.matching.certificate.certify`, which trusts nothing above.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from scheduler_core.matching.certificate import DEFAULT_GAP_TOL, Certificate, certify, duals_from_matching
from scheduler_core.matching.dense import max_weight_matching
from scheduler_core.matching.grouped_weights import GroupedWeights, class_max
from scheduler_core.matching.sparse import solve_sparse

# Largest instance (GPUs × jobs) solved densely if the LP ever fails.
DENSE_FALLBACK_PAIRS = 25_000_000


@dataclass(frozen=True)
class SolverConfig:
    gap_tol: float = DEFAULT_GAP_TOL  # certificate: optimum − value ≤ this
    price_tol: float = 1e-9  # reduced weight above which a pair joins the LP
    auction_eps: float = 0.01  # bid increment of the pricing auction (weights are in [0, 1])
    auction_max_rounds: int = 5000
    candidate_slack: float = 0.0  # arcs within this of a class's best value start in the LP
    extra_arcs: int = 4  # per node, beyond its supply
    gpu_best_classes: int = 1  # 1: an initial arc from each GPU to its best node …
    gpu_best_floor: float = -0.01  # … if its value (weight − node price − GPU price) is at least this
    add_per_node: int = 8  # arcs a violating node may add per round (plus its supply)
    max_rounds: int = 60
    # Above this many nodes (jobs that do not group: a profile per job), scheduler_core.matching.sparse.
    sparse_min_nodes: int = 1000
    sparse_groups: int = 200  # groups of alike classes whose LP prices the GPUs
    sparse_top_arcs: int = 64  # initial arcs per job: its best GPUs at the groups' prices …
    sparse_group_arcs: int = 64  # … and its best of the GPUs its group got
    sparse_part_jobs: int = 1250  # above this many jobs, start from random parts of about this many
    sparse_top_arcs_join: int = 24  # arcs per job when the parts are joined (at the parts' prices)
    sparse_add_arcs: int = 24  # arcs a job with a positive reduced weight adds per round
    # Stop adding arcs once the certified gap is within this fraction of the matching's value
    # (0: until optimal). The round states the gap it stopped at.
    sparse_gap_rel: float = 1e-3


@dataclass(frozen=True, eq=False)
class Solution:
    pairs: list[tuple[int, int]]  # (gpu, job), sorted by gpu
    total: float
    gpu_duals: np.ndarray
    job_duals: np.ndarray
    certificate: Certificate
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class _Nodes:
    base: np.ndarray
    cls: np.ndarray  # (A,) class of each node
    pen: np.ndarray  # (A,) penalty of each node
    supply: np.ndarray  # (A,)
    members: list[np.ndarray]  # jobs of each node, in job order
    job_node: np.ndarray  # (m,)
    ov_node: np.ndarray  # home weights that beat the node's row: (node, gpu, weight, job)
    ov_gpu: np.ndarray
    ov_w: np.ndarray
    ov_key: np.ndarray  # node * n + gpu, sorted
    main: np.ndarray  # (K,) the node of each class with the smallest penalty (−1: none)

    @property
    def n(self) -> int:
        return int(self.base.shape[1])

    def weights(self, nodes: np.ndarray, gpus: np.ndarray) -> np.ndarray:
        w = self.base[self.cls[nodes], gpus] - self.pen[nodes]
        if self.ov_key.size:
            key = nodes * max(1, self.n) + gpus
            pos = np.minimum(np.searchsorted(self.ov_key, key), self.ov_key.size - 1)
            hit = self.ov_key[pos] == key
            w[hit] = self.ov_w[pos[hit]]
        return w


def _nodes(problem: GroupedWeights) -> _Nodes:
    k, h, p, hw = problem.job_class, problem.home, problem.penalty, problem.home_weight
    n, m = problem.n_gpus, problem.n_jobs
    keys = np.column_stack([k.astype(np.float64), p])
    if m:
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
    else:
        uniq, inv = keys.reshape(0, 2), np.zeros(0, dtype=np.int64)
    cls, pen = uniq[:, 0].astype(np.int64), uniq[:, 1]
    supply = np.bincount(inv, minlength=cls.size).astype(np.int64)
    order = np.argsort(inv, kind="stable")
    members = np.split(order, np.cumsum(supply)[:-1]) if supply.size else []
    # Homes worth more than the node's row there (a penalised job staying put, or
    # a job on an Unhealthy GPU): one arc per (node, GPU) at the best member's weight.
    has = np.flatnonzero(h >= 0)
    if has.size:
        row = problem.base[k[has], h[has]] - p[has]
        has = has[hw[has] > row]
    ov_key = inv[has] * max(1, n) + h[has]
    order = np.lexsort((-hw[has], ov_key))
    ov_key, has = ov_key[order], has[order]
    first = np.r_[True, ov_key[1:] != ov_key[:-1]] if ov_key.size else np.zeros(0, dtype=bool)
    ov_key, has = ov_key[first], has[first]
    main = np.full(problem.n_classes, -1, dtype=np.int64)
    for a in np.lexsort((np.arange(cls.size), -pen)):  # ends with the smallest penalty per class
        main[cls[a]] = a
    return _Nodes(problem.base, cls, pen, supply, members, inv, inv[has], h[has], hw[has], ov_key, main)


def _top(row: np.ndarray, count: int) -> np.ndarray:
    """Indices of the ``count`` largest finite entries of ``row``, largest first, ties by index."""
    count = min(count, row.size)
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    part = np.argpartition(-row, count - 1)[:count] if count < row.size else np.arange(row.size)
    part = part[np.isfinite(row[part])]
    return part[np.lexsort((part, -row[part]))]


def _node_row(nodes: _Nodes, a: int, u: np.ndarray, ov_start: np.ndarray) -> np.ndarray:
    """Node ``a``'s weight − price on every GPU (−inf where infeasible)."""
    val = nodes.base[nodes.cls[a]] - nodes.pen[a] - u
    lo, hi = ov_start[a], ov_start[a + 1]
    if hi > lo:
        g = nodes.ov_gpu[lo:hi]
        val[g] = nodes.ov_w[lo:hi] - u[g]
    return val


def _auction(nodes: _Nodes, cfg: SolverConfig) -> tuple[np.ndarray, np.ndarray, int]:
    """Approximate GPU prices from a forward auction between nodes (units) and GPUs.

    Units of one node rank GPUs alike, so a node with q unassigned units bids
    on its q best GPUs at once (Bertsekas's "similar persons"), each bid
    raising the GPU's price to leave the unit ε below its next option. Only
    the prices and the assignment (a feasible plan the LP can always fall back
    on) are used, to choose candidate arcs; optimality comes later.
    """
    n = nodes.n
    q = nodes.supply.copy()
    u = np.zeros(n)
    owner = np.full(n, -1, dtype=np.int64)
    rounds = 0
    if n == 0:
        return u, owner, 0
    ov_start = np.searchsorted(nodes.ov_node, np.arange(nodes.supply.size + 1))
    while rounds < cfg.auction_max_rounds:
        active = np.flatnonzero(q > 0)
        if active.size == 0:
            break
        rounds += 1
        bids_g, bids_p, bids_a = [], [], []
        for a in active:
            val = _node_row(nodes, a, u, ov_start)
            val[owner == a] = -np.inf
            qa = int(q[a])
            top = _top(val, qa + 1)
            vals = val[top]
            beta = max(float(vals[qa]), 0.0) if top.size > qa else 0.0
            keep = vals[:qa] > 0
            good = top[:qa][keep]
            q[a] = good.size  # units with no positive option stay unmatched
            bids_g.append(good)
            bids_p.append(vals[:qa][keep] + u[good] - beta + cfg.auction_eps)
            bids_a.append(np.full(good.size, a))
        g = np.concatenate(bids_g)
        if g.size == 0:
            break
        b, aa = np.concatenate(bids_p), np.concatenate(bids_a)
        order = np.lexsort((-b, g))
        g, b, aa = g[order], b[order], aa[order]
        first = np.r_[True, g[1:] != g[:-1]]
        g, b, aa = g[first], b[first], aa[first]
        prev = owner[g]
        np.add.at(q, prev[prev >= 0], 1)
        np.add.at(q, aa, -1)
        owner[g] = aa
        u[g] = b
    return u, owner, rounds


def _initial_arcs(nodes: _Nodes, u: np.ndarray, owner: np.ndarray, cfg: SolverConfig):
    n = nodes.n
    owned = np.flatnonzero(owner >= 0)
    an, ag = [nodes.ov_node, owner[owned]], [nodes.ov_gpu, owned]  # homes and the auction's plan
    classes = np.unique(nodes.cls)
    best, _ = class_max(nodes.base, u, classes)
    for kk in classes:
        row = nodes.base[kk] - u
        near = int(np.count_nonzero(row >= max(best[kk], 0.0) - cfg.candidate_slack))
        for a in np.flatnonzero(nodes.cls == kk):
            s = int(nodes.supply[a])
            top = _top(row, min(max(near, s), 2 * s) + cfg.extra_arcs)
            an.append(np.full(top.size, a))
            ag.append(top)
    if n and cfg.gpu_best_classes:
        # Each GPU's best node at the node prices the auction implies.
        v = np.maximum(_node_best(nodes, u), 0.0)
        a_best, val = _gpu_best_node(nodes, u, v)
        ok = np.flatnonzero(val >= cfg.gpu_best_floor)
        an.append(a_best[ok])
        ag.append(ok)
    return np.concatenate(an), np.concatenate(ag)


def _gpu_best_node(nodes: _Nodes, u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per GPU: the node maximising weight − v − u (home weights aside) and that value."""
    n = nodes.n
    if nodes.cls.size == 0:
        return np.full(n, -1, dtype=np.int64), np.full(n, -np.inf)
    k_count = nodes.base.shape[0]
    offset = np.full(k_count, -np.inf)
    np.maximum.at(offset, nodes.cls, -nodes.pen - v)
    best_node = np.full(k_count, -1, dtype=np.int64)
    for a in np.lexsort((np.arange(nodes.cls.size), -nodes.pen - v)):
        best_node[nodes.cls[a]] = a
    best_val = np.full(n, -np.inf)
    best_cls = np.zeros(n, dtype=np.int64)
    live = np.flatnonzero(np.isfinite(offset))
    for start in range(0, live.size, 64):
        ks = live[start : start + 64]
        score = nodes.base[ks] + offset[ks, None] - u
        idx = np.argmax(score, axis=0)
        val = score[idx, np.arange(n)]
        better = val > best_val
        best_val[better], best_cls[better] = val[better], ks[idx[better]]
    return best_node[best_cls], best_val


class _ArcSet:
    def __init__(self, n_gpus: int):
        self.n = max(1, n_gpus)
        self.keys = np.zeros(0, dtype=np.int64)

    def add(self, nodes: np.ndarray, gpus: np.ndarray) -> int:
        new = np.unique(np.asarray(nodes, dtype=np.int64) * self.n + np.asarray(gpus, dtype=np.int64))
        new = new[~np.isin(new, self.keys, assume_unique=True)]
        if new.size:
            self.keys = np.union1d(self.keys, new)
        return int(new.size)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self.keys // self.n, self.keys % self.n


def _solve_lp(nodes: _Nodes, arc_node: np.ndarray, arc_gpu: np.ndarray, arc_w: np.ndarray):
    n = nodes.n
    a_count = nodes.supply.size
    gpus_used, gpu_row = np.unique(arc_gpu, return_inverse=True)
    e = arc_w.size
    rows = np.concatenate([arc_node, a_count + gpu_row.reshape(-1)])
    cols = np.concatenate([np.arange(e), np.arange(e)])
    mat = sp.csc_matrix((np.ones(2 * e), (rows, cols)), shape=(a_count + gpus_used.size, e))
    rhs = np.concatenate([nodes.supply.astype(np.float64), np.ones(gpus_used.size)])
    opts = {"dual_feasibility_tolerance": 1e-10, "primal_feasibility_tolerance": 1e-10}
    for method in ("highs-ipm", "highs-ds"):
        res = linprog(-arc_w, A_ub=mat, b_ub=rhs, bounds=(0, None), method=method, options=opts)
        if res.status == 0:
            x = np.rint(res.x)
            if np.max(np.abs(res.x - x), initial=0.0) <= 1e-6:
                duals = -np.asarray(res.ineqlin.marginals)
                u = np.zeros(n)
                u[gpus_used] = np.maximum(duals[a_count:], 0.0)
                return x.astype(np.int64), u, np.maximum(duals[:a_count], 0.0)
    raise RuntimeError("the transportation LP did not return an integral optimum")


def _node_best(nodes: _Nodes, u: np.ndarray) -> np.ndarray:
    """Per node: max over GPUs of (weight − u)."""
    top1, _ = class_max(nodes.base, u, np.unique(nodes.cls))
    best = top1[nodes.cls] - nodes.pen
    if nodes.ov_node.size:
        np.maximum.at(best, nodes.ov_node, nodes.ov_w - u[nodes.ov_gpu])
    return best


def _price(nodes: _Nodes, u: np.ndarray, v: np.ndarray, cfg: SolverConfig, arcs: _ArcSet) -> tuple[int, int]:
    """Add arcs with positive reduced weight; return (violating nodes, arcs added)."""
    n = nodes.n
    tol = cfg.price_tol
    viol = np.flatnonzero(_node_best(nodes, u) - v > tol)
    if viol.size == 0:
        return 0, 0
    new_n, new_g = [], []
    take = cfg.add_per_node + nodes.supply
    for kk in np.unique(nodes.cls[viol]):
        row = nodes.base[kk] - u
        here = viol[nodes.cls[viol] == kk]
        top = _top(row, int(take[here].max()))
        for a in here:
            pick = top[row[top] - nodes.pen[a] > v[a] + tol][: take[a]]
            new_n.append(np.full(pick.size, a))
            new_g.append(pick)
    if nodes.ov_node.size:
        hot = nodes.ov_w - u[nodes.ov_gpu] - v[nodes.ov_node] > tol
        new_n.append(nodes.ov_node[hot])
        new_g.append(nodes.ov_gpu[hot])
    # Each GPU's best node at the current node prices.
    if n:
        a_best, val = _gpu_best_node(nodes, u, v)
        hot_gpu = np.flatnonzero(val > tol)
        new_n.append(a_best[hot_gpu])
        new_g.append(hot_gpu)
    added = arcs.add(np.concatenate(new_n), np.concatenate(new_g)) if new_n else 0
    return int(viol.size), added


def _expand(nodes: _Nodes, problem: GroupedWeights, arc_node, arc_gpu, x) -> list[tuple[int, int]]:
    """Node flows → job pairs. A member goes to its own GPU when its node was given it."""
    used = x > 0
    node_of, gpu_of = arc_node[used], arc_gpu[used]
    order = np.lexsort((gpu_of, node_of))
    node_of, gpu_of = node_of[order], gpu_of[order]
    bounds = np.searchsorted(node_of, np.arange(nodes.supply.size + 1))
    pairs: list[tuple[int, int]] = []
    for a in np.unique(node_of):
        gpus = gpu_of[bounds[a] : bounds[a + 1]]
        members = nodes.members[a]
        if gpus.size == 1 and members.size == 1:
            pairs.append((int(gpus[0]), int(members[0])))
            continue
        free = np.ones(gpus.size, dtype=bool)
        taken = np.zeros(members.size, dtype=bool)
        homes = problem.home[members]
        # Best home weight first, so a GPU that is two members' home goes to the one the arc was priced for.
        for q in np.lexsort((np.arange(members.size), -problem.home_weight[members])):
            if homes[q] < 0:
                continue
            hit = np.flatnonzero((gpus == homes[q]) & free)
            if hit.size:
                free[hit[0]], taken[q] = False, True
                pairs.append((int(gpus[hit[0]]), int(members[q])))
        for g, j in zip(gpus[free], members[~taken]):
            pairs.append((int(g), int(j)))
    pairs.sort()
    return pairs


def _dense_fallback(problem: GroupedWeights, cfg: SolverConfig, t0: float) -> Solution:
    """Kuhn–Munkres on the dense matrix, certified the same way (duals rebuilt from the matching)."""
    w = problem.to_dense()
    ok = np.isfinite(w) & (w > 0)
    match = max_weight_matching(np.where(ok, w, 0.0), ok)
    pairs = sorted(match.pairs)
    u, v = duals_from_matching(problem, pairs)
    cert = certify(problem, pairs, u, v, cfg.gap_tol)
    stats = {"nodes": 0, "rounds": 0, "converged": cert.ok, "duals_from": "relaxation", "fallback": "dense",
             "total_s": time.perf_counter() - t0, "history": []}
    return Solution(pairs, cert.value, u, v, cert, stats)


def _solve_sparse(problem: GroupedWeights, cfg: SolverConfig, t0: float) -> Solution:
    """Many nodes: :mod:`scheduler_core.matching.sparse`, certified the same way."""
    def group_prices(p: GroupedWeights) -> tuple[np.ndarray, np.ndarray]:
        # The grouped LP's GPU duals and which group each GPU went to: they choose the arcs.
        sol = _solve_grouped(p, cfg, time.perf_counter(), _nodes(p))
        got = np.full(p.n_gpus, -1, dtype=np.int64)
        for i, j in sol.pairs:
            got[i] = p.job_class[j]
        return sol.gpu_duals, got

    pairs, u, v, stats = solve_sparse(problem, cfg, group_prices)
    t = time.perf_counter()
    cert = certify(problem, pairs, u, v, cfg.gap_tol)
    stats["duals_from"] = "relaxation"
    stats["certify_s"] = time.perf_counter() - t
    arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    total = math.fsum(problem.weights_at(arr[:, 0], arr[:, 1]).tolist()) if pairs else 0.0
    stats["total_s"] = time.perf_counter() - t0
    return Solution(pairs, total, u, v, cert, stats)


def solve(problem: GroupedWeights, cfg: SolverConfig = SolverConfig()) -> Solution:
    """Maximum-weight matching of GPUs to jobs over pairs with positive weight, with its certificate."""
    t0 = time.perf_counter()
    nodes = _nodes(problem)
    if nodes.supply.size > cfg.sparse_min_nodes:
        return _solve_sparse(problem, cfg, t0)
    return _solve_grouped(problem, cfg, t0, nodes)


def _solve_grouped(problem: GroupedWeights, cfg: SolverConfig, t0: float, nodes: _Nodes) -> Solution:
    """The transportation LP between nodes and GPUs, by column generation (module docstring)."""
    n = problem.n_gpus
    u_auction, owner, auction_rounds = _auction(nodes, cfg)
    t_auction = time.perf_counter()
    arcs = _ArcSet(n)
    arcs.add(*_initial_arcs(nodes, u_auction, owner, cfg))
    u, v = np.zeros(n), np.zeros(nodes.supply.size)
    x = arc_node = arc_gpu = np.zeros(0, dtype=np.int64)
    rounds, lp_s, price_s, converged, history = 0, 0.0, 0.0, False, []
    while rounds < cfg.max_rounds:
        rounds += 1
        arc_node, arc_gpu = arcs.arrays()
        w = nodes.weights(arc_node, arc_gpu)
        keep = w > 0
        arc_node, arc_gpu, w = arc_node[keep], arc_gpu[keep], w[keep]
        t = time.perf_counter()
        if w.size:
            try:
                x, u, v = _solve_lp(nodes, arc_node, arc_gpu, w)
            except RuntimeError:
                if problem.n_gpus * problem.n_jobs > DENSE_FALLBACK_PAIRS:
                    raise
                return _dense_fallback(problem, cfg, t0)
        else:
            x, u, v = np.zeros(0, dtype=np.int64), np.zeros(n), np.zeros(nodes.supply.size)
        lp_s += time.perf_counter() - t
        t = time.perf_counter()
        violating, added = _price(nodes, u, v, cfg, arcs)
        price_s += time.perf_counter() - t
        history.append({"arcs": int(w.size), "violating_nodes": violating, "added": added})
        if violating == 0 or added == 0:
            converged = violating == 0
            break
    pairs = _expand(nodes, problem, arc_node, arc_gpu, x)
    job_v = v[nodes.job_node] if problem.n_jobs else np.zeros(0)
    t = time.perf_counter()
    cert = certify(problem, pairs, u, job_v, cfg.gap_tol)
    duals_from = "lp"
    if not cert.ok and cert.reason.startswith("duality gap"):
        # LP duals off by its tolerance: rebuild them from the matching alone.
        u2, v2 = duals_from_matching(problem, pairs)
        cert2 = certify(problem, pairs, u2, v2, cfg.gap_tol)
        if cert2.gap_bound < cert.gap_bound:
            u, job_v, cert, duals_from = u2, v2, cert2, "relaxation"
    cert_s = time.perf_counter() - t
    arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    total = math.fsum(problem.weights_at(arr[:, 0], arr[:, 1]).tolist()) if pairs else 0.0
    stats = {
        "nodes": int(nodes.supply.size), "auction_rounds": auction_rounds, "auction_s": t_auction - t0,
        "rounds": rounds, "converged": converged, "lp_arcs": int(arc_node.size), "lp_s": lp_s,
        "pricing_s": price_s, "certify_s": cert_s, "duals_from": duals_from,
        "total_s": time.perf_counter() - t0, "history": history,
    }
    return Solution(pairs, total, u, job_v, cert, stats)
