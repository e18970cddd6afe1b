"""The pacing thread of a live preloaded process (fake driver, a record rewritten every 5 ms with a moving load)
decides, period by period, exactly what the Python mirror decides from the same inputs: its debug trace replayed
through scheduler_core.guard.xcuda_control (executors.node.xcuda.trace) agrees on every period."""

from __future__ import annotations

import random
import threading

from executors.node.xcuda.shm import GpuSample
from executors.node.xcuda.trace import Gains, mismatches, parse, steady_state

T4 = {"clock_threshold_mhz": 1290.0, "clock_max_mhz": 1590.0}
ENV = {"XCUDA_LOG_LEVEL": "debug", "XCUDA_FALLBACK_LAUNCH_RATE": "1000", "XCUDA_MIN_LAUNCH_RATE": "10",
       "XCUDA_CONTROL_PERIOD_MS": "10", "XCUDA_KP": "1.5", "XCUDA_KI": "15", "XCUDA_KD": "0.01",
       "XCUDA_TARGET_UTIL": "0.6"}
GAINS = Gains(fallback_rate=1000.0, min_rate=10.0, kp=1.5, ki=15.0, kd=0.01)


def test_a_live_trace_replays_exactly_through_the_mirror(harness, feeder, tmp_path) -> None:
    record = tmp_path / "gpu-record"
    rng = random.Random(7)
    with feeder(GpuSample(u_sm=0.3, sm_clock_mhz=1590.0, **T4)) as feed:
        stop = threading.Event()

        def agent() -> None:   # a load that moves: under the target, over it, the clock sagging, back down
            k = 0
            while not stop.wait(0.007):
                k += 1
                base = 0.3 if k < 40 else (0.95 if k < 100 else 0.45)
                feed.sample = GpuSample(u_sm=min(1.0, max(0.0, base + rng.uniform(-0.1, 0.1))),
                                        sm_clock_mhz=1590.0 - 400.0 * (40 <= k < 100), **T4)

        t = threading.Thread(target=agent)
        t.start()
        try:
            run = harness("init", "launch-for", "1.2", XCUDA_SHM_PATH=str(record), **ENV)
        finally:
            stop.set()
            t.join()
    assert run.returncode == 0, run.stderr
    runs = parse(run.stderr)
    assert len(runs) == 1, run.stderr[-2000:]
    periods = runs[0]
    assert len(periods) > 50
    assert {p.mode for p in periods} == {1, 2}           # it paced and it opened
    assert all(p.flags & 1 for p in periods)              # the record carried the integral
    assert any(abs(p.u - p.u_sm) > 0.02 for p in periods)  # and the library acted on the mean, not the sample
    assert mismatches(periods, GAINS) == []
    wrong = Gains(fallback_rate=1000.0, min_rate=10.0, kp=1.0, ki=15.0, kd=0.01)
    assert mismatches(periods, wrong)                     # the replay can tell


def test_steady_state_of_a_trace() -> None:
    line = ("xcuda[1]: debug: pace ts={ts} flags=1 u_sm=0.5 integral=0 c_sm=0 t_sm=0 c_h=0 target=0.4 demand=100 "
            "dt=0.5 u={u} u_gpu={u} mode={mode} rate=50")
    text = "\n".join(["xcuda[1]: info: GPU record /x in use: closed-loop pacing of kernel launches",
                      *(line.format(ts=i, u=0.9 if i < 6 else (0.3 if i % 2 else 0.5), mode=1 if i % 3 else 2)
                        for i in range(12)),
                      "xcuda[1]: debug: pace ts=99 flags=1 u_sm=0.5"])   # cut short: ignored
    (periods,) = parse(text)
    assert len(periods) == 12
    s = steady_state(periods, settle_s=3.0)
    assert s["periods"] == 6 and abs(s["u_gpu_mean"] - 0.4) < 1e-12 and abs(s["error"]) < 1e-12
    assert s["paced_share"] == 4 / 6 and s["rate_mean"] == 50
    assert steady_state(periods, settle_s=100)["u_gpu_mean"] is None
