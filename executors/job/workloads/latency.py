"""Open-loop request serving and per-request latency (paper §7.1: average and p99 latency).

Requests *arrive* on a schedule fixed in advance (Poisson or evenly spaced at the
target QPS), whatever the server is doing: when the server falls behind,
requests queue, and a request's latency is ``finish - arrival``, queueing
included. (A closed loop, which sends the next request when the previous one
returns, would hide exactly the slowdown co-location causes.)

:func:`run_open_loop` takes the clock, the sleep and the handler as arguments,
so the loop is tested against a fake clock; ``executors.job.workloads.serve`` runs
it with real time and a real model, for a fixed window (``arrival_times``) or as a
long-running replica whose target rate changes at run time (``arrival_stream``).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence

from executors.job.runtime.timing import finite_or_none, percentile

REPORT_FORMAT = "muxflow-latency-report/1"


def arrival_times(qps: float, duration_s: float, seed: int = 0, process: str = "poisson") -> list[float]:
    """Arrival offsets (s from the start) of requests at ``qps`` over ``duration_s``."""
    if not (math.isfinite(qps) and qps > 0):
        raise ValueError(f"qps: must be a positive number, got {qps}")
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration: must be a positive number of seconds, got {duration_s}")
    if process == "uniform":
        n = int(math.floor(qps * duration_s))
        return [i / qps for i in range(n)]
    if process != "poisson":
        raise ValueError(f"arrivals: expected poisson or uniform, got {process!r}")
    rng = random.Random(seed)
    out, t = [], rng.expovariate(qps)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(qps)
    return out


def arrival_stream(rate_qps: Callable[[], float], seed: int = 0, process: str = "poisson",
                   duration_s: float | None = None) -> Iterator[float]:
    """Arrival offsets (s from the start) at a rate that may change while the service runs.

    ``rate_qps()`` is read for every next arrival, so a new target rate takes effect from
    the next request on (a Poisson process is memoryless: no schedule to rebuild). Endless
    unless ``duration_s`` is given.
    """
    if process not in ("poisson", "uniform"):
        raise ValueError(f"arrivals: expected poisson or uniform, got {process!r}")
    rng = random.Random(seed)
    t = 0.0
    while True:
        qps = rate_qps()
        if not (math.isfinite(qps) and qps > 0):
            raise ValueError(f"qps: must be a positive number, got {qps}")
        t += rng.expovariate(qps) if process == "poisson" else 1.0 / qps
        if duration_s is not None and t >= duration_s:
            return
        yield t


class LatencyRecorder:
    """Per-request arrival, service start and finish (seconds on one clock).

    ``keep`` bounds how many requests are kept for percentiles (a replica that runs for
    days keeps the latest ones); counts, busy time and the span cover every request.
    """

    def __init__(self, keep: int | None = None) -> None:
        self.arrival_s: deque[float] = deque(maxlen=keep)
        self.start_s: deque[float] = deque(maxlen=keep)
        self.finish_s: deque[float] = deque(maxlen=keep)
        self.busy_s = 0.0  # time the server spent computing (batches), for its busy fraction
        self.served = 0
        self._first_arrival_s: float | None = None
        self._last_finish_s: float | None = None

    def record(self, arrival_s: float, start_s: float, finish_s: float) -> None:
        if not arrival_s <= start_s <= finish_s:
            raise ValueError(f"request times out of order: arrival {arrival_s}, start {start_s}, finish {finish_s}")
        self.arrival_s.append(arrival_s)
        self.start_s.append(start_s)
        self.finish_s.append(finish_s)
        self.served += 1
        if self._first_arrival_s is None:
            self._first_arrival_s = arrival_s
        self._last_finish_s = finish_s if self._last_finish_s is None else max(self._last_finish_s, finish_s)

    @property
    def count(self) -> int:
        return self.served

    def latencies_s(self) -> list[float]:
        return [f - a for a, f in zip(self.arrival_s, self.finish_s)]

    def summary(self) -> dict[str, float | int | None]:
        lat = sorted(self.latencies_s())
        queue = [s - a for a, s in zip(self.arrival_s, self.start_s)]
        span = (self._last_finish_s - self._first_arrival_s) if self.served else 0.0
        ms = lambda x: finite_or_none(1000.0 * x)  # noqa: E731
        return {
            "requests": self.served,
            "avg_ms": ms(sum(lat) / len(lat)) if lat else None,
            "p50_ms": ms(percentile(lat, 50)),
            "p95_ms": ms(percentile(lat, 95)),
            "p99_ms": ms(percentile(lat, 99)),
            "max_ms": ms(lat[-1]) if lat else None,
            "avg_queue_ms": ms(sum(queue) / len(queue)) if queue else None,
            "achieved_qps": (self.served / span) if span > 0 else None,
            "busy_frac": (self.busy_s / span) if span > 0 else None,
        }


# The longest the loop sleeps at once while waiting for the next arrival: a stop request
# is noticed within it even when requests are far apart.
MAX_WAIT_S = 0.25

BatchHook = Callable[[list[float], float, float], None]


def run_open_loop(
    arrivals_s: Iterable[float],
    handle: Callable[[int], None],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    max_batch: int = 1,
    should_stop: Callable[[], bool] = lambda: False,
    on_batch: BatchHook | None = None,
    recorder: LatencyRecorder | None = None,
) -> LatencyRecorder:
    """Serve requests arriving at ``arrivals_s`` (offsets from now, a list or an endless stream) one batch at a time.

    ``handle(n)`` serves a batch of ``n`` requests and returns when its results
    are ready. Requests that have arrived while the server was busy are queued
    and served first-come first-served, up to ``max_batch`` at a time (dynamic
    batching; 1 = none). Every request is served, so the last ones may finish
    after the last arrival, unless ``should_stop()`` turns true (a signal): then
    the loop ends after the batch in progress and only served requests count.
    ``on_batch(arrivals, start, finish)`` sees every served batch (live metrics).
    """
    if max_batch < 1:
        raise ValueError("max_batch: must be >= 1")
    if isinstance(arrivals_s, Sequence) and any(b < a for a, b in zip(arrivals_s, arrivals_s[1:])):
        raise ValueError("arrivals must be sorted")
    rec = recorder if recorder is not None else LatencyRecorder()
    it = iter(arrivals_s)
    t0 = clock()
    nxt = next(it, None)
    while nxt is not None and not should_stop():
        now = clock() - t0
        if now < nxt:
            sleep(min(nxt - now, MAX_WAIT_S))  # waiting for the next request to arrive (the client's schedule)
            continue
        batch = [nxt]
        nxt = next(it, None)
        while nxt is not None and len(batch) < max_batch and nxt <= now:
            batch.append(nxt)
            nxt = next(it, None)
        if nxt is not None and nxt < batch[-1]:
            raise ValueError("arrivals must be sorted")
        handle(len(batch))
        done = clock() - t0
        rec.busy_s += done - now
        for a in batch:
            rec.record(a, now, done)
        if on_batch is not None:
            on_batch(batch, now, done)
    return rec
