"""The Dagster deployment: definitions load, settings, the round sensor and the other sensors, backfills, Postgres instance storage."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    DagsterInstance,
    DagsterRunStatus,
    Definitions,
    DynamicPartitionsDefinition,
    build_sensor_context,
    instance_for_test,
    partition_loading_context,
)
from sqlalchemy import func, select

from executors.cluster import EvictionRecord, IntervalReport
from executors.scheduler import round_runner
from executors.store import models as m
from executors.store import rounds as rounds_db
from executors.store.db import Store
from executors.store.jobs import transition
from pipelines.definitions import build_definitions
from pipelines.main_job import DagsterDriver
from pipelines.settings import MuxflowSettings, SettingsError, load_settings, write_settings
from scheduler_core.domain import JobState
from scheduler_core.round.clock import RoundClock

REPO = Path(__file__).resolve().parents[2]
START = dt.datetime(2026, 1, 5, 0, 0, tzinfo=dt.timezone.utc)
ASSETS = {"offline_job_profiles", "online_service_features", "colocation_samples", "speed_predictor_candidate",
          "speed_predictor", "placement_plan", "plan_dispatch", "cluster_interval", "utilization_report"}
CHECKS = {("speed_predictor_candidate", "holdout_error_within_bound"), ("placement_plan", "plan_feasible")}
JOBS = {"round_job", "train_job", "refresh_job", "profile_job", "report_job", "requeue_job"}


def settings(url: str, tmp_path: Path, **over) -> MuxflowSettings:
    base = dict(db_url=url, gpu_types=("a10", "t4"), rounds_start=START, samples_per_type=200, epochs=20,
                max_holdout_mae=0.5, report_dir=str(tmp_path / "report"))
    base.update(over)
    return MuxflowSettings(**base)


# -- loading -------------------------------------------------------------------------------


def test_definitions_resolve_every_asset_check_job_and_sensor(tmp_path: Path) -> None:
    defs = build_definitions(settings("sqlite:///" + str(tmp_path / "x.db"), tmp_path))
    Definitions.validate_loadable(defs)
    repo = defs.get_repository_def()
    assert {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()} == ASSETS
    checks = {(k.asset_key.to_user_string(), k.name) for k in repo.asset_graph.asset_check_keys}
    assert checks == CHECKS
    for name in JOBS:
        assert defs.resolve_job_def(name).name == name
    assert defs.resolve_sensor_def("round_sensor").job_name == "round_job"
    assert defs.resolve_sensor_def("new_submission_sensor").job_name == "profile_job"
    assert defs.resolve_sensor_def("eviction_sensor").job_name == "requeue_job"
    assert {s.name for s in defs.sensors} == {"round_sensor", "new_submission_sensor", "eviction_sensor"}
    assert set(defs.resolve_job_def("train_job").partitions_def.get_partition_keys()) == {"a10", "t4"}
    parts = defs.resolve_job_def("round_job").partitions_def
    assert isinstance(parts, DynamicPartitionsDefinition) and parts.name == "rounds"
    assert defs.resolve_job_def("round_job").tags["muxflow/kind"] == "round"
    # Retries on the steps that talk to the cluster.
    graph = defs.resolve_job_def("round_job").graph
    for node in ("plan_dispatch", "cluster_interval"):
        assert graph.node_named(node).definition.retry_policy.max_retries == 3
    assert not (tmp_path / "x.db").exists()  # building the definitions opens nothing


def test_code_location_loads_from_settings_file(tmp_path: Path) -> None:
    path = write_settings(settings(f"sqlite:///{tmp_path / 's.db'}", tmp_path, gpu_types=("h100",)), tmp_path)
    code = ("from pipelines.code_location import defs; "
            "print(sorted(defs.resolve_job_def('train_job').partitions_def.get_partition_keys()))")
    env = {"PATH": "/usr/bin:/bin", "DAGSTER_HOME": str(tmp_path), "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "['h100']"
    assert json.loads(path.read_text())["gpu_types"] == ["h100"]


def test_settings_from_environment_and_errors(tmp_path: Path) -> None:
    s = load_settings({"MUXFLOW_DATABASE_URL": "sqlite:///x.db", "MUXFLOW_GPU_TYPES": "t4, a100",
                       "MUXFLOW_ROUNDS_START": "2026-03-01T06:30", "MUXFLOW_MAX_HOLDOUT_MAE": "0.2",
                       "MUXFLOW_MAX_JOBS_PER_GPU": "2", "MUXFLOW_PREDICTOR_HIDDEN": "64"})
    assert s.gpu_types == ("t4", "a100") and s.max_holdout_mae == 0.2 and s.max_jobs_per_gpu == 2
    # the predictor resource trains the network the settings name: here the paper's width, at its default epochs
    cfg = build_definitions(s).resources["predictors"].fixed_value.config()
    assert (cfg.hidden, cfg.epochs) == (64, 400)
    assert s.rounds_start == dt.datetime(2026, 3, 1, 6, 30, tzinfo=dt.timezone.utc)
    assert MuxflowSettings.from_json(s.to_json()) == s
    bad = [
        ({"MUXFLOW_CLUSTER": "kubernetes"}, "cluster must be"),
        ({"MUXFLOW_CLUSTER": "slurm"}, "needs slurm_url"),
        ({"MUXFLOW_ROUNDS_START": "2026-03-01T06:20"}, "start of a round window"),
        ({"MUXFLOW_ROUND_PERIOD_S": "7"}, "must divide a day"),
        ({"MUXFLOW_ROUND_PERIOD_S": "30"}, "simulated cluster steps whole minutes"),
        ({"MUXFLOW_ROUNDS_START": "yesterday"}, "not an ISO time"),
        ({"MUXFLOW_SEED": "zero"}, "MUXFLOW_SEED"),
        ({"MUXFLOW_GPU_TYPES": "t4,t4"}, "distinct"),
        ({"MUXFLOW_MAX_HOLDOUT_MAE": "0"}, "max_holdout_mae"),
        ({"MUXFLOW_MAX_JOBS_PER_GPU": "0"}, "max_jobs_per_gpu"),
        ({"MUXFLOW_MAX_JOBS_PER_GPU": "two"}, "MUXFLOW_MAX_JOBS_PER_GPU"),
        ({"MUXFLOW_PREDICTOR_HIDDEN": "0"}, "predictor_hidden"),
    ]
    for env, msg in bad:
        with pytest.raises(SettingsError, match=msg):
            load_settings({"MUXFLOW_DATABASE_URL": "sqlite:///x.db", **env})
    slurm = load_settings({"MUXFLOW_DATABASE_URL": "sqlite:///x.db", "MUXFLOW_CLUSTER": "slurm",
                           "MUXFLOW_SLURM_URL": "unix:/run/slurmrestd.sock", "MUXFLOW_ROUND_PERIOD_S": "20",
                           "MUXFLOW_XCUDA_GAINS": "0.5,12.5,0.02", "MUXFLOW_SLURM_API_VERSION": "v0.0.40",
                           "MUXFLOW_SLURM_NAME_GPUS": "yes"})
    assert slurm.round_period_s == 20 and slurm.xcuda_gains == (0.5, 12.5, 0.02)
    assert MuxflowSettings.from_json(slurm.to_json()) == slurm
    res = slurm.cluster_resource()
    assert (res.kind, res.xcuda_kp, res.xcuda_ki, res.xcuda_kd, res.slurm_api_version) == \
        ("slurm", 0.5, 12.5, 0.02, "v0.0.40")
    assert res.backend().gains.ki == 12.5 and res.backend().name_gpus is True
    with pytest.raises(SettingsError, match="MUXFLOW_SLURM_NAME_GPUS"):
        load_settings({"MUXFLOW_DATABASE_URL": "sqlite:///x.db", "MUXFLOW_SLURM_NAME_GPUS": "maybe"})
    with pytest.raises(SettingsError, match="after rounds_start"):
        load_settings({"MUXFLOW_DATABASE_URL": "sqlite:///x.db", "MUXFLOW_ROUNDS_END": "2026-01-04T03:00"})
    (tmp_path / "bad.json").write_text('{"db_url": "sqlite:///x.db", "colour": "red"}')
    with pytest.raises(SettingsError, match="unknown settings: colour"):
        load_settings({"MUXFLOW_SETTINGS": str(tmp_path / "bad.json")})


def test_the_dev_clusters_slurm_conf_goes_with_its_rest_socket_over_the_environments() -> None:
    # $SLURM_CONF of another cluster in the shell: scontrol must not talk to it while REST talks to the dev cluster
    s = load_settings({"MUXFLOW_DATABASE_URL": "sqlite:///x.db", "SLURM_CONF": "/etc/other/slurm.conf"})
    dev = s.slurm_config(default_url="unix:/tmp/dev/rest.sock", default_conf="/tmp/dev/slurm.conf")
    assert (dev.url, dev.conf_path) == ("unix:/tmp/dev/rest.sock", "/tmp/dev/slurm.conf")
    assert s.slurm_config().conf_path == "/etc/other/slurm.conf"
    named = load_settings({"MUXFLOW_DATABASE_URL": "sqlite:///x.db", "SLURM_CONF": "/etc/site/slurm.conf",
                           "MUXFLOW_SLURM_URL": "unix:/run/slurmrestd.sock"})
    site = named.slurm_config(default_url="unix:/tmp/dev/rest.sock", default_conf="/tmp/dev/slurm.conf")
    assert (site.url, site.conf_path) == ("unix:/run/slurmrestd.sock", "/etc/site/slurm.conf")


# -- schedule and sensors -------------------------------------------------------------------


def _tick(defs, name: str, inst, cursor: str | None):
    # As the daemon evaluates sensors: dynamic partitions are read from the instance, and only the resources the
    # sensor needs are built.
    sensor = defs.resolve_sensor_def(name)
    resources = {k: v for k, v in defs.resources.items() if k in sensor.required_resource_keys}
    with partition_loading_context(dynamic_partitions_store=inst), \
            build_sensor_context(instance=inst, instance_ref=inst.get_ref() if inst.is_persistent else None,
                                 cursor=cursor, resources=resources, definitions=defs) as ctx:
        return sensor.evaluate_tick(ctx)


def test_round_sensor_requests_each_window_once_as_it_starts(tmp_path: Path) -> None:
    clock = [dt.datetime(2026, 2, 3, 10, 15, 3, tzinfo=dt.timezone.utc)]
    end = dt.datetime(2026, 2, 3, 11, 0, tzinfo=dt.timezone.utc)
    defs = build_definitions(settings(f"sqlite:///{tmp_path / 'x.db'}", tmp_path, rounds_end=end),
                             now=lambda: clock[0])
    with instance_for_test() as inst:  # an instance with a ref, as the daemon's
        first = _tick(defs, "round_sensor", inst, None)
        assert [(r.partition_key, r.run_key) for r in first.run_requests] == [("2026-02-03-10:15", "round-2026-02-03-10:15")]
        assert [list(r.partition_keys) for r in first.dynamic_partitions_requests] == [["2026-02-03-10:15"]]
        assert first.run_requests[0].tags["muxflow/kind"] == "round"
        clock[0] = dt.datetime(2026, 2, 3, 10, 29, 59, tzinfo=dt.timezone.utc)  # same window: nothing more
        again = _tick(defs, "round_sensor", inst, first.cursor)
        assert not again.run_requests and "requested already" in again.skip_message
        clock[0] = dt.datetime(2026, 2, 3, 10, 30, 0, 1, tzinfo=dt.timezone.utc)
        nxt = _tick(defs, "round_sensor", inst, again.cursor or first.cursor)
        assert [r.partition_key for r in nxt.run_requests] == ["2026-02-03-10:30"]
        clock[0] = end
        assert "rounds ended" in _tick(defs, "round_sensor", inst, nxt.cursor).skip_message
        clock[0] = START - dt.timedelta(seconds=1)
        assert "rounds start" in _tick(defs, "round_sensor", inst, nxt.cursor).skip_message


def test_round_sensor_never_starts_a_round_while_the_previous_one_runs(tmp_path: Path) -> None:
    clock = [dt.datetime(2026, 2, 3, 10, 0, 21, tzinfo=dt.timezone.utc)]
    s = settings(f"sqlite:///{tmp_path / 'x.db'}", tmp_path, cluster="slurm", slurm_url="unix:/nonexistent.sock",
                 round_period_s=20)
    defs = build_definitions(s, now=lambda: clock[0])
    assert defs.resolve_sensor_def("round_sensor").minimum_interval_seconds == 6
    with instance_for_test() as inst:  # an instance with a ref, as the daemon's
        first = _tick(defs, "round_sensor", inst, None)
        assert [r.partition_key for r in first.run_requests] == ["2026-02-03-10:00:20"]
        assert RoundClock(20).parse_key("2026-02-03-10:00:20") == dt.datetime(2026, 2, 3, 10, 0, 20,
                                                                              tzinfo=dt.timezone.utc)
        # The run it asked for is still going when the next window starts.
        inst.create_run_for_job(defs.resolve_job_def("round_job"), run_id="a" * 32,
                                status=DagsterRunStatus.STARTED, tags={"muxflow/kind": "round"})
        clock[0] = dt.datetime(2026, 2, 3, 10, 0, 41, tzinfo=dt.timezone.utc)
        busy = _tick(defs, "round_sensor", inst, first.cursor)
        assert not busy.run_requests and "still running" in busy.skip_message
        inst.report_run_failed(inst.get_run_by_id("a" * 32))
        later = _tick(defs, "round_sensor", inst, busy.cursor or first.cursor)
        assert [r.partition_key for r in later.run_requests] == ["2026-02-03-10:00:40"]


def test_submission_sensor_requests_one_profiling_run_per_batch(cluster_store: Store, submit_more,
                                                               tmp_path: Path) -> None:
    defs = build_definitions(settings(cluster_store.url, tmp_path))
    with DagsterInstance.ephemeral() as inst:
        first = _tick(defs, "new_submission_sensor", inst, None)
        assert [r.run_key for r in first.run_requests] == ["profile-upto-6"]
        again = _tick(defs, "new_submission_sensor", inst, first.cursor)
        assert not again.run_requests and "already have a profiling run" in again.skip_message
        submit_more(cluster_store, 2)
        third = _tick(defs, "new_submission_sensor", inst, again.cursor or first.cursor)
        assert [r.run_key for r in third.run_requests] == ["profile-upto-8"]
        # The run it requests profiles them all.
        driver = DagsterDriver(defs, inst)
        driver.execute("profile_job")
        with cluster_store.session() as s:
            assert s.scalar(select(func.count()).select_from(m.OfflineJob)
                            .where(m.OfflineJob.state == JobState.PENDING.value)) == 8
        empty = _tick(defs, "new_submission_sensor", inst, third.cursor)
        assert not empty.run_requests and "no submitted job" in empty.skip_message


def test_eviction_sensor_requeues_evicted_jobs(cluster_store: Store, tmp_path: Path) -> None:
    defs = build_definitions(settings(cluster_store.url, tmp_path))
    with cluster_store.session() as s:
        gpu = s.scalars(select(m.Gpu).order_by(m.Gpu.id)).first()
        job_ids = [j.id for j in s.scalars(select(m.OfflineJob).order_by(m.OfflineJob.id))][:2]
        for jid in job_ids:  # as if placed and running
            for st in (JobState.PROFILING, JobState.PENDING, JobState.RUNNING):
                transition(s, jid, st, "test setup")
    at = START + dt.timedelta(hours=2)
    report = IntervalReport(evictions=[EvictionRecord(jid, gpu.id, at, "SysMonitor Overlimit (test)", "Overlimit", 0.0)
                                       for jid in job_ids])
    round_runner.book_interval(cluster_store, report, None, "simulated", at)
    with DagsterInstance.ephemeral() as inst:
        tick = _tick(defs, "eviction_sensor", inst, None)
        assert len(tick.run_requests) == 1
        DagsterDriver(defs, inst).execute("requeue_job")
        with cluster_store.session() as s:
            states = {j.id: j.state for j in s.scalars(select(m.OfflineJob).where(m.OfflineJob.id.in_(job_ids)))}
            reasons = s.scalars(select(m.JobTransition.reason).where(m.JobTransition.to_state == "PENDING",
                                                                     m.JobTransition.from_state == "EVICTED")).all()
        assert set(states.values()) == {JobState.PENDING.value}
        assert reasons == ["requeued after eviction"] * 2  # by the backend's job-state sync
        again = _tick(defs, "eviction_sensor", inst, tick.cursor)
        assert not again.run_requests


def test_fill_sensor_asks_for_a_fill_when_a_gpu_frees_or_a_job_arrives_while_jobs_wait(cluster_store: Store,
                                                                                        tmp_path: Path) -> None:
    s_ = settings(cluster_store.url, tmp_path, cluster="slurm", slurm_url="unix:/nonexistent.sock")
    defs = build_definitions(s_)
    assert defs.resolve_sensor_def("fill_sensor").job_name == "fill_job"
    assert defs.resolve_job_def("fill_job").tags["muxflow/kind"] == "round"  # never beside a round
    assert "fill_sensor" not in {x.name for x in build_definitions(settings(cluster_store.url, tmp_path)).sensors}
    t0 = START + dt.timedelta(hours=3)
    with cluster_store.session() as s:
        ids = [j.id for j in s.scalars(select(m.OfflineJob).order_by(m.OfflineJob.id))]
        for jid in ids[:2]:  # the round placed these two; they run
            for k, st in enumerate((JobState.PROFILING, JobState.PENDING, JobState.PLACED, JobState.RUNNING)):
                transition(s, jid, st, "setup", at_utc=t0 - dt.timedelta(minutes=10 - k))
        rnd = m.SchedulingRound(window_start_utc=t0 - dt.timedelta(minutes=5), status="planned")
        s.add(rnd)
        s.flush()
        rid = rnd.id

    def move(jid: int, *states: JobState, minutes: float = 1) -> None:
        with cluster_store.session() as s:
            for st in states:
                transition(s, jid, st, "test", at_utc=t0 + dt.timedelta(minutes=minutes))

    with instance_for_test() as inst:
        assert "no dispatched round" in _tick(defs, "fill_sensor", inst, None).skip_message
        with cluster_store.session() as s:
            s.get(m.SchedulingRound, rid).status, s.get(m.SchedulingRound, rid).finished_utc = "dispatched", t0
        move(ids[3], JobState.PROFILING, JobState.PENDING, minutes=0)  # moved by the round's own dispatch
        quiet = _tick(defs, "fill_sensor", inst, None)
        assert not quiet.run_requests and "no GPU freed and no job arrived" in quiet.skip_message
        move(ids[3], JobState.PLACED)
        move(ids[0], JobState.DONE)  # a GPU frees up, but nothing waits
        idle = _tick(defs, "fill_sensor", inst, quiet.cursor)
        assert not idle.run_requests and "no job waits" in idle.skip_message
        move(ids[2], JobState.PROFILING, JobState.PENDING, minutes=2)  # a job arrives
        tick = _tick(defs, "fill_sensor", inst, idle.cursor)
        (req,) = tick.run_requests
        assert req.tags["muxflow/kind"] == "round" and req.run_key.startswith(f"fill-r{rid}-t")
        assert not _tick(defs, "fill_sensor", inst, tick.cursor).run_requests  # asked once
        # A round (or fill) is running when the next job finishes: the fill waits for it, and is not lost.
        inst.create_run_for_job(defs.resolve_job_def("round_job"), run_id="b" * 32,
                                status=DagsterRunStatus.STARTED, tags={"muxflow/kind": "round"})
        move(ids[1], JobState.DONE, minutes=3)
        busy = _tick(defs, "fill_sensor", inst, tick.cursor)
        assert not busy.run_requests and "is running" in busy.skip_message
        inst.report_run_failed(inst.get_run_by_id("b" * 32))
        after = _tick(defs, "fill_sensor", inst, busy.cursor or tick.cursor)
        assert len(after.run_requests) == 1 and after.run_requests[0].run_key != req.run_key


# -- a backfill of past round partitions ----------------------------------------------------------


def _stored_plan(store: Store, window: dt.datetime) -> list[tuple]:
    with store.session() as s:
        rnd = rounds_db.round_for_window(s, window)
        return [(p.job_id, p.gpu_id, p.sm_pct, p.mem_quota_bytes, p.predicted_norm_tput, p.action)
                for p in s.scalars(select(m.Placement).where(m.Placement.round_id == rnd.id).order_by(m.Placement.job_id))]


def test_backfill_of_two_past_rounds_reproduces_their_plans(cluster_store: Store, submit_more,
                                                           tmp_path: Path) -> None:
    defs = build_definitions(settings(cluster_store.url, tmp_path))
    windows = [START + dt.timedelta(hours=1, minutes=15 * k) for k in range(3)]
    with DagsterInstance.ephemeral() as inst:
        driver = DagsterDriver(defs, inst)
        driver.execute("refresh_job")
        for t in ("a10", "t4"):
            driver.execute("train_job", partition_key=t)
        for k, w in enumerate(windows):
            if k == 1:
                submit_more(cluster_store, 4)
                driver.execute("profile_job")
            driver.execute("round_job", partition_key=RoundClock().key(w))
        before = {w: _stored_plan(cluster_store, w) for w in windows[:2]}
        assert all(before.values()) and before[windows[0]] != before[windows[1]]
        # A backfill of the first two windows: one run per partition, tagged as a backfill.
        for w in windows[:2]:
            res = driver.execute("round_job", partition_key=RoundClock().key(w), tags={"dagster/backfill": "test"})
            mat = res.asset_materializations_for_node("placement_plan")[-1]
            assert mat.metadata["replayed_from_snapshot"].value is True
        after = {w: _stored_plan(cluster_store, w) for w in windows[:2]}
        assert after == before
        with cluster_store.session() as s:
            assert s.scalar(select(func.count()).select_from(m.SchedulingRound)) == 3
        for w in windows[:2]:
            assert round_runner.replay_round(cluster_store, w).matches
        checks = inst.event_log_storage.get_latest_asset_check_execution_by_key(
            [AssetCheckKey(AssetKey("placement_plan"), "plan_feasible")])
        assert list(checks.values())[0].status.value == "SUCCEEDED"
        runs = inst.get_runs()
        assert sum(1 for r in runs if r.tags.get("dagster/backfill") == "test") == 2


# -- Postgres instance storage ------------------------------------------------------------------


@pytest.mark.postgres
def test_postgres_instance_storage_records_and_reads_back_a_run(make_postgres_database, tmp_path: Path,
                                                               cluster_store: Store) -> None:
    # With SQLAlchemy 2.1 a bare postgresql:// URL means psycopg 3; name the driver that is installed.
    url = make_postgres_database()
    assert url.startswith("postgresql+psycopg2://")
    (tmp_path / "dagster.yaml").write_text(
        "storage:\n  postgres:\n    postgres_url: " + json.dumps(url) + "\ntelemetry:\n  enabled: false\n")
    defs = build_definitions(settings(cluster_store.url, tmp_path))
    with DagsterInstance.from_config(str(tmp_path)) as inst:
        assert type(inst.run_storage).__name__ == "PostgresRunStorage"
        res = DagsterDriver(defs, inst).execute("profile_job")
        run_id = res.run_id
    with DagsterInstance.from_config(str(tmp_path)) as inst:  # a new process would see the same
        run = inst.get_run_by_id(run_id)
        assert run is not None and run.is_success and run.job_name == "profile_job"
        mat = inst.get_latest_materialization_event(AssetKey("offline_job_profiles"))
        assert mat.asset_materialization.metadata["profiled_now"].value == 6


def test_the_configuration_table_documents_every_setting_and_variable() -> None:
    """docs/CONFIGURATION.md is the one table of the deployment's settings: every field and every variable."""
    import dataclasses
    import re

    from pipelines.settings import ENV_VARS, MuxflowSettings

    doc = (Path(__file__).resolve().parents[2] / "docs" / "CONFIGURATION.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| ([^|]*) \|", doc, re.M)}
    fields = {f.name for f in dataclasses.fields(MuxflowSettings)}
    assert set(rows) == fields, f"undocumented {sorted(fields - set(rows))}, stale {sorted(set(rows) - fields)}"
    for var, (name, _parse) in ENV_VARS.items():
        assert f"`{var}`" in rows[name], f"{var} is not in the row of {name}"
