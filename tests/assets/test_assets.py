"""Assets materialized with Dagster's ``materialize`` on a real feature store (SQLite and Postgres).

The cluster resource is a fake around the simulated backend that records
what is sent and can fail on command; everything else is the real code.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, Failure, materialize
from sqlalchemy import func, select, update

from assets.resources import ClusterResource, FeatureStoreResource, PredictorStoreResource
from executors.simulated.backend import SimulatedBackend
from executors.store import models as m
from executors.store import rounds as rounds_db
from executors.store.db import Store
from pipelines.definitions import build_definitions, scheduling_resource
from pipelines.settings import MuxflowSettings
from scheduler_core.domain import JobState

START = dt.datetime(2026, 1, 5, 0, 0, tzinfo=dt.timezone.utc)
WINDOW = START + dt.timedelta(hours=1)
KEY = WINDOW.strftime("%Y-%m-%d-%H:%M")


def round_key(instance: DagsterInstance, key: str = KEY) -> str:
    """The round partition ``key``, added as the round sensor adds each window's."""
    if not instance.has_dynamic_partition("rounds", key):
        instance.add_dynamic_partitions("rounds", [key])
    return key


def settings_for(url: str, tmp_path: Path, **over) -> MuxflowSettings:
    base = dict(db_url=url, gpu_types=("a10", "t4"), rounds_start=START, samples_per_type=200, epochs=20,
                max_holdout_mae=0.5, migration_penalty=0.05, report_dir=str(tmp_path / "report"))
    base.update(over)
    return MuxflowSettings(**base)


class RecordingBackend(SimulatedBackend):
    """The simulated backend, recording dispatches; fails the first ``fail_dispatches`` of them."""

    calls: list = []
    fail_dispatches: int = 0

    def dispatch(self, store, round_id, result, now):
        type(self).calls.append((round_id, [a.action.value for a in result.actions]))
        if type(self).fail_dispatches > 0:
            type(self).fail_dispatches -= 1
            raise ConnectionError("cluster API unavailable (injected)")
        return super().dispatch(store, round_id, result, now)


class FakeClusterResource(ClusterResource):
    def backend(self):
        return RecordingBackend()


@pytest.fixture(autouse=True)
def _reset_recording():
    RecordingBackend.calls = []
    RecordingBackend.fail_dispatches = 0


def resources(url: str, max_mae: float = 0.5, tmp_path: Path = Path("unused")) -> dict:
    fs = FeatureStoreResource(db_url=url)
    return {"feature_store": fs, "cluster": FakeClusterResource(),
            "predictors": PredictorStoreResource(feature_store=fs, epochs=20, max_holdout_mae=max_mae),
            "scheduling": scheduling_resource(settings_for(url, tmp_path))}


def assets_of(url: str, tmp_path: Path, **over):
    defs = build_definitions(settings_for(url, tmp_path, **over))
    return {a.key.to_user_string(): a for a in defs.assets}


def meta(result, key: str) -> dict:
    mats = result.asset_materializations_for_node(key)
    assert mats, f"{key} was not materialized"
    return {k: v.value for k, v in mats[-1].metadata.items()}


def prepare(url: str, tmp_path: Path, instance: DagsterInstance) -> dict:
    """Profiles, samples and promoted predictors, as refresh_job and train_job make them."""
    a = assets_of(url, tmp_path)
    res = materialize([a["offline_job_profiles"], a["online_service_features"], a["colocation_samples"]],
                      resources=resources(url), instance=instance)
    assert res.success
    for gtype in ("a10", "t4"):
        r = materialize([a["speed_predictor_candidate"], a["speed_predictor"]], partition_key=gtype,
                        resources=resources(url), instance=instance, selection=[a["speed_predictor_candidate"],
                                                                                a["speed_predictor"]])
        assert r.success
    return a


