"""The Dagster deployment, built in one function from explicit settings.

Jobs
  ``round_job``      placement_plan → plan_dispatch → cluster_interval, one round window per run (in process)
  ``train_job``      speed_predictor_candidate (+ blocking check) → speed_predictor, one GPU type per run
  ``refresh_job``    offline_job_profiles → online_service_features → colocation_samples
  ``profile_job``    offline_job_profiles only (launched by the submission sensor)
  ``requeue_job``    evicted jobs back to the queue (launched by the eviction sensor)
  ``fill_job``       (Slurm) waiting jobs onto GPUs freed since the latest round (launched by the fill sensor)
  ``report_job``     utilization_report
Automation
  ``round_sensor``           the round of each window of the round period (15 minutes by default), as it starts:
                             adds the window's partition and requests its round_job run (never two at once)
  ``new_submission_sensor``  new SUBMITTED jobs → profile_job (on Slurm: after importing new sbatch jobs)
  ``eviction_sensor``        new evictions → requeue_job
  ``job_state_sensor``       (Slurm) job states follow Slurm between rounds: started, finished, requeued
  ``fill_sensor``            (Slurm) a GPU freed or a job arrived while jobs wait → ``fill_job``: the waiting jobs
                             start on the free GPUs now, not at the next round (never beside a round run)
"""


import datetime as dt
import warnings
from collections.abc import Callable

from dagster import (
    AssetSelection,
    DagsterRunStatus,
    DefaultSensorStatus,
    Definitions,
    OpExecutionContext,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    define_asset_job,
    in_process_executor,
    job,
    op,
    sensor,
)

from assets.predictor import build_predictor_assets
from assets.profiling import build_profiling_assets
from assets.resources import ClusterResource, FeatureStoreResource, PredictorStoreResource
from assets.rounds import EXTERNAL_RETRY, build_round_assets, round_failure, round_partitions
from executors.round_service import RoundError, RoundService
from executors.store import inventory
from executors.store import rounds as rounds_db
from pipelines.settings import MuxflowSettings
from scheduler_core.domain import JobState
from scheduler_core.round.plan import RoundConfig

# Dagster's own @sensor passes its beta `owners` parameter internally and warns about it.
warnings.filterwarnings("ignore", message="Parameter `owners`", module="dagster")

ROUND_TAGS = {"muxflow/kind": "round"}  # dagster.yaml limits runs with this tag to one at a time
_IN_PROGRESS = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
                DagsterRunStatus.STARTED]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def pick_up_slurm_submissions(context: SensorEvaluationContext, store, cluster: ClusterResource) -> str:
    """Import new held ``sbatch -p offline`` jobs (docs/DESIGN.md §3 step 1) so the sensor's profiling run follows.

    Returns a note for the skip message. Slurm not answering does not fail the tick:
    jobs already in the store still get their profiling run, and the note says why
    nothing was imported (the next tick tries again; the pick-up is idempotent).
    """
    from executors.slurm.errors import SlurmError
    from executors.slurm.pickup import import_submissions

    client = cluster.backend().client_factory()
    try:
        rep = import_submissions(store, client)  # a job type is a free label on Slurm (docs/SLURM.md)
    except SlurmError as exc:
        context.log.warning(f"Slurm pick-up failed, retried next tick: {exc}")
        return f" (Slurm pick-up failed: {exc})"
    finally:
        getattr(client, "close", lambda: None)()
    for sid, reason in rep.rejected:
        context.log.warning(f"Slurm job {sid} {reason}")
    if rep.imported or rep.rejected:
        context.log.info(f"picked up {len(rep.imported)} Slurm submission(s) (store jobs {rep.imported}), "
                         f"rejected {len(rep.rejected)}")
    return f" (Slurm pick-up: {len(rep.imported)} imported, {len(rep.rejected)} rejected)"


