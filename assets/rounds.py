"""The scheduling round, one partition per round window: plan → dispatch → what the cluster reported.

Thin: each asset is one phase of :class:`executors.scheduler.round_service.RoundService`.

* ``placement_plan`` plans the window from the live state (after the job states
  follow the cluster) and stores the round (inputs snapshot, predictor versions,
  settings, plan). Materialized again for a window that already has a round, it
  re-plans from that snapshot and fails unless the plan comes out identical. Its
  blocking check ``plan_feasible`` re-derives every constraint from the snapshot
  (``scheduler_core.round.check``).
* ``plan_dispatch`` sends the stored plan to the cluster; every action has a
  key, so a retry or a re-run sends nothing twice.
* ``cluster_interval`` books what the cluster reported during the window
  (simulated: the window is simulated now; on Slurm the job states follow Slurm
  and the node agents write their own metrics).
* ``utilization_report`` runs the SQL reports over everything booked.

Partitions are dynamic: the round sensor adds one key per window as the window
starts (``scheduler_core.round.clock``: windows of the round period, aligned to
midnight UTC), so the UI lists exactly the rounds that ran, and periods shorter
than a minute (tests) work as well as the paper's 15 minutes.
"""


import datetime as dt
from pathlib import Path

from dagster import (
    AllPartitionMapping,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    Backoff,
    DynamicPartitionsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    RetryPolicy,
    asset,
)

from assets.plots import predicted_vs_realised_plot
from assets.reports import write_utilization_report
from assets.resources import ClusterResource, FeatureStoreResource, SchedulingResource
from executors.scheduler import round_runner
from executors.scheduler.round_service import RoundError, RoundService
from executors.store import models as m
from executors.store import rounds as rounds_db
from scheduler_core.round.check import plan_violations
from scheduler_core.round.plan import from_snapshot

GROUP = "rounds"
ROUND_PARTITIONS = "rounds"
FEASIBLE_CHECK = "plan_feasible"
# Talking to the cluster (slurmrestd, or the store behind the simulated one) may fail transiently.
EXTERNAL_RETRY = RetryPolicy(max_retries=3, delay=2, backoff=Backoff.EXPONENTIAL)

round_partitions = DynamicPartitionsDefinition(name=ROUND_PARTITIONS)


def round_failure(exc: RoundError) -> Failure:
    meta = {"details": MetadataValue.md("\n".join(f"- {d}" for d in exc.details[:50]))} if exc.details else None
    return Failure(description=str(exc), metadata=meta)


def service(feature_store: FeatureStoreResource, cluster: ClusterResource,
            scheduling: SchedulingResource) -> RoundService:
    try:
        return RoundService(feature_store.store, cluster.backend(), scheduling.round_config(), scheduling.clock())
    except RoundError as exc:
        raise round_failure(exc) from exc


def window_of(context: AssetExecutionContext, scheduling: SchedulingResource) -> dt.datetime:
    try:
        return scheduling.clock().parse_key(context.partition_key)
    except ValueError as exc:
        raise Failure(description=str(exc)) from exc


@asset(
    group_name=GROUP, partitions_def=round_partitions,
    deps=[AssetDep("speed_predictor", partition_mapping=AllPartitionMapping()),
          "offline_job_profiles", "online_service_features"],
    check_specs=[AssetCheckSpec(FEASIBLE_CHECK, asset="placement_plan", blocking=True,
                                description="each job once, each GPU once, SM within bounds, memory quota within "
                                            "forecast free memory, new work on Healthy GPUs only")],
    description="The round's plan: forecast → dynamic SM → predicted throughput → maximum-weight matching.",
)
def placement_plan(context: AssetExecutionContext, feature_store: FeatureStoreResource, cluster: ClusterResource,
                   scheduling: SchedulingResource) -> MaterializeResult:
    window = window_of(context, scheduling)
    svc = service(feature_store, cluster, scheduling)
    try:
        planned = svc.plan(window)
    except RoundError as exc:
        raise round_failure(exc) from exc
    with feature_store.store.session() as s:
        rnd = s.get(m.SchedulingRound, planned.round_id)
        gpus, jobs = from_snapshot(rnd.snapshot)
        stored = rounds_db.stored_result(s, rnd)
        cfg = round_runner.round_config_from_json(rnd.snapshot.get("config", {}))
        meta = _round_metadata(rnd, planned.result)
    violations = plan_violations(gpus, jobs, stored.placements, stored.actions, cfg.sm, cfg.max_jobs_per_gpu)
    if planned.warmup_minutes:
        meta["warmup_minutes_recorded"] = planned.warmup_minutes
    if planned.sync is not None and planned.sync.changed:
        meta["job_states_synced"] = MetadataValue.json(planned.sync.transitions)
    meta["replayed_from_snapshot"] = planned.replayed
    return MaterializeResult(
        metadata=meta,
        check_results=[AssetCheckResult(
            check_name=FEASIBLE_CHECK, passed=not violations, severity=AssetCheckSeverity.ERROR,
            metadata={"violations": len(violations), "placements": len(stored.placements),
                      "details": MetadataValue.md("\n".join(f"- {v}" for v in violations[:50]) or "none")},
        )],
    )


