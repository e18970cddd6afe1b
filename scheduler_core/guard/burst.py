"""Burst guard: an online replica's load above what its round planned for pauses its GPU's offline work.

A round shares a GPU at the online load it forecasts for the next interval (a high quantile of the recent
minutes, :mod:`scheduler_core.online.forecast`), and admits the offline job whose predicted slowdown of the
replica at that load stays within the service's allowance and SLO. A burst — the replica's request rate jumping
well above that level within the interval — is what no forecast foresees, and it is where sharing costs a
service its tail: the replicas in a burst carry more requests than the others, each slower, so a few of them
set the whole service's p99 for that minute, and an offline job beside them slows them further. xCUDA's pacing
holds the GPU's *load* at its target, which does not help a replica whose SM activity is saturated by the burst
while its queue grows.

So the node agent watches each replica's request rate (its endpoint's counters over the latest scrape
interval) against a reference: the ``quantile`` (0.9) of its per-minute rate over the last ``window_minutes``
(30) — the level the round's forecast planned for. Over ``reference · (1 + margin)`` the replica is in a
burst, and the agent sets xCUDA's target on that GPU to :data:`BURST_TARGET_UTIL`, below any online load, so
every offline process there is paced to xCUDA's floor (a few launches a second: it stalls, it is not killed,
nothing is lost) until the rate falls back under ``reference · (1 + margin / 2)`` (hysteresis: a rate that
hovers at the threshold does not flap). The minutes spent in a burst are left out of the reference, so a long
burst does not raise the level it is judged against and end its own guard; a reference needs
``min_minutes`` (5) minutes, and a replica without one (just started, or no rate scraped) is not guarded.

A burst begins only on a replica over its latency limit as it is, shared or not (``over``: its p99 over its
service's SLO; a simulated service without an SLO: its slowdown over its allowance); unknown, the rate alone
decides. A replica within its SLO loses nothing to its neighbour worth a pause, and pausing there is what made
a guard on every burst expensive (2.5 % of oversold GPU on the heaviest trace, SIMULATED).

What it costs: the offline job's progress in the guarded minutes (0.02–0.23 % of the GPU-minutes on the four
evaluation traces, SIMULATED). What it buys: bursting replicas at their latency alone, which keeps
service-minutes within their SLO. The margin is the guard's only threshold: it must stay above the load's
minute-to-minute noise (a replica's rate varies by several percent from one minute to the next) and below a
burst.

Pure (numpy only): the simulator (:mod:`scheduler_core.simulator.fleet`) runs one :class:`BurstGuard` over
all its GPUs a minute at a time, the node agent one per GPU (``executors.node.agent``) on every scrape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scheduler_core.online.latency_model import P99_OF_MEAN

__all__ = ["BURST_TARGET_UTIL", "BurstGuard", "BurstParams", "modelled_over_limit", "nan_quantile_columns"]

# xCUDA's target GPU load during a burst: under any online load, so the PID holds the offline processes at
# its floor rate (min_rate); a positive value, as 0 in the GPU record means "xCUDA's own default".
BURST_TARGET_UTIL = 0.01


@dataclass(frozen=True)
class BurstParams:
    window_minutes: int = 30
    quantile: float = 0.9
    margin: float = 0.2
    min_minutes: int = 5

    def __post_init__(self) -> None:
        if not (isinstance(self.window_minutes, int) and self.window_minutes >= 1):
            raise ValueError(f"burst window_minutes: expected a whole number >= 1, got {self.window_minutes!r}")
        if not (isinstance(self.min_minutes, int) and 1 <= self.min_minutes <= self.window_minutes):
            raise ValueError(f"burst min_minutes: expected a whole number in [1, window_minutes], "
                             f"got {self.min_minutes!r}")
        if not (isinstance(self.quantile, (int, float)) and 0.0 <= self.quantile <= 1.0):
            raise ValueError(f"burst quantile: expected a number in [0, 1], got {self.quantile!r}")
        if not (isinstance(self.margin, (int, float)) and math.isfinite(self.margin) and self.margin > 0.0):
            raise ValueError(f"burst margin: expected a number > 0, got {self.margin!r}")


class BurstGuard:
    """The burst state of ``n`` replicas: their reference rates and which of them are in a burst."""

    def __init__(self, n: int, params: BurstParams = BurstParams()):
        self.params = params
        self.n = n
        self._window = np.full((params.window_minutes, n), np.nan)
        self._pos = 0
        self._ref = np.full(n, np.nan)
        self.active = np.zeros(n, dtype=bool)  # in a burst now
        self._in_minute = np.zeros(n, dtype=bool)  # in a burst at some point of the minute being recorded

    @property
    def reference(self) -> np.ndarray:
        """(n,) each replica's reference rate (req/s); NaN: fewer than ``min_minutes`` usable minutes."""
        return self._ref.copy()

    def update(self, qps_now, over=None) -> np.ndarray:
        """The replicas' rates now (NaN or None: not known, the state stays); which are in a burst after it.

        ``over``: whether each replica is over its latency limit now, as it is (shared or not) — its p99 over its
        service's SLO, or its slowdown over its allowance (True/1, False/0; NaN or None: not known). A burst begins
        only on a replica over its limit: one within it loses nothing to its neighbour worth a pause. Not known:
        the rate alone decides."""
        q = np.broadcast_to(self._vec(qps_now), (self.n,))
        risk = np.broadcast_to(self._vec(over), (self.n,))
        at_risk = ~np.isfinite(risk) | (risk > 0.0)
        known = np.isfinite(q) & np.isfinite(self._ref)
        enter = known & at_risk & (q > self._ref * (1.0 + self.params.margin))
        stay = known & (q > self._ref * (1.0 + 0.5 * self.params.margin))
        # Without a reference (none yet, or gone) a replica is not guarded; without a rate it keeps its state.
        self.active = np.where(known, enter | (self.active & stay), self.active & np.isfinite(self._ref))
        self._in_minute |= self.active
        return self.active.copy()

    @staticmethod
    def _vec(x) -> np.ndarray:
        return np.asarray(np.nan if x is None else x, dtype=float).reshape(-1)

    def record_minute(self, qps_minute) -> None:
        """A finished minute's rate per replica (NaN: none measured); minutes in a burst are left out."""
        q = np.asarray(qps_minute, dtype=float).reshape(-1)
        q = np.broadcast_to(q, (self.n,))
        self._window[self._pos % self.params.window_minutes] = np.where(
            self._in_minute | ~np.isfinite(q) | (q < 0.0), np.nan, q)
        self._pos += 1
        self._in_minute = self.active.copy()
        self._refresh()

    def _refresh(self) -> None:
        usable = np.isfinite(self._window).sum(axis=0)
        ref = nan_quantile_columns(self._window, self.params.quantile)
        self._ref = np.where(usable >= self.params.min_minutes, ref, np.nan)


    # -- state between processes (the simulated cluster keeps it in the store) --------------------------
    def to_state(self) -> dict:
        """JSON-able: the window (None for a minute left out), its position and the burst flags."""
        return {"window": [[None if math.isnan(x) else float(x) for x in row] for row in self._window.T],
                "pos": int(self._pos), "active": self.active.tolist(), "in_minute": self._in_minute.tolist()}

    @classmethod
    def from_state(cls, n: int, params: BurstParams, state: dict | None) -> BurstGuard:
        """:meth:`to_state`'s output for ``n`` replicas; None, or a state of another shape: a fresh guard."""
        g = cls(n, params)
        try:
            window = np.array([[np.nan if x is None else float(x) for x in row] for row in state["window"]]).T
            active = np.array(state["active"], dtype=bool)
            in_minute = np.array(state["in_minute"], dtype=bool)
            pos = int(state["pos"])
        except (TypeError, KeyError, ValueError):
            return g
        if window.shape != g._window.shape or active.shape != (n,) or in_minute.shape != (n,) or pos < 0:
            return g
        g._window, g._pos, g.active, g._in_minute = window, pos, active, in_minute
        g._refresh()
        return g