def test_profiling_assets_profile_new_jobs_and_top_up_samples(cluster_store: Store, tmp_path, dagster_instance) -> None:
    url = cluster_store.url
    a = assets_of(url, tmp_path)
    res = materialize([a["offline_job_profiles"], a["online_service_features"], a["colocation_samples"]],
                      resources=resources(url), instance=dagster_instance)
    assert res.success
    prof = meta(res, "offline_job_profiles")
    assert prof["profiled_now"] == 6 and prof["jobs_pending"] == 6
    samples = meta(res, "colocation_samples")
    assert samples["samples_a10"] == samples["samples_t4"] == 200 and samples["added_now"] == 400
    assert samples["method"] == "simulated"
    # A second materialization has nothing new to profile and the samples are already topped up.
    res2 = materialize([a["offline_job_profiles"], a["colocation_samples"]], resources=resources(url),
                       instance=dagster_instance, selection=[a["offline_job_profiles"], a["colocation_samples"]])
    assert meta(res2, "offline_job_profiles")["profiled_now"] == 0
    assert meta(res2, "colocation_samples")["added_now"] == 0
    with cluster_store.session() as s:
        assert s.scalar(select(func.count()).select_from(m.ColocationSample)) == 400


def test_predictor_check_passes_and_promotes(cluster_store: Store, tmp_path, dagster_instance) -> None:
    prepare(cluster_store.url, tmp_path, dagster_instance)
    check = dagster_instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [_check_key("speed_predictor_candidate", "holdout_error_within_bound")]
    )
    assert check and list(check.values())[0].status.value == "SUCCEEDED"
    with cluster_store.session() as s:
        promoted = s.execute(select(m.PredictorModel.gpu_type, m.PredictorModel.version)
                             .where(m.PredictorModel.promoted.is_(True))).all()
    assert sorted(promoted) == [("a10", 1), ("t4", 1)]


def _check_key(asset: str, name: str):
    from dagster import AssetCheckKey

    return AssetCheckKey(AssetKey(asset), name)


def test_failing_predictor_check_blocks_promotion(cluster_store: Store, tmp_path, dagster_instance) -> None:
    url = cluster_store.url
    a = prepare(url, tmp_path, dagster_instance)  # v1 of each type promoted under a loose bound
    strict = resources(url, max_mae=1e-6)
    res = materialize([a["speed_predictor_candidate"], a["speed_predictor"]], partition_key="t4", resources=strict,
                      instance=dagster_instance, raise_on_error=False)
    assert meta(res, "speed_predictor_candidate")["version"] == 2
    assert not res.asset_materializations_for_node("speed_predictor")  # blocked by the failed check
    with cluster_store.session() as s:
        rows = dict(s.execute(select(m.PredictorModel.version, m.PredictorModel.promoted)
                              .where(m.PredictorModel.gpu_type == "t4")).all())
    assert rows == {1: True, 2: False}


