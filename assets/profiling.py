"""Assets upstream of the predictor: offline job profiles, online service features, co-location samples.

With the simulated cluster resource profiles and samples come from the simulated GPU model; with
the Slurm one they are measured on the profile partition (executors.scheduler.profiling, docs/PROFILING.md).
The metadata says which, per row.
"""


import datetime as dt

from dagster import MaterializeResult, MetadataValue, asset

from assets.resources import ClusterResource, FeatureStoreResource, SchedulingResource
from executors.scheduler.profiling.report import (
    profile_methods,
    recent_profiling_runs,
    recent_sampling_runs,
    runs_markdown,
)
from executors.store import repo
from scheduler_core.domain import JobState

GROUP = "profiling"


@asset(group_name=GROUP, description="Solo profiles of newly submitted offline jobs (SUBMITTED → PENDING).")
def offline_job_profiles(feature_store: FeatureStoreResource, cluster: ClusterResource,
                         scheduling: SchedulingResource) -> MaterializeResult:
    profiler = cluster.profiler()
    started = dt.datetime.now(dt.timezone.utc)
    done = profiler.profile_new_jobs(feature_store.store, scheduling.seed)
    with feature_store.store.session() as s:
        counts = repo.job_counts_by_state(s)
        runs = recent_profiling_runs(s, started)
        methods = profile_methods(s)
    return MaterializeResult(metadata={
        "profiled_now": done,
        "jobs_pending": counts.get(JobState.PENDING.value, 0),
        "jobs_profiling": counts.get(JobState.PROFILING.value, 0),
        "jobs_failed": counts.get(JobState.FAILED.value, 0),
        "profiler": "simulated GPU model" if profiler.simulated else "profile partition",
        "profiling_runs_ended_now": len(runs),
        "profiling_runs_failed_now": sum(1 for r in runs if r["state"] == "failed"),
        "profiles_by_method": MetadataValue.json(methods),
        "profiling_runs": MetadataValue.md(runs_markdown(runs, "Profiling runs that ended in this "
                                                               "materialization")),
    })


@asset(group_name=GROUP,
       description="Each online service's own load over the last hour (the predictor's online features).")
def online_service_features(feature_store: FeatureStoreResource, cluster: ClusterResource) -> MaterializeResult:
    with feature_store.store.session() as s:
        latest = repo.latest_metric_minute(s)
        rows = [] if latest is None else repo.online_service_summary(s, latest - dt.timedelta(hours=1))
    label = " (SIMULATED)" if cluster.backend().simulated else ""
    table = ("| service | family | GPUs | QPS | GPU util % | SM activity % | solo latency ms |\n"
             "|---|---|---|---|---|---|---|\n")
    table += "\n".join(
        f"| {r['service']} | {r['family']} | {r['gpus']} | {r['qps']:.1f} | {r['gpu_util_pct']:.1f} | "
        f"{r['sm_activity_pct']:.1f} | {r['solo_latency_ms']:.2f} |"
        for r in rows
    )
    return MaterializeResult(metadata={
        "services": len(rows),
        "window_end_utc": str(latest) if latest else "no metrics yet",
        "features": MetadataValue.md(f"Online services over the last hour{label}\n\n{table}" if rows
                                     else "No online metrics recorded yet."),
    })


@asset(group_name=GROUP, deps=[offline_job_profiles, online_service_features],
       description="Co-location samples per GPU type, topped up to the deployment's samples per type.")
def colocation_samples(feature_store: FeatureStoreResource, cluster: ClusterResource,
                       scheduling: SchedulingResource) -> MaterializeResult:
    profiler = cluster.profiler()
    started = dt.datetime.now(dt.timezone.utc)
    added = profiler.collect_samples(feature_store.store, scheduling.samples_per_type, scheduling.seed)
    with feature_store.store.session() as s:
        totals = {t: repo.sample_count(s, t) for t in sorted(repo.gpu_type_names(s))}
        by_method = repo.sample_counts_by_method(s)
        runs = recent_sampling_runs(s, started)
    meta = {f"samples_{t}": n for t, n in totals.items()}
    simulated = profiler.simulated
    meta.update({"added_now": sum(added.values()), "method": "simulated" if simulated else "measured"})
    meta["samples_by_type_and_method"] = MetadataValue.json(
        {f"{g}/{meth}" + (" (SIMULATED)" if meth == "simulated" else " (CPU: not training data)" if meth == "cpu"
                          else ""): n for (g, meth), n in sorted(by_method.items())})
    if not simulated:
        meta["sampling_runs_ended_now"] = len(runs)
        meta["sampling_gpu_minutes_now"] = round(sum(r["seconds"] or 0.0 for r in runs) / 60.0, 2)
        meta["sampling_runs"] = MetadataValue.md(runs_markdown(runs, "Sampling runs that ended in this "
                                                                     "materialization"))
    return MaterializeResult(metadata=meta)

PROFILING_ASSETS = [offline_job_profiles, online_service_features, colocation_samples]
