"""The Dagster deployment, built in one function from explicit settings.

Jobs
  ``round_job``      placement_plan → plan_dispatch → cluster_interval, one 15-minute partition per run
  ``train_job``      speed_predictor_candidate (+ blocking check) → speed_predictor, one GPU type per run
  ``refresh_job``    offline_job_profiles → online_service_features → colocation_samples
  ``profile_job``    offline_job_profiles only (launched by the submission sensor)
  ``requeue_job``    evicted jobs back to the queue (launched by the eviction sensor)
  ``report_job``     utilization_report
Automation
  ``round_schedule`` cron ``*/15 * * * *`` (UTC): the round of the window that starts at the tick
  ``new_submission_sensor``  new SUBMITTED jobs → profile_job (on Slurm: after importing new sbatch jobs)
  ``eviction_sensor``        new evictions → requeue_job
"""


import datetime as dt
import warnings

from dagster import (
    AssetSelection,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Definitions,
    OpExecutionContext,
    RunRequest,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    SkipReason,
    define_asset_job,
    job,
    op,
    schedule,
    sensor,
)
from sqlalchemy import func, select

from assets.predictor import build_predictor_assets
from assets.profiling import build_profiling_assets
from assets.resources import ClusterResource, FeatureStoreResource, PredictorStoreResource
from assets.rounds import EXTERNAL_RETRY, ROUND_MINUTES, build_round_assets
from executors import round_runner
from executors.store import models as m
from pipelines.settings import MuxflowSettings
from scheduler_core.domain import JobState
from scheduler_core.round import RoundConfig

ROUND_CRON = f"*/{ROUND_MINUTES} * * * *"

# Dagster's own @sensor passes its beta `owners` parameter internally and warns about it.
warnings.filterwarnings("ignore", message="Parameter `owners`", module="dagster")


def window_start_for(t: dt.datetime) -> dt.datetime:
    """Start of the 15-minute window containing ``t`` (UTC)."""
    t = t.astimezone(dt.timezone.utc)
    return t.replace(minute=t.minute - t.minute % ROUND_MINUTES, second=0, microsecond=0)


def partition_key_for(t: dt.datetime) -> str:
    return window_start_for(t).strftime("%Y-%m-%d-%H:%M")


def pick_up_slurm_submissions(context: SensorEvaluationContext, store, cluster: ClusterResource) -> str:
    """Import new held ``sbatch -p offline`` jobs (DESIGN §3 step 1) so the sensor's profiling run follows.

    Returns a note for the skip message. Slurm not answering does not fail the tick:
    jobs already in the store still get their profiling run, and the note says why
    nothing was imported (the next tick tries again; the pick-up is idempotent).
    """
    from executors.simulated.calibration import default_catalog
    from executors.slurm.errors import SlurmError
    from executors.slurm.pickup import import_submissions

    client = cluster.backend().client_factory()
    try:
        rep = import_submissions(store, client, set(default_catalog().offline))
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


def build_definitions(settings: MuxflowSettings) -> Definitions:
    profiling = build_profiling_assets(settings.seed, settings.samples_per_type)
    predictor_assets, _ = build_predictor_assets(settings.gpu_types)
    round_cfg = RoundConfig(migration_penalty=settings.migration_penalty)
    round_assets, _ = build_round_assets(settings.rounds_start, settings.rounds_end, round_cfg,
                                      settings.report_dir)

    feature_store = FeatureStoreResource(db_url=settings.db_url)
    resources = {
        "feature_store": feature_store,
        "cluster": ClusterResource(kind=settings.cluster, seed=settings.seed, slurm_url=settings.slurm_url,
                                   warmup_minutes=settings.warmup_minutes),
        "predictors": PredictorStoreResource(feature_store=feature_store, epochs=settings.epochs,
                                             seed=settings.seed, max_holdout_mae=settings.max_holdout_mae),
    }

    round_job = define_asset_job(
        "round_job", selection=AssetSelection.assets("placement_plan", "plan_dispatch", "cluster_interval"),
        description="One scheduling round: plan, dispatch, observe its window.",
        tags={"muxflow/kind": "round"},
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

    @op(retry_policy=EXTERNAL_RETRY, description="EVICTED → PENDING for every evicted job.")
    def requeue_evicted_jobs(context: OpExecutionContext, feature_store: FeatureStoreResource) -> list[int]:
        ids = round_runner.requeue_evicted(feature_store.store, "requeued after eviction (eviction sensor)")
        context.log.info("requeued %d evicted job(s): %s", len(ids), ids)
        return ids

    @job(description="Return evicted offline jobs to the queue so the next round considers them.")
    def requeue_job():
        requeue_evicted_jobs()

    @schedule(cron_schedule=ROUND_CRON, job=round_job, execution_timezone="UTC",
              default_status=DefaultScheduleStatus.STOPPED,
              description="A scheduling round at the start of every 15-minute window.")
    def round_schedule(context: ScheduleEvaluationContext):
        key = partition_key_for(context.scheduled_execution_time)
        return RunRequest(run_key=f"round-{key}", partition_key=key)

    @sensor(job=profile_job, minimum_interval_seconds=30, default_status=DefaultSensorStatus.STOPPED,
            description="Profiles offline jobs as soon as they are submitted; on Slurm it first picks up "
                        "new `sbatch -p offline` submissions.")
    def new_submission_sensor(context: SensorEvaluationContext, feature_store: FeatureStoreResource,
                              cluster: ClusterResource):
        note = pick_up_slurm_submissions(context, feature_store.store, cluster) if cluster.kind == "slurm" else ""
        with feature_store.store.session() as s:
            newest = s.scalar(select(func.max(m.OfflineJob.id)).where(m.OfflineJob.state == JobState.SUBMITTED.value))
        if newest is None:
            return SkipReason("no submitted job waits for profiling" + note)
        if context.cursor and int(context.cursor) >= newest:
            return SkipReason(f"job {newest} and earlier already have a profiling run" + note)
        context.update_cursor(str(newest))
        return RunRequest(run_key=f"profile-upto-{newest}")

    @sensor(job=requeue_job, minimum_interval_seconds=30, default_status=DefaultSensorStatus.STOPPED,
            description="Returns evicted jobs to the queue after each eviction.")
    def eviction_sensor(context: SensorEvaluationContext, feature_store: FeatureStoreResource):
        with feature_store.store.session() as s:
            newest = s.scalar(select(func.max(m.Eviction.id)))
            waiting = s.scalar(select(func.count()).select_from(m.OfflineJob)
                               .where(m.OfflineJob.state == JobState.EVICTED.value))
        if newest is None or (context.cursor and int(context.cursor) >= newest):
            return SkipReason("no new eviction")
        context.update_cursor(str(newest))
        if not waiting:
            return SkipReason(f"evictions up to {newest} already requeued")
        return RunRequest(run_key=f"requeue-upto-{newest}")

    return Definitions(
        assets=[*profiling, *predictor_assets, *round_assets],
        jobs=[round_job, train_job, refresh_job, profile_job, report_job, requeue_job],
        schedules=[round_schedule],
        sensors=[new_submission_sensor, eviction_sensor],
        resources=resources,
    )
