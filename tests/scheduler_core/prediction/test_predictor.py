"""Speed predictor (paper §5–6): accepted input range, saved model, errors, promotion, batch invariance.

Learning a known function, reproducibility and NaN refusal are in test_units.py.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from scheduler_core.prediction import predictor as pred_mod
from scheduler_core.prediction.features import FEATURE_NAMES, N_FEATURES, PHYSICAL_BOUNDS, FeatureError
from scheduler_core.prediction.nets import GPU_COLUMNS, JOB_COLUMNS
from scheduler_core.prediction.predictor import PredictorConfig, SpeedPredictor, TrainingReport, _mlp, should_promote, train


def synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features in [0, 1] (SM % in [10, 90]); a known smooth target."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 1.0, (n, N_FEATURES))
    x[:, -1] = rng.uniform(10.0, 90.0, n)
    tput = 0.2 + 0.5 * x[:, -1] / 100.0 + 0.2 * x[:, 0]
    slowdown = 1.0 + 0.3 * (x[:, -1] / 100.0) * x[:, 1]
    return x, tput, slowdown


@pytest.fixture(scope="module")
def trained():
    torch.set_num_threads(1)
    x, yt, ys = synthetic(600, seed=1)
    return train(x, yt, ys, PredictorConfig(epochs=25, seed=3, eval_every=5))


def test_report_has_mape_and_error_curve(trained) -> None:
    model, report = trained
    assert 0 < report.holdout_mape_tput < 0.2 and 0 < report.holdout_mape_slowdown < 0.1
    epochs = [e for e, _ in report.curve]
    assert epochs == [5, 10, 15, 20, 25]
    assert report.curve[-1][1] == pytest.approx(report.holdout_mae_tput, abs=1e-6)
    assert report.feature_ranges["sm_pct"][0] >= 10.0 and report.feature_ranges["sm_pct"][1] <= 90.0


def test_out_of_range_input_is_refused_with_the_feature_named(trained) -> None:
    model, _ = trained
    x, _, _ = synthetic(4, seed=2)
    x[2, FEATURE_NAMES.index("on_mem_frac")] = 1.2  # trained on ~[0, 1]: within the 50 % margin and physical 1.25
    model.predict(x)
    x[2, FEATURE_NAMES.index("on_qps")] = 40.0  # trained on [0, 1]: far outside
    with pytest.raises(FeatureError) as info:
        model.predict(x)
    msg = str(info.value)
    assert "on_qps=40.0" in msg and "row 2" in msg and "accepted [" in msg and "training range" in msg
    assert model.accepts(x).tolist() == [True, True, False, True]


def test_nan_and_physically_impossible_values_are_refused(trained) -> None:
    model, _ = trained
    x, _, _ = synthetic(3, seed=5)
    x[1, FEATURE_NAMES.index("off_sm_activity_pct")] = np.nan
    with pytest.raises(FeatureError, match="off_sm_activity_pct=nan in row 1"):
        model.predict(x)
    # A model without a training range (saved before ranges existed) still refuses impossible values.
    bare = SpeedPredictor(model.cfg, model.net, model.mean, model.std)
    x, _, _ = synthetic(3, seed=5)
    bare.predict(x)
    x[0, FEATURE_NAMES.index("sm_pct")] = 150.0
    with pytest.raises(FeatureError, match="sm_pct=150.0"):
        bare.predict(x)
    x[0, FEATURE_NAMES.index("sm_pct")] = 50.0
    x[0, FEATURE_NAMES.index("on_gpu_util_pct")] = -3.0
    with pytest.raises(FeatureError, match="on_gpu_util_pct"):
        bare.predict(x)


def test_physical_bounds_cover_every_feature() -> None:
    assert set(PHYSICAL_BOUNDS) == set(FEATURE_NAMES)
    assert all(lo < hi for lo, hi in PHYSICAL_BOUNDS.values())


def test_save_load_round_trip_keeps_range_and_predictions(trained) -> None:
    model, _ = trained
    clone = SpeedPredictor.from_bytes(model.to_bytes())
    x, _, _ = synthetic(200, seed=6)
    for a, b in zip(model.predict(x), clone.predict(x)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(clone.accept_lo, model.accept_lo)
    np.testing.assert_array_equal(clone.accept_hi, model.accept_hi)
    assert clone.cfg == model.cfg


def test_loads_a_blob_saved_before_ranges(trained) -> None:
    model, _ = trained
    old = {k: v for k, v in PredictorConfig().__dict__.items() if k not in ("range_margin_frac", "eval_every")}
    buf = io.BytesIO()
    torch.save({"config": old, "state": model.net.state_dict(), "mean": torch.from_numpy(model.mean),
                "std": torch.from_numpy(model.std)}, buf)
    loaded = SpeedPredictor.from_bytes(buf.getvalue())
    assert loaded.train_min is None
    x, _, _ = synthetic(10, seed=8)
    np.testing.assert_array_equal(loaded.predict(x)[0], model.predict(x)[0])


def test_predictions_do_not_depend_on_the_batch(trained, monkeypatch) -> None:
    """Each row's prediction depends only on that row: the round predicts de-duplicated rows only."""
    model, _ = trained
    x, _, _ = synthetic(300, seed=9)
    x = np.vstack([x, x[:50]])  # duplicates
    full_t, full_s = model.predict(x)
    idx = np.random.default_rng(0).permutation(x.shape[0])[:37]
    sub_t, sub_s = model.predict(x[idx])
    np.testing.assert_array_equal(full_t[idx], sub_t)
    np.testing.assert_array_equal(full_s[idx], sub_s)
    np.testing.assert_array_equal(full_t[300:], full_t[:50])
    # Across several passes too (the last one padded).
    monkeypatch.setattr(pred_mod, "PREDICT_CHUNK_ROWS", 64)
    many_t, many_s = model.predict(x)
    for rows in (1, 63, 64, 65, 200):
        sub = np.random.default_rng(rows).permutation(x.shape[0])[:rows]
        t, s = model.predict(x[sub])
        np.testing.assert_array_equal(t, many_t[sub])
        np.testing.assert_array_equal(s, many_s[sub])


