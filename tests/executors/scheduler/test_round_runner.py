"""The round's view of the GPUs (what the node agents wrote) and how dispatch results are booked."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from executors.cluster import DispatchResult, MetricRow, RunningJob
from executors.scheduler import round_runner
from executors.store import models as m
from executors.store import repo
from executors.store.db import Store
from executors.store.jobs import transition
from executors.store.migrate import upgrade
from executors.store.rounds import latest_round
from scheduler_core.domain import Action, JobState, PlanAction, RoundResult
from scheduler_core.gpu_specs import get_spec
from scheduler_core.online.forecast import ForecastPolicy
from scheduler_core.online.latency_budget import budget_allowances
from scheduler_core.round.weights import slo_allowance

NOW = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.timezone.utc)


def _store(tmp_path: Path, gpus: int = 2) -> tuple[Store, list[int]]:
    url = f"sqlite:///{tmp_path / 's.db'}"
    upgrade(url)
    store = Store(url)
    with store.session() as s:
        repo.upsert_gpu_type(s, get_spec("t4"))
        node = m.Node(name="n1")
        svc = m.OnlineService(name="svc", model_family="cnn", qps_min=10, qps_max=50, latency_slo_ms=100,
                              mem_bytes=2 * 1024**3, slowdown_allowance=0.2)
        s.add_all([node, svc])
        s.flush()
        ids = []
        for i in range(gpus):
            g = m.Gpu(node_id=node.id, gpu_index=i, gpu_type="t4", uuid=f"u{i}", health="Healthy")
            s.add(g)
            s.flush()
            s.add(m.ServiceInstance(service_id=svc.id, gpu_id=g.id))
            ids.append(g.id)
    return store, ids


def _row(gpu_id: int, minutes_ago: int, online_sm: float | None) -> MetricRow:
    on = online_sm is not None
    return MetricRow(gpu_id, NOW - dt.timedelta(minutes=minutes_ago), 60.0, 50.0, 30.0, 4e9, 15e9, 30.0, 1400.0,
                     None, None, 30.0 if on else None, online_sm, 2e9 if on else None, 20.0 if on else None,
                     40.0 if on else None, 8.0 if on else None, 7.0 if on else None, None, "Healthy")


def test_a_gpu_whose_latest_split_is_a_gap_keeps_its_last_known_online_load(tmp_path: Path) -> None:
    store, (g1, g2) = _store(tmp_path)
    with store.session() as s:
        # g1: online SM known an hour ago, then 20 minutes without a split (an offline job ran there).
        repo.write_metrics(s, [_row(g1, k, 25.0) for k in range(60, 80)] + [_row(g1, k, None) for k in range(1, 21)],
                           "measured")
        repo.write_metrics(s, [_row(g2, k, None) for k in range(1, 30)], "measured")  # never split
    with store.session() as s:
        gpus = round_runner._gpu_candidates(s, NOW, {}, ForecastPolicy())
    assert [g.gpu_id for g in gpus] == [g1]
    assert gpus[0].online.sm_activity_pct == 25.0 and gpus[0].forecast_sm_pct == 25.0


def test_dispatch_books_placed_on_a_cluster_that_starts_jobs_later_and_keeps_the_newer_truth(tmp_path: Path) -> None:
    store, (g1, g2) = _store(tmp_path)
    with store.session() as s:
        jobs = []
        for k in range(2):
            j = m.OfflineJob(name=f"j{k}", job_type="x", command="c", mem_bytes=1, allowed_gpu_types=["t4"],
                             checkpoint_dir="/c", total_steps=10)
            s.add(j)
            s.flush()
            for st in (JobState.PROFILING, JobState.PENDING):
                transition(s, j.id, st, "setup")
            jobs.append(j.id)
    actions = [PlanAction(Action.START, jobs[0], g1, None, 40), PlanAction(Action.START, jobs[1], g2, None, 30)]
    result = RoundResult([], actions, 0.0, 2, 2, 2)
    with store.session() as s:
        rid = repo.record_round(s, NOW, result, {}, False, 2, {}).id

    class Later:
        """A cluster that takes both starts; job 1 finished meanwhile (the sync saw it first)."""

        simulated = False
        starts_jobs_at_once = False

        def dispatch(self, acts, now):
            with store.session() as s:
                transition(s, jobs[1], JobState.FAILED, "cancelled in the cluster")
            return [DispatchResult(a, True, "released") for a in acts]

        def running(self):
            return {jobs[0]: RunningJob(jobs[0], g1, 40)}

    assert round_runner.dispatch_round(store, Later(), rid, result, NOW) == (2, 0)
    with store.session() as s:
        states = {j: s.get(m.OfflineJob, j).state for j in jobs}
        logged = {r.job_id: (r.status, r.error) for r in s.scalars(select(m.DispatchLog))}
    assert states == {jobs[0]: "PLACED", jobs[1]: "FAILED"}
    assert logged[jobs[0]] == ("done", None)
    assert logged[jobs[1]][0] == "done" and logged[jobs[1]][1].startswith("not booked:")


def test_gpus_carry_their_service_slo_and_the_p99_its_latency_model_forecasts(tmp_path: Path) -> None:
    store, (g1, g2) = _store(tmp_path)
    rows = []
    for gid in (g1, g2):
        for k in range(1, 121):  # two hours of a replica whose latency grows with its load
            sm = 10.0 + 40.0 * ((k * 7 + gid) % 120) / 120.0
            lat = 5.0 + 0.2 * sm
            rows.append(dataclasses.replace(_row(gid, k, sm), online_solo_latency_ms=lat, online_latency_ms=lat))
    with store.session() as s:
        repo.write_metrics(s, rows, "measured")
    with store.session() as s:
        gpus = round_runner._gpu_candidates(s, NOW, {}, ForecastPolicy())
    assert len(gpus) == 2
    for g in gpus:
        assert g.latency_slo_ms == 100.0
        # p99 = ln 100 × the mean latency the fitted curve gives at the forecast SM (it errs high, by < 1 bin)
        want = math.log(100.0) * (5.0 + 0.2 * g.forecast_sm_pct)
        assert want <= g.forecast_p99_ms <= want * 1.05
        assert slo_allowance(g) == pytest.approx(min(g.slowdown_allowance, 100.0 / g.forecast_p99_ms - 1.0))


def test_without_enough_latency_samples_the_flat_allowance_stands(tmp_path: Path) -> None:
    store, (g1, _g2) = _store(tmp_path, gpus=2)
    with store.session() as s:
        repo.write_metrics(s, [_row(g1, k, 25.0) for k in range(1, 5)], "measured")  # one load level only
    with store.session() as s:
        [g] = round_runner._gpu_candidates(s, NOW, {}, ForecastPolicy())
    assert g.forecast_p99_ms is None and slo_allowance(g) == g.slowdown_allowance


def _row_qps(gpu_id: int, minutes_ago: int, qps: float, online_sm: float | None) -> MetricRow:
    """A minute with the replica's request rate scraped; its split (util, SM, bandwidth) a gap where
    ``online_sm`` is None, as under MPS on a real GPU while an offline job runs."""
    on = online_sm is not None
    return MetricRow(gpu_id, NOW - dt.timedelta(minutes=minutes_ago), 60.0, 50.0, 30.0, 4e9, 15e9, 30.0, 1400.0,
                     None, None, 1.2 * online_sm if on else None, online_sm, 2e9, 0.8 * online_sm if on else None,
                     qps, 8.0, 7.0, None, "Healthy")


def test_a_gpu_shared_under_mps_is_planned_from_the_load_its_request_rate_implies(tmp_path: Path) -> None:
    store, (g1, g2) = _store(tmp_path)
    with store.session() as s:
        # g1: five quiet hours alone (SM 0.5 % per request/s), then an hour shared with no split while its
        # requests climb to twice anything seen alone. g2: shared the whole day, its rate known throughout.
        alone = [_row_qps(g1, k, 20.0 + (k % 40), 0.5 * (20.0 + (k % 40))) for k in range(61, 361)]
        shared = [_row_qps(g1, k, 120.0 - k, None) for k in range(1, 61)]
        always = [_row_qps(g2, k, 30.0, None) for k in range(1, 1441)]
        repo.write_metrics(s, alone + shared + always, "measured")
    with store.session() as s:
        by_id = {g.gpu_id: g for g in round_runner._gpu_candidates(s, NOW, {}, ForecastPolicy())}
    # g1's latest minutes: rates 105-119, beyond the fitted range, so SM in proportion to the highest bin's.
    assert by_id[g1].online.sm_activity_pct > 0.45 * 105
    assert by_id[g1].online.sm_activity_pct == pytest.approx(0.5 * np.mean(120.0 - np.arange(1, 16)), rel=0.1)
    assert by_id[g1].forecast_sm_pct > 50.0  # not the stale 10-30 % of its minutes alone
    # g2 never had a split in the last day: planned from its service's curve instead of left out.
    assert by_id[g2].online.sm_activity_pct == pytest.approx(15.0, rel=0.1)
    assert by_id[g2].online.gpu_util_pct == pytest.approx(18.0, rel=0.1)


def test_a_service_with_a_slowdown_budget_gets_less_than_its_cap_at_its_busy_hour(tmp_path: Path) -> None:
    store, (g1, g2) = _store(tmp_path)
    with store.session() as s:
        s.execute(m.OnlineService.__table__.update().values(slowdown_allowance=0.3, slowdown_budget=0.1))
        # g1: a quiet day behind it (10 % SM) and busy now (60 %); g2: busy all day.
        rows = [_row(g1, k, 10.0) for k in range(31, 600)] + [_row(g1, k, 60.0) for k in range(1, 31)]
        rows += [_row(g2, k, 60.0) for k in range(1, 600)]
        repo.write_metrics(s, rows, "measured")
    with store.session() as s:
        by_id = {g.gpu_id: g for g in round_runner._gpu_candidates(s, NOW, {}, ForecastPolicy())}
    want = budget_allowances(np.array([10.0] * 569 + [60.0] * 30), [by_id[g1].forecast_sm_pct], 0.1, 0.3)[0]
    # The busy interval of g1 pays for its quiet day at the cap; g2, busy all day, gets the budget itself.
    assert by_id[g1].slowdown_allowance == pytest.approx(want)
    assert by_id[g1].slowdown_allowance < 0.1
    assert by_id[g2].slowdown_allowance == pytest.approx(0.1)


def test_a_job_s_remaining_work_is_its_steps_left_at_its_fastest_profiled_iteration(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    with store.session() as s:
        repo.upsert_gpu_type(s, get_spec("a10"))
        ids = []
        for k, (total, done, iters) in enumerate([(1000, 250.0, {"t4": 0.2, "a10": 0.1}), (400, 0.0, {"t4": 0.5}),
                                                  (300, 0.0, {})]):
            j = m.OfflineJob(name=f"j{k}", job_type="x", command="c", mem_bytes=1, allowed_gpu_types=["t4", "a10"],
                             checkpoint_dir="/c", total_steps=total, steps_done=done)
            s.add(j)
            s.flush()
            for st in (JobState.PROFILING, JobState.PENDING):
                transition(s, j.id, st, "setup")
            for gtype, it in iters.items():
                s.add(m.JobProfile(job_id=j.id, gpu_type=gtype, gpu_util_pct=90.0, sm_activity_pct=60.0,
                                   sm_occupancy_pct=40.0, mem_used_bytes=1e9, mem_bw_util_pct=30.0, iter_time_s=it,
                                   sm_clock_mhz=1400.0, source="measured"))
            ids.append(j.id)
    with store.session() as s:
        jobs = {j.job_id: j for j in round_runner._job_candidates(s, {})}
    # 750 steps left at 0.1 s on the A10; 400 at 0.5 s; the job with no profile is not a candidate yet.
    assert jobs[ids[0]].remaining_s == pytest.approx(75.0) and jobs[ids[1]].remaining_s == pytest.approx(200.0)
    assert ids[2] not in jobs


def _simulated_day(store: Store, gpu_ids: list[int], mps_split_gaps: bool) -> None:
    """Ten hours of the simulated cluster into ``store``: a job shares the first GPU for the last seven, while
    the service's load climbs towards its noon peak."""
    from executors.data.calibration import default_catalog
    from executors.simulated.cluster import SimGpuSpec, SimJobSpec, SimServiceSpec, SimSettings, SimulatedCluster

    svc = SimServiceSpec("svc", "cnn", 10.0, 50.0, 12.0, 2 * 1024**3)
    cluster = SimulatedCluster([SimGpuSpec(g, "t4", svc) for g in gpu_ids], default_catalog(),
                               SimSettings(seed=5, burst_prob_per_min=0.0, mps_split_gaps=mps_split_gaps))
    cluster.register_job(SimJobSpec(1, "ResNet-50 (batch size 64)", 10**9))
    start = NOW - dt.timedelta(hours=10)
    rows = []
    for k in range(40):
        t = start + dt.timedelta(minutes=15 * k)
        if k == 12:
            cluster.dispatch([PlanAction(Action.START, 1, gpu_ids[0], None, 40)], t)
        rows += [dataclasses.replace(r, offline_job_id=None) for r in cluster.advance(t, 15).metrics]
    with store.session() as s:
        repo.write_metrics(s, rows, "simulated")
    shared = [r for r in rows if r.gpu_id == gpu_ids[0] and r.minute_utc >= start + dt.timedelta(hours=3)]
    assert all((r.online_sm_activity_pct is None) == mps_split_gaps for r in shared)


