"""When rounds happen: windows of a fixed period, aligned to midnight UTC, and their names.

The paper's rounds are 15 minutes apart (§5, §7.2); the period is a setting
(seconds in tests). A period must divide a day, so every day's windows start at
the same times and a window's name (the Dagster partition key) never depends on
when the scheduler started.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

DAY_S = 86_400
DEFAULT_PERIOD_S = 900
_KEY_MIN = "%Y-%m-%d-%H:%M"
_KEY_SEC = "%Y-%m-%d-%H:%M:%S"


@dataclass(frozen=True)
class RoundClock:
    period_s: int = DEFAULT_PERIOD_S

    def __post_init__(self) -> None:
        if isinstance(self.period_s, bool) or not isinstance(self.period_s, int) or self.period_s < 1:
            raise ValueError(f"round period must be a whole number of seconds >= 1, got {self.period_s!r}")
        if DAY_S % self.period_s:
            raise ValueError(f"round period must divide a day (86400 s) so windows line up every day, "
                             f"got {self.period_s} s")

    @property
    def period(self) -> dt.timedelta:
        return dt.timedelta(seconds=self.period_s)

    def window_of(self, t: dt.datetime) -> dt.datetime:
        """Start of the window containing ``t`` (UTC; ``t`` must carry a time zone)."""
        if t.tzinfo is None:
            raise ValueError(f"time without a time zone: {t.isoformat()}")
        epoch = int(t.timestamp() // self.period_s) * self.period_s
        return dt.datetime.fromtimestamp(epoch, tz=dt.timezone.utc)

    def next_window(self, t: dt.datetime) -> dt.datetime:
        return self.window_of(t) + self.period

    def is_window_start(self, t: dt.datetime) -> bool:
        return t.tzinfo is not None and self.window_of(t) == t.astimezone(dt.timezone.utc)

    def key(self, window: dt.datetime) -> str:
        """The window's name: ``2026-01-05-01:15`` (``…:20`` seconds too when the period is not whole minutes)."""
        w = self.window_of(window)
        return w.strftime(_KEY_MIN if self.period_s % 60 == 0 else _KEY_SEC)

    def parse_key(self, key: str) -> dt.datetime:
        for fmt in (_KEY_SEC, _KEY_MIN):
            try:
                t = dt.datetime.strptime(key, fmt).replace(tzinfo=dt.timezone.utc)
            except ValueError:
                continue
            if not self.is_window_start(t):
                raise ValueError(f"round key {key!r} is not the start of a {self.period_s}-second window")
            return t
        raise ValueError(f"not a round key: {key!r} (expected like 2026-01-05-01:15)")
