"""The per-GPU record: shm.py writes exactly the layout xCUDA's C reader expects,
and the reader rejects anything it must not trust."""

from __future__ import annotations

import json
import struct
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executors.node.xcuda.build import Artifacts
from executors.node.xcuda.shm import (
    FLAG_INTEGRAL,
    LAYOUT,
    MAGIC,
    RECORD_SIZE,
    VERSION,
    GpuSample,
    ShmWriter,
    decode,
    default_path,
    encode,
)

SAMPLE = GpuSample(u_sm=0.42, sm_clock_mhz=1215.0, clock_threshold_mhz=1290.0, clock_max_mhz=1590.0,
                   target_util=0.85, sm_occupancy=0.3, gpu_util=0.7, mem_used_bytes=3 << 30)


def _dump(xcuda: Artifacts, path: Path, stale_ms: int = 1000, shift_ms: int = 0) -> dict:
    out = subprocess.run([str(xcuda.shm_dump), str(path), str(stale_ms), str(shift_ms)], capture_output=True,
                         text=True, check=True, timeout=30)
    return json.loads(out.stdout)


def test_layout_matches_the_c_header(xcuda) -> None:
    out = subprocess.run([str(xcuda.shm_dump), "--layout"], capture_output=True, text=True, check=True)
    c = json.loads(out.stdout)
    assert c["size"] == RECORD_SIZE == 128
    assert c["magic"] == MAGIC and c["version"] == VERSION
    assert c["fields"] == {k: list(v) for k, v in LAYOUT.items()}


def test_what_python_writes_c_reads(xcuda, tmp_path) -> None:
    path = tmp_path / "rec"
    with ShmWriter(path, gpu_index=5) as w:
        seq = w.write(SAMPLE)
    got = _dump(xcuda, path)
    assert got["status"] == "ok" and got["seq"] == seq and got["gpu_index"] == 5
    for field in ("u_sm", "sm_clock_mhz", "clock_threshold_mhz", "clock_max_mhz", "target_util", "sm_occupancy",
                  "gpu_util", "mem_used_bytes"):
        assert got[field] == getattr(SAMPLE, field), field
    assert abs(got["timestamp_ns"] - time.monotonic_ns()) < 30e9  # the same clock on both sides
    assert path.stat().st_mode & 0o777 == 0o644
    assert got["flags"] == FLAG_INTEGRAL and got["u_sm_integral_s"] == 0.0  # nothing to integrate yet


def test_the_writer_publishes_the_integral_of_u_sm_over_time(xcuda, tmp_path) -> None:
    path = tmp_path / "rec"
    t0 = time.monotonic_ns()
    with ShmWriter(path) as w:
        w.write(replace(SAMPLE, u_sm=0.9), t0)
        w.write(replace(SAMPLE, u_sm=0.5), t0 + 10_000_000)          # 10 ms at 0.5
        w.write(replace(SAMPLE, u_sm=0.2), t0 + 30_000_000)          # 20 ms at 0.2
        assert decode(path.read_bytes()).sample.u_sm_integral_s == pytest.approx(0.005 + 0.004)
        w.write(replace(SAMPLE, u_sm=1.0), t0 + 6_030_000_000)       # after a 6 s silence: adds nothing
        w.write(replace(SAMPLE, u_sm=float("nan")), t0 + 6_040_000_000)  # a NaN sample adds nothing
        w.write(replace(SAMPLE, u_sm=0.4), t0 + 6_050_000_000)
    rec = decode(path.read_bytes())
    assert rec.sample.flags & FLAG_INTEGRAL
    assert rec.sample.u_sm_integral_s == pytest.approx(0.009 + 0.004)
    got = _dump(xcuda, path, stale_ms=10**7)   # what xCUDA's reader sees
    assert got["u_sm_integral_s"] == pytest.approx(0.013) and got["flags"] == FLAG_INTEGRAL


def test_a_stalled_or_restarted_writer_never_makes_the_gpu_read_idle(tmp_path) -> None:
    """The mean U_SM a reader takes between two records (xCUDA's meter, Python mirror) is the samples' U_SM even
    when the agent stalled for seconds or a new writer took the record over: never 0 for a busy GPU (a 0 would open
    xCUDA's gate to the job for as long as its demand peak holds)."""
    from scheduler_core.guard.xcuda_control import Meter

    path = tmp_path / "rec"
    t0 = time.monotonic_ns()
    meter = Meter()

    def read() -> float:
        rec = decode(path.read_bytes())
        return meter.update(rec.sample.u_sm, bool(rec.sample.flags & FLAG_INTEGRAL), rec.sample.u_sm_integral_s,
                            rec.timestamp_ns)

    busy = replace(SAMPLE, u_sm=0.6)
    with ShmWriter(path) as w:
        w.write(busy, t0)
        read()
        w.write(busy, t0 + 10_000_000)
        assert read() == pytest.approx(0.6)
        w.write(busy, t0 + 3_010_000_000)  # the agent stalled 3 s (within the reader's horizon)
        assert read() == pytest.approx(0.6)
    with ShmWriter(path) as again:  # a new writer (a restarted agent, a second feeder) on the same record
        again.write(busy, t0 + 3_020_000_000)
        assert read() == pytest.approx(0.6)
        again.write(busy, t0 + 3_030_000_000)
        assert read() == pytest.approx(0.6)