def test_errors_match_a_direct_computation(trained) -> None:
    model, _ = trained
    x, yt, ys = synthetic(100, seed=10)
    e = model.errors(x, yt, ys)
    p_t, p_s = model.predict(x)
    assert e.mae_tput == pytest.approx(np.mean(np.abs(p_t - yt)))
    assert e.mape_tput == pytest.approx(np.mean(np.abs(p_t - yt) / np.maximum(yt, 0.05)))
    assert e.mae_slowdown == pytest.approx(np.mean(np.abs(p_s - ys)))


def _report(mae: float) -> TrainingReport:
    return TrainingReport(n_train=8, n_holdout=2, holdout_mae_tput=mae, holdout_mae_slowdown=0.1,
                          train_mae_tput=mae, feature_ranges={})


def test_promotion_only_when_no_worse() -> None:
    assert should_promote(_report(0.05), None)
    assert should_promote(_report(0.05), 0.05)
    assert should_promote(_report(0.04), 0.05)
    assert not should_promote(_report(0.051), 0.05)
    assert should_promote(_report(0.051), 0.05, tolerance=0.002)


@pytest.mark.parametrize("kwargs", [{"layers": 1}, {"hidden": 0}])
def test_invalid_architecture(kwargs) -> None:
    with pytest.raises(ValueError):
        _mlp(PredictorConfig(**kwargs))


@pytest.mark.parametrize(("layers", "hidden"), [(2, 64), (4, 64), (8, 64), (4, 256)])
def test_architectures_of_figure_12_build(layers, hidden) -> None:
    net = _mlp(PredictorConfig(arch="mlp", layers=layers, hidden=hidden))
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    assert len(linears) == layers and linears[0].in_features == N_FEATURES and linears[-1].out_features == 2


def test_factorized_pair_tables_equal_row_predictions() -> None:
    """A round predicts every (GPU row, profile) pair as a matrix product; it equals predict() on each pair."""
    torch.set_num_threads(1)
    x, yt, ys = synthetic(600, seed=1)
    model, _ = train(x, yt, ys, PredictorConfig(arch="factorized", epochs=10, seed=3))
    assert model.factorized
    x, _, _ = synthetic(40, seed=11)
    gpu_side, job_side = x[:25][:, GPU_COLUMNS], x[25:][:, JOB_COLUMNS]
    t_tab, s_tab = model.pair_tables(model.embed_gpu(gpu_side), model.embed_job(job_side))
    assert t_tab.shape == s_tab.shape == (25, 15)
    pairs = np.zeros((25 * 15, N_FEATURES))
    pairs[:, GPU_COLUMNS] = np.repeat(gpu_side, 15, axis=0)
    pairs[:, JOB_COLUMNS] = np.tile(job_side, (25, 1))
    t_row, s_row = model.predict(pairs)
    np.testing.assert_array_equal(t_tab.reshape(-1).astype(np.float64), t_row)
    np.testing.assert_array_equal(s_tab.reshape(-1).astype(np.float64), s_row)
    assert (t_row >= 0).all() and (t_row <= 1).all() and (s_row >= 1).all()


def test_a_blob_without_an_architecture_is_an_mlp() -> None:
    torch.set_num_threads(1)
    x, yt, ys = synthetic(200, seed=12)
    model, _ = train(x, yt, ys, PredictorConfig(arch="mlp", epochs=2, seed=1))
    old = {k: v for k, v in model.cfg.__dict__.items() if k not in ("arch", "embed_dim", "optimizer")}
    buf = io.BytesIO()
    torch.save({"config": old, "state": model.net.state_dict(), "mean": torch.from_numpy(model.mean),
                "std": torch.from_numpy(model.std)}, buf)
    loaded = SpeedPredictor.from_bytes(buf.getvalue())
    assert loaded.cfg.arch == "mlp" and not loaded.factorized
    np.testing.assert_array_equal(loaded.predict(x[:20])[0], model.predict(x[:20])[0])
    with pytest.raises(TypeError, match="factorized"):
        loaded.embed_gpu(x[:2][:, GPU_COLUMNS])


@pytest.mark.parametrize("kwargs", [{"arch": "transformer"}, {"optimizer": "rmsprop"}])
def test_unknown_architecture_or_optimizer_is_refused(kwargs) -> None:
    with pytest.raises(ValueError, match="arch|optimizer"):
        PredictorConfig(**kwargs)


def test_each_architecture_has_its_own_optimizer_defaults() -> None:
    assert (PredictorConfig(arch="mlp").optimizer_name, PredictorConfig(arch="mlp").learning_rate) == ("sgd", 0.02)
    assert (PredictorConfig(arch="factorized").optimizer_name, PredictorConfig(arch="factorized").learning_rate) \
        == ("adam", 0.003)
    assert PredictorConfig().arch == "mlp"  # the paper's network unless asked otherwise
    assert PredictorConfig(arch="mlp", optimizer="adam", lr=0.01).learning_rate == 0.01
