"""The round's prediction tables (scheduler_core.prediction.pair_tables) and the float32 slowdown limit.

A factorized predictor's blocks (matrix products) equal its row-by-row ``predict``;
so do the MLP's pairs predicted on demand (MlpTable), mask or not; a round with
either equals the dense reference, and the on-demand table predicts only pairs
that fit and have no feasible larger share; comparing a float32 slowdown against
``slowdown_limit32`` is exactly ``slowdown − 1 ≤ budget``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.domain import GpuHealth
from scheduler_core.prediction.features import N_FEATURES, OFFLINE_SLICE, ONLINE_SLICE, SM_COLUMN
import scheduler_core.prediction.pair_tables as pair_tables
from scheduler_core.prediction.pair_tables import EmbeddedTable, MlpTable, _embedded
from scheduler_core.round.weights import slowdown_limit32
from scheduler_core.prediction.predictor import PredictorConfig, train
from scheduler_core.round.plan import RoundConfig, plan_round
from scheduler_core.round.dense import plan_round_dense
from tests.scheduler_core.round.test_dense import GIB, random_cluster, synthetic_pairs


def _pair_rows(rows: np.ndarray, profs: np.ndarray) -> np.ndarray:
    """Every (row, profile) pair's 16 features, row-major."""
    pairs = np.zeros((rows.shape[0] * profs.shape[0], N_FEATURES))
    pairs[:, ONLINE_SLICE] = np.repeat(rows[:, ONLINE_SLICE], profs.shape[0], axis=0)
    pairs[:, SM_COLUMN] = np.repeat(rows[:, SM_COLUMN], profs.shape[0])
    pairs[:, OFFLINE_SLICE] = np.tile(profs[:, OFFLINE_SLICE], (rows.shape[0], 1))
    return pairs


@pytest.fixture(scope="module")
def mlp():
    torch.set_num_threads(1)
    x, yt, ys = synthetic_pairs()
    model, _ = train(x, yt, ys, PredictorConfig(epochs=3, seed=1))
    return model, x


def test_mlp_pairs_on_demand_equal_row_predictions(mlp) -> None:
    model, x = mlp
    rows, profs = x[:30], x[30:50]
    k = model.pair_kernel
    # A grid of 30 rows × 300 profiles (over a pass of 8,192 pairs: passes that start inside a row) equals them too.
    big = x[50:350]
    gt, gs = k.grid(k.gpu_part(np.column_stack([rows[:, ONLINE_SLICE], rows[:, SM_COLUMN]])),
                    k.job_part(big[:, OFFLINE_SLICE]))
    raw = model.pair_kernel.pairs(k.gpu_part(np.column_stack([rows[:, ONLINE_SLICE], rows[:, SM_COLUMN]])),
                                  k.job_part(big[:, OFFLINE_SLICE]), np.repeat(np.arange(30), 300),
                                  np.tile(np.arange(300), 30))
    np.testing.assert_array_equal(gt.reshape(-1), raw[0])
    np.testing.assert_array_equal(gs.reshape(-1), raw[1])
    t_big, _ = model.predict(_pair_rows(rows, big))
    np.testing.assert_array_equal(np.clip(gt.reshape(-1), 0, 1).astype(np.float64), t_big)
    table = MlpTable(k, k.gpu_part(np.column_stack([rows[:, ONLINE_SLICE], rows[:, SM_COLUMN]])),
                     np.zeros(30, dtype=np.int64), {0: k.job_part(profs[:, OFFLINE_SLICE])}, np.ones(30, bool),
                     np.r_[np.ones(19, bool), False], np.zeros(1, dtype=np.int64))
    t, s = model.predict(_pair_rows(rows, profs[:19]))
    t32, s32 = np.empty((30, 20), np.float32), np.empty((30, 20), np.float32)
    table.fill(np.arange(30), table.prepare(np.arange(20)), t32, s32)
    np.testing.assert_array_equal(t32[:, :19].reshape(-1).astype(np.float64), t)
    np.testing.assert_array_equal(s32[:, :19].reshape(-1).astype(np.float64), s)
    assert np.isnan(t32[:, 19]).all() and np.isnan(s32[:, 19]).all()  # a profile out of range: not accepted
    assert table.evaluated[0] == 30 * 19
    # Only the masked pairs are predicted and written; the rest of the block is left as it was.
    mask = np.random.default_rng(0).random((30, 20)) < 0.3
    t32[...], s32[...] = -7.0, -7.0
    table.fill(np.arange(30), table.prepare(np.arange(20)), t32, s32, mask)
    assert table.evaluated[0] == 30 * 19 + int(mask[:, :19].sum())
    np.testing.assert_array_equal(t32[~mask], -7.0)
    np.testing.assert_array_equal(t32[mask[:, :19].nonzero()[0], mask[:, :19].nonzero()[1]].astype(np.float64),
                                  t.reshape(30, 19)[mask[:, :19]])
    at_t, at_s = table.at(np.repeat(np.arange(30), 19), np.tile(np.arange(19), 30))
    np.testing.assert_array_equal(at_t, t)
    np.testing.assert_array_equal(at_s, s)


