"""The scheduling round, one partition per 15-minute window: plan → dispatch → what the cluster reported.

* ``placement_plan`` plans the window from the live state and stores the round
  (inputs snapshot, predictor versions, settings, plan). Materialized again for
  a window that already has a round, it re-plans from that snapshot and fails
  unless the plan comes out identical. Its blocking check ``plan_feasible``
  re-derives every constraint from the snapshot (``scheduler_core.plan_check``).
* ``plan_dispatch`` sends the stored plan to the cluster; every action has a
  key, so a retry or a re-run sends nothing twice.
* ``cluster_interval`` books what the cluster reported during the window
  (simulated: the window is simulated now; a real cluster's node agents write
  their own reports).
* ``utilization_report`` runs the SQL reports over everything booked.
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
    Failure,
    MaterializeResult,
    MetadataValue,
    RetryPolicy,
    TimeWindowPartitionsDefinition,
    asset,
)
from sqlalchemy import func, select

from assets.plots import predicted_vs_realised_plot
from assets.resources import ClusterResource, FeatureStoreResource
from executors import round_runner
from executors.store import models as m
from executors.store import repo
from scheduler_core.plan_check import plan_violations
from scheduler_core.round import RoundConfig, from_snapshot

GROUP = "rounds"
ROUND_MINUTES = 15
PARTITION_FMT = "%Y-%m-%d-%H:%M"
FEASIBLE_CHECK = "plan_feasible"
# Talking to the cluster (slurmrestd, or the store behind the simulated one) may fail transiently.
EXTERNAL_RETRY = RetryPolicy(max_retries=3, delay=2, backoff=Backoff.EXPONENTIAL)


def round_partitions(start: dt.datetime, end: dt.datetime | None = None) -> TimeWindowPartitionsDefinition:
    """One partition per 15-minute window from ``start`` (to ``end``, exclusive, when given).

    end_offset=1: the window that has just begun is a partition, so the schedule
    can plan it at its start (it never reaches past ``end``).
    """
    return TimeWindowPartitionsDefinition(
        cron_schedule=f"*/{ROUND_MINUTES} * * * *", start=start, end=end, fmt=PARTITION_FMT, timezone="UTC",
        end_offset=1,
    )


def window_of(context: AssetExecutionContext) -> dt.datetime:
    start = context.partition_time_window.start
    return dt.datetime.fromtimestamp(start.timestamp(), tz=dt.timezone.utc)


def _load_round(s, window: dt.datetime) -> m.SchedulingRound:
    rnd = round_runner.round_for_window(s, window)
    if rnd is None:
        raise Failure(description=f"no placement plan for the window {window:%Y-%m-%d %H:%M} UTC: "
                                  "materialize placement_plan for this partition first")
    return rnd


def build_round_assets(start: dt.datetime, end: dt.datetime | None, round_cfg: RoundConfig,
                       report_dir: str) -> tuple[list, TimeWindowPartitionsDefinition]:
    partitions = round_partitions(start, end)

    @asset(
        group_name=GROUP, partitions_def=partitions,
        deps=[AssetDep("speed_predictor", partition_mapping=AllPartitionMapping()),
              "offline_job_profiles", "online_service_features"],
        check_specs=[AssetCheckSpec(FEASIBLE_CHECK, asset="placement_plan", blocking=True,
                                    description="each job once, each GPU once, SM within bounds, memory quota within "
                                                "forecast free memory, new work on Healthy GPUs only")],
        description="The round's plan: forecast → dynamic SM → predicted throughput → maximum-weight matching.",
    )
    def placement_plan(context: AssetExecutionContext, feature_store: FeatureStoreResource,
                       cluster: ClusterResource) -> MaterializeResult:
        window = window_of(context)
        store = feature_store.store
        backend = cluster.backend()
        with store.session() as s:
            existing = round_runner.round_for_window(s, window)
        warm = 0
        if existing is not None:
            rep = round_runner.replay_round(store, window)
            if not rep.matches:
                raise Failure(
                    description=f"replaying round {rep.round_id} from its snapshot gave a different plan",
                    metadata={"differences": MetadataValue.md("\n".join(f"- {d}" for d in rep.mismatches[:50]))},
                )
            round_id, result = rep.round_id, rep.replayed
        else:
            warm = backend.ensure_history(store, window)
            try:
                round_id, result = round_runner.plan_and_record(store, backend.cluster(store), window, round_cfg)
            except (round_runner.RoundOrderError, round_runner.NoPredictorError) as exc:
                raise Failure(description=str(exc)) from exc
        with store.session() as s:
            rnd = s.get(m.SchedulingRound, round_id)
            gpus, jobs = from_snapshot(rnd.snapshot)
            stored = round_runner.stored_result(s, rnd)
            cfg = round_runner.round_config_from_json(rnd.snapshot.get("config", {}))
            meta = _round_metadata(rnd, result)
        violations = plan_violations(gpus, jobs, stored.placements, stored.actions, cfg.sm)
        if warm:
            meta["warmup_minutes_recorded"] = warm
        meta["replayed_from_snapshot"] = existing is not None
        return MaterializeResult(
            metadata=meta,
            check_results=[AssetCheckResult(
                check_name=FEASIBLE_CHECK, passed=not violations, severity=AssetCheckSeverity.ERROR,
                metadata={"violations": len(violations), "placements": len(stored.placements),
                          "details": MetadataValue.md("\n".join(f"- {v}" for v in violations[:50]) or "none")},
            )],
        )

    @asset(group_name=GROUP, partitions_def=partitions, deps=[placement_plan], retry_policy=EXTERNAL_RETRY,
           description="The plan diff sent to the cluster (start / keep / migrate / evict), each action once.")
    def plan_dispatch(context: AssetExecutionContext, feature_store: FeatureStoreResource,
                      cluster: ClusterResource) -> MaterializeResult:
        window = window_of(context)
        store = feature_store.store
        backend = cluster.backend()
        with store.session() as s:
            rnd = _load_round(s, window)
            later = s.scalar(select(func.count()).select_from(m.SchedulingRound)
                             .where(m.SchedulingRound.window_start_utc > window))
            if later and rnd.status == "planned":
                raise Failure(description=f"round {rnd.id} was never dispatched and later rounds exist: "
                                          "its plan is out of date and is not sent")
            result = round_runner.stored_result(s, rnd)
            round_id = rnd.id
        ok, failed = backend.dispatch(store, round_id, result, window)
        with store.session() as s:
            logged = dict(s.execute(select(m.DispatchLog.status, func.count()).where(m.DispatchLog.round_id == round_id)
                                    .group_by(m.DispatchLog.status)).all())
        return MaterializeResult(metadata={
            "round_id": round_id, "actions": len(result.actions), "sent_now_ok": ok, "sent_now_failed": failed,
            "done_total": logged.get("done", 0), "failed_total": logged.get("failed", 0),
            "cluster": "SIMULATED" if backend.simulated else cluster.kind,
        })

    @asset(group_name=GROUP, partitions_def=partitions, deps=[plan_dispatch], retry_policy=EXTERNAL_RETRY,
           description="What the cluster reported during the window: metrics, executions, evictions, completions.")
    def cluster_interval(context: AssetExecutionContext, feature_store: FeatureStoreResource,
                         cluster: ClusterResource) -> MaterializeResult:
        window = window_of(context)
        store = feature_store.store
        backend = cluster.backend()
        with store.session() as s:
            round_id = _load_round(s, window).id
        report = backend.observe(store, window, ROUND_MINUTES, round_id)
        end = window + dt.timedelta(minutes=ROUND_MINUTES)
        with store.session() as s:
            wall, solo, n_ex = s.execute(
                select(func.sum(m.JobExecution.wall_s), func.sum(m.JobExecution.solo_equiv_s), func.count())
                .where(m.JobExecution.round_id == round_id)).one()
            evictions = s.scalar(select(func.count()).select_from(m.Eviction)
                                 .where(m.Eviction.at_utc > window, m.Eviction.at_utc <= end))
            rows = repo.predicted_vs_realised(s, round_id)
        label = "simulated" if backend.simulated else "measured"
        meta = {
            "round_id": round_id, "source": label, "booked_now": report is not None,
            "executions": n_ex, f"oversold_gpu_realised_{label}": round(solo / wall, 4) if wall else None,
            "evictions": evictions,
            "completed_jobs": len(report.completed) if report is not None else None,
        }
        plot = predicted_vs_realised_plot(rows, backend.simulated)
        if plot is not None:
            meta["predicted_vs_realised"] = plot
        return MaterializeResult(metadata={k: v for k, v in meta.items() if v is not None})

    @asset(group_name=GROUP, deps=[AssetDep(cluster_interval, partition_mapping=AllPartitionMapping())],
           description="SQL reports on utilization and oversold GPU over every booked window (CSV + plot).")
    def utilization_report(feature_store: FeatureStoreResource, cluster: ClusterResource) -> MaterializeResult:
        from assets.reports import write_utilization_report

        return MaterializeResult(metadata=write_utilization_report(
            feature_store.store, Path(report_dir), cluster.backend().simulated))

    return [placement_plan, plan_dispatch, cluster_interval, utilization_report], partitions


def _round_metadata(rnd: m.SchedulingRound, result) -> dict:
    counts = rnd.action_counts or {}
    return {
        "round_id": rnd.id,
        "window_start_utc": rnd.window_start_utc.strftime("%Y-%m-%d %H:%M"),
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
        "cluster": "SIMULATED" if rnd.simulated else "real",
    }
