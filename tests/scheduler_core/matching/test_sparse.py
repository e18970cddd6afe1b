"""The matching when jobs do not group (scheduler_core.matching.sparse): every job its own class.

Random instances with homes and penalties, solved on the sparse path (forced by a
small ``sparse_min_nodes``), from groups and from parts: equal to
``linear_sum_assignment`` when run to optimality, certified; stopped early, the
certificate bounds the gap and the bound is what the solver stated.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_core.matching.assignment import SolverConfig, solve
from scheduler_core.matching.sparse import sparse_duals
from scheduler_core.matching.certificate import certify
from scheduler_core.matching.grouped_weights import GroupedWeights
from scheduler_core.matching.dense import max_weight_matching
from tests.scheduler_core.matching.test_assignment import check_valid, make_problem, usable

SPARSE = SolverConfig(sparse_min_nodes=8, sparse_groups=6, sparse_top_arcs=4, sparse_group_arcs=4,
                      sparse_part_jobs=25, sparse_top_arcs_join=3, sparse_add_arcs=3, sparse_gap_rel=0.0)


def distinct_problem(seed: int, n: int, m: int, **kw) -> GroupedWeights:
    """Every job its own class, rows alike by job 'type' (as profiles of one job type are) plus noise."""
    rng = np.random.default_rng(seed)
    p = make_problem(rng, n, m, m, **kw)
    types = rng.uniform(0.1, 1.0, (4, n))
    rows = types[rng.integers(0, 4, m)] * rng.uniform(0.95, 1.05, (m, n))
    base = np.where(np.isfinite(p.base), rows, -np.inf)
    has = p.home >= 0
    stranger = np.where(has, base[np.arange(m), np.maximum(p.home, 0)] - p.penalty, -np.inf)
    hw = np.where(has, np.maximum(p.home_weight, stranger), -np.inf)
    return GroupedWeights(base, np.arange(m), p.home, hw, p.penalty)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31 - 1), st.integers(1, 70), st.integers(9, 60), st.sampled_from([0.0, 0.3]))
def test_sparse_path_equals_linear_sum_assignment(seed, n, m, p_inf) -> None:
    problem = distinct_problem(seed, n, m, p_inf=p_inf)
    sol = solve(problem, SPARSE)
    assert sol.stats["method"] == "sparse"
    assert sol.stats["start"] == ("parts" if m > SPARSE.sparse_part_jobs else "groups")
    check_valid(problem, sol.pairs)
    assert sol.certificate.ok, sol.certificate.reason
    w, ok = usable(problem)
    assert sol.total == pytest.approx(max_weight_matching(w, ok).total, abs=1e-9)


def test_stopping_early_states_a_bound_the_certificate_confirms() -> None:
    problem = distinct_problem(3, 300, 200, p_inf=0.1)
    cfg = SolverConfig(**{**SPARSE.__dict__, "sparse_gap_rel": 0.05, "sparse_add_arcs": 1, "sparse_top_arcs_join": 1})
    sol = solve(problem, cfg)
    again = certify(problem, sol.pairs, sol.gpu_duals, sol.job_duals)
    assert again.gap_bound == pytest.approx(sol.certificate.gap_bound)
    assert sol.stats["history"][-1]["gap_bound"] == pytest.approx(sol.certificate.gap_bound, rel=1e-9, abs=1e-9)
    w, ok = usable(problem)
    best = max_weight_matching(w, ok).total
    assert best - sol.total <= sol.certificate.gap_bound + 1e-9  # the bound holds
    assert sol.certificate.gap_bound <= 0.05 * sol.total or sol.stats["converged"]


def test_duals_of_an_optimal_matching_are_complementary_on_the_arcs() -> None:
    # Two jobs, three GPUs; job 0 prefers GPU 0 (0.9) over GPU 1 (0.5); job 1 has GPU 0 (0.8) and GPU 2 (0.1).
    arc_j = np.array([0, 0, 1, 1])
    arc_i = np.array([0, 1, 0, 2])
    arc_w = np.array([0.9, 0.5, 0.8, 0.1])
    job_gpu = np.array([1, 0])  # 0.5 + 0.8 = 1.3 > 0.9 + 0.1
    u, v, _ = sparse_duals(2, 3, arc_j, arc_i, arc_w, job_gpu)
    red = arc_w - u[arc_i] - v[arc_j]
    assert (red <= 1e-12).all()
    assert red[1] == pytest.approx(0.0) and red[2] == pytest.approx(0.0)  # matched arcs are tight
    assert u[2] == 0.0 and (u >= 0).all() and (v >= 0).all()
