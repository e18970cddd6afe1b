"""The round service: one way to run a scheduling round, for Dagster, the CLI and the main job.

A round for a window (docs/DESIGN.md §3 step 5–6, paper §5) has three phases, each a
method here and each a Dagster asset (``placement_plan``, ``plan_dispatch``,
``cluster_interval``); ``muxflow round --once`` runs them in a row
(:meth:`RoundService.run_once`):

1. **plan** — job states follow the cluster first (started, finished, requeued,
   evicted jobs back in the queue: ``ClusterBackend.sync_jobs``), online history
   exists before the window, then snapshot → forecast → dynamic SM → predicted
   throughput → certified matching → plan diff, stored with everything needed to
   replay it. A window that already has a round is replayed from its snapshot and
   must come out identical.
2. **dispatch** — the stored plan is sent, every action once (intent → result,
   keyed), and the store books what the cluster carried out.
3. **book** — what the cluster reported for the window: the simulated cluster
   simulates it; on Slurm the job states follow Slurm again (the node agents
   write metrics, health and evictions themselves).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from executors.cluster import ClusterBackend, IntervalReport, JobSyncReport, round_period_error
from executors.scheduler import round_runner
from executors.store import repo
from executors.store import rounds as rounds_db
from executors.store.db import Store
from scheduler_core.domain import RoundResult
from scheduler_core.online.forecast import ForecastPolicy
from scheduler_core.round.clock import RoundClock
from scheduler_core.round.plan import RoundConfig


class RoundError(RuntimeError):
    """A round phase cannot run; the message says why (shown in the UI and by the CLI)."""

    def __init__(self, message: str, details: list[str] | None = None):
        super().__init__(message)
        self.details = details or []


@dataclass(frozen=True)
class Planned:
    round_id: int
    result: RoundResult
    replayed: bool
    warmup_minutes: int = 0
    sync: JobSyncReport | None = None


@dataclass(frozen=True)
class Dispatched:
    round_id: int
    actions: int
    sent_ok: int
    sent_failed: int
    log: dict[str, int]  # dispatch log of the round by status, after this dispatch


@dataclass(frozen=True)
class Booked:
    round_id: int
    booked_now: bool
    figures: rounds_db.WindowFigures
    report: IntervalReport | None = None
    predicted_vs_realised: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class RoundOutcome:
    window: dt.datetime
    planned: Planned
    dispatched: Dispatched
    booked: Booked


@dataclass(frozen=True)
class Filled:
    fill: round_runner.Fill
    sync: JobSyncReport
    sent_ok: int
    sent_failed: int


@dataclass
class RoundService:
    store: Store
    backend: ClusterBackend
    config: RoundConfig = field(default_factory=RoundConfig)
    clock: RoundClock = field(default_factory=RoundClock)
    forecast: ForecastPolicy = field(default_factory=ForecastPolicy)

    def __post_init__(self) -> None:
        why = round_period_error(self.clock.period_s, self.backend.simulated)
        if why:
            raise RoundError(why)

    # -- windows ------------------------------------------------------------------------
    def _now(self, window: dt.datetime) -> dt.datetime:
        """When things happen: the window's start on a simulated cluster (its own time), the wall clock on a
        real one (a round's dispatch may come well after its window began)."""
        if self.backend.simulated:
            return window
        return max(window, dt.datetime.now(dt.timezone.utc))

    def next_window(self, now: dt.datetime) -> dt.datetime:
        """The window a round started at ``now`` plans: the one ``now`` falls in, or the one after the latest
        round when that one is already planned (a simulated cluster's time runs ahead of the clock)."""
        window = self.clock.window_of(now)
        with self.store.session() as s:
            latest = rounds_db.latest_round_window(s)
        if latest is not None and latest >= window:
            window = latest + self.clock.period
        return window

    def require_predictor(self) -> None:
        """RoundError unless a promoted speed predictor exists: checked before a round changes anything."""
        try:
            round_runner.require_predictor(self.store)
        except round_runner.NoPredictorError as exc:
            raise RoundError(str(exc)) from exc

    # -- phases -------------------------------------------------------------------------
    def plan(self, window: dt.datetime, now: dt.datetime | None = None) -> Planned:
        if not self.clock.is_window_start(window):
            raise RoundError(f"{window.isoformat()} is not the start of a {self.clock.period_s}-second round window")
        with self.store.session() as s:
            existing = rounds_db.round_for_window(s, window)
        if existing is not None:
            rep = round_runner.replay_round(self.store, window)
            if not rep.matches:
                raise RoundError(f"replaying round {rep.round_id} from its snapshot gave a different plan",
                                 rep.mismatches)
            return Planned(rep.round_id, rep.replayed, replayed=True)
        self.require_predictor()
        sync = self.backend.sync_jobs(self.store, now or self._now(window))
        warm = self.backend.ensure_history(self.store, window)
        try:
            round_id, result = round_runner.plan_and_record(self.store, self.backend.cluster(self.store), window,
                                                            self.config, self.forecast, self.clock.period_s)
        except (round_runner.RoundOrderError, round_runner.NoPredictorError) as exc:
            raise RoundError(str(exc)) from exc
        return Planned(round_id, result, replayed=False, warmup_minutes=warm, sync=sync)

    def dispatch(self, window: dt.datetime) -> Dispatched:
        with self.store.session() as s:
            rnd = self._round(s, window)
            if rounds_db.later_rounds(s, window) and rnd.status == "planned":
                raise RoundError(f"round {rnd.id} was never dispatched and later rounds exist: "
                                 "its plan is out of date and is not sent")
            result = rounds_db.stored_result(s, rnd)
            round_id = rnd.id
        ok, failed = self.backend.dispatch(self.store, round_id, result, self._now(window))
        with self.store.session() as s:
            counts = rounds_db.dispatch_counts(s, round_id)
        return Dispatched(round_id, len(result.actions), ok, failed, counts)

    def book(self, window: dt.datetime) -> Booked:
        with self.store.session() as s:
            rnd = self._round(s, window)
            round_id, period_s = rnd.id, rnd.period_s or self.clock.period_s
        report = self.backend.observe(self.store, window, max(1, period_s // 60), round_id)
        end = window + dt.timedelta(seconds=period_s)
        with self.store.session() as s:
            figures = rounds_db.window_figures(s, round_id, window, end)
            pvr = repo.predicted_vs_realised(s, round_id)
        return Booked(round_id, report is not None, figures, report, pvr)

    def fill(self, now: dt.datetime) -> Filled:
        """A fill after the latest round (:func:`executors.scheduler.round_runner.plan_fill`): job states follow the
        cluster, then the waiting jobs are matched to the free GPUs, stored and dispatched at once. A fill
        whose dispatch did not finish (Slurm unreachable) is dispatched again instead of planning another,
        unless it was planned more than a round period ago: then it is marked failed and a new one planned.

        Real clusters only: the simulated cluster books whole windows (its time is the window's, not the
        wall clock's); the simulator measures placing between rounds itself (``simulate --between-rounds``)."""
        if self.backend.simulated:
            raise RoundError("fills run on a real cluster: the simulated cluster books whole round windows "
                             "(`muxflow simulate --between-rounds` measures placing between rounds)")
        self.require_predictor()
        with self.store.session() as s:
            unsent = rounds_db.undispatched_fill(s)
            if unsent is not None and now - unsent.started_utc > self.clock.period:
                # Planned more than a period ago (Slurm was unreachable since): its free GPUs are history.
                unsent.status, unsent.finished_utc = "failed", now
                unsent = None
            if unsent is not None:
                fill = round_runner.Fill(unsent.id, rounds_db.stored_result(s, unsent), unsent.gpus_considered,
                                         unsent.jobs_pending, unsent.seq)
        if unsent is not None:
            sync = JobSyncReport()
        else:
            sync = self.backend.sync_jobs(self.store, now)
            try:
                fill = round_runner.plan_fill(self.store, self.backend.cluster(self.store), now, self.forecast)
            except (round_runner.FillRefused, round_runner.NoPredictorError) as exc:
                raise RoundError(str(exc)) from exc
        if fill.round_id is None:
            return Filled(fill, sync, 0, 0)
        ok, failed = self.backend.dispatch(self.store, fill.round_id, fill.result, now)
        return Filled(fill, sync, ok, failed)

    def run_once(self, window: dt.datetime, now: dt.datetime | None = None) -> RoundOutcome:
        planned = self.plan(window, now)
        return RoundOutcome(window, planned, self.dispatch(window), self.book(window))

    def _round(self, s, window: dt.datetime):
        rnd = rounds_db.round_for_window(s, window)
        if rnd is None:
            raise RoundError(f"no placement plan for the window {window:%Y-%m-%d %H:%M:%S} UTC: "
                             "plan it first (placement_plan)")
        return rnd
