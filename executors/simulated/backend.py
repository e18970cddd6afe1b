"""The simulated cluster as a :class:`executors.cluster.ClusterBackend`.

Each call rebuilds the live model from the store (GPUs, live jobs, the node
state saved by the previous call), acts, and saves the state in the same
transaction as the records it produced. So a round planned by the main job,
dispatched by a Dagster run launched from the UI and observed by the CLI
behaves exactly as if one process had done all three.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field

from executors.cluster import IntervalReport, JobSyncReport
from executors.data.calibration import default_catalog
from executors.scheduler import round_runner
from executors.simulated import profiler
from executors.simulated.cluster import SOURCE, SimSettings, SimulatedCluster
from executors.simulated.setup import cluster_from_store, observed_until, save_cluster_state
from executors.store import models as m
from executors.store.db import Store
from executors.store.jobs import transition
from scheduler_core.domain import JobState, RoundResult
from scheduler_core.workloads import WorkloadCatalog

log = logging.getLogger(__name__)


class ObservationOrderError(ValueError):
    """A window was asked to be simulated that overlaps what was already simulated."""


@dataclass
class SimulatedBackend:
    settings: SimSettings = field(default_factory=SimSettings)
    catalog: WorkloadCatalog = field(default_factory=default_catalog)
    warmup_minutes: int = 60
    max_gap_minutes: int = 24 * 60
    simulated: bool = True
    source: str = SOURCE

    def profile_new_jobs(self, store: Store, seed: int) -> int:
        """Solo profiles of newly submitted jobs from the simulated GPU models."""
        return profiler.profile_new_jobs(store, self.catalog, seed)

    def collect_samples(self, store: Store, per_type: int, seed: int) -> dict[str, int]:
        """Top the co-location samples of each GPU type up to ``per_type`` (simulated measurements)."""
        return profiler.collect_samples(store, self.catalog, per_type, seed, top_up=True)

    def cluster(self, store: Store) -> SimulatedCluster:
        with store.session() as s:
            return cluster_from_store(s, self.catalog, self.settings)

    def sync_jobs(self, store: Store, now: dt.datetime) -> JobSyncReport:
        """The simulated cluster stops an evicted job at once, so its only follow-up is EVICTED → PENDING."""
        report = JobSyncReport()
        report.count(JobState.PENDING.value, len(round_runner.requeue_evicted(store)))
        return report

    def cancel_jobs(self, store: Store, job_ids: list[int], reason: str) -> dict[int, str]:
        """Cancel live jobs: FAILED with ``reason``; a running one stops at the cluster's time (its execution so
        far is booked with the next interval). All or none (one transaction). Each job's state before."""
        cluster = self.cluster(store)
        with store.session() as s:
            before = {}
            for job_id in job_ids:
                job = s.get(m.OfflineJob, job_id)
                if job is None:
                    raise ValueError(f"no offline job {job_id}")
                if JobState(job.state) in (JobState.DONE, JobState.FAILED):
                    raise ValueError(f"job {job_id} has already ended ({job.state})")
                before[job_id] = job.state
            at = observed_until(s)
            stopped = [j for j in job_ids if at is not None and cluster.stop(j, at)]
            for job_id in job_ids:
                transition(s, job_id, JobState.FAILED, reason, expected=JobState(before[job_id]))
            if stopped:
                save_cluster_state(s, cluster)
        return before

    def ensure_history(self, store: Store, window_start: dt.datetime) -> int:
        """Simulate up to ``window_start``: an hour of online-only load before the first round, else any gap."""
        with store.session() as s:
            until = observed_until(s)
        if until is None:
            self._simulate(store, window_start - dt.timedelta(minutes=self.warmup_minutes), window_start)
            return self.warmup_minutes
        if until < window_start:
            return self._catch_up(store, until, window_start)
        return 0

    def _catch_up(self, store: Store, until: dt.datetime, window_start: dt.datetime) -> int:
        gap = int((window_start - until).total_seconds() // 60)
        start = until
        if gap > self.max_gap_minutes:
            # Nobody ran rounds for a long time (e.g. the schedule started days after
            # the last run): simulate only the last warm-up before the window; the
            # cluster stands still over the rest of the gap.
            log.warning("simulated cluster idle for %d minutes; simulating the last %d only", gap, self.warmup_minutes)
            start = window_start - dt.timedelta(minutes=self.warmup_minutes)
        log.info("simulating %s to %s without a round", start, window_start)
        self._simulate(store, start, window_start)
        return int((window_start - start).total_seconds() // 60)

    def _simulate(self, store: Store, start: dt.datetime, end: dt.datetime, round_id: int | None = None) -> IntervalReport:
        """Advance the cluster from ``start`` to ``end`` and book it, state saved in the same transaction."""
        cluster = self.cluster(store)
        report = cluster.advance(start, int((end - start).total_seconds() // 60))
        round_runner.book_interval(store, report, round_id, self.source, end,
                                   persist=lambda s: save_cluster_state(s, cluster, end))
        return report

    def dispatch(self, store: Store, round_id: int, result: RoundResult, now: dt.datetime) -> tuple[int, int]:
        cluster = self.cluster(store)
        return round_runner.dispatch_round(store, cluster, round_id, result, now,
                                           persist=lambda s: save_cluster_state(s, cluster))

    def observe(self, store: Store, window_start: dt.datetime, minutes: int, round_id: int | None) -> IntervalReport | None:
        """Simulate ``minutes`` from ``window_start`` and book them (a gap before it is simulated first)."""
        end = window_start + dt.timedelta(minutes=minutes)
        with store.session() as s:
            until = observed_until(s)
        if until is not None and until >= end:
            return None
        if until is not None and until > window_start:
            raise ObservationOrderError(
                f"the simulated cluster is observed until {until.isoformat()}, inside the window "
                f"{window_start.isoformat()}–{end.isoformat()}")
        if until is not None and until < window_start:
            self._catch_up(store, until, window_start)
        return self._simulate(store, window_start, end, round_id)
