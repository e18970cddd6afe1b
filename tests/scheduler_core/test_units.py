"""Pure units of the core: dynamic SM, forecast, interference, calibration, predictor,
SysMonitor, trace parsing and the job state machine."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.domain import JOB_TRANSITIONS, GpuHealth, IllegalTransition, JobState, check_transition
from scheduler_core.guard.sysmonitor import GpuSample, SysMonitor
from scheduler_core.interference.pairs import InterferenceParams, WorkloadTraits, colocate
from scheduler_core.online.dynamic_sm import SmPolicy, offline_sm_pct
from scheduler_core.online.forecast import ForecastPolicy, forecast_next
from scheduler_core.prediction.features import N_FEATURES, FeatureError
from scheduler_core.prediction.predictor import PredictorConfig, SpeedPredictor, train
from scheduler_core.trace import TraceError, parse_trace

# -- dynamic SM (paper §4.3) ---------------------------------------------------


def test_dynamic_sm_default_policy() -> None:
    got = offline_sm_pct(np.array([0.0, 20.0, 20.5, 50.0, 85.0, 100.0]))
    # 100 − f − 10, floored, clamped to [10, 90].
    assert got.tolist() == [90, 70, 69, 40, 10, 10]
    assert got.dtype.kind == "i"


def test_dynamic_sm_scalar_and_custom_bounds() -> None:
    policy = SmPolicy(headroom_pct=0.0, min_pct=5, max_pct=100)
    assert int(offline_sm_pct(0.0, policy)) == 100
    assert int(offline_sm_pct(99.0, policy)) == 5
    assert int(offline_sm_pct(30.0, policy)) == 70


def test_dynamic_sm_fixed_pct_ignores_forecast() -> None:
    got = offline_sm_pct(np.array([0.0, 50.0, 99.0]), SmPolicy(fixed_pct=40))
    assert got.tolist() == [40, 40, 40]


@pytest.mark.parametrize(
    "kwargs",
    [{"min_pct": 0}, {"min_pct": 60, "max_pct": 50}, {"max_pct": 101}, {"headroom_pct": -1.0}],
)
def test_dynamic_sm_invalid_policy(kwargs) -> None:
    with pytest.raises(ValueError):
        SmPolicy(**kwargs)


@given(st.lists(st.floats(0.0, 100.0), min_size=1, max_size=20))
def test_dynamic_sm_always_within_bounds_and_monotone(forecasts) -> None:
    f = np.array(sorted(forecasts))
    got = offline_sm_pct(f)
    assert np.all((got >= 10) & (got <= 90))
    assert np.all(np.diff(got) <= 0)  # more online load never gives the offline job more SMs


# -- forecast (paper §2.2) ------------------------------------------------------


def test_forecast_uses_recent_high_quantile() -> None:
    history = np.concatenate([np.full(100, 95.0), np.arange(30, dtype=float)])  # old peak, recent ramp
    assert forecast_next(history) == pytest.approx(np.quantile(np.arange(30.0), 0.9))


def test_forecast_uses_yesterday_same_time_window() -> None:
    policy = ForecastPolicy()
    n = policy.period_minutes + 100
    history = np.full(n, 10.0)
    start = n - policy.period_minutes
    history[start + 5] = 80.0  # yesterday, inside the coming 15 minutes
    history[start + policy.horizon_minutes] = 99.0  # just after the window: ignored
    assert forecast_next(history, policy) == pytest.approx(80.0)
    # Less than a day of the same series: only the recent quantile counts.
    assert forecast_next(history[-(policy.period_minutes - 1):], policy) == pytest.approx(10.0)


def test_forecast_yesterday_never_lowers_recent() -> None:
    policy = ForecastPolicy()
    history = np.full(policy.period_minutes + 30, 5.0)
    history[-30:] = 60.0
    assert forecast_next(history, policy) == pytest.approx(60.0)


def test_forecast_tolerates_nan_gaps() -> None:
    history = np.arange(30, dtype=float)
    history[::3] = np.nan
    expected = np.quantile(history[np.isfinite(history)], 0.9)
    assert forecast_next(history) == pytest.approx(expected)
    # Recent window entirely missing: fall back to all valid history.
    history = np.concatenate([np.array([10.0, 20.0, 30.0]), np.full(30, np.nan)])
    assert forecast_next(history) == pytest.approx(np.quantile([10.0, 20.0, 30.0], 0.9))


@pytest.mark.parametrize("history", [np.array([]), np.full(50, np.nan)])
def test_forecast_without_data_raises(history) -> None:
    with pytest.raises(ValueError):
        forecast_next(history)


# -- interference model -----------------------------------------------------------

ON = WorkloadTraits(sensitivity=0.8, pressure=1.3, sm_need=0.5, mem_bw=0.4)
OFF = WorkloadTraits(sensitivity=1.1, pressure=0.7, sm_need=0.9, mem_bw=0.6)


def test_colocate_full_sharing_reduces_to_calibrated_formula() -> None:
    tput, slowdown = colocate(ON, 1.0, OFF, 100.0)
    assert float(tput) == pytest.approx(1.0 / (1.0 + OFF.sensitivity * ON.pressure))
    # Online side: 1 + σ_on·π_off, times the oversubscription factor (0.5 + 0.9 > 1).
    expected = (1.0 + ON.sensitivity * OFF.pressure) * (1.0 + InterferenceParams().oversubscription_penalty * 0.4)
    assert float(slowdown) == pytest.approx(expected)


@settings(max_examples=50, deadline=None)
@given(
    st.floats(0.05, 5.0), st.floats(0.05, 5.0), st.floats(0.1, 1.0),
    st.floats(0.05, 5.0), st.floats(0.05, 5.0), st.floats(0.1, 1.0),
)
def test_colocate_full_sharing_property(s_on, p_on, n_on, s_off, p_off, n_off) -> None:
    on = WorkloadTraits(s_on, p_on, n_on, 0.5)
    off = WorkloadTraits(s_off, p_off, n_off, 0.5)
    tput, slowdown = colocate(on, 1.0, off, 100.0)
    assert float(tput) == pytest.approx(1.0 / (1.0 + s_off * p_on))
    assert float(slowdown) >= 1.0 + s_on * p_off - 1e-12


def test_colocate_throughput_increases_with_sm_pct() -> None:
    # While the two SM footprints do not overlap (sm_pct ≤ 1 − online need), more SMs only add capacity.
    sm = np.arange(1, 51)
    tput, _ = colocate(ON, 1.0, OFF, sm)
    assert np.all(np.diff(tput) > 0)
    # And from a small share to full sharing the job is faster overall.
    lo, _ = colocate(ON, 1.0, OFF, 10.0)
    hi, _ = colocate(ON, 1.0, OFF, 100.0)
    assert float(hi) > float(lo)


def test_colocate_slowdown_at_least_one_and_increasing() -> None:
    sm = np.arange(1, 101)
    for load in (0.0, 0.3, 1.0):
        _, slowdown = colocate(ON, load, OFF, sm)
        assert np.all(slowdown >= 1.0)
        assert np.all(np.diff(slowdown) >= -1e-12)
    _, slowdown = colocate(ON, 1.0, OFF, sm)
    below_need = slowdown[: int(OFF.sm_need * 100)]
    assert np.all(np.diff(below_need) > 0)


def test_colocate_idle_online_service_costs_only_capacity() -> None:
    tput, slowdown = colocate(ON, 0.0, OFF, np.array([45.0, 90.0]))
    assert tput.tolist() == pytest.approx([(0.5) ** 0.8, 1.0])
    assert np.all(slowdown >= 1.0)


# -- calibration on the measured Gavel pairs --------------------------------------


def test_calibration_beats_mean_baseline_on_holdout() -> None:
    from executors.data.calibration import holdout_reports

    reports = {r.gpu_type: r for r in holdout_reports()}
    assert set(reports) == {"k80", "p100"}
    for r in reports.values():
        assert r.n_train > 0 and r.n_holdout > 0
        assert r.mae < r.baseline_mae * 0.6, r.as_dict()


# -- speed predictor (paper §5–6) ------------------------------------------------------

PRED_CFG = PredictorConfig(epochs=30, seed=3)


def _synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 1.0, (n, N_FEATURES))
    x[:, -1] = rng.uniform(10.0, 90.0, n)  # SM %
    tput = 0.2 + 0.5 * x[:, -1] / 100.0 + 0.2 * x[:, 0]
    slowdown = 1.0 + 0.3 * (x[:, -1] / 100.0) * x[:, 1]
    return x, tput, slowdown


@pytest.fixture(scope="module")
def trained():
    torch.set_num_threads(1)
    x, yt, ys = _synthetic(800, seed=1)
    return train(x, yt, ys, PRED_CFG)


def test_predictor_learns_known_function(trained) -> None:
    model, report = trained
    assert report.n_train + report.n_holdout == 800
    assert report.holdout_mae_tput < 0.05
    assert report.holdout_mae_slowdown < 0.05
    # And on fresh points from the same function.
    x, yt, ys = _synthetic(200, seed=2)
    p_t, p_s = model.predict(x)
    assert np.mean(np.abs(p_t - yt)) < 0.05
    assert np.mean(np.abs(p_s - ys)) < 0.05
    assert np.all((p_t >= 0) & (p_t <= 1)) and np.all(p_s >= 1)


def test_predictor_bytes_round_trip(trained) -> None:
    model, _ = trained
    clone = SpeedPredictor.from_bytes(model.to_bytes())
    x, _, _ = _synthetic(50, seed=4)
    a, b = model.predict(x), clone.predict(x)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert clone.cfg == model.cfg


def test_predictor_rejects_bad_input(trained) -> None:
    model, _ = trained
    x, _, _ = _synthetic(5, seed=5)
    x[2, 3] = np.nan
    with pytest.raises(FeatureError):
        model.predict(x)
    with pytest.raises(FeatureError):
        model.predict(np.zeros((3, N_FEATURES - 1)))
    with pytest.raises(FeatureError):
        model.predict(np.full((1, N_FEATURES), np.inf))
    t, s = model.predict(np.zeros((0, N_FEATURES)))
    assert t.shape == (0,) and s.shape == (0,)


def test_training_rejects_nan_and_tiny_data() -> None:
    x, yt, ys = _synthetic(20, seed=6)
    yt[3] = np.nan
    with pytest.raises(FeatureError):
        train(x, yt, ys, PredictorConfig(epochs=1))
    with pytest.raises(ValueError):
        train(x[:5], ys[:5] - 1, ys[:5], PredictorConfig(epochs=1))


def test_predictor_training_is_reproducible(trained) -> None:
    torch.set_num_threads(1)
    model, report = trained
    x, yt, ys = _synthetic(800, seed=1)
    again, report2 = train(x, yt, ys, PRED_CFG)
    for (k1, v1), (k2, v2) in zip(model.net.state_dict().items(), again.net.state_dict().items()):
        assert k1 == k2
        assert torch.equal(v1, v2)
    assert report == report2
    xq, _, _ = _synthetic(20, seed=7)
    np.testing.assert_array_equal(model.predict(xq)[0], again.predict(xq)[0])


# -- SysMonitor (paper §4.1, Fig. 6b) ------------------------------------------------

CALM = GpuSample(gpu_util_pct=50.0, sm_activity_pct=40.0, sm_clock_frac=0.95, mem_used_frac=0.5)
BUSY = GpuSample(gpu_util_pct=50.0, sm_activity_pct=92.0, sm_clock_frac=0.95, mem_used_frac=0.5)  # ≥ Unhealthy
OVER = GpuSample(gpu_util_pct=50.0, sm_activity_pct=98.0, sm_clock_frac=0.95, mem_used_frac=0.5)  # > Overlimit


def test_sysmonitor_init_to_healthy() -> None:
    mon = SysMonitor()
    assert mon.state == GpuHealth.INIT
    assert mon.step(0.0, CALM) is False
    assert mon.state == GpuHealth.HEALTHY


def test_sysmonitor_healthy_unhealthy_and_back() -> None:
    mon = SysMonitor()
    mon.step(0.0, CALM)
    assert mon.step(10.0, BUSY) is False
    assert mon.state == GpuHealth.UNHEALTHY
    mon.step(20.0, BUSY)
    assert mon.state == GpuHealth.UNHEALTHY
    mon.step(30.0, CALM)
    assert mon.state == GpuHealth.HEALTHY


@pytest.mark.parametrize(
    "sample",
    [
        OVER,
        GpuSample(50.0, 40.0, 0.60, 0.5),  # throttled clock
        GpuSample(50.0, 40.0, 0.95, 0.99),  # memory
    ],
)
def test_sysmonitor_overlimit_evicts_once(sample: GpuSample) -> None:
    mon = SysMonitor()
    mon.step(0.0, CALM)
    assert mon.step(10.0, sample) is True
    assert mon.state == GpuHealth.OVERLIMIT
    assert mon.step(20.0, sample) is False  # already evicted
    assert mon.state == GpuHealth.OVERLIMIT


def test_sysmonitor_overlimit_to_unhealthy_after_hold() -> None:
    mon = SysMonitor()
    mon.step(0.0, CALM)
    assert mon.step(100.0, OVER)
    mon.step(110.0, CALM)  # calm from t=110; base hold 60 s
    mon.step(169.0, CALM)
    assert mon.state == GpuHealth.OVERLIMIT
    mon.step(170.0, CALM)
    assert mon.state == GpuHealth.UNHEALTHY
    mon.step(180.0, CALM)
    assert mon.state == GpuHealth.HEALTHY


def test_sysmonitor_relapse_during_hold_restarts_it() -> None:
    mon = SysMonitor()
    mon.step(0.0, CALM)
    mon.step(100.0, OVER)
    mon.step(110.0, CALM)
    assert mon.step(150.0, OVER) is False  # still Overlimit: no second eviction
    mon.step(160.0, CALM)
    mon.step(210.0, CALM)
    assert mon.state == GpuHealth.OVERLIMIT  # hold restarted at 160
    mon.step(220.0, CALM)
    assert mon.state == GpuHealth.UNHEALTHY


def _cycle(mon: SysMonitor, t_over: float) -> float:
    """Enter Overlimit at t_over, then stay calm; return how long it took to leave Overlimit."""
    assert mon.step(t_over, OVER) is True
    t = t_over
    while mon.state == GpuHealth.OVERLIMIT:
        t += 1.0
        mon.step(t, CALM)
    assert mon.state == GpuHealth.UNHEALTHY
    mon.step(t + 1.0, CALM)  # back to Healthy
    return t - (t_over + 1.0)


def test_sysmonitor_hold_doubles_within_two_hours() -> None:
    mon = SysMonitor()
    mon.step(0.0, CALM)
    assert _cycle(mon, 100.0) == 60.0
    assert _cycle(mon, 1000.0) == 120.0
    assert _cycle(mon, 2000.0) == 240.0
    # Entries more than two hours old no longer count.
    assert mon.hold_period_s(2000.0 + 2 * 3600.0 + 1.0) == 60.0
    assert _cycle(mon, 2000.0 + 2 * 3600.0 + 1.0) == 60.0


def test_sysmonitor_disabled_stays_disabled() -> None:
    mon = SysMonitor()
    mon.step(0.0, CALM)
    mon.disable()
    assert mon.step(10.0, OVER) is False
    assert mon.state == GpuHealth.DISABLED


# -- Philly trace parser -------------------------------------------------------------

GOOD = "ResNet-50 (batch size 64)\tcd %s/x && python3 main.py\t--num_steps\t1\t5000\t12.5\t1\n"


def _line(*cols: str) -> str:
    return "\t".join(cols) + "\n"


def test_trace_parses_good_lines() -> None:
    lines = [GOOD, "\n", _line("LM (batch size 5)", "python3 lm.py", "-n", "0", "300", "0", "2")]
    jobs = parse_trace(lines)
    assert [j.line_no for j in jobs] == [1, 3]  # blank line skipped, numbering kept
    a, b = jobs
    assert (a.job_type, a.command, a.steps_arg, a.needs_data_dir) == (
        "ResNet-50 (batch size 64)", "cd %s/x && python3 main.py", "--num_steps", True)
    assert (a.total_steps, a.arrival_s, a.scale_factor) == (5000, 12.5, 1)
    assert (b.needs_data_dir, b.total_steps, b.arrival_s, b.scale_factor) == (False, 300, 0.0, 2)


def test_trace_parses_bundled_sample() -> None:
    from executors.data.calibration import SAMPLE_TRACE

    with open(SAMPLE_TRACE) as fh:
        jobs = parse_trace(fh)
    assert len(jobs) > 20
    assert all(j.total_steps > 0 and j.arrival_s >= 0 and j.scale_factor >= 1 for j in jobs)


@pytest.mark.parametrize(
    "bad",
    [
        "ResNet-50 (batch size 64)\tcmd\t-n\t1\t5000\t12.5\n",  # 6 columns
        _line("ResNet-50 (batch size 64)", "cmd", "-n", "1", "5000", "12.5", "1", "extra"),
        _line("ResNet-50 (batch size 64)", "cmd", "-n", "1", "5k", "12.5", "1"),
        _line("ResNet-50 (batch size 64)", "cmd", "-n", "1", "50.5", "12.5", "1"),
        _line("ResNet-50 (batch size 64)", "cmd", "-n", "1", "0", "12.5", "1"),
        _line("ResNet-50 (batch size 64)", "cmd", "-n", "1", "5000", "-1", "1"),
        _line("ResNet-50 (batch size 64)", "cmd", "-n", "1", "5000", "nan", "1"),
        _line("ResNet-50 (batch size 64)", "cmd", "-n", "1", "5000", "inf", "1"),
        _line("ResNet-50 (batch size 64)", "cmd", "-n", "2", "5000", "1", "1"),
        _line("ResNet-50 (batch size 64)", "cmd", "-n", "1", "5000", "1", "0"),
        _line("", "cmd", "-n", "1", "5000", "1", "1"),
    ],
)
def test_trace_bad_line_names_line_number(bad: str) -> None:
    with pytest.raises(TraceError) as info:
        parse_trace([GOOD, GOOD, bad, GOOD])
    assert info.value.line_no == 3
    assert "line 3" in str(info.value)


# -- job state machine (docs/DESIGN.md §3) -----------------------------------------------------


@pytest.mark.parametrize(("current", "target"), list(itertools.product(JobState, JobState)))
def test_check_transition_matches_table(current: JobState, target: JobState) -> None:
    if target in JOB_TRANSITIONS[current]:
        check_transition(current, target)
    else:
        with pytest.raises(IllegalTransition) as info:
            check_transition(current, target)
        assert current.value in str(info.value) and target.value in str(info.value)


def test_transition_table_shape() -> None:
    assert set(JOB_TRANSITIONS) == set(JobState)
    assert JOB_TRANSITIONS[JobState.DONE] == frozenset() == JOB_TRANSITIONS[JobState.FAILED]
    for state, targets in JOB_TRANSITIONS.items():
        if state not in (JobState.DONE, JobState.FAILED):
            assert JobState.FAILED in targets
    assert issubclass(IllegalTransition, ValueError)


@pytest.mark.parametrize(("steps", "scale", "words"), [
    ("1" + "0" * 400, "1", "total steps must be within"),
    (str(10**12 + 1), "1", "total steps must be within"),
    ("100", str(10**10), "scale factor (GPUs) must be within"),
])
def test_trace_rows_past_any_real_job_are_refused_with_their_line(steps, scale, words) -> None:
    """A corrupt row must not be expanded into memory nor overflow every duration downstream."""
    from scheduler_core.trace import TraceError, parse_trace

    good = "ResNet-50 (batch size 64)\tpython train.py\t--steps\t0\t1000\t0\t1"
    bad = f"ResNet-50 (batch size 64)\tpython train.py\t--steps\t0\t{steps}\t5\t{scale}"
    with pytest.raises(TraceError) as exc:
        parse_trace([good, bad])
    assert exc.value.line_no == 2 and words in str(exc.value) and len(str(exc.value)) < 200
    assert parse_trace([good])[0].total_steps == 1000