def test_round_predicting_mlp_pairs_on_demand_equals_the_up_front_table_and_the_dense_reference(
        mlp, monkeypatch) -> None:
    model, _ = mlp
    gpus, jobs = random_cluster(11, 70, 50)
    preds = {"t4": model, "a10": model}
    for cfg in (RoundConfig(migration_penalty=0.05), RoundConfig(max_jobs_per_gpu=2)):
        up_front = plan_round(gpus, jobs, preds, cfg)
        assert "lazy_tables" not in up_front.stats
        monkeypatch.setattr(pair_tables, "DENSE_TABLE_MAX_PAIRS", 0)
        lazy = plan_round(gpus, jobs, preds, cfg)
        monkeypatch.undo()
        assert lazy.stats["lazy_tables"] == 2
        dense = plan_round_dense(gpus, jobs, preds, cfg)
        assert lazy.certified_optimal
        assert lazy.matching_objective == up_front.matching_objective
        assert lazy.matching_objective == pytest.approx(dense.matching_objective, abs=1e-9)
        assert lazy.feasible_pairs == up_front.feasible_pairs == dense.feasible_pairs
        assert [(p.gpu_id, p.job_id, p.sm_pct) for p in lazy.placements] == [
            (p.gpu_id, p.job_id, p.sm_pct) for p in up_front.placements]
        if cfg.max_jobs_per_gpu == 1:  # pairs that do not fit, or are feasible at a larger share, are not predicted
            st_ = lazy.stats
            assert 0 < st_["predicted_pairs"] < st_["slots"] * st_["classes"] * st_["share_levels"] / 2


def test_round_with_a_profile_per_job_predicted_on_demand_equals_the_up_front_table(mlp, monkeypatch) -> None:
    """700 jobs, each its own profile: the on-demand round predicts each block's dynamic share as one grid."""
    model, _ = mlp
    gpus, jobs = random_cluster(4, 40, 700, running=0.05)
    rng = np.random.default_rng(4)
    jobs = [replace(j, profiles={t: replace(p, sm_activity_pct=float(np.clip(p.sm_activity_pct * rng.uniform(0.9, 1.1),
                                                                                1, 100)))
                                 for t, p in j.profiles.items()}) for j in jobs]
    preds = {"t4": model, "a10": model}
    cfg = RoundConfig(migration_penalty=0.02)
    up_front = plan_round(gpus, jobs, preds, cfg)
    monkeypatch.setattr(pair_tables, "DENSE_TABLE_MAX_PAIRS", 0)
    lazy = plan_round(gpus, jobs, preds, cfg)
    assert lazy.stats["lazy_tables"] == 2
    for t in ("t4", "a10"):  # grid rows of at least 256 classes a type (shorter ones are gathered)
        assert sum(t in j.allowed_gpu_types and t in j.profiles for j in jobs) >= 256
    assert lazy.matching_objective == up_front.matching_objective
    assert lazy.feasible_pairs == up_front.feasible_pairs
    assert [(p.gpu_id, p.job_id, p.sm_pct) for p in lazy.placements] == [
        (p.gpu_id, p.job_id, p.sm_pct) for p in up_front.placements]


class NonMonotoneStub:
    """Throughput that peaks at a 50 % share (higher below 70 % than at it), slowdown growing with the share."""

    def predict(self, x):
        share = x[:, SM_COLUMN]
        return np.clip(1.0 - np.abs(share - 50.0) / 100.0, 0.0, 1.0), 1.0 + share / 1000.0


def test_a_pair_takes_its_largest_feasible_share_not_the_share_predicted_fastest() -> None:
    """Fallback levels are for pairs the dynamic share cannot take: a pair feasible at the dynamic share keeps it,
    though the predictor says a smaller share would run faster."""
    from scheduler_core.online.dynamic_sm import SmPolicy

    gpus, jobs = random_cluster(3, 12, 4, running=0.0)
    gpus = [replace(g, health=GpuHealth.HEALTHY, forecast_sm_pct=20.0, slowdown_allowance=0.5,
                    forecast_mem_bytes=GIB) for g in gpus]
    jobs = [replace(j, mem_bytes=GIB) for j in jobs]
    preds = {"t4": NonMonotoneStub(), "a10": NonMonotoneStub()}
    cfg = RoundConfig(sm=SmPolicy(fallback_levels=2, fallback_step_pct=15))
    res = plan_round(gpus, jobs, preds, cfg)
    dense = plan_round_dense(gpus, jobs, preds, cfg)
    dynamic = res.placements[0].sm_pct
    assert all(p.sm_pct == dynamic for p in res.placements) and dynamic > 60
    assert sorted(p.sm_pct for p in dense.placements) == sorted(p.sm_pct for p in res.placements)
    # …and one whose slowdown is over the budget there falls back to the next share that is within it.
    tight = [replace(g, slowdown_allowance=(dynamic - 10) / 1000.0) for g in gpus]
    res = plan_round(tight, jobs, preds, cfg)
    assert res.placements and all(p.sm_pct == dynamic - 15 for p in res.placements)


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
