"""Assets upstream of the predictor: offline job profiles, online service features, co-location samples."""


import datetime as dt

from dagster import MaterializeResult, MetadataValue, asset

from assets.resources import ClusterResource, FeatureStoreResource
from executors.store import repo
from scheduler_core.domain import JobState

GROUP = "profiling"


def build_profiling_assets(seed: int, samples_per_type: int) -> list:
    @asset(group_name=GROUP, description="Solo profiles of newly submitted offline jobs (SUBMITTED → PENDING).")
    def offline_job_profiles(feature_store: FeatureStoreResource, cluster: ClusterResource) -> MaterializeResult:
        backend = cluster.backend()
        done = backend.profile_new_jobs(feature_store.store, seed)
        with feature_store.store.session() as s:
            counts = repo.job_counts_by_state(s)
        return MaterializeResult(metadata={
            "profiled_now": done,
            "jobs_pending": counts.get(JobState.PENDING.value, 0),
            "jobs_failed": counts.get(JobState.FAILED.value, 0),
            "profiler": "simulated GPU model" if backend.simulated else "profile partition",
        })

    @asset(group_name=GROUP, description="Each online service's own load over the last hour (the predictor's online features).")
    def online_service_features(feature_store: FeatureStoreResource, cluster: ClusterResource) -> MaterializeResult:
        with feature_store.store.session() as s:
            latest = s.scalar(repo.latest_metric_minute_query())
            rows = [] if latest is None else repo.online_service_summary(s, _utc(latest) - dt.timedelta(hours=1))
        label = " (SIMULATED)" if cluster.backend().simulated else ""
        table = "| service | family | GPUs | QPS | GPU util % | SM activity % | solo latency ms |\n|---|---|---|---|---|---|---|\n"
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
           description=f"Co-location samples per GPU type, topped up to {samples_per_type} each.")
    def colocation_samples(feature_store: FeatureStoreResource, cluster: ClusterResource) -> MaterializeResult:
        backend = cluster.backend()
        added = backend.collect_samples(feature_store.store, samples_per_type, seed)
        with feature_store.store.session() as s:
            totals = {t: repo.sample_count(s, t) for t in sorted(repo.gpu_type_names(s))}
        meta = {f"samples_{t}": n for t, n in totals.items()}
        meta.update({"added_now": sum(added.values()), "method": "simulated" if backend.simulated else "measured"})
        return MaterializeResult(metadata=meta)

    return [offline_job_profiles, online_service_features, colocation_samples]


def _utc(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)
