"""The round's prediction tables (scheduler_core.pair_tables) and the float32 slowdown limit.

A factorized predictor's blocks (matrix products) equal its row-by-row ``predict``;
a round with a factorized predictor equals the dense reference; comparing a float32
slowdown against ``slowdown_limit32`` is exactly ``slowdown − 1 ≤ budget``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.features import N_FEATURES, OFFLINE_SLICE, ONLINE_SLICE, SM_COLUMN
from scheduler_core.pair_tables import EmbeddedTable, _embedded
from scheduler_core.pair_weights import slowdown_limit32
from scheduler_core.predictor import PredictorConfig, train
from scheduler_core.round import RoundConfig, plan_round
from scheduler_core.round_dense import plan_round_dense
from tests.scheduler_core.test_round_dense import random_cluster, synthetic_pairs


@pytest.fixture(scope="module")
def factorized():
    torch.set_num_threads(1)
    x, yt, ys = synthetic_pairs()
    model, _ = train(x, yt, ys, PredictorConfig(arch="factorized", epochs=3, seed=1))
    return model, x


def test_embedded_blocks_equal_row_predictions(factorized) -> None:
    model, x = factorized
    rows, profs = x[:30], x[30:50]
    table = _embedded(model, rows[:, ONLINE_SLICE], rows[:, SM_COLUMN], np.zeros(30, dtype=np.int64),
                      {0: profs[:, OFFLINE_SLICE]}, np.ones(30, bool), np.ones(20, bool))
    assert isinstance(table, EmbeddedTable)
    t32, s32 = np.empty((30, 20), np.float32), np.empty((30, 20), np.float32)
    table.fill(np.arange(30), table.prepare(np.arange(20)), t32, s32)
    pairs = np.zeros((600, N_FEATURES))
    pairs[:, ONLINE_SLICE] = np.repeat(rows[:, ONLINE_SLICE], 20, axis=0)
    pairs[:, SM_COLUMN] = np.repeat(rows[:, SM_COLUMN], 20)
    pairs[:, OFFLINE_SLICE] = np.tile(profs[:, OFFLINE_SLICE], (30, 1))
    t, s = model.predict(pairs)
    np.testing.assert_array_equal(t32.reshape(-1).astype(np.float64), t)
    np.testing.assert_array_equal(s32.reshape(-1).astype(np.float64), s)
    at_t, at_s = table.at(np.repeat(np.arange(30), 20), np.tile(np.arange(20), 30))
    np.testing.assert_array_equal(at_t, t)
    np.testing.assert_array_equal(at_s, s)


def test_round_with_a_factorized_predictor_equals_the_dense_reference(factorized) -> None:
    model, _ = factorized
    gpus, jobs = random_cluster(5, 60, 45)
    preds = {"t4": model, "a10": model}
    for cfg in (RoundConfig(migration_penalty=0.05), RoundConfig(max_jobs_per_gpu=2)):
        fast = plan_round(gpus, jobs, preds, cfg)
        dense = plan_round_dense(gpus, jobs, preds, cfg)
        assert fast.certified_optimal
        assert fast.matching_objective == pytest.approx(dense.matching_objective, abs=1e-9)
        assert fast.feasible_pairs == dense.feasible_pairs


@settings(max_examples=300, deadline=None)
@given(st.floats(-2.0, 3.0, allow_nan=False), st.floats(1.0, 4.0, width=32, allow_nan=False))
def test_the_float32_limit_is_the_budget_exactly(budget, slowdown) -> None:
    """Predicted slowdowns are float32 numbers ≥ 1 (their ``− 1`` is exact)."""
    limit = slowdown_limit32(np.array([budget]))[0]
    y = np.float32(slowdown)
    assert (y <= limit) == (float(y) - 1.0 <= budget)
    # …and for the float32 numbers next to the limit.
    for z in (limit, np.nextafter(limit, np.float32(np.inf)), np.nextafter(limit, np.float32(-np.inf))):
        if z >= 1.0:
            assert (z <= limit) == (float(z) - 1.0 <= budget)
