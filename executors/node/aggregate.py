"""Per-minute aggregation of ring samples into a ``gpu_metrics_minute`` row.

A minute with missing samples is written with what exists (NaN readings ignored per
metric) and its coverage — valid samples / expected samples — logged; a minute with
no usable utilization, SM activity, memory or clock reading is skipped. The online
columns the samples carry (the replica's share, a simulated replica's load) are averaged
the same way; the rest of them come from the replica's endpoint (``executors.node.online``).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from dataclasses import dataclass

import numpy as np

from executors.cluster import MetricRow
from executors.node.sampler import FIELDS

log = logging.getLogger(__name__)

REQUIRED = ("gpu_util_pct", "sm_activity_pct", "mem_used_bytes", "sm_clock_mhz")
_COL = {f: i for i, f in enumerate(FIELDS)}


@dataclass
class AgentMetricRow(MetricRow):
    """A node agent's minute: the shared row plus what only the agent measures."""

    online_latency_p99_ms: float | None = None
    online_gap_reason: str | None = None   # why online columns are None (stored, docs/NODE_AGENT.md)


@dataclass(frozen=True)
class MinuteAggregate:
    row: AgentMetricRow | None
    samples: int
    expected: int
    coverage: float   # valid samples / expected, in [0, 1]
    skipped_reason: str = ""


def _mean(data: np.ndarray, name: str) -> float:
    col = data[:, _COL[name]]
    ok = ~np.isnan(col)
    return float(col[ok].mean()) if ok.any() else math.nan


def aggregate_minute(
    gpu_id: int, minute_utc: dt.datetime, data: np.ndarray, expected: int, health: str,
) -> MinuteAggregate:
    """``data``: rows of raw samples (``FIELDS`` columns) that fell into ``minute_utc``."""
    n = int(data.shape[0])
    if n == 0:
        return MinuteAggregate(None, 0, expected, 0.0, "no samples")
    valid = int((~np.isnan(data[:, [_COL[f] for f in REQUIRED]])).all(axis=1).sum())
    coverage = min(1.0, valid / expected) if expected > 0 else 0.0
    means = {f: _mean(data, f) for f in FIELDS}
    missing = [f for f in REQUIRED if math.isnan(means[f])]
    if missing:
        return MinuteAggregate(None, n, expected, coverage, f"no readings of {', '.join(missing)}")

    def opt(f: str) -> float | None:
        return None if math.isnan(means[f]) else means[f]

    row = AgentMetricRow(
        gpu_id=gpu_id, minute_utc=minute_utc, gpu_util_pct=means["gpu_util_pct"],
        sm_activity_pct=means["sm_activity_pct"],
        # occupancy needs GPM (Hopper+); without it the column (NOT NULL) gets 0 and the log says so
        sm_occupancy_pct=0.0 if math.isnan(means["sm_occupancy_pct"]) else means["sm_occupancy_pct"],
        mem_used_bytes=means["mem_used_bytes"],
        mem_total_bytes=0.0 if math.isnan(means["mem_total_bytes"]) else means["mem_total_bytes"],
        mem_bw_util_pct=opt("mem_bw_util_pct"), sm_clock_mhz=means["sm_clock_mhz"], power_w=opt("power_w"),
        temperature_c=opt("temperature_c"), online_gpu_util_pct=opt("online_gpu_util_pct"),
        online_sm_activity_pct=opt("online_sm_activity_pct"), online_mem_used_bytes=opt("online_mem_used_bytes"),
        online_mem_bw_util_pct=opt("online_mem_bw_util_pct"), online_qps=opt("online_qps"),
        online_latency_ms=opt("online_latency_ms"), online_solo_latency_ms=opt("online_solo_latency_ms"),
        offline_job_id=None, health=health,
    )
    return MinuteAggregate(row, n, expected, coverage)


def minute_floor(t_epoch_s: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t_epoch_s - (t_epoch_s % 60.0), tz=dt.timezone.utc)
