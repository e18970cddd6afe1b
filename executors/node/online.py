"""The online columns of a node agent's minute row, and why any of them is missing.

A minute row (``executors.node.aggregate``) carries the device totals and, averaged over
the minute's samples, the online replica's share of the GPU (NVML per-process accounting,
or the simulated GPU's split). :class:`OnlineAccounting` completes it:

- ``online_qps``, ``online_latency_ms`` (average), ``online_latency_p99_ms``: from the
  replica's endpoint, counter deltas over the window (``executors.node.scrape``) — real,
  on simulated GPUs too. A simulated replica without an endpoint keeps its modelled
  rate and latencies (no p99: the model gives means);
- ``online_solo_latency_ms``: the replica's measured latency while no offline job was on
  its GPU, over the last ``solo_window_s`` (the paper's online-only baseline, §7.1: on a
  real node nobody can run the replica alone on demand, so its own recent solo periods
  are the reference; a GPU that has hosted offline work the whole time has none);
- ``offline_job_id``: the offline job that shared the GPU in the window.

Whatever stays None is a labelled gap: the reasons, joined by ``; ``, go to
``online_gap_reason`` and to the log (a warning when they change).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from executors.node.aggregate import AgentMetricRow
from executors.node.scrape import Scrapers
from executors.node.simgpu import Replica

log = logging.getLogger(__name__)

SPLIT_COLUMNS = ("online_gpu_util_pct", "online_sm_activity_pct", "online_mem_used_bytes", "online_mem_bw_util_pct")
ONLINE_COLUMNS = SPLIT_COLUMNS + ("online_qps", "online_latency_ms", "online_latency_p99_ms",
                                  "online_solo_latency_ms")


class OnlineAccounting:
    def __init__(self, replicas: Mapping[int, Replica], scrapers: Scrapers | None = None,
                 solo_window_s: float = 3600.0):
        self.replicas = dict(replicas)
        self.scrapers = scrapers or Scrapers({})
        self.solo_window_s = solo_window_s
        self._last_reason: dict[int, str | None] = {}

    def complete(self, gpu_index: int, row: AgentMetricRow, start_s: float, end_s: float,
                 offline_job_id: int | None, split_gap: str | None) -> AgentMetricRow:
        """``row`` with its online columns filled from the endpoint and every remaining gap explained."""
        rep = self.replicas.get(gpu_index)
        if rep is None:
            row = replace(row, **{c: None for c in ONLINE_COLUMNS}, offline_job_id=offline_job_id,
                          online_gap_reason="no online service registered on this GPU")
            return self._note(gpu_index, row)
        reasons: list[str] = []
        missing = [c for c in SPLIT_COLUMNS if getattr(row, c) is None]
        if missing:
            reasons.append(split_gap or f"GPU split: no per-process reading of {', '.join(missing)} in this window")
        scraper = self.scrapers.get(gpu_index)
        if scraper is not None:
            st = scraper.window(start_s, end_s)
            solo = scraper.solo_latency_ms(end_s, self.solo_window_s)
            row = replace(row, online_qps=st.qps, online_latency_ms=st.latency_ms,
                          online_latency_p99_ms=st.latency_p99_ms, online_solo_latency_ms=solo)
            if st.reason:
                reasons.append(st.reason)
            if solo is None and st.qps is not None:
                reasons.append(f"solo latency: no request served without offline work on this GPU in the last "
                               f"{self.solo_window_s / 60:g} min")
        elif rep.metrics_url is None and row.online_qps is not None:
            reasons.append("p99 latency: not modelled (simulated replica without a metrics endpoint)")
        else:
            row = replace(row, online_qps=None, online_latency_ms=None, online_solo_latency_ms=None)
            reasons.append("qps, latency: no metrics endpoint registered for this replica "
                           "(muxflow online register --endpoint)")
        row = replace(row, offline_job_id=offline_job_id, online_gap_reason="; ".join(reasons) or None)
        return self._note(gpu_index, row)

    def _note(self, gpu_index: int, row: AgentMetricRow) -> AgentMetricRow:
        reason = row.online_gap_reason
        if reason != self._last_reason.get(gpu_index, ""):
            if reason:
                log.warning("GPU %d minute %s: online gap: %s", gpu_index, row.minute_utc.isoformat(), reason)
            elif gpu_index in self._last_reason:
                log.info("GPU %d: every online column filled again", gpu_index)
        self._last_reason[gpu_index] = reason
        return row
