"""The Dagster deployment: the definitions of ``assets/``, assembled with the resources one settings object
describes.

The assets (``assets.profiling``, ``assets.predictor``, ``assets.rounds``), the jobs (``assets.jobs``) and the
sensors (``assets.sensors``) are module-level definitions; this module only picks what a deployment has and binds
it to its settings:

- the resources: the feature store, the cluster, the predictor store, the scheduling settings and the round
  sensor's clock (``now``: the wall clock, or the main job's simulated time);
- the speed predictor's partitions: the deployment's GPU types;
- the sensors' cadence: ``sensor_interval_s`` (the round sensor at most a third of the round period), running from
  the start when ``sensors_running``;
- on Slurm, the fill job, and the job-state and fill sensors.
"""

import datetime as dt
from collections.abc import Callable

from dagster import Definitions, ResourceDefinition

from assets.jobs import JOBS, SLURM_JOBS, utcnow
from assets.predictor import build_predictor_assets
from assets.profiling import PROFILING_ASSETS
from assets.resources import FeatureStoreResource, PredictorStoreResource, SchedulingResource, fixed
from assets.rounds import ROUND_ASSETS
from assets.sensors import NOW, SENSORS, SLURM_SENSORS, round_sensor, with_cadence
from pipelines.settings import MuxflowSettings


def scheduling_resource(settings: MuxflowSettings) -> SchedulingResource:
    """The scheduling settings the assets, jobs and sensors read."""
    return SchedulingResource(
        round_period_s=settings.round_period_s, rounds_start=settings.rounds_start.isoformat(),
        rounds_end=settings.rounds_end.isoformat() if settings.rounds_end else None,
        migration_penalty=settings.migration_penalty, max_jobs_per_gpu=settings.max_jobs_per_gpu, seed=settings.seed,
        samples_per_type=settings.samples_per_type, report_dir=settings.report_dir)


def build_definitions(settings: MuxflowSettings, now: Callable[[], dt.datetime] = utcnow) -> Definitions:
    """The deployment. ``now`` is the round sensor's clock (the main job passes simulated time)."""
    predictor_assets, _ = build_predictor_assets(settings.gpu_types)
    feature_store = FeatureStoreResource(db_url=settings.db_url)
    cluster = settings.cluster_resource()
    slurm = cluster.kind == "slurm"
    # Every resource is fixed at what the settings say (assets.resources.fixed): no run config can point the
    # store, the cluster or a credential elsewhere.
    resources = {
        "feature_store": fixed(feature_store),
        "cluster": fixed(cluster),
        "predictors": fixed(PredictorStoreResource(feature_store=feature_store, epochs=settings.epochs,
                                                   hidden=settings.predictor_hidden, seed=settings.seed,
                                                   max_holdout_mae=settings.max_holdout_mae)),
        "scheduling": fixed(scheduling_resource(settings)),
        NOW: ResourceDefinition.hardcoded_resource(now, "the round sensor's clock (UTC)"),
    }
    interval = settings.sensor_interval_s
    sensors = [with_cadence(s, min(interval, settings.round_period_s // 3) if s is round_sensor else interval,
                            settings.sensors_running)
               for s in [*SENSORS, *(SLURM_SENSORS if slurm else [])]]
    return Definitions(
        assets=[*PROFILING_ASSETS, *predictor_assets, *ROUND_ASSETS],
        jobs=[*JOBS, *(SLURM_JOBS if slurm else [])],
        sensors=sensors,
        resources=resources,
    )
