"""Open-loop request serving and per-request latency (paper §7.1: average and p99 latency).

Requests *arrive* on a schedule fixed in advance (Poisson or evenly spaced at the
target QPS), whatever the server is doing: when the server falls behind,
requests queue, and a request's latency is ``finish - arrival``, queueing
included. (A closed loop, which sends the next request when the previous one
returns, would hide exactly the slowdown co-location causes.)

:func:`run_open_loop` takes the clock, the sleep and the handler as arguments,
so the loop is tested against a fake clock; ``executors.workloads.serve`` runs
it with real time and a real model.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from executors.runtime.timing import finite_or_none, percentile

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


@dataclass
class LatencyRecorder:
    """Per-request arrival, service start and finish (seconds on one clock)."""

    arrival_s: list[float] = field(default_factory=list)
    start_s: list[float] = field(default_factory=list)
    finish_s: list[float] = field(default_factory=list)
    busy_s: float = 0.0  # time the server spent computing (batches), for its busy fraction

    def record(self, arrival_s: float, start_s: float, finish_s: float) -> None:
        if not arrival_s <= start_s <= finish_s:
            raise ValueError(f"request times out of order: arrival {arrival_s}, start {start_s}, finish {finish_s}")
        self.arrival_s.append(arrival_s)
        self.start_s.append(start_s)
        self.finish_s.append(finish_s)

    @property
    def count(self) -> int:
        return len(self.arrival_s)

    def latencies_s(self) -> list[float]:
        return [f - a for a, f in zip(self.arrival_s, self.finish_s)]

    def summary(self) -> dict[str, float | int | None]:
        lat = sorted(self.latencies_s())
        queue = [s - a for a, s in zip(self.arrival_s, self.start_s)]
        span = (max(self.finish_s) - min(self.arrival_s)) if lat else 0.0
        ms = lambda x: finite_or_none(1000.0 * x)  # noqa: E731
        return {
            "requests": len(lat),
            "avg_ms": ms(sum(lat) / len(lat)) if lat else None,
            "p50_ms": ms(percentile(lat, 50)),
            "p95_ms": ms(percentile(lat, 95)),
            "p99_ms": ms(percentile(lat, 99)),
            "max_ms": ms(lat[-1]) if lat else None,
            "avg_queue_ms": ms(sum(queue) / len(queue)) if queue else None,
            "achieved_qps": (len(lat) / span) if span > 0 else None,
            "busy_frac": (self.busy_s / span) if span > 0 else None,
        }


def run_open_loop(
    arrivals_s: list[float],
    handle: Callable[[int], None],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    max_batch: int = 1,
    should_stop: Callable[[], bool] = lambda: False,
) -> LatencyRecorder:
    """Serve requests arriving at ``arrivals_s`` (offsets from now) one batch at a time.

    ``handle(n)`` serves a batch of ``n`` requests and returns when its results
    are ready. Requests that have arrived while the server was busy are queued
    and served first-come first-served, up to ``max_batch`` at a time (dynamic
    batching; 1 = none). Every request is served, so the last ones may finish
    after the last arrival, unless ``should_stop()`` turns true (a signal): then
    the loop ends after the batch in progress and only served requests count.
    """
    if max_batch < 1:
        raise ValueError("max_batch: must be >= 1")
    if any(b < a for a, b in zip(arrivals_s, arrivals_s[1:])):
        raise ValueError("arrivals must be sorted")
    rec = LatencyRecorder()
    t0 = clock()
    i, n = 0, len(arrivals_s)
    while i < n and not should_stop():
        now = clock() - t0
        if now < arrivals_s[i]:
            sleep(arrivals_s[i] - now)  # waiting for the next request to arrive (the client's schedule)
            continue
        j = i + 1
        while j < n and j - i < max_batch and arrivals_s[j] <= now:
            j += 1
        handle(j - i)
        done = clock() - t0
        rec.busy_s += done - now
        for k in range(i, j):
            rec.record(arrivals_s[k], now, done)
        i = j
    return rec
