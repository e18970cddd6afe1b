"""Per-service latency model: an online replica's p99 latency alone, against its load, fitted from samples.

Mudi (and the SLO checks of this scheduler) need to know what latency a replica will have at the
load forecast for the next interval, before any offline job is added. The model is fitted, per
service and GPU type, from what the monitors report: pairs of (SM activity %, mean request latency
ms) of the replica alone — its load shows as SM activity, the quantity the forecaster
(:mod:`scheduler_core.online.forecast`) predicts. No functional form is assumed:

- samples are binned by SM activity (``bin_pct`` wide); each bin keeps a high quantile
  (``quantile``) of its latencies, so one quiet minute does not make a bin look fast;
- the curve is made non-decreasing in load (latency never falls as load grows);
- between bins it is linear; above the highest bin it continues with the steepest slope seen
  over the last ``tail_bins`` bins (queueing only gets worse towards saturation); below the
  lowest it is flat.

The p99 is taken from the mean as for an M/M/1 sojourn time (exponential: p99 = mean · ln 100),
the assumption the simulator's latency metric makes too (:mod:`scheduler_core.simulator.metrics`).
A service with fewer than ``min_bins`` filled bins has no model (None): the round then falls back
to the flat slowdown allowance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

P99_OF_MEAN = math.log(100.0)


@dataclass(frozen=True)
class LatencyModelConfig:
    bin_pct: float = 2.5
    quantile: float = 0.9
    min_bins: int = 3
    min_samples_per_bin: int = 2
    tail_bins: int = 3

    def __post_init__(self) -> None:
        if not self.bin_pct > 0 or not 0.0 <= self.quantile <= 1.0:
            raise ValueError("bin_pct must be > 0 and quantile in [0, 1]")
        if self.min_bins < 2 or self.min_samples_per_bin < 1 or self.tail_bins < 2:
            raise ValueError("min_bins and tail_bins must be >= 2, min_samples_per_bin >= 1")


@dataclass(frozen=True)
class LatencyCurve:
    """Mean latency (ms) of a replica alone against its SM activity (%)."""

    sm_pct: np.ndarray  # bin centres, increasing
    mean_ms: np.ndarray  # non-decreasing
    tail_slope: float  # ms per SM percent above the last bin

    def mean_at(self, sm_pct) -> np.ndarray:
        x = np.asarray(sm_pct, dtype=float)
        inside = np.interp(x, self.sm_pct, self.mean_ms)
        above = self.mean_ms[-1] + self.tail_slope * np.maximum(0.0, x - self.sm_pct[-1])
        return np.where(x > self.sm_pct[-1], above, inside)

    def p99_at(self, sm_pct) -> np.ndarray:
        return P99_OF_MEAN * self.mean_at(sm_pct)


def fit(sm_pct, latency_ms, cfg: LatencyModelConfig = LatencyModelConfig()) -> LatencyCurve | None:
    """The curve of one service on one GPU type from its samples; None with too few (NaN samples are skipped)."""
    x = np.asarray(sm_pct, dtype=float).reshape(-1)
    y = np.asarray(latency_ms, dtype=float).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"{x.size} SM samples for {y.size} latency samples")
    ok = np.isfinite(x) & np.isfinite(y) & (y > 0) & (x >= 0)
    x, y = x[ok], y[ok]
    if x.size == 0:
        return None
    b = np.floor(x / cfg.bin_pct).astype(np.int64)
    order = np.argsort(b, kind="stable")
    b, y = b[order], y[order]
    edges = np.flatnonzero(np.diff(b)) + 1
    centres, values = [], []
    for lo, hi in zip(np.r_[0, edges], np.r_[edges, b.size]):
        if hi - lo >= cfg.min_samples_per_bin:
            centres.append((b[lo] + 0.5) * cfg.bin_pct)
            values.append(float(np.quantile(y[lo:hi], cfg.quantile)))
    if len(centres) < cfg.min_bins:
        return None
    cx = np.array(centres)
    cy = np.maximum.accumulate(np.array(values))
    k = min(cfg.tail_bins, cx.size)
    slopes = np.diff(cy[-k:]) / np.diff(cx[-k:])
    return LatencyCurve(cx, cy, float(max(0.0, slopes.max())))


class ServiceLatencyModels:
    """Curves per (service, GPU type), refitted from a rolling window of per-round samples."""

    def __init__(self, window_rounds: int = 96, cfg: LatencyModelConfig = LatencyModelConfig()):
        if window_rounds < 1:
            raise ValueError("window_rounds must be >= 1")
        self.window_rounds, self.cfg = window_rounds, cfg
        self._samples: dict[tuple[str, str], list[tuple[np.ndarray, np.ndarray]]] = {}
        self._curves: dict[tuple[str, str], LatencyCurve | None] = {}

    def observe(self, service: str, gpu_type: str, sm_pct, latency_ms) -> None:
        key = (service, gpu_type)
        got = self._samples.setdefault(key, [])
        got.append((np.asarray(sm_pct, dtype=float).reshape(-1), np.asarray(latency_ms, dtype=float).reshape(-1)))
        del got[:-self.window_rounds]
        xs, ys = zip(*got)
        self._curves[key] = fit(np.concatenate(xs), np.concatenate(ys), self.cfg)

    def curve(self, service: str, gpu_type: str) -> LatencyCurve | None:
        return self._curves.get((service, gpu_type))