def test_round_partition_plans_dispatches_and_observes(cluster_store: Store, tmp_path, dagster_instance) -> None:
    url = cluster_store.url
    a = prepare(url, tmp_path, dagster_instance)
    rounds = [a["placement_plan"], a["plan_dispatch"], a["cluster_interval"]]
    res = materialize(rounds, partition_key=round_key(dagster_instance), resources=resources(url), instance=dagster_instance)
    assert res.success
    plan = meta(res, "placement_plan")
    with cluster_store.session() as s:
        rnd = rounds_db.round_for_window(s, WINDOW)
        assert rnd is not None and rnd.status == "dispatched"
        placements = s.scalar(select(func.count()).select_from(m.Placement).where(m.Placement.round_id == rnd.id))
        running = s.scalar(select(func.count()).select_from(m.OfflineJob)
                           .where(m.OfflineJob.state == JobState.RUNNING.value))
    assert plan["round_id"] == rnd.id and plan["placements"] == placements > 0
    assert plan["objective"] == pytest.approx(rnd.objective, abs=1e-4)
    assert plan["gpus_considered"] == 16 and plan["jobs_pending"] == 6
    assert plan["jobs_unplaced"] == 6 - placements == sum(plan["unplaced_by_reason"].values())
    assert plan["start"] == placements and plan["keep"] == plan["migrate"] == plan["evict"] == 0
    assert plan["warmup_minutes_recorded"] == 60 and plan["replayed_from_snapshot"] is False
    assert plan["cluster"] == "SIMULATED"
    assert "matching_ms" in plan and plan["predictor_versions"] == {"a10": 1, "t4": 1}
    assert plan["certified_optimal"] is True and plan["optimality_gap_bound"] == pytest.approx(0.0, abs=1e-6)
    assert rnd.certified_optimal is True
    # the first round: no shared minute yet, so no service's allowance is corrected (what the UI shows)
    assert plan["allowance_correction"] == rnd.snapshot["allowance_correction"] == {}
    feasible = dagster_instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [_check_key("placement_plan", "plan_feasible")])
    assert list(feasible.values())[0].status.value == "SUCCEEDED"
    disp = meta(res, "plan_dispatch")
    assert disp["sent_now_ok"] == placements and disp["sent_now_failed"] == 0 and running == placements
    obs = meta(res, "cluster_interval")
    assert obs["booked_now"] is True and obs["executions"] == placements
    assert 0 < obs["oversold_gpu_realised_simulated"] <= 1
    assert str(obs["predicted_vs_realised"]).startswith("![predicted vs realised")