def test_on_a_simulated_cluster_without_a_split_under_mps_the_round_sees_the_load_it_would_have_measured(
        tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "truth").mkdir()
    (tmp_path / "mps").mkdir()
    truth, ids = _store(tmp_path / "truth")
    gaps, same = _store(tmp_path / "mps")
    assert ids == same
    _simulated_day(truth, ids, mps_split_gaps=False)
    _simulated_day(gaps, ids, mps_split_gaps=True)

    def first_gpu(store: Store):
        with store.session() as s:
            return next(g for g in round_runner._gpu_candidates(s, NOW, {}, ForecastPolicy()) if g.gpu_id == ids[0])

    want, got = first_gpu(truth), first_gpu(gaps)
    assert got.online.sm_activity_pct == pytest.approx(want.online.sm_activity_pct, rel=0.1)
    assert got.forecast_sm_pct == pytest.approx(want.forecast_sm_pct, rel=0.1)
    assert got.online.gpu_util_pct == pytest.approx(want.online.gpu_util_pct, rel=0.1)
    # Without the estimate the round would plan from the last minutes measured alone, seven hours earlier.
    monkeypatch.setattr(round_runner, "fit_split", lambda series: {})
    stale = first_gpu(gaps)
    assert stale.online.sm_activity_pct < 0.7 * want.online.sm_activity_pct


