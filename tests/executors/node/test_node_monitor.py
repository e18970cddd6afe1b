"""GPU monitor pieces on the simulated backend: ring buffer, per-minute aggregation, samplers."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from executors.node.aggregate import aggregate_minute, minute_floor
from executors.node.ring import SampleRing
from executors.node.sampler import FIELDS, NAN, RawSample, SimulatedSampler, nvml_available

MIN = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)


def raw(sm: float = 30.0, util: float = 40.0, clock: float = 1500.0, mem: float = 4e9, **kw) -> RawSample:
    return RawSample(gpu_util_pct=util, sm_activity_pct=sm, sm_occupancy_pct=kw.get("occ", 20.0),
                     mem_used_bytes=mem, mem_total_bytes=24e9, mem_bw_util_pct=kw.get("bw", 10.0),
                     sm_clock_mhz=clock, sm_clock_max_mhz=1695.0, power_w=kw.get("power", 100.0),
                     temperature_c=kw.get("temp", 50.0))


def test_ring_is_preallocated_and_wraps():
    ring = SampleRing.for_window(window_s=300.0, interval_s=0.01)
    assert ring.capacity == 30_000
    buf, tbuf = ring.data, ring.t_s
    for k in range(ring.capacity + 250):
        ring.append(float(k), raw(sm=float(k % 100)))
    assert ring.data is buf and ring.t_s is tbuf  # no reallocation, ever
    assert len(ring) == ring.capacity and ring.count == ring.capacity + 250
    t, d = ring.last(3)
    assert list(t) == [float(ring.count - 3), float(ring.count - 2), float(ring.count - 1)]
    assert d.shape == (3, len(FIELDS))
    # samples overwritten are gone: since() returns only what is still held
    t_all, _ = ring.since(0)
    assert len(t_all) == ring.capacity and t_all[0] == 250.0


def test_ring_append_does_not_allocate_arrays():
    import tracemalloc

    ring = SampleRing(10_000)
    s = raw()
    for k in range(100):
        ring.append(float(k), s)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for k in range(5_000):
        ring.append(float(k), s)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(st.size_diff for st in after.compare_to(before, "filename") if st.size_diff > 0)
    assert grown < 20_000, grown  # 5,000 appends: no per-sample buffers


def test_aggregate_full_minute_means():
    online = [NAN] * (len(FIELDS) - 10)
    data = np.array([[*map(float, [40, 30, 20, 4e9, 24e9, 10, 1500, 1695, 100, 50]), *online],
                     [*map(float, [60, 50, 40, 6e9, 24e9, 30, 1300, 1695, 200, 60]), *online]])
    agg = aggregate_minute(7, MIN, data, expected=2, health="Healthy")
    r = agg.row
    assert agg.coverage == 1.0 and agg.samples == 2
    assert (r.gpu_id, r.minute_utc, r.health) == (7, MIN, "Healthy")
    assert (r.gpu_util_pct, r.sm_activity_pct, r.sm_occupancy_pct) == (50.0, 40.0, 30.0)
    assert (r.mem_used_bytes, r.sm_clock_mhz, r.power_w, r.temperature_c, r.mem_bw_util_pct) == (5e9, 1400.0, 150.0, 55.0, 20.0)
    assert r.online_qps is None and r.online_gpu_util_pct is None and r.offline_job_id is None


def test_aggregate_averages_the_online_split_like_any_metric():
    ring = SampleRing(10)
    for k, on in enumerate((10.0, NAN, 30.0)):
        ring.append(float(k), RawSample(40.0, 30.0, 20.0, 4e9, 24e9, 10.0, 1500.0, 1695.0, online_gpu_util_pct=on,
                                        online_mem_used_bytes=3e9, online_qps=NAN))
    _, data = ring.since(0)
    r = aggregate_minute(1, MIN, data, expected=3, health="Healthy").row
    assert r.online_gpu_util_pct == 20.0 and r.online_mem_used_bytes == 3e9
    assert r.online_qps is None and r.online_sm_activity_pct is None  # never read: None, not 0


def test_aggregate_with_gaps_and_nans():
    ring = SampleRing(100)
    for k in range(10):
        ring.append(float(k), raw(sm=10.0 * k, power=NAN if k % 2 else 100.0))
    ring.append(10.0, RawSample())  # a sample with nothing in it
    _, data = ring.since(0)
    agg = aggregate_minute(1, MIN, data, expected=20, health="Unhealthy")
    assert agg.samples == 11
    assert agg.coverage == pytest.approx(10 / 20)  # only complete readings count as coverage
    assert agg.row.sm_activity_pct == pytest.approx(45.0)
    assert agg.row.power_w == 100.0                 # NaNs ignored per metric


def test_aggregate_optional_metrics_missing_become_null_and_occupancy_zero():
    ring = SampleRing(10)
    ring.append(0.0, RawSample(gpu_util_pct=5.0, sm_activity_pct=5.0, mem_used_bytes=1.0, mem_total_bytes=2.0,
                               sm_clock_mhz=900.0))
    _, data = ring.since(0)
    r = aggregate_minute(1, MIN, data, expected=6000, health="Healthy").row
    assert r.power_w is None and r.temperature_c is None and r.mem_bw_util_pct is None
    assert r.sm_occupancy_pct == 0.0


def test_aggregate_skips_empty_and_unusable_minutes():
    empty = aggregate_minute(1, MIN, np.empty((0, len(FIELDS))), expected=6000, health="Healthy")
    assert empty.row is None and empty.coverage == 0.0 and empty.skipped_reason == "no samples"
    ring = SampleRing(10)
    ring.append(0.0, RawSample(power_w=50.0))
    _, data = ring.since(0)
    bad = aggregate_minute(1, MIN, data, expected=6000, health="Healthy")
    assert bad.row is None and "gpu_util_pct" in bad.skipped_reason


def test_minute_floor():
    t = MIN.timestamp() + 59.999
    assert minute_floor(t) == MIN
    assert minute_floor(t + 0.002) == MIN + dt.timedelta(minutes=1)


def test_simulated_sampler_model_replay_gaps_and_xids():
    seq = [raw(sm=1.0), None, raw(sm=3.0)]
    smp = SimulatedSampler(models={0: lambda t: raw(sm=t)}, replay={1: seq}, xids=[(5.0, 1, 31), (1.0, 0, 13)])
    assert smp.source == "simulated" and smp.gpu_indices() == [0, 1]
    assert smp.sample(0, 7.0).sm_activity_pct == 7.0
    assert [smp.sample(1, t) for t in range(4)] == [seq[0], None, seq[2], seq[2]]  # holds the last
    assert smp.poll_xids(0.5) == []
    assert [(e.gpu_index, e.xid) for e in smp.poll_xids(2.0)] == [(0, 13)]
    assert [(e.gpu_index, e.xid) for e in smp.poll_xids(9.0)] == [(1, 31)]
    assert smp.poll_xids(10.0) == []
    looped = SimulatedSampler(replay={0: [raw(sm=1.0), raw(sm=2.0)]}, loop=True)
    assert [looped.sample(0, 0).sm_activity_pct for _ in range(5)] == [1.0, 2.0, 1.0, 2.0, 1.0]
    smp.set_override(0, None)
    assert smp.sample(0, 0.0) is None
    with pytest.raises(ValueError):
        SimulatedSampler(models={0: lambda t: raw()}, replay={0: []})


def test_nvml_sampler_fails_cleanly_without_a_driver():
    ok, why = nvml_available()
    if ok:
        pytest.skip(f"an NVIDIA driver is present ({why}); tests/gpu covers it")
    assert "nvmlInit failed" in why or "not installed" in why
    import pynvml

    from executors.node.sampler import NvmlSampler

    with pytest.raises(pynvml.NVMLError):
        NvmlSampler()
