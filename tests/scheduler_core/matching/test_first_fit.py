"""First fit (the MuxFlow-M ablation): same feasibility as the matching, no optimisation."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_core.matching.first_fit import first_fit
from scheduler_core.matching.grouped_weights import GroupedWeights
from scheduler_core.matching.dense import max_weight_matching
from scheduler_core.round.plan import RoundConfig

NEG = -np.inf


def test_first_fit_takes_the_first_feasible_gpu_where_the_matching_looks_further() -> None:
    # GPU 0: job 0 → 0.5, job 1 → 0.4; GPU 1: job 0 → 0.9, job 1 infeasible.
    w = np.array([[0.5, 0.4], [0.9, NEG]])
    problem = GroupedWeights.from_dense(np.where(np.isfinite(w), w, 0.0), np.isfinite(w))
    pairs, total, stats = first_fit(problem)
    assert pairs == [(0, 0)] and total == pytest.approx(0.5) and stats["method"] == "first_fit"
    best = max_weight_matching(np.where(np.isfinite(w), w, 0.0), np.isfinite(w))
    assert sorted(best.pairs) == [(0, 1), (1, 0)] and best.total == pytest.approx(1.3)


def test_running_jobs_stay_where_still_feasible_and_queue_order_is_kept() -> None:
    base = np.array([[0.6, 0.6, 0.6]])  # one class, three GPUs
    problem = GroupedWeights(base, job_class=np.zeros(3, dtype=np.int64), home=np.array([-1, 2, -1]),
                             home_weight=np.array([NEG, 0.6, NEG]), penalty=np.zeros(3))
    pairs, _, _ = first_fit(problem)
    assert dict((j, i) for i, j in pairs) == {1: 2, 0: 0, 2: 1}
    pairs, _, _ = first_fit(problem, order=np.array([2, 0, 1]))
    assert dict((j, i) for i, j in pairs) == {1: 2, 2: 0, 0: 1}


def test_a_gpu_that_admits_the_dynamic_share_comes_before_a_fallback_share() -> None:
    base = np.array([[0.3, 0.7]])
    levels = np.array([[2, 0]], dtype=np.int8)  # GPU 0 admits the job only at a fallback share
    problem = GroupedWeights(base, np.zeros(1, dtype=np.int64), np.array([-1]), np.array([NEG]), np.zeros(1))
    assert first_fit(problem)[0] == [(0, 0)]
    assert first_fit(problem, levels=levels)[0] == [(1, 0)]


def test_unknown_matcher_is_refused() -> None:
    with pytest.raises(ValueError, match="matcher must be one of km, first_fit"):
        RoundConfig(matcher="greedy")