def test_the_round_period_is_checked_against_the_cluster_by_one_rule(tmp_path: Path) -> None:
    from executors.cluster import round_period_error
    from executors.scheduler.round_service import RoundError, RoundService
    from executors.simulated.backend import SimulatedBackend
    from pipelines.settings import MuxflowSettings, SettingsError
    from scheduler_core.round.clock import RoundClock

    store, _ = _store(tmp_path)
    with pytest.raises(RoundError, match="multiple of 60 s, got 30 s"):
        RoundService(store, SimulatedBackend(), clock=RoundClock(30))
    assert RoundService(store, SimulatedBackend(), clock=RoundClock(120)).clock.period_s == 120
    # The settings refuse the same period with the same words, before anything runs.
    with pytest.raises(SettingsError, match="round_period_s: the simulated cluster steps whole minutes"):
        MuxflowSettings(db_url=store.url, round_period_s=30)
    assert round_period_error(30, simulated=False) is None and round_period_error(30, simulated=True)


def _shared_row(gpu_id: int, minutes_ago: int, job_id: int | None, slowdown: float) -> MetricRow:
    """A replica-minute at 40 QPS (SM 20 %), an offline job beside it (``job_id``) slowing it ``slowdown`` ×."""
    return dataclasses.replace(_row_qps(gpu_id, minutes_ago, 40.0, 20.0), online_solo_latency_ms=8.0,
                               online_latency_ms=8.0 * slowdown, offline_job_id=job_id)


