"""Hypothesis properties of the SysMonitor state machine (scheduler_core/guard/sysmonitor.py, docs/DESIGN.md §8).

- Overlimit always evicts within one sample;
- no flapping when metrics oscillate around a threshold (inside the hysteresis band);
- the Overlimit → Unhealthy hold grows as base · 2^(k−1), k = entries in the last two hours.
"""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from scheduler_core.domain import GpuHealth
from scheduler_core.guard.sysmonitor import GpuSample, SysMonitor, SysMonitorConfig

CFG = SysMonitorConfig()
CALM = GpuSample(10.0, 10.0, 1.0, 0.2)  # below every Healthy threshold
PROPS = settings(max_examples=100, deadline=None)


def sample_st(lo_util=0.0, hi_util=100.0):
    return st.builds(
        GpuSample,
        gpu_util_pct=st.floats(lo_util, hi_util),
        sm_activity_pct=st.floats(0.0, 100.0),
        sm_clock_frac=st.floats(0.3, 1.0),
        mem_used_frac=st.floats(0.0, 1.0),
    )


def overlimit_st():
    """Samples that reach at least one Overlimit threshold."""
    ol = CFG.overlimit
    base = sample_st()
    return st.one_of(
        st.tuples(base, st.floats(ol.sm_activity_pct, 100.0)).map(
            lambda t: GpuSample(t[0].gpu_util_pct, t[1], t[0].sm_clock_frac, t[0].mem_used_frac)),
        st.tuples(base, st.floats(0.0, ol.sm_clock_frac)).map(
            lambda t: GpuSample(t[0].gpu_util_pct, t[0].sm_activity_pct, t[1], t[0].mem_used_frac)),
        st.tuples(base, st.floats(ol.mem_used_frac, 1.0)).map(
            lambda t: GpuSample(t[0].gpu_util_pct, t[0].sm_activity_pct, t[0].sm_clock_frac, t[1])),
    )


@PROPS
@given(history=st.lists(st.tuples(st.floats(0.001, 30.0), sample_st()), max_size=40), hot=overlimit_st(),
       gap=st.floats(0.001, 30.0))
def test_overlimit_always_evicts_within_one_sample(history, hot, gap):
    mon = SysMonitor(CFG)
    t = 0.0
    for dt_s, s in history:
        t += dt_s
        mon.step(t, s)
    before = mon.state
    evict = mon.step(t + gap, hot)
    assert mon.state == GpuHealth.OVERLIMIT
    # evicted on this very sample unless offline work was already evicted (still Overlimit)
    assert evict == (before != GpuHealth.OVERLIMIT)
    if evict:
        assert mon.overlimit_entries_s[-1] == t + gap


@PROPS
@given(history=st.lists(st.tuples(st.floats(0.001, 30.0), sample_st()), min_size=1, max_size=60))
def test_every_overlimit_entry_evicts_and_nothing_else_does(history):
    """Evictions happen exactly on the samples that enter Overlimit, never otherwise."""
    mon = SysMonitor(CFG)
    t = 0.0
    for dt_s, s in history:
        t += dt_s
        before = mon.state
        evict = mon.step(t, s)
        assert evict == (before != GpuHealth.OVERLIMIT and mon.state == GpuHealth.OVERLIMIT)


def _transitions(mon: SysMonitor, samples, dt_s: float) -> tuple[list[GpuHealth], int]:
    states, evictions, t = [mon.state], 0, 0.0
    for s in samples:
        t += dt_s
        evictions += mon.step(t, s)
        if mon.state != states[-1]:
            states.append(mon.state)
    return states, evictions


@PROPS
@given(amp=st.floats(0.01, 4.9), n=st.integers(10, 300), dt_s=st.floats(0.001, 1.0), seed=st.randoms())
def test_no_flapping_around_the_unhealthy_threshold(amp, n, dt_s, seed):
    """SM activity jittering around the Unhealthy threshold (inside the band to Healthy): at most one change."""
    thr = CFG.unhealthy.sm_activity_pct
    samples = [GpuSample(50.0, thr + seed.uniform(-amp, amp), 1.0, 0.3) for _ in range(n)]
    mon = SysMonitor(CFG, state=GpuHealth.HEALTHY)
    states, evictions = _transitions(mon, samples, dt_s)
    assert evictions == 0
    assert states in ([GpuHealth.HEALTHY], [GpuHealth.HEALTHY, GpuHealth.UNHEALTHY])


