"""Grouped-weight matching (scheduler_core.matching.assignment) and its certificate (scheduler_core.matching.certificate).

Properties on random instances with classes, homes and migration penalties:
never a GPU or job twice, never an infeasible pair, equal to brute force on
small instances and to ``linear_sum_assignment`` on medium ones, certified —
and the certificate rejects plans that are not optimal.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scheduler_core.matching.assignment import SolverConfig, solve
from scheduler_core.matching.certificate import certify, duals_from_matching
from scheduler_core.matching.grouped_weights import GroupedWeights, best_reduced
from scheduler_core.matching.dense import max_weight_matching


def make_problem(rng: np.random.Generator, n: int, m: int, k: int, p_inf: float = 0.3,
                 p_home: float = 0.4, p_pen: float = 0.5, lo: float = -0.2, fixed_pen: float | None = None
                 ) -> GroupedWeights:
    base = rng.uniform(lo, 1.0, (k, n))
    base[rng.random((k, n)) < p_inf] = -np.inf
    cls = rng.integers(0, k, m)
    home = np.where(rng.random(m) < p_home, rng.integers(0, max(n, 1), m), -1) if n else np.full(m, -1)
    pen = np.where(rng.random(m) < p_pen, rng.uniform(0.0, 0.3, m), 0.0)
    if fixed_pen is not None:  # the round's case: one penalty for every running job
        pen = np.where(home >= 0, fixed_pen, 0.0)
    hw = np.where(home >= 0, rng.uniform(-0.1, 1.0, m), -np.inf)
    if n:
        stranger = np.where(home >= 0, base[cls, np.maximum(home, 0)] - pen, -np.inf)
        hw = np.where(home >= 0, np.maximum(hw, stranger), -np.inf)
        # Some homes are feasible only for their own job (the Unhealthy-GPU case).
        lone = (home >= 0) & (rng.random(m) < 0.2)
        hw[lone] = np.maximum(hw[lone], rng.uniform(0.1, 1.0, lone.sum()))
    return GroupedWeights(base, cls, home, hw, pen)


@st.composite
def problems(draw, max_n: int = 6, max_m: int = 6, max_k: int = 4):
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(0, max_n))
    m = draw(st.integers(0, max_m))
    k = draw(st.integers(1, max_k))
    p_inf = draw(st.sampled_from([0.0, 0.3, 0.8]))
    return make_problem(np.random.default_rng(seed), n, m, k, p_inf=p_inf)


def usable(problem: GroupedWeights) -> tuple[np.ndarray, np.ndarray]:
    w = problem.to_dense()
    ok = np.isfinite(w) & (w > 0)
    return np.where(ok, w, 0.0), ok


def brute_force(w: np.ndarray, ok: np.ndarray) -> float:
    n, m = w.shape
    best = 0.0
    for choice in itertools.product([None, *range(m)], repeat=n):
        cols = [c for c in choice if c is not None]
        if len(cols) != len(set(cols)) or any(not ok[r, c] for r, c in enumerate(choice) if c is not None):
            continue
        best = max(best, sum(w[r, c] for r, c in enumerate(choice) if c is not None))
    return best


def check_valid(problem: GroupedWeights, pairs: list[tuple[int, int]]) -> None:
    gpus = [i for i, _ in pairs]
    jobs = [j for _, j in pairs]
    assert len(gpus) == len(set(gpus)), "a GPU is used twice"
    assert len(jobs) == len(set(jobs)), "a job is placed twice"
    w = problem.to_dense()
    for i, j in pairs:
        assert np.isfinite(w[i, j]) and w[i, j] > 0, f"infeasible or worthless pair ({i}, {j})"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_n=5, max_m=5))
def test_equals_brute_force_and_is_certified(problem) -> None:
    sol = solve(problem)
    check_valid(problem, sol.pairs)
    w, ok = usable(problem)
    assert sol.total == pytest.approx(sum(w[i, j] for i, j in sol.pairs), abs=1e-12)
    assert sol.total == pytest.approx(brute_force(w, ok), abs=1e-9)
    assert sol.certificate.ok and sol.certificate.gap_bound <= 1e-9


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_n=40, max_m=40, max_k=8))
def test_equals_linear_sum_assignment_on_medium_instances(problem) -> None:
    sol = solve(problem)
    check_valid(problem, sol.pairs)
    w, ok = usable(problem)
    ref = max_weight_matching(w, ok)
    assert sol.total == pytest.approx(ref.total, abs=1e-9)
    assert sol.certificate.ok


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 60), st.integers(1, 60))
def test_dense_matrices_equal_linear_sum_assignment(seed, n, m) -> None:
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.0, 1.0, (n, m))
    ok = rng.random((n, m)) < 0.6
    sol = solve(GroupedWeights.from_dense(w, ok))
    ref = max_weight_matching(w, ok)
    assert sol.total == pytest.approx(ref.total, abs=1e-9)
    assert sol.certificate.ok


def test_structured_instance_with_running_jobs_equals_dense_optimum() -> None:
    # 300 GPUs, 250 jobs in 6 classes, a third of them running with a penalty.
    rng = np.random.default_rng(7)
    problem = make_problem(rng, 300, 250, 6, p_inf=0.2, p_home=0.35, lo=0.0, fixed_pen=0.05)
    sol = solve(problem)
    w, ok = usable(problem)
    assert sol.total == pytest.approx(max_weight_matching(w, ok).total, abs=1e-9)
    assert sol.certificate.ok and sol.certificate.pairs_checked == int(np.isfinite(problem.to_dense()).sum())
    assert sol.stats["nodes"] <= 12  # jobs grouped by (class, penalty), not one node each


def test_identical_jobs_are_one_node_and_plain_running_jobs_stay_home() -> None:
    # Three identical GPUs and three identical jobs; two of them already run (no penalty).
    base = np.array([[0.5, 0.5, 0.5]])
    problem = GroupedWeights(base, [0, 0, 0], [-1, 2, 0], [-np.inf, 0.5, 0.5], [0.0, 0.0, 0.0])
    sol = solve(problem)
    assert sol.stats["nodes"] == 1
    assert sorted(sol.pairs) == [(0, 2), (1, 0), (2, 1)]  # jobs 1 and 2 keep GPUs 2 and 0


def test_deterministic() -> None:
    problem = make_problem(np.random.default_rng(3), 80, 60, 5)
    a, b = solve(problem), solve(problem)
    assert a.pairs == b.pairs and a.total == b.total


def test_empty_and_infeasible_instances() -> None:
    for n, m in [(0, 0), (0, 3), (4, 0)]:
        sol = solve(GroupedWeights.from_dense(np.zeros((n, m)), np.zeros((n, m), dtype=bool)))
        assert sol.pairs == [] and sol.total == 0.0 and sol.certificate.ok
    sol = solve(GroupedWeights.from_dense(np.ones((3, 3)), np.zeros((3, 3), dtype=bool)))
    assert sol.pairs == [] and sol.certificate.ok
    # Weights ≤ 0 are never worth a match.
    sol = solve(GroupedWeights.from_dense(np.array([[0.0, -0.5]]), np.ones((1, 2), dtype=bool)))
    assert sol.pairs == [] and sol.certificate.ok


# -- the certificate ---------------------------------------------------------------------


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_n=8, max_m=8), st.integers(0, 10**6))
def test_certificate_rejects_a_perturbed_plan(problem, pick) -> None:
    sol = solve(problem)
    assume(sol.pairs)
    w = problem.to_dense()
    # Drop one match: a strictly worse plan.
    i, j = sol.pairs[pick % len(sol.pairs)]
    worse = [p for p in sol.pairs if p != (i, j)]
    cert = certify(problem, worse, sol.gpu_duals, sol.job_duals)
    assert not cert.ok and cert.gap_bound >= w[i, j] - 1e-9
    # Nor can duals built for the worse plan itself certify it.
    u, v = duals_from_matching(problem, worse)
    assert not certify(problem, worse, u, v).ok


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_n=6, max_m=6), st.integers(0, 10**6))
def test_certificate_rejects_any_strictly_worse_plan(problem, seed) -> None:
    """Any other valid plan worth less than the optimum by more than the tolerance is rejected, whatever duals."""
    sol = solve(problem)
    w, ok = usable(problem)
    rng = np.random.default_rng(seed)
    # A random valid plan: greedy over a random order of usable pairs.
    cand = [tuple(map(int, p)) for p in np.argwhere(ok)]
    rng.shuffle(cand)
    used_i, used_j, plan = set(), set(), []
    for i, j in cand:
        if i not in used_i and j not in used_j and rng.random() < 0.7:
            plan.append((i, j))
            used_i.add(i)
            used_j.add(j)
    value = sum(w[i, j] for i, j in plan)
    for u, v in [(sol.gpu_duals, sol.job_duals), duals_from_matching(problem, plan),
                 (rng.uniform(0, 1, problem.n_gpus), rng.uniform(0, 1, problem.n_jobs))]:
        cert = certify(problem, plan, u, v)
        assert cert.dual_bound >= sol.total - 1e-9  # weak duality: never below the optimum
        if value < sol.total - 1e-6:
            assert not cert.ok


def test_certificate_rejects_invalid_plans() -> None:
    w = np.array([[0.3, 0.8, 0.0], [0.8, 0.0, 0.4]])
    ok = np.array([[True, True, False], [True, False, True]])
    problem = GroupedWeights.from_dense(w, ok)
    sol = solve(problem)
    assert sorted(sol.pairs) == [(0, 1), (1, 0)] and sol.total == pytest.approx(1.6)
    u, v = sol.gpu_duals, sol.job_duals
    assert certify(problem, sol.pairs, u, v).ok
    assert "GPU is matched twice" in certify(problem, [(0, 1), (0, 0)], u, v).reason
    assert "job is matched twice" in certify(problem, [(0, 0), (1, 0)], u, v).reason
    assert "infeasible" in certify(problem, [(0, 2)], u, v).reason
    assert "outside" in certify(problem, [(5, 0)], u, v).reason
    assert not certify(problem, sol.pairs, u, np.full(3, math.nan)).ok
    with pytest.raises(ValueError):
        certify(problem, sol.pairs, u[:1], v)


def test_certificate_of_linear_sum_assignment_via_duals_from_matching() -> None:
    rng = np.random.default_rng(11)
    w = rng.uniform(0, 1, (30, 20))
    ok = rng.random((30, 20)) < 0.5
    problem = GroupedWeights.from_dense(w, ok)
    ref = max_weight_matching(w, ok)
    u, v = duals_from_matching(problem, ref.pairs)
    cert = certify(problem, ref.pairs, u, v)
    assert cert.ok and cert.value == pytest.approx(ref.total) and cert.max_violation <= 1e-12


# -- the weight model ----------------------------------------------------------------------


def test_weights_at_and_dense_agree() -> None:
    problem = make_problem(np.random.default_rng(5), 7, 9, 3)
    dense = problem.to_dense()
    i, j = np.meshgrid(np.arange(7), np.arange(9), indexing="ij")
    np.testing.assert_array_equal(problem.weights_at(i.ravel(), j.ravel()).reshape(7, 9), dense)
    assert problem.feasible_pair_count() == int(np.isfinite(dense).sum())


def test_best_reduced_is_the_row_maximum() -> None:
    rng = np.random.default_rng(9)
    problem = make_problem(rng, 12, 15, 4)
    u = rng.uniform(0, 0.5, 12)
    best, arg = best_reduced(problem, u)
    red = problem.to_dense() - u[:, None]
    np.testing.assert_allclose(best, red.max(axis=0))
    finite = np.isfinite(best)
    np.testing.assert_allclose(red[arg[finite], np.flatnonzero(finite)], best[finite])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"base": np.array([[np.nan]])}, "finite or −inf"),
        ({"base": np.array([[np.inf]])}, "finite or −inf"),
        ({"job_class": [1]}, "job_class"),
        ({"home": [3]}, "home"),
        ({"penalty": [-0.1]}, "penalties"),
        ({"home": [0], "home_weight": [0.1], "penalty": [0.0]}, "home weight"),  # below the class's 0.5 there
        ({"penalty": [0.0, 0.0]}, "entries"),
    ],
)
def test_invalid_weights_are_refused(kwargs, message) -> None:
    args = {"base": np.array([[0.5]]), "job_class": [0], "home": [-1], "home_weight": [-np.inf], "penalty": [0.0]}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        GroupedWeights(**args)


def test_solver_reports_lp_rounds_and_certificate() -> None:
    problem = make_problem(np.random.default_rng(2), 50, 40, 4, lo=0.0)
    sol = solve(problem, SolverConfig(max_rounds=60))
    assert sol.stats["converged"] and sol.stats["rounds"] >= 1
    assert sol.certificate.as_dict()["ok"] is True


def test_falls_back_to_dense_km_if_the_lp_fails(monkeypatch) -> None:
    from scheduler_core.matching import assignment

    def broken(*_args, **_kwargs):
        raise RuntimeError("no integral optimum")

    monkeypatch.setattr(assignment, "_solve_lp", broken)
    problem = make_problem(np.random.default_rng(12), 20, 15, 3, lo=0.0)
    sol = solve(problem)
    w, ok = usable(problem)
    assert sol.stats["fallback"] == "dense" and sol.certificate.ok
    assert sol.total == pytest.approx(max_weight_matching(w, ok).total, abs=1e-9)
