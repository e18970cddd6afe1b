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

from executors import round_runner, steps
from executors.cluster import IntervalReport
from executors.simulated.calibration import default_catalog
from executors.simulated.cluster import SOURCE, SimSettings, SimulatedCluster
from executors.simulated.setup import cluster_from_store, observed_until, save_cluster_state
from executors.store.db import Store
from scheduler_core.domain import RoundResult
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
        return steps.profile_new_jobs(store, self.catalog, seed)

    def collect_samples(self, store: Store, per_type: int, seed: int) -> dict[str, int]:
        """Top the co-location samples of each GPU type up to ``per_type`` (simulated measurements)."""
        return steps.collect_samples(store, self.catalog, per_type, seed, top_up=True)

    def cluster(self, store: Store) -> SimulatedCluster:
        with store.session() as s:
            return cluster_from_store(s, self.catalog, self.settings)

    def ensure_history(self, store: Store, window_start: dt.datetime) -> int:
        """Before the first round, an hour (``warmup_minutes``) of online-only load ending at ``window_start``."""
        with store.session() as s:
            if observed_until(s) is not None:
                return 0
        cluster = self.cluster(store)
        start = window_start - dt.timedelta(minutes=self.warmup_minutes)
        report = cluster.advance(start, self.warmup_minutes)
        round_runner.book_interval(store, report, None, self.source, window_start,
                                   persist=lambda s: save_cluster_state(s, cluster, window_start))
        return self.warmup_minutes

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
            gap = int((window_start - until).total_seconds() // 60)
            start = until
            if gap > self.max_gap_minutes:
                # Nobody ran rounds for a long time (e.g. the schedule started days
                # after the last run): simulate only the last warm-up before the
                # window; the cluster stands still over the rest of the gap.
                log.warning("simulated cluster idle for %d minutes; simulating the last %d only", gap,
                            self.warmup_minutes)
                gap = self.warmup_minutes
                start = window_start - dt.timedelta(minutes=gap)
            log.info("simulating %d minutes without a round (%s to %s)", gap, start, window_start)
            cluster = self.cluster(store)
            report = cluster.advance(start, gap)
            round_runner.book_interval(store, report, None, self.source, window_start,
                                       persist=lambda s: save_cluster_state(s, cluster, window_start))
        cluster = self.cluster(store)
        report = cluster.advance(window_start, minutes)
        round_runner.book_interval(store, report, round_id, self.source, end,
                                   persist=lambda s: save_cluster_state(s, cluster, end))
        return report
