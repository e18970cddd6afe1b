"""The deployment's jobs: asset selections, and two op jobs that act on the cluster between rounds.

  ``round_job``    placement_plan → plan_dispatch → cluster_interval, one round window per run (in process)
  ``train_job``    speed_predictor_candidate (+ blocking check) → speed_predictor, one GPU type per run
  ``refresh_job``  offline_job_profiles → online_service_features → colocation_samples
  ``profile_job``  offline_job_profiles only (launched by the submission sensor)
  ``report_job``   utilization_report
  ``requeue_job``  evicted jobs back to the queue (launched by the eviction sensor)
  ``fill_job``     (Slurm) waiting jobs onto GPUs freed since the latest round (launched by the fill sensor)
"""

import datetime as dt

from dagster import AssetSelection, OpExecutionContext, define_asset_job, in_process_executor, job, op

from assets.resources import ClusterResource, FeatureStoreResource, SchedulingResource
from assets.rounds import EXTERNAL_RETRY, round_failure
from executors.scheduler.round_service import RoundError, RoundService

ROUND_TAGS = {"muxflow/kind": "round"}  # dagster.yaml limits runs with this tag to one at a time


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


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
def fill_between_rounds(context: OpExecutionContext, feature_store: FeatureStoreResource, cluster: ClusterResource,
                        scheduling: SchedulingResource) -> dict:
    svc = RoundService(feature_store.store, cluster.backend(), scheduling.round_config(), scheduling.clock())
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


JOBS = [round_job, train_job, refresh_job, profile_job, report_job, requeue_job]
SLURM_JOBS = [fill_job]