@pytest.mark.parametrize(
    ("damage", "status"),
    [
        (lambda b: b[:100], "file shorter than a record"),
        (lambda b: b"X" + b[1:], "bad magic"),
        (lambda b: b[:8] + struct.pack("<I", 2) + b[12:], "unsupported version"),
        (lambda b: b[:16] + struct.pack("<Q", 7) + b[24:], "writer always mid-update"),
        (lambda b: b[:60] + bytes([b[60] ^ 1]) + b[61:], "checksum mismatch"),
    ],
)
def test_damaged_records_are_rejected(xcuda, tmp_path, damage, status) -> None:
    path = tmp_path / "rec"
    path.write_bytes(damage(encode(SAMPLE, 0, time.monotonic_ns())))
    assert _dump(xcuda, path)["status"] == status


def test_out_of_range_values_are_rejected(xcuda, tmp_path) -> None:
    path = tmp_path / "rec"
    for bad in (GpuSample(float("nan"), 1000, 1290, 1590), GpuSample(1.5, 1000, 1290, 1590),
                GpuSample(0.5, -1, 1290, 1590), GpuSample(0.5, 1000, 1290, 1590, target_util=3)):
        path.write_bytes(encode(bad, 0, time.monotonic_ns()))
        assert _dump(xcuda, path)["status"] == "values out of range"


def test_stale_and_future_records_are_rejected(xcuda, tmp_path) -> None:
    path = tmp_path / "rec"
    path.write_bytes(encode(SAMPLE, 0, time.monotonic_ns() - 5_000_000_000))
    assert _dump(xcuda, path, stale_ms=1000)["status"].startswith("stale")
    assert _dump(xcuda, path, stale_ms=60_000)["status"] == "ok"
    path.write_bytes(encode(SAMPLE, 0, time.monotonic_ns() + 5_000_000_000))
    assert _dump(xcuda, path, stale_ms=1000)["status"].startswith("stale")


def test_a_sample_newer_than_the_readers_clock_is_fresh(xcuda, tmp_path) -> None:
    # The controller reads the clock, then the record; the agent may write in between.
    path = tmp_path / "rec"
    path.write_bytes(encode(SAMPLE, 0, time.monotonic_ns()))
    assert _dump(xcuda, path, stale_ms=1000, shift_ms=-50)["status"] == "ok"


def test_missing_file(xcuda, tmp_path) -> None:
    assert _dump(xcuda, tmp_path / "nothing")["status"] == "no such file"


def test_reads_during_writes_are_never_torn(xcuda, tmp_path) -> None:
    path = tmp_path / "rec"
    a = GpuSample(0.1, 1000.0, 1290.0, 1590.0, gpu_util=0.1)
    b = GpuSample(0.9, 1500.0, 1290.0, 1590.0, gpu_util=0.9)
    stop = threading.Event()

    def writer() -> None:
        with ShmWriter(path) as w:
            while not stop.is_set():  # far faster than an agent, with gaps a reader can hit
                w.write(a)
                w.write(b)
                time.sleep(0.0002)

    ShmWriter(path).write(a)
    t = threading.Thread(target=writer)
    t.start()
    try:
        seen = [_dump(xcuda, path) for _ in range(40)]
    finally:
        stop.set()
        t.join()
    ok = [s for s in seen if s["status"] == "ok"]
    assert ok, seen
    for s in ok:
        assert (s["u_sm"], s["sm_clock_mhz"], s["gpu_util"]) in {(0.1, 1000.0, 0.1), (0.9, 1500.0, 0.9)}
    assert all(s["status"] in ("ok", "writer always mid-update") for s in seen), [s["status"] for s in seen]


def test_a_writer_resumes_after_one_that_died_mid_update(tmp_path) -> None:
    path = tmp_path / "rec"
    path.write_bytes(encode(SAMPLE, 0, 1)[:16] + struct.pack("<Q", 9) + encode(SAMPLE, 0, 1)[24:])
    with ShmWriter(path) as w:
        assert w.write(SAMPLE) % 2 == 0
    assert decode(path.read_bytes()).sample == replace(SAMPLE, flags=FLAG_INTEGRAL)


def test_default_path() -> None:
    assert default_path(3) == Path("/dev/shm/muxflow-gpu-3")


finite = st.floats(min_value=0, max_value=1, allow_nan=False)


@given(u=finite, c=st.floats(0, 5000), t=st.floats(0, 5000), h=st.floats(0, 5000), idx=st.integers(0, 4095),
       ts=st.integers(0, 2**63), mem=st.integers(0, 2**64 - 1))
def test_encode_decode_round_trip(u, c, t, h, idx, ts, mem) -> None:
    sample = GpuSample(u, c, t, h, mem_used_bytes=mem)
    rec = decode(encode(sample, idx, ts))
    assert (rec.sample, rec.gpu_index, rec.timestamp_ns) == (sample, idx, ts)


def test_decode_says_what_is_wrong() -> None:
    good = encode(SAMPLE, 0, 1)
    with pytest.raises(ValueError, match="checksum"):
        decode(good[:40] + bytes([good[40] ^ 0xFF]) + good[41:])
    with pytest.raises(ValueError, match="magic"):
        decode(b"\x00" * 128)
