"""Compute pacing (paper §4.1, Eq. 1-2, PID): launches slow down when the GPU
record shows a high load and not when it shows a low one; without a usable
record xCUDA paces at a fixed safe rate and says so once."""

from __future__ import annotations

import os
import threading
import time

from executors.node.xcuda.shm import GpuSample, ShmWriter, encode

from .conftest import wait_for_line

T4 = {"clock_threshold_mhz": 1290.0, "clock_max_mhz": 1590.0}
LOW = GpuSample(u_sm=0.2, sm_clock_mhz=1590.0, **T4)
HIGH = GpuSample(u_sm=1.0, sm_clock_mhz=1100.0, **T4)  # busy and the clock sagging: a_C > 1

PACING = {"XCUDA_FALLBACK_LAUNCH_RATE": "1000", "XCUDA_MIN_LAUNCH_RATE": "10", "XCUDA_CONTROL_PERIOD_MS": "10"}


def _launched(run) -> int:
    assert run.returncode == 0, run.stderr
    return int(run.fields("launched")["n"])


def test_high_load_slows_launches_and_low_load_does_not(harness, feeder, tmp_path) -> None:
    record = str(tmp_path / "gpu-record")
    with feeder(LOW):
        low = _launched(harness("init", "launch-for", "0.5", XCUDA_SHM_PATH=record, **PACING))
    with feeder(HIGH):
        high = _launched(harness("init", "launch-for", "0.5", XCUDA_SHM_PATH=record, **PACING))
    # Low load: the gate opens and launches run at the fake driver's speed
    # (millions a second). High load: the rate falls to the 10/s floor.
    assert low > 100_000
    assert high < 200
    assert low > 500 * high


def test_a_load_step_is_followed_within_a_period(harness, feeder, tmp_path) -> None:
    record = tmp_path / "gpu-record"
    with feeder(LOW) as feed:
        proc_env = {"XCUDA_SHM_PATH": str(record), **PACING}
        # Switch the record to HIGH while the harness is launching.
        def switch() -> None:
            time.sleep(0.6)
            feed.sample = HIGH

        t = threading.Thread(target=switch)
        t.start()
        run = harness("init", "launch-trace", "1.8", "100", **proc_env)
        t.join()
    assert run.returncode == 0, run.stderr
    buckets = [int(x) for x in run.lines("trace")[0].split()[1:]]
    early = min(buckets[:3])
    assert early > 10_000, buckets
    # The first 100 ms after the switch already runs at a tenth of the rate or
    # less; a second later the rate is at the floor (10/s).
    switch = next(i for i, b in enumerate(buckets) if b < early / 2)
    assert buckets[switch + 1] < early / 10, buckets
    assert buckets[-1] < 50, buckets


def test_clock_sag_alone_is_enough_to_pace(harness, feeder, tmp_path) -> None:
    # U_SM 0.6 is under the 0.9 target, but the clock is 30 % under its threshold:
    # a_C = 1 + 5 * 0.3 = 2.5 (Eq. 2), so U_GPU = 1.5 and launches are held back.
    sagging = GpuSample(u_sm=0.6, sm_clock_mhz=0.7 * 1290.0, **T4)
    fast = GpuSample(u_sm=0.6, sm_clock_mhz=1590.0, **T4)
    record = str(tmp_path / "gpu-record")
    with feeder(sagging):
        slow = _launched(harness("init", "launch-for", "0.5", XCUDA_SHM_PATH=record, **PACING))
    with feeder(fast):
        quick = _launched(harness("init", "launch-for", "0.5", XCUDA_SHM_PATH=record, **PACING))
    assert slow < 200 < 100_000 < quick


def test_without_a_record_the_fixed_safe_rate_applies_and_is_logged_once(harness) -> None:
    run = harness("init", "launch-for", "1.0", XCUDA_FALLBACK_LAUNCH_RATE="500", XCUDA_CONTROL_PERIOD_MS="10")
    n = _launched(run)
    # 500/s for a second, plus at most two periods banked at the start.
    assert 350 <= n <= 520, n
    assert run.stderr.count("fixed safe rate of 500/s") == 1
    assert "no such file" in run.stderr


def test_a_stale_record_is_not_trusted(harness, tmp_path) -> None:
    record = tmp_path / "gpu-record"
    record.write_bytes(encode(LOW, 0, time.monotonic_ns() - 30_000_000_000))  # 30 s old
    run = harness("init", "launch-for", "0.3", XCUDA_SHM_PATH=str(record), XCUDA_FALLBACK_LAUNCH_RATE="500")
    assert _launched(run) < 400
    assert "stale" in run.stderr and "fixed safe rate" in run.stderr


def test_a_foreign_file_is_not_trusted(harness, tmp_path) -> None:
    record = tmp_path / "gpu-record"
    record.write_bytes(os.urandom(128))
    run = harness("init", "launch-for", "0.3", XCUDA_SHM_PATH=str(record), XCUDA_FALLBACK_LAUNCH_RATE="500")
    assert _launched(run) < 400
    assert "bad magic" in run.stderr


def test_an_agent_that_starts_late_is_picked_up(spawn, tmp_path) -> None:
    record = tmp_path / "gpu-record"
    # 300 launches at the 1000/s fallback rate first: they finish only once the
    # controller has run without a record. Then the agent starts writing one.
    proc = spawn("init", "launch", "300", "launch-trace", "2.1", "300", XCUDA_SHM_PATH=str(record), **PACING)
    seen = wait_for_line(proc.stdout, "launched", deadline_s=30)
    stop = threading.Event()

    def agent() -> None:
        with ShmWriter(record) as w:
            while not stop.is_set():
                w.write(LOW)
                stop.wait(0.005)

    t = threading.Thread(target=agent)
    t.start()
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        stop.set()
        t.join()
    paced = dict(kv.split("=") for kv in seen[-1].split()[1:])
    assert float(paced["seconds"]) > 0.15  # 300 launches at about 1000/s
    buckets = [int(x) for x in out.split("trace")[1].split()]
    # xCUDA looks for a missing record once a second, then opens the gate.
    assert buckets[-1] > 100_000, buckets
    assert err.index("fixed safe rate") < err.index("in use: closed-loop pacing")


def test_a_forked_child_paces_its_own_launches(harness) -> None:
    # The child has no controller thread (threads do not survive fork): its
    # first launch starts one. 300 launches at 1000/s take a bounded time.
    run = harness("init", "launch", "10", "fork-launch", "300", "launch", "10", timeout=30, **PACING)
    assert run.returncode == 0, run.stderr
    assert run.fields("fork-launch") == {"exit": "0"}
    assert run.fields("launched", 1)["errors"] == "0"