def test_a_service_whose_shared_minutes_went_over_its_allowance_gets_a_tighter_one_round_after_round(
        tmp_path: Path) -> None:
    store, (g1, g2, g3) = _store(tmp_path, gpus=3)
    with store.session() as s:
        other = m.OnlineService(name="other", model_family="cnn", qps_min=10, qps_max=50, latency_slo_ms=100,
                                mem_bytes=2 * 1024**3, slowdown_allowance=0.2)
        s.add(other)
        s.flush()
        s.execute(m.ServiceInstance.__table__.update().where(m.ServiceInstance.gpu_id == g3)
                  .values(service_id=other.id))
        jobs = [m.OfflineJob(name=f"j{k}", job_type="x", command="c", mem_bytes=1, allowed_gpu_types=["t4"],
                             checkpoint_dir="/c", total_steps=10) for k in range(3)]
        s.add_all(jobs)
        s.flush()
        j1, j2, j3 = (j.id for j in jobs)
        # An hour alone, then an hour shared: "svc" measured +30 % against its +20 %, "other" +10 %.
        rows = [_shared_row(g, k, None, 1.0) for g in (g1, g2, g3) for k in range(61, 121)]
        rows += [_shared_row(g1, k, j1, 1.30) for k in range(1, 61)]
        rows += [_shared_row(g2, k, j2, 1.30) for k in range(1, 61)]
        rows += [_shared_row(g3, k, j3, 1.10) for k in range(1, 61)]
        repo.write_metrics(s, rows, "measured")
    with store.session() as s:
        # no round before: every factor starts at 1; "svc"'s p99 is 1.5× its allowance, "other"'s half of it
        first = round_runner.allowance_corrections(s, NOW)
        assert first["svc"].minutes == 120 and first["other"].minutes == 60
        assert min(c.minutes for c in first.values()) >= round_runner.CORRECTION.min_minutes  # enough to act
        assert first["svc"].tail == pytest.approx(1.5) and first["other"].tail == pytest.approx(0.5)
        gain = round_runner.CORRECTION.gain
        assert first["svc"].factor == pytest.approx(1.5 ** gain)
        assert first["other"].factor == 1.0  # within its allowance: as declared
        by_id = {g.gpu_id: g for g in round_runner._gpu_candidates(s, NOW, {}, ForecastPolicy(), first)}
        assert by_id[g1].slowdown_allowance == pytest.approx(0.2 / 1.5 ** gain)
        assert by_id[g2].slowdown_allowance == pytest.approx(0.2 / 1.5 ** gain)
        assert by_id[g3].slowdown_allowance == pytest.approx(0.2)  # the other service: untouched
        # The previous round stored its factors in its snapshot: the next step starts from them.
        meta = round_runner.corrections_metadata({**first, "svc": dataclasses.replace(first["svc"], factor=2.0)})
        assert meta["svc"]["factor"] == 2.0 and meta["svc"]["minutes"] == 120
        s.add(m.SchedulingRound(window_start_utc=NOW - dt.timedelta(minutes=15), period_s=900, status="dispatched",
                                snapshot={"allowance_correction": meta}))
    with store.session() as s:
        assert {k: c.factor for k, c in round_runner.stored_corrections(latest_round(s)).items()} == {"svc": 2.0}
        # a fill (or anything but a full round) uses the stored factors as they are
        by_id = {g.gpu_id: g for g in round_runner._gpu_candidates(s, NOW, {}, ForecastPolicy())}
        assert by_id[g1].slowdown_allowance == pytest.approx(0.1) and by_id[g3].slowdown_allowance == 0.2
        again = round_runner.allowance_corrections(s, NOW)
        assert again["svc"].factor == pytest.approx(2.0 * 1.5 ** gain)  # still over: tighter again
        assert again["other"].factor == 1.0
        # Minutes older than the correction's window are no evidence: the factor stays where the last round left it.
        later = NOW + dt.timedelta(minutes=round_runner.CORRECTION.window_minutes + 1)
        stale = round_runner.allowance_corrections(s, later)
        assert stale["svc"].factor == 2.0 and stale["svc"].minutes == 0 and stale["svc"].tail is None
        assert "other" not in stale