def build_definitions(settings: MuxflowSettings, now: Callable[[], dt.datetime] = utcnow) -> Definitions:
    """The deployment. ``now`` is the round sensor's clock (the main job passes simulated time)."""
    profiling = build_profiling_assets(settings.seed, settings.samples_per_type)
    predictor_assets, _ = build_predictor_assets(settings.gpu_types)
    round_cfg = RoundConfig(migration_penalty=settings.migration_penalty, max_jobs_per_gpu=settings.max_jobs_per_gpu)
    clock = settings.round_clock
    round_assets = build_round_assets(clock, round_cfg, settings.report_dir)

    feature_store = FeatureStoreResource(db_url=settings.db_url)
    cluster_resource = settings.cluster_resource()
    resources = {
        "feature_store": feature_store,
        "cluster": cluster_resource,
        "predictors": PredictorStoreResource(feature_store=feature_store, epochs=settings.epochs,
                                             hidden=settings.predictor_hidden, seed=settings.seed,
                                             max_holdout_mae=settings.max_holdout_mae),
    }

    round_job = define_asset_job(
        "round_job", selection=AssetSelection.assets("placement_plan", "plan_dispatch", "cluster_interval"),
        description="One scheduling round: plan, dispatch, observe its window.",
        tags=ROUND_TAGS,
        # One process: the three phases run one after the other anyway, and a subprocess per step
        # would cost seconds of start-up in every round.
        executor_def=in_process_executor,
    )
    train_job = define_asset_job(
        "train_job", selection=AssetSelection.assets("speed_predictor_candidate", "speed_predictor"),
        description="Train a GPU type's speed predictor; promote it if its checks pass.",
    )
    refresh_job = define_asset_job(
        "refresh_job",
        selection=AssetSelection.assets("offline_job_profiles", "online_service_features", "colocation_samples"),
        description="Profile new jobs, summarize online features, top up co-location samples.",
    )
    profile_job = define_asset_job("profile_job", selection=AssetSelection.assets("offline_job_profiles"),
                                   description="Profile newly submitted offline jobs.")
    report_job = define_asset_job("report_job", selection=AssetSelection.assets("utilization_report"),
                                  description="Utilization and oversold-GPU reports.")

    @op(retry_policy=EXTERNAL_RETRY, description="Evicted jobs back to the queue (once the cluster has them held).")
    def requeue_evicted_jobs(context: OpExecutionContext, feature_store: FeatureStoreResource,
                             cluster: ClusterResource) -> dict:
        report = cluster.backend().sync_jobs(feature_store.store, utcnow())
        context.log.info("job states after evictions: %s (held %s)", report.transitions, report.held)
        return report.transitions

    @job(description="Return evicted offline jobs to the queue so the next round considers them.")
    def requeue_job():
        requeue_evicted_jobs()

    @op(retry_policy=EXTERNAL_RETRY,
        description="Start waiting jobs on GPUs that freed up since the latest round (nothing running moves).")
    def fill_between_rounds(context: OpExecutionContext, feature_store: FeatureStoreResource,
                            cluster: ClusterResource) -> dict:
        svc = RoundService(feature_store.store, cluster.backend(), round_cfg, clock)
        try:
            out = svc.fill(utcnow())
        except RoundError as exc:
            raise round_failure(exc) from exc
        f = out.fill
        starts = len(f.result.actions) if f.result is not None else 0
        context.log.info("fill %s: %d free GPU(s), %d waiting job(s), %d start(s) (sent ok %d, failed %d)",
                         f.round_id if f.round_id is not None else "not stored", f.free_gpus, f.waiting_jobs,
                         starts, out.sent_ok, out.sent_failed)
        return {"fill_id": f.round_id, "seq": f.seq, "free_gpus": f.free_gpus, "waiting_jobs": f.waiting_jobs,
                "starts": starts, "sent_ok": out.sent_ok, "sent_failed": out.sent_failed}

    @job(description="A fill: the waiting jobs matched to the GPUs that freed up since the latest round, "
                     "dispatched at once (a real cluster only).", tags=ROUND_TAGS)
    def fill_job():
        fill_between_rounds()

    interval = settings.sensor_interval_s
    # Off until an operator turns them on (UI, `dagster sensor start`), unless the deployment says so.
    status = DefaultSensorStatus.RUNNING if settings.sensors_running else DefaultSensorStatus.STOPPED

    @sensor(job=round_job, minimum_interval_seconds=max(1, min(interval, settings.round_period_s // 3)),
            default_status=status,
            description=f"A scheduling round at the start of every {settings.round_period_s}-second window.")
    def round_sensor(context: SensorEvaluationContext):
        window = clock.window_of(now())
        key = clock.key(window)
        if window < settings.rounds_start:
            return SkipReason(f"rounds start at {settings.rounds_start.isoformat()}")
        if settings.rounds_end is not None and window >= settings.rounds_end:
            return SkipReason(f"rounds ended at {settings.rounds_end.isoformat()}")
        if context.cursor == key:
            return SkipReason(f"the round of {key} is requested already")
        if context.instance.get_runs_count(RunsFilter(job_name="round_job", statuses=_IN_PROGRESS)):
            return SkipReason(f"the previous round is still running; {key} waits for it")
        return SensorResult(
            run_requests=[RunRequest(run_key=f"round-{key}", partition_key=key, tags=ROUND_TAGS)],
            dynamic_partitions_requests=[round_partitions.build_add_request([key])],
            cursor=key,
        )

    @sensor(job=profile_job, minimum_interval_seconds=interval, default_status=status,
            description="Profiles offline jobs as soon as they are submitted; on Slurm it first picks up "
                        "new `sbatch -p offline` submissions.")
    def new_submission_sensor(context: SensorEvaluationContext, feature_store: FeatureStoreResource,
                              cluster: ClusterResource):
        note = pick_up_slurm_submissions(context, feature_store.store, cluster) if cluster.kind == "slurm" else ""
        with feature_store.store.session() as s:
            newest = inventory.newest_job_id(s, JobState.SUBMITTED)
        if newest is None:
            return SkipReason("no submitted job waits for profiling" + note)
        if context.cursor and int(context.cursor) >= newest:
            return SkipReason(f"job {newest} and earlier already have a profiling run" + note)
        context.update_cursor(str(newest))
        return RunRequest(run_key=f"profile-upto-{newest}")

    @sensor(job=requeue_job, minimum_interval_seconds=interval, default_status=status,
            description="Returns evicted jobs to the queue after each eviction.")
    def eviction_sensor(context: SensorEvaluationContext, feature_store: FeatureStoreResource):
        with feature_store.store.session() as s:
            newest = inventory.newest_eviction_id(s)
            waiting = inventory.jobs_in_state(s, JobState.EVICTED)
        if newest is None or (context.cursor and int(context.cursor) >= newest):
            # (On Slurm an eviction whose requeue-hold was still under way is finished by job_state_sensor.)
            return SkipReason("no new eviction")
        context.update_cursor(str(newest))
        if not waiting:
            return SkipReason(f"evictions up to {newest} already requeued")
        return RunRequest(run_key=f"requeue-upto-{newest}")

    sensors = [round_sensor, new_submission_sensor, eviction_sensor]
    if cluster_resource.kind == "slurm":
        @sensor(minimum_interval_seconds=interval, default_status=status,
                description="Between rounds, job states follow Slurm: placed jobs that started, jobs that "
                            "finished or failed, jobs Slurm requeued (held again for the next round).")
        def job_state_sensor(context: SensorEvaluationContext, feature_store: FeatureStoreResource,
                             cluster: ClusterResource):
            from executors.slurm.errors import SlurmError

            try:
                report = cluster.backend().sync_jobs(feature_store.store, utcnow())
            except SlurmError as exc:
                return SkipReason(f"Slurm did not answer; next tick tries again: {exc}")
            if not report.changed:
                return SkipReason("job states match Slurm")
            return SkipReason(f"job states now follow Slurm: {report.transitions}"
                              + (f", held {report.held}" if report.held else "")
                              + (f", {report.executions} execution(s) booked" if report.executions else ""))
        sensors.append(job_state_sensor)

        @sensor(job=fill_job, minimum_interval_seconds=interval, default_status=status,
                description="Between rounds, a fill when a GPU frees up or a job starts waiting while jobs "
                            "wait: they start now instead of at the next round.")
        def fill_sensor(context: SensorEvaluationContext, feature_store: FeatureStoreResource):
            with feature_store.store.session() as s:
                rnd = rounds_db.latest_round(s)
                if rnd is None or rnd.status != "dispatched":
                    return SkipReason("no dispatched round to follow yet")
                seen_round, _, seen_tid = (context.cursor or "").partition(":")
                after = int(seen_tid) if seen_round == str(rnd.id) and seen_tid else None
                event = inventory.newest_fill_event(s, after, rnd.finished_utc)
                newest = inventory.newest_transition_id(s)
                waiting = inventory.jobs_in_state(s, JobState.PENDING)
            if event is None:
                context.update_cursor(f"{rnd.id}:{newest}")
                return SkipReason(f"no GPU freed and no job arrived since round {rnd.id} or its last fill")
            # Rounds and fills carry the same tag (one at a time, dagster.yaml).
            if context.instance.get_runs_count(RunsFilter(tags=ROUND_TAGS, statuses=_IN_PROGRESS)):
                return SkipReason("a round or a fill is running; the fill waits for it")  # cursor kept: not lost
            context.update_cursor(f"{rnd.id}:{newest}")
            if not waiting:
                return SkipReason("GPUs freed, but no job waits")
            return RunRequest(run_key=f"fill-r{rnd.id}-t{newest}", tags=ROUND_TAGS)
        sensors.append(fill_sensor)

    return Definitions(
        assets=[*profiling, *predictor_assets, *round_assets],
        jobs=[round_job, train_job, refresh_job, profile_job, report_job, requeue_job,
              *([fill_job] if cluster_resource.kind == "slurm" else [])],
        sensors=sensors,
        resources=resources,
    )