@PROPS
@given(amp=st.floats(0.01, 4.9), n=st.integers(10, 300), dt_s=st.floats(0.001, 1.0), seed=st.randoms())
def test_no_flapping_around_the_healthy_threshold(amp, n, dt_s, seed):
    """Jitter around the Healthy threshold from Unhealthy: at most one change (to Healthy), never back."""
    thr = CFG.healthy.sm_activity_pct
    samples = [GpuSample(50.0, thr + seed.uniform(-amp, amp), 1.0, 0.3) for _ in range(n)]
    mon = SysMonitor(CFG, state=GpuHealth.UNHEALTHY)
    states, evictions = _transitions(mon, samples, dt_s)
    assert evictions == 0
    assert states in ([GpuHealth.UNHEALTHY], [GpuHealth.UNHEALTHY, GpuHealth.HEALTHY])


@PROPS
@given(metric=st.sampled_from(["sm", "clock", "mem"]), amp=st.floats(0.001, 0.05), n=st.integers(10, 400),
       dt_s=st.floats(0.001, 0.5), seed=st.randoms())
def test_no_flapping_around_the_overlimit_threshold(metric, amp, n, dt_s, seed):
    """A metric oscillating around its Overlimit threshold faster than the hold: one entry, one eviction.

    Every reading over the threshold restarts the calm period, so the GPU stays in Overlimit
    instead of cycling Overlimit → Unhealthy → Overlimit with an eviction each time."""
    ol = CFG.overlimit
    samples = []
    for k in range(n):
        sign = 1 if k % 2 == 0 else -1   # alternate so the threshold is crossed every sample
        d = sign * seed.uniform(1e-6, amp)
        if metric == "sm":
            samples.append(GpuSample(50.0, ol.sm_activity_pct + d * 100, 1.0, 0.3))
        elif metric == "clock":
            samples.append(GpuSample(50.0, 50.0, ol.sm_clock_frac - d, 0.3))
        else:
            samples.append(GpuSample(50.0, 50.0, 1.0, ol.mem_used_frac + d))
    mon = SysMonitor(CFG, state=GpuHealth.HEALTHY)
    states, evictions = _transitions(mon, samples, dt_s)
    assert evictions == 1
    assert states == [GpuHealth.HEALTHY, GpuHealth.OVERLIMIT]


def _hold_after_entry(mon: SysMonitor, t: float, step_s: float) -> tuple[float, float]:
    """Enter Overlimit at ``t``, then calm samples every ``step_s``; (hold observed, time of Unhealthy)."""
    assert mon.step(t, GpuSample(50.0, 99.0, 1.0, 0.3))
    calm_start = t + step_s
    now = calm_start
    while True:
        mon.step(now, CALM)
        if mon.state != GpuHealth.OVERLIMIT:
            assert mon.state == GpuHealth.UNHEALTHY
            return now - calm_start, now
        now += step_s


@PROPS
@given(k=st.integers(1, 6), base=st.floats(1.0, 120.0), step_s=st.floats(0.05, 1.0), pause=st.floats(0.0, 5.0))
def test_backoff_doubles_with_each_entry_in_two_hours(k, base, step_s, pause):
    cfg = SysMonitorConfig(base_hold_s=base)
    # Only sequences whose entries all stay inside the two-hour window test the doubling.
    assume(base * (2**k - 1) + k * (pause + 2 * step_s) < cfg.window_s)
    mon = SysMonitor(cfg, state=GpuHealth.HEALTHY)
    t = 0.0
    holds = []
    for _ in range(k):
        hold, t = _hold_after_entry(mon, t, step_s)
        holds.append(hold)
        t += pause
    assert t < cfg.window_s  # every entry is still inside the window
    for i, hold in enumerate(holds):
        expected = base * 2**i
        # calm samples are step_s apart: the change lands on the first sample at or past the hold
        assert expected <= hold + 1e-9 < expected + step_s + 1e-6, (i, hold, expected)


@PROPS
@given(k=st.integers(1, 4), base=st.floats(1.0, 60.0))
def test_backoff_forgets_entries_older_than_two_hours(k, base):
    cfg = SysMonitorConfig(base_hold_s=base)
    mon = SysMonitor(cfg, state=GpuHealth.HEALTHY)
    t = 0.0
    for _ in range(k):
        _, t = _hold_after_entry(mon, t, 0.5)
    t += cfg.window_s + 1.0  # all earlier entries are now older than two hours
    hold, _ = _hold_after_entry(mon, t, 0.5)
    assert base <= hold < base + 0.5 + 1e-6
    assert len(mon.overlimit_entries_s) == 1


def test_hold_period_formula():
    mon = SysMonitor(SysMonitorConfig(base_hold_s=60.0))
    mon.overlimit_entries_s = [0.0, 100.0, 200.0]
    assert mon.hold_period_s(300.0) == 240.0
    assert mon.hold_period_s(2 * 3600.0 + 50.0) == 120.0  # the entry at 0 s has left the window


def test_disabled_never_evicts_or_leaves():
    mon = SysMonitor(CFG)
    mon.disable()
    assert not mon.step(1.0, GpuSample(100.0, 100.0, 0.1, 1.0))
    assert mon.state == GpuHealth.DISABLED