def nan_quantile_columns(x: np.ndarray, q: float) -> np.ndarray:
    """Each column's ``q``-quantile over its finite values (NaN for a column without one): ``np.nanquantile``'s
    linear interpolation, vectorized — numpy's own loops over the columns in Python, 30 ms a minute on a 1,000-GPU
    fleet where this takes well under one."""
    a = np.where(np.isfinite(x), x, np.nan)
    srt = np.sort(a, axis=0)  # NaN last
    n = np.isfinite(a).sum(axis=0)
    pos = np.maximum(n - 1, 0) * float(q)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    cols = np.arange(a.shape[1])
    frac = pos - lo
    with np.errstate(invalid="ignore"):
        out = srt[lo, cols] * (1.0 - frac) + srt[hi, cols] * frac
    return np.where(n > 0, out, np.nan)


def modelled_over_limit(latency_alone_ms, slowdown, slo_ms, allowance=None) -> np.ndarray:
    """:meth:`BurstGuard.update`'s ``over`` for a simulated replica (the fleet's and the simulated cluster's), from
    what the model gives: its p99 as it is (``P99_OF_MEAN`` × its mean latency alone × the slowdown) over its SLO;
    without an SLO (None, NaN) its slowdown over its ``allowance``; without either, NaN (the rate alone decides)."""
    lat, slow = np.asarray(latency_alone_ms, dtype=float), np.asarray(slowdown, dtype=float)
    slo = np.asarray(np.nan if slo_ms is None else slo_ms, dtype=float)
    allow = np.asarray(np.nan if allowance is None else allowance, dtype=float)
    by_allowance = np.where(np.isnan(allow), np.nan, slow > 1.0 + allow)
    return np.where(np.isnan(slo), by_allowance, P99_OF_MEAN * lat * slow > slo)
