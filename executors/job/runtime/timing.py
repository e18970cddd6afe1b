"""Iteration timing for training loops (paper §6: profiling measures a job's solo iteration time).

    timer = IterationTimer()
    for batch in data:
        with timer.iteration():          # context-manager form: times exactly the block
            train_step(batch)
    # or, callback form: timer.mark() once after each iteration (time since the previous mark)
    stats = timer.stats(warmup=2)        # IterationStats: count, mean, p50, p95, ...

The clock is injectable (``time.perf_counter`` by default) so the numbers can be
checked against a fake clock. Durations are seconds (``_s``).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

Clock = Callable[[], float]


@dataclass(frozen=True)
class IterationStats:
    """Summary of iteration durations; the first ``warmup`` iterations are left out when others remain."""

    count: int             # iterations summarised (after warm-up)
    warmup: int            # iterations left out
    mean_s: float
    p50_s: float
    p95_s: float
    min_s: float
    max_s: float
    total_s: float         # sum of the summarised iterations

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of an already sorted sequence."""
    if not sorted_values:
        return math.nan
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


def summarize(durations_s: Sequence[float], warmup: int = 0) -> IterationStats:
    """Stats of ``durations_s`` without the first ``warmup`` (kept if nothing else would remain)."""
    if warmup < 0:
        raise ValueError("warmup must be >= 0")
    left_out = warmup if len(durations_s) > warmup else 0
    xs = sorted(float(d) for d in durations_s[left_out:])
    if not xs:
        return IterationStats(0, 0, math.nan, math.nan, math.nan, math.nan, math.nan, 0.0)
    total = math.fsum(xs)
    return IterationStats(len(xs), left_out, total / len(xs), percentile(xs, 50), percentile(xs, 95),
                          xs[0], xs[-1], total)


class IterationTimer:
    """Records one duration per iteration, by context manager or by marks between iterations.

    ``keep`` bounds the memory of a long-running job: only the newest ``keep``
    durations are kept (``count`` still counts them all).
    """

    def __init__(self, clock: Clock = time.perf_counter, keep: int | None = None):
        if keep is not None and keep < 1:
            raise ValueError("keep must be >= 1")
        self.clock = clock
        self._durations: deque[float] = deque(maxlen=keep)
        self.count = 0
        self._last_mark = clock()
        self._timed_since_mark = False

    @contextmanager
    def iteration(self) -> Iterator[None]:
        """Time the block as one iteration (an exception inside is not recorded)."""
        t0 = self.clock()
        yield
        self.record(self.clock() - t0)
        self._timed_since_mark = True

    def record(self, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"iteration time must be a finite number >= 0, got {seconds!r}")
        self._durations.append(float(seconds))
        self.count += 1

    def mark(self) -> float | None:
        """One iteration just finished: record the time since the previous mark and return it.

        If :meth:`iteration` timed a block since the previous mark, that block is the
        iteration and nothing more is recorded (None is returned).
        """
        now = self.clock()
        since, self._last_mark = now - self._last_mark, now
        if self._timed_since_mark:
            self._timed_since_mark = False
            return None
        self.record(since)
        return since

    def reset_mark(self) -> None:
        """Start the next mark interval now (e.g. after setup that is not an iteration)."""
        self._last_mark = self.clock()
        self._timed_since_mark = False

    @property
    def durations_s(self) -> list[float]:
        """The kept durations, oldest first."""
        return list(self._durations)

    def stats(self, warmup: int = 0) -> IterationStats:
        """Stats of the kept durations without the first ``warmup``."""
        return summarize(self.durations_s, warmup)


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    """Write JSON to a temporary file in the same directory, fsync, rename: readers see all or nothing."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True, allow_nan=False, default=_json_default)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    return p


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def finite_or_none(x: float) -> float | None:
    """JSON has no NaN: missing statistics are written as null."""
    return float(x) if x is not None and math.isfinite(x) else None