def test_dispatch_retries_a_failing_cluster_and_sends_each_action_once(cluster_store: Store, tmp_path,
                                                                       dagster_instance) -> None:
    url = cluster_store.url
    a = prepare(url, tmp_path, dagster_instance)
    RecordingBackend.fail_dispatches = 1
    res = materialize([a["placement_plan"], a["plan_dispatch"]], partition_key=round_key(dagster_instance), resources=resources(url),
                      instance=dagster_instance)
    assert res.success
    assert len(RecordingBackend.calls) == 2  # the failure, then the retry
    retried = [e for e in res.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(retried) == 1
    # Dispatching the same partition again sends nothing new: every action key is done.
    res2 = materialize([a["plan_dispatch"]], partition_key=round_key(dagster_instance), resources=resources(url), instance=dagster_instance)
    d = meta(res2, "plan_dispatch")
    assert d["sent_now_ok"] == 0 and d["done_total"] == d["actions"] > 0
    with cluster_store.session() as s:
        keys = s.scalars(select(m.DispatchLog.action_key)).all()
    assert len(keys) == len(set(keys)) == d["actions"]


def test_rematerializing_a_round_replays_its_snapshot(cluster_store: Store, tmp_path, dagster_instance) -> None:
    url = cluster_store.url
    a = prepare(url, tmp_path, dagster_instance)
    rounds = [a["placement_plan"], a["plan_dispatch"], a["cluster_interval"]]
    first = materialize(rounds, partition_key=round_key(dagster_instance), resources=resources(url), instance=dagster_instance)
    again = materialize(rounds, partition_key=round_key(dagster_instance), resources=resources(url), instance=dagster_instance)
    p1, p2 = meta(first, "placement_plan"), meta(again, "placement_plan")
    assert p2["replayed_from_snapshot"] is True
    for k in ("round_id", "placements", "objective", "start", "keep", "migrate", "evict"):
        assert p1[k] == p2[k], k
    assert meta(again, "cluster_interval")["booked_now"] is False  # the window was simulated once
    with cluster_store.session() as s:
        assert s.scalar(select(func.count()).select_from(m.SchedulingRound)) == 1
        assert s.scalar(select(func.count()).select_from(m.GpuMetricMinute)) == 16 * (60 + 15)


def test_replay_fails_when_the_stored_plan_was_altered(cluster_store: Store, tmp_path, dagster_instance) -> None:
    url = cluster_store.url
    a = prepare(url, tmp_path, dagster_instance)
    assert materialize([a["placement_plan"]], partition_key=round_key(dagster_instance), resources=resources(url),
                       instance=dagster_instance).success
    with cluster_store.session() as s:
        s.execute(update(m.Placement).values(sm_pct=m.Placement.sm_pct - 1))
    res = materialize([a["placement_plan"]], partition_key=round_key(dagster_instance), resources=resources(url), instance=dagster_instance,
                      raise_on_error=False)
    assert not res.success
    failure = next(e for e in res.all_events if e.event_type_value == "STEP_FAILURE")
    assert "different plan" in failure.event_specific_data.error.message + str(failure.event_specific_data.error)


def test_round_before_the_latest_cannot_be_planned(cluster_store: Store, tmp_path, dagster_instance) -> None:
    url = cluster_store.url
    a = prepare(url, tmp_path, dagster_instance)
    assert materialize([a["placement_plan"]], partition_key=round_key(dagster_instance), resources=resources(url),
                       instance=dagster_instance).success
    earlier = (WINDOW - dt.timedelta(minutes=15)).strftime("%Y-%m-%d-%H:%M")
    res = materialize([a["placement_plan"]], partition_key=round_key(dagster_instance, earlier), resources=resources(url),
                      instance=dagster_instance, raise_on_error=False)
    assert not res.success
    failure = next(e for e in res.all_events if e.event_type_value == "STEP_FAILURE")
    assert "not after the latest round" in str(failure.event_specific_data.error)


def test_round_without_a_predictor_fails_clearly(cluster_store: Store, tmp_path, dagster_instance) -> None:
    a = assets_of(cluster_store.url, tmp_path)
    res = materialize([a["placement_plan"]], partition_key=round_key(dagster_instance), resources=resources(cluster_store.url),
                      instance=dagster_instance, raise_on_error=False)
    assert not res.success
    failure = next(e for e in res.all_events if e.event_type_value == "STEP_FAILURE")
    assert "no promoted speed predictor" in str(failure.event_specific_data.error)
    with cluster_store.session() as s:
        assert s.scalar(select(func.count()).select_from(m.SchedulingRound)) == 0


def test_utilization_report_writes_csvs(cluster_store: Store, tmp_path, dagster_instance) -> None:
    url = cluster_store.url
    a = prepare(url, tmp_path, dagster_instance)
    assert materialize([a["placement_plan"], a["plan_dispatch"], a["cluster_interval"]], partition_key=round_key(dagster_instance),
                       resources=resources(url), instance=dagster_instance).success
    res = materialize([a["utilization_report"]], resources=resources(url, tmp_path=tmp_path),
                      instance=dagster_instance)
    md = meta(res, "utilization_report")
    assert md["rounds"] == 1 and md["hours"] >= 1
    for name in ("utilization_per_hour", "oversold_per_round", "evictions_per_day", "online_latency_per_day",
                 "restarts_per_day"):
        path = Path(md[f"csv_{name}"])
        assert path.parent == tmp_path / "report" and path.stat().st_size > 0
    assert 0 < md["oversold_gpu_mean_simulated"] <= 1
    assert str(md["utilization_per_hour"]).startswith("![utilization per hour](data:image/png;base64,")
    assert "slowdown_all_requests" in str(md["online_latency_per_day"])  # the simulated replicas' requests
    assert "restarts_per_job" in str(md["restarts_per_day"]) and "simulated" in str(md["restarts_per_day"])


def test_feature_store_resource_refuses_an_unmigrated_store(empty_db_url: str, tmp_path, dagster_instance) -> None:
    a = assets_of(empty_db_url, tmp_path)
    res = materialize([a["offline_job_profiles"]], resources=resources(empty_db_url), instance=dagster_instance,
                      raise_on_error=False)
    assert not res.success
    assert any("muxflow db upgrade" in str(getattr(e.event_specific_data, "error", "")) for e in res.all_events
               if e.is_failure)


def test_unknown_cluster_kind_fails_clearly() -> None:
    with pytest.raises(Failure, match="unknown cluster kind 'kubernetes'"):
        ClusterResource(kind="kubernetes").backend()
