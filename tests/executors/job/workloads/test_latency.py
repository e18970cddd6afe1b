"""Open-loop serving and the latency recorder against a fake clock: queueing counts, batching, stopping."""

from __future__ import annotations

import pytest

from executors.job.workloads.latency import LatencyRecorder, arrival_times, run_open_loop


class FakeTime:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        assert s > 0
        self.sleeps.append(s)
        self.t += s


def server(ft: FakeTime, service_s: float, batches: list[int] | None = None):
    def handle(n: int) -> None:
        if batches is not None:
            batches.append(n)
        ft.t += service_s
    return handle


def test_under_capacity_latency_is_the_service_time() -> None:
    ft = FakeTime()
    rec = run_open_loop(arrival_times(10, 1.0, process="uniform"), server(ft, 0.05), ft.clock, ft.sleep)
    assert rec.count == 10
    assert rec.latencies_s() == pytest.approx([0.05] * 10)
    s = rec.summary()
    assert s["avg_ms"] == pytest.approx(50.0) and s["p99_ms"] == pytest.approx(50.0) and s["avg_queue_ms"] == 0
    assert s["busy_frac"] == pytest.approx(0.5 / 0.95)


def test_over_capacity_requests_queue_and_latency_includes_the_wait() -> None:
    ft = FakeTime()
    arrivals = [0.1 * k for k in range(5)]          # 10 QPS offered
    rec = run_open_loop(arrivals, server(ft, 0.15), ft.clock, ft.sleep)   # ~6.7 QPS served
    # request k starts at 0.15 k and finishes at 0.15 (k + 1): it waited 0.05 k
    assert rec.latencies_s() == pytest.approx([0.15 + 0.05 * k for k in range(5)])
    s = rec.summary()
    assert s["p50_ms"] == pytest.approx(250.0) and s["max_ms"] == pytest.approx(350.0)
    assert s["avg_queue_ms"] == pytest.approx(100.0)
    assert ft.sleeps == []  # never idle: the server was always behind


def test_dynamic_batching_serves_what_has_queued_up_to_the_limit() -> None:
    ft = FakeTime()
    batches: list[int] = []
    arrivals = [0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.5]
    rec = run_open_loop(arrivals, server(ft, 0.1, batches), ft.clock, ft.sleep, max_batch=4)
    assert batches == [1, 4, 1, 1]  # the 2nd batch takes 4 of the 5 queued; then one more; then the late one
    assert rec.count == 7 and rec.finish_s[-1] == pytest.approx(0.6)


def test_should_stop_ends_after_the_batch_in_progress() -> None:
    ft = FakeTime()
    served: list[int] = []
    rec = run_open_loop(arrival_times(100, 1.0, process="uniform"), server(ft, 0.001, served), ft.clock, ft.sleep,
                        should_stop=lambda: len(served) >= 3)
    assert rec.count == 3


def test_poisson_arrivals_are_seeded_and_have_the_right_rate() -> None:
    a = arrival_times(50, 40.0, seed=7)
    assert a == arrival_times(50, 40.0, seed=7) and a != arrival_times(50, 40.0, seed=8)
    assert a == sorted(a) and 0 < a[0] and a[-1] < 40.0
    assert 1800 < len(a) < 2200  # 2000 expected; sd ~45


@pytest.mark.parametrize("qps,dur,msg", [(0, 1, "qps"), (5, -1, "duration"), (float("nan"), 1, "qps")])
def test_bad_load_is_refused(qps, dur, msg) -> None:
    with pytest.raises(ValueError, match=msg):
        arrival_times(qps, dur)


def test_recorder_refuses_impossible_times_and_summarises_percentiles() -> None:
    rec = LatencyRecorder()
    with pytest.raises(ValueError):
        rec.record(1.0, 0.5, 2.0)
    for k in range(100):
        rec.record(float(k), float(k), k + (k + 1) / 1000)   # latencies 1..100 ms
    s = rec.summary()
    assert s["requests"] == 100 and s["p50_ms"] == pytest.approx(50.5) and s["p99_ms"] == pytest.approx(99.01)
    assert s["avg_ms"] == pytest.approx(50.5)
    assert LatencyRecorder().summary()["avg_ms"] is None