@asset(group_name=GROUP, partitions_def=round_partitions, deps=[placement_plan], retry_policy=EXTERNAL_RETRY,
       description="The plan diff sent to the cluster (start / keep / migrate / evict), each action once.")
def plan_dispatch(context: AssetExecutionContext, feature_store: FeatureStoreResource, cluster: ClusterResource,
                  scheduling: SchedulingResource) -> MaterializeResult:
    svc = service(feature_store, cluster, scheduling)
    try:
        out = svc.dispatch(window_of(context, scheduling))
    except RoundError as exc:
        raise round_failure(exc) from exc
    return MaterializeResult(metadata={
        "round_id": out.round_id, "actions": out.actions, "sent_now_ok": out.sent_ok,
        "sent_now_failed": out.sent_failed, "done_total": out.log.get("done", 0),
        "failed_total": out.log.get("failed", 0),
        "cluster": "SIMULATED" if svc.backend.simulated else cluster.kind,
    })


@asset(group_name=GROUP, partitions_def=round_partitions, deps=[plan_dispatch], retry_policy=EXTERNAL_RETRY,
       description="What the cluster reported during the window: metrics, executions, evictions, completions.")
def cluster_interval(context: AssetExecutionContext, feature_store: FeatureStoreResource, cluster: ClusterResource,
                     scheduling: SchedulingResource) -> MaterializeResult:
    svc = service(feature_store, cluster, scheduling)
    try:
        out = svc.book(window_of(context, scheduling))
    except RoundError as exc:
        raise round_failure(exc) from exc
    label = "simulated" if svc.backend.simulated else "measured"
    f = out.figures
    meta = {
        "round_id": out.round_id, "source": label, "booked_now": out.booked_now,
        "executions": f.executions, f"oversold_gpu_realised_{label}": round(f.oversold, 4) if f.oversold else None,
        "evictions": f.evictions, "completed_jobs": f.completed,
    }
    plot = predicted_vs_realised_plot(out.predicted_vs_realised, svc.backend.simulated)
    if plot is not None:
        meta["predicted_vs_realised"] = plot
    return MaterializeResult(metadata={k: v for k, v in meta.items() if v is not None})


@asset(group_name=GROUP, deps=[AssetDep(cluster_interval, partition_mapping=AllPartitionMapping())],
       description="SQL reports on utilization and oversold GPU over every booked window (CSV + plot).")
def utilization_report(feature_store: FeatureStoreResource, cluster: ClusterResource,
                       scheduling: SchedulingResource) -> MaterializeResult:
    return MaterializeResult(metadata=write_utilization_report(
        feature_store.store, Path(scheduling.report_dir), cluster.backend().simulated))


ROUND_ASSETS = [placement_plan, plan_dispatch, cluster_interval, utilization_report]


def _round_metadata(rnd: m.SchedulingRound, result) -> dict:
    counts = rnd.action_counts or {}
    # why the jobs this plan leaves out are not placed, by reason (scheduler_core.jobs.unplaced; `muxflow jobs list`)
    unplaced = ((rnd.stats or {}).get("unplaced") or {}).get("counts") or {}
    return {
        "jobs_unplaced": sum(unplaced.values()),
        "unplaced_by_reason": MetadataValue.json(unplaced),
        "round_id": rnd.id,
        "window_start_utc": rnd.window_start_utc.strftime("%Y-%m-%d %H:%M:%S"),
        "period_s": rnd.period_s,
        "gpus_considered": rnd.gpus_considered,
        "jobs_pending": rnd.jobs_pending,
        "feasible_pairs": rnd.feasible_pairs,
        "placements": rnd.placements,
        "objective": round(rnd.objective, 4),
        "predicted_oversold_gpu": round(rnd.predicted_oversold, 4) if rnd.predicted_oversold is not None else 0.0,
        "start": counts.get("start", 0), "keep": counts.get("keep", 0),
        "migrate": counts.get("migrate", 0), "evict": counts.get("evict", 0),
        "matching_ms": round(1000 * result.timings_s.get("matching", 0.0), 2),
        "certified_optimal": bool(rnd.certified_optimal),
        "optimality_gap_bound": rnd.optimality_gap_bound if rnd.optimality_gap_bound is not None else -1.0,
        "round_ms": round(1000 * result.timings_s.get("total", 0.0), 2),
        "predictor_versions": MetadataValue.json(rnd.snapshot.get("predictor_versions", {})),
        # per service: the factor its allowance was divided by, and its last shared p99 against the allowance (tail)
        "allowance_correction": MetadataValue.json(rnd.snapshot.get("allowance_correction", {})),
        "budget_pacing": MetadataValue.json(rnd.snapshot.get("budget_pacing", {})),
        "cluster": "SIMULATED" if rnd.simulated else "real",
    }
