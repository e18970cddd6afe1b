"""A fixed-capacity ring buffer of raw GPU samples (paper §4.1: ms samples kept for minutes only).

Preallocated numpy storage; ``append`` writes one row in place (O(1), no allocation of
arrays); the oldest samples are overwritten once full.
"""

from __future__ import annotations

from operator import attrgetter

import numpy as np

from executors.node.sampler import FIELDS, RawSample

NAN = float("nan")
_VALUES = attrgetter(*FIELDS)


class SampleRing:
    """Columns: ``t_s`` (sample time, agent clock seconds) and every field of ``RawSample``."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.t_s = np.full(capacity, NAN)
        self.data = np.full((capacity, len(FIELDS)), NAN)
        self.count = 0  # samples ever appended; the next slot is count % capacity

    @classmethod
    def for_window(cls, window_s: float, interval_s: float) -> SampleRing:
        return cls(max(1, int(round(window_s / interval_s))))

    def append(self, t_s: float, s: RawSample) -> None:
        i = self.count % self.capacity
        self.t_s[i] = t_s
        self.data[i] = _VALUES(s)
        self.count += 1

    def __len__(self) -> int:
        return min(self.count, self.capacity)

    def since(self, start_count: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of (t_s, data) for samples numbered ``start_count`` .. ``count-1`` still held."""
        first = max(start_count, self.count - self.capacity)
        idx = np.arange(first, self.count) % self.capacity
        return self.t_s[idx], self.data[idx]

    def last(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self.since(self.count - n)

    def column(self, name: str) -> int:
        return FIELDS.index(name)
