"""The scheduler's Prometheus endpoint (``muxflow metrics serve``; docs/OBSERVABILITY.md): rounds, placements,
pending jobs, oversold GPU, predicted against realized throughput per GPU type, and dispatch outcomes.

Every scrape reads one snapshot of the feature store (:func:`executors.store.observability.scheduler_snapshot`), so
whichever process plans the rounds (the Dagster code location, ``muxflow round``, the round service), one endpoint
shows them all, and a restarted exporter loses nothing. A store that cannot be read makes the scrape report
``muxflow_scheduler_store_up 0`` and nothing else, rather than fail.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from executors.store.observability import scheduler_snapshot

log = logging.getLogger(__name__)

ACTIONS = ("start", "keep", "migrate", "evict")


class SchedulerCollector:
    """A ``prometheus_client`` collector over the feature store."""

    def __init__(self, store: Any, now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)):
        self.store = store
        self.now = now

    def collect(self) -> Iterable[Any]:
        up = GaugeMetricFamily("muxflow_scheduler_store_up", "1 if the feature store could be read for this scrape.")
        try:
            with self.store.session() as s:
                snap = scheduler_snapshot(s, self.now())
        except Exception as exc:
            log.warning("metrics: cannot read the feature store: %s", exc)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        now = self.now()
        r = snap.last_round
        if r is not None:
            labels = ["simulated"]
            lv = ["true" if r.simulated else "false"]

            def gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily | None:
                if value is None:
                    return None
                g = GaugeMetricFamily(name, doc, labels=labels)
                g.add_metric(lv, float(value))
                return g

            finished = r.finished_utc.replace(tzinfo=r.finished_utc.tzinfo or dt.UTC)
            started = r.started_utc.replace(tzinfo=r.started_utc.tzinfo or dt.UTC)
            for fam in (
                gauge("muxflow_round_last_finished_timestamp_seconds", "When the latest round finished (Unix time).",
                      finished.timestamp()),
                gauge("muxflow_round_last_duration_seconds", "How long the latest round took to plan and dispatch.",
                      max(0.0, (finished - started).total_seconds())),
                gauge("muxflow_round_period_seconds", "The round period (a round plans each window of this length).",
                      r.period_s),
                gauge("muxflow_round_last_objective", "The latest round's objective (predicted normalised "
                      "throughput, minus migration penalties).", r.objective),
                gauge("muxflow_round_last_optimality_gap", "Bound on how far the latest round's matching is from "
                      "the optimum (objective units); absent when not computed.", r.optimality_gap_bound),
                gauge("muxflow_round_last_certified_optimal", "1 if the latest round's matching is certified "
                      "optimal.", 1.0 if r.certified_optimal else 0.0),
                gauge("muxflow_round_last_predicted_oversold", "The GPU share the latest round predicts offline "
                      "work gets without hurting the services (oversold GPU).", r.predicted_oversold),
            ):
                if fam is not None:
                    yield fam
            yield by_label(GaugeMetricFamily, "muxflow_round_last_placements", "The latest round's placements by "
                           "action.", "action", {**dict.fromkeys(ACTIONS, 0), **r.action_counts})
            yield by_label(GaugeMetricFamily, "muxflow_round_last_unplaced_jobs",
                           "Jobs the latest round did not place, by reason.", "reason", r.unplaced)
        yield by_label(CounterMetricFamily, "muxflow_rounds", "Rounds recorded, by status.", "status",
                       snap.rounds_by_status)
        yield by_label(GaugeMetricFamily, "muxflow_jobs", "Offline jobs by state.", "state", snap.jobs_by_state)
        if snap.oldest_pending_since_utc is not None:
            t = snap.oldest_pending_since_utc
            t = t.replace(tzinfo=t.tzinfo or dt.UTC)
            wait = GaugeMetricFamily("muxflow_jobs_oldest_pending_seconds",
                                     "How long the longest-waiting PENDING job has waited since it became PENDING.")
            wait.add_metric([], max(0.0, (now - t).total_seconds()))
            yield wait
        dispatch = CounterMetricFamily("muxflow_dispatch_actions", "Dispatched actions by outcome (failed: the "
                                       "cluster refused or did not answer in time).", labels=["action", "status"])
        for (action, status), n in sorted(snap.dispatch.items()):
            dispatch.add_metric([action, status], float(n))
        yield dispatch
        yield by_label(GaugeMetricFamily, "muxflow_predicted_normalized_throughput", "Mean normalised throughput "
                       "the latest round predicts for its placements, per GPU type.", "gpu_type", snap.predicted_tput)
        yield by_label(GaugeMetricFamily, "muxflow_realized_normalized_throughput", "Normalised throughput offline "
                       "jobs reached in the last hour (solo-equivalent time over wall time), per GPU type.",
                       "gpu_type", snap.realized_tput)
        yield by_label(CounterMetricFamily, "muxflow_evictions", "Evictions recorded by the node agents, per GPU "
                       "type.", "gpu_type", snap.evictions)
        day = {name: GaugeMetricFamily(name, doc, labels=["service"]) for name, doc in (
            ("muxflow_service_day_requests", "Requests the service's replicas served today (UTC), as recorded."),
            ("muxflow_service_day_slowdown_ratio", "Today's request-weighted slowdown of the service: rate x "
                                                   "latency over rate x solo latency, minus 1 (what a slowdown "
                                                   "budget bounds)."),
            ("muxflow_service_slowdown_budget_ratio", "The mean slowdown over its requests the service accepts per "
                                                      "day (absent: a flat allowance on every minute)."),
            ("muxflow_service_day_budget_used_ratio", "Today's slowdown over the service's budget (1: all of it)."),
        )}
        for sv in snap.services:
            day["muxflow_service_day_requests"].add_metric([sv.name], sv.requests)
            if sv.slowdown is not None:
                day["muxflow_service_day_slowdown_ratio"].add_metric([sv.name], sv.slowdown)
            if sv.slowdown_budget is not None:
                day["muxflow_service_slowdown_budget_ratio"].add_metric([sv.name], sv.slowdown_budget)
                if sv.slowdown is not None and sv.slowdown_budget > 0:
                    day["muxflow_service_day_budget_used_ratio"].add_metric(
                        [sv.name], max(0.0, sv.slowdown) / sv.slowdown_budget)
        yield from day.values()
        mig = CounterMetricFamily("muxflow_job_migrations", "Times a round migrated the job (jobs not yet ended).",
                                  labels=["hpc_job", "job_id", "user"])
        for jm in snap.migrations:
            mig.add_metric(["" if jm.slurm_job_id is None else str(jm.slurm_job_id), str(jm.job_id), jm.user],
                           float(jm.migrations))
        yield mig


def by_label(family: type, name: str, doc: str, label: str, values: dict[str, float]) -> Any:
    """A metric family with one sample per key of ``values`` (in key order), the key as its ``label``."""
    fam = family(name, doc, labels=[label])
    for key, v in sorted(values.items()):
        fam.add_metric([key], float(v))
    return fam