def test_a_budgeted_service_s_budget_is_paced_by_what_its_requests_spent_over_the_day(tmp_path: Path) -> None:
    store, (g1, g2) = _store(tmp_path)
    with store.session() as s:
        s.execute(m.OnlineService.__table__.update().values(slowdown_allowance=0.3, slowdown_budget=0.1))
        job = m.OfflineJob(name="j", job_type="x", command="c", mem_bytes=1, allowed_gpu_types=["t4"],
                           checkpoint_dir="/c", total_steps=10)
        s.add(job)
        s.flush()
        # The last day: g1 shared at +10 % for its last hour, and at +30 % in the hour 23 hours ago; the rest of g1's
        # day and all of g2's alone (they spend nothing). Requests weigh alike: 2 × 60 of 2 × 1439 minutes.
        rows = [_shared_row(g, k, None, 1.0) for g in (g1, g2) for k in range(61, 1440) if not (g == g1 and
                                                                                                1320 < k <= 1380)]
        rows += [_shared_row(g1, k, job.id, 1.3) for k in range(1321, 1381)]
        rows += [_shared_row(g1, k, job.id, 1.1) for k in range(1, 61)] + [_shared_row(g2, k, None, 1.0)
                                                                          for k in range(1, 61)]
        repo.write_metrics(s, rows, "measured")
    total = 2 * 1439
    with store.session() as s:
        # no round before: k starts at 1, every minute counts as spent
        first = round_runner.budget_paces(s, NOW)["svc"]
        assert first.minutes == total and first.spent == pytest.approx(60 * (0.3 + 0.1) / total)
        gain = round_runner.PACING.gain
        aim = round_runner.PACING.setpoint * 0.1
        assert first.k == pytest.approx(min(3.0, (aim / first.spent) ** gain))  # at most cap / budget
        assert first.budget == pytest.approx(0.1 * first.k)
        # Two rounds stored their k: 0.25 from 1,400 minutes ago, 2.0 over the last hour.
        for ago, k in ((1400, 0.25), (60, 2.0)):
            meta = round_runner.paces_metadata({"svc": round_runner.Pace(k, min(0.3, 0.1 * k))})
            s.add(m.SchedulingRound(window_start_utc=NOW - dt.timedelta(minutes=ago), period_s=900,
                                    status="dispatched", snapshot={"budget_pacing": meta}))
    with store.session() as s:
        assert round_runner.stored_paces(latest_round(s)) == {"svc": 2.0}
        paced = round_runner.budget_paces(s, NOW)["svc"]
        # The +30 % hour was planned under 0.25: it counts at 2.0 (× 8); the last hour as it was, under 2.0.
        want = 60 * (0.3 * 8 + 0.1) / total
        assert paced.spent == pytest.approx(want)
        assert paced.k == pytest.approx(2.0 * (aim / want) ** gain) and paced.k < 3.0
        by_id = {g.gpu_id: g for g in round_runner._gpu_candidates(s, NOW, {}, ForecastPolicy(), {},
                                                                      {"svc": paced.k})}
        hist = np.full(1440, 20.0)
        want_allowance = budget_allowances(hist, [by_id[g1].forecast_sm_pct], paced.budget, 0.3)[0]
        assert by_id[g1].slowdown_allowance == pytest.approx(want_allowance)
        # A fill (or anything but a full round) plans with the k the round stored.
        by_id = {g.gpu_id: g for g in round_runner._gpu_candidates(s, NOW, {}, ForecastPolicy())}
        assert by_id[g1].slowdown_allowance == pytest.approx(
            budget_allowances(hist, [by_id[g1].forecast_sm_pct], 0.2, 0.3)[0])
        # Minutes older than the window are no evidence; a service without a budget is not paced.
        later = NOW + dt.timedelta(minutes=round_runner.PACING.window_minutes + 1)
        stale = round_runner.budget_paces(s, later)["svc"]
        assert stale.minutes == 0 and stale.spent is None and stale.k == 2.0
        s.execute(m.OnlineService.__table__.update().values(slowdown_budget=None))
        assert round_runner.budget_paces(s, NOW) == {}
