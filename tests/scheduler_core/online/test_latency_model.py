"""The per-service latency model: a monotone curve of latency against load, fitted from monitor samples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scheduler_core.online.latency_model import LatencyModelConfig, ServiceLatencyModels, fit
from scheduler_core.online.load import latency_at_load_ms


def _samples(rng, n=400, sm_need=0.8, base=10.0):
    load = rng.uniform(0.05, 0.85, n)
    sm = 100.0 * sm_need * load
    lat = latency_at_load_ms(load, base) * rng.normal(1.0, 0.03, n)
    return sm, lat


def test_the_fitted_curve_follows_the_replica_and_errs_high() -> None:
    rng = np.random.default_rng(0)
    sm, lat = _samples(rng)
    curve = fit(sm, lat)
    assert curve is not None
    assert np.all(np.diff(curve.mean_ms) >= 0)
    grid = np.linspace(10.0, 65.0, 12)
    truth = latency_at_load_ms(grid / 80.0, 10.0)
    got = curve.mean_at(grid)
    # within 10 % of the true mean, and above it more often than not (a high quantile per bin)
    assert np.all(np.abs(got / truth - 1.0) < 0.10)
    assert (got >= truth).mean() >= 0.5
    assert curve.p99_at(40.0) == pytest.approx(math.log(100.0) * float(curve.mean_at(40.0)))


def test_beyond_the_samples_latency_keeps_rising_and_below_it_is_flat() -> None:
    rng = np.random.default_rng(1)
    sm, lat = _samples(rng)
    curve = fit(sm, lat)
    top = curve.sm_pct[-1]
    assert curve.tail_slope > 0
    assert float(curve.mean_at(top + 10.0)) == pytest.approx(float(curve.mean_ms[-1]) + 10.0 * curve.tail_slope)
    assert float(curve.mean_at(0.0)) == pytest.approx(float(curve.mean_ms[0]))


def test_too_few_or_broken_samples_give_no_model() -> None:
    assert fit([], []) is None
    assert fit([10.0, 10.5, 30.0], [5.0, 5.1, 9.0]) is None  # fewer than min_bins filled bins
    assert fit([np.nan] * 10, [1.0] * 10) is None
    with pytest.raises(ValueError, match="samples"):
        fit([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        LatencyModelConfig(min_bins=1)
    # NaN samples (monitor gaps) are skipped, not taken as zero
    rng = np.random.default_rng(2)
    sm, lat = _samples(rng)
    lat_gaps = lat.copy()
    lat_gaps[::7] = np.nan
    a, b = fit(sm, lat_gaps), fit(sm[np.isfinite(lat_gaps)], lat[np.isfinite(lat_gaps)])
    np.testing.assert_allclose(a.mean_ms, b.mean_ms)


def test_models_per_service_keep_a_rolling_window() -> None:
    rng = np.random.default_rng(3)
    models = ServiceLatencyModels(window_rounds=2)
    assert models.curve("svc", "t4") is None
    slow_sm, slow_lat = _samples(rng, base=50.0)
    models.observe("svc", "t4", slow_sm, slow_lat)
    slow = float(models.curve("svc", "t4").mean_at(40.0))
    for _ in range(2):  # two rounds of a faster replica push the slow one out of the window
        sm, lat = _samples(rng, base=10.0)
        models.observe("svc", "t4", sm, lat)
    assert float(models.curve("svc", "t4").mean_at(40.0)) < slow / 3
    assert models.curve("svc", "a10") is None
    with pytest.raises(ValueError):
        ServiceLatencyModels(window_rounds=0)
