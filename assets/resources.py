"""Dagster resources: the feature store, the cluster, the predictor store and the scheduling settings.

Thin handles over the adapters in ``executors``. Which implementation a run
gets is configuration (``pipelines.settings``), resolved when the run starts;
importing this module opens nothing.

None of them is launch-time configuration: the deployment binds each with :func:`fixed`, so their values are the
settings the code location loaded (its settings file and environment, which only the service account writes) and
a run whose config names any field of theirs is refused by Dagster before it starts. Dagster's open-source UI has
no login, and a resource field is a default that run config may override: a store URL, a Slurm URL, a token or key
file, the cluster kind or a report directory set at launch would send MuxFlow's credentials, or write its files,
where the launcher chose (docs/SECURITY.md, "Dagster").
"""


import datetime as dt

from dagster import ConfigurableResource, Failure, InitResourceContext, ResourceDefinition, ResourceDependency, resource
from pydantic import PrivateAttr

from executors.cluster import ClusterBackend, Profiler
from executors.scheduler import predictors
from executors.scheduler.profiling.backend import SlurmProfiler
from executors.scheduler.slurm.config import SlurmConfig, SlurmConfigError
from executors.store import repo
from executors.store.db import Store
from executors.store.migrate import current_revision, head_revision
from scheduler_core.prediction.predictor import PredictorConfig
from scheduler_core.round.clock import DEFAULT_PERIOD_S, RoundClock
from scheduler_core.round.plan import RoundConfig


class FeatureStoreResource(ConfigurableResource):
    """The feature store (SQLAlchemy URL: SQLite file or Postgres)."""

    db_url: str
    _store: Store | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        rev, head = current_revision(self.db_url), head_revision()
        if rev != head:
            raise Failure(
                description=f"feature store at revision {rev or 'none'}, code expects {head}: run `muxflow db upgrade`",
            )
        self._store = Store(self.db_url)

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._store is not None:
            self._store.dispose()

    @property
    def store(self) -> Store:
        if self._store is None:  # used outside a run (tests): open lazily
            self._store = Store(self.db_url)
        return self._store


class ClusterResource(ConfigurableResource):
    """Where plans go: ``simulated`` (modelled GPUs, state kept in the store) or ``slurm`` (slurmrestd)."""

    kind: str = "simulated"
    seed: int = 0
    slurm_url: str | None = None  # http(s)://host:port (JWT), or unix:/path/to/slurmrestd.sock (rest_auth/local)
    warmup_minutes: int = 60
    slurm_api_version: str = "auto"
    slurm_jwt_file: str | None = None  # file holding the token (else $SLURM_JWT at run time)
    slurm_user: str | None = None  # X-SLURM-USER-NAME (default: the token's sun claim)
    slurm_conf: str | None = None  # for `scontrol requeuehold` (no REST requeue); default $SLURM_CONF
    slurm_retry_deadline_s: float = 60.0
    slurm_plan_key_file: str | None = None  # the key that signs plans (docs/SECURITY.md)
    slurm_reference_jwt_file: str | None = None  # the unprivileged account reference workloads run as
    xcuda_kp: float = 1.0  # xCUDA's PID gains, sent with every placement (executors/node/xcuda/README.md)
    xcuda_ki: float = 20.0
    xcuda_kd: float = 0.0
    slurm_name_gpus: bool = False  # shares name the planned GPU (docs/SLURM.md: only where jobs do not move)
    # Overrides of executors.scheduler.profiling.settings.ProfilingSettings / SamplingSettings for the Slurm profiler.
    profiling: dict = {}
    sampling: dict = {}

    def backend(self) -> ClusterBackend:
        if self.kind == "simulated":
            from executors.simulated.backend import SimulatedBackend
            from executors.simulated.cluster import SimSettings

            return SimulatedBackend(SimSettings(seed=self.seed), warmup_minutes=self.warmup_minutes)
        if self.kind == "slurm":
            return self._slurm_backend()
        raise Failure(description=f"unknown cluster kind {self.kind!r}")

    def profiler(self) -> Profiler:
        """Where jobs are profiled and co-location samples measured: the simulated GPU model, or Slurm's profile
        partition (with the deployment's profiling and sampling settings)."""
        if self.kind != "slurm":
            return self.backend()  # the simulated backend profiles with its GPU model
        return SlurmProfiler.from_config(self.slurm_config())

    def slurm_config(self) -> SlurmConfig:
        """This resource's Slurm settings as the one object every Slurm client and backend is built from."""
        try:
            return SlurmConfig.build(
                url=self.slurm_url, api_version=self.slurm_api_version, jwt_file=self.slurm_jwt_file,
                user=self.slurm_user, conf=self.slurm_conf, retry_deadline_s=self.slurm_retry_deadline_s,
                plan_key_file=self.slurm_plan_key_file, reference_jwt_file=self.slurm_reference_jwt_file,
                name_gpus=self.slurm_name_gpus, gains=(self.xcuda_kp, self.xcuda_ki, self.xcuda_kd),
                profiling=self.profiling, sampling=self.sampling)
        except SlurmConfigError as exc:
            raise Failure(description=f"cluster 'slurm': {exc}") from exc

    def _slurm_backend(self) -> ClusterBackend:
        if not self.slurm_url:
            raise Failure(description="cluster 'slurm': slurm_url is not set (MUXFLOW_SLURM_URL)")
        return self.slurm_config().backend()


class PredictorStoreResource(ConfigurableResource):
    """Versioned speed predictors, kept in the feature store (``predictor_models``)."""

    feature_store: ResourceDependency[FeatureStoreResource]
    epochs: int | None = None  # None: the network's default
    hidden: int | None = None  # the MLP's hidden units per layer; None: the default
    seed: int = 0
    max_holdout_mae: float = 0.10

    def config(self) -> PredictorConfig:
        return PredictorConfig(epochs=self.epochs, hidden=self.hidden, seed=self.seed)

    def train_candidate(self, gpu_type: str) -> predictors.TrainOutcome:
        return predictors.train_candidate(self.feature_store.store, gpu_type, self.config())

    def promote_latest(self, gpu_type: str) -> predictors.Promotion:
        with self.feature_store.store.session() as s:
            version = repo.latest_model_version(s, gpu_type)
        if version is None:
            raise Failure(description=f"no trained model for GPU type {gpu_type}: materialize its candidate first")
        return predictors.promote(self.feature_store.store, gpu_type, version, self.max_holdout_mae)


class SchedulingResource(ConfigurableResource):
    """What the round, profiling and report assets, the jobs and the sensors read of the deployment's settings
    (``pipelines.settings``): the round windows, the round's configuration, profiling's seed and sample budget."""

    round_period_s: int = DEFAULT_PERIOD_S
    rounds_start: str  # ISO 8601 with a time zone: the first window a round may plan
    rounds_end: str | None = None  # exclusive; None: open-ended (a live cluster)
    migration_penalty: float = 0.05
    max_jobs_per_gpu: int = 1
    seed: int = 0
    samples_per_type: int = 2000
    report_dir: str = ".muxflow/report"

    def clock(self) -> RoundClock:
        return RoundClock(self.round_period_s)

    def round_config(self) -> RoundConfig:
        return RoundConfig(migration_penalty=self.migration_penalty, max_jobs_per_gpu=self.max_jobs_per_gpu)

    def start(self) -> dt.datetime:
        return dt.datetime.fromisoformat(self.rounds_start)

    def end(self) -> dt.datetime | None:
        return dt.datetime.fromisoformat(self.rounds_end) if self.rounds_end else None


def fixed(res: ConfigurableResource) -> ResourceDefinition:
    """``res`` as a resource with no launch-time configuration: its fields are what the deployment gave it, and a
    run config with any entry for it is refused ("unexpected config entry"). Its set-up and tear-down run as they
    would for the resource itself; the instance stays reachable as ``.fixed_value`` of the definition for the
    deployment's own checks."""

    @resource(description=f"{(type(res).__doc__ or type(res).__name__).strip().splitlines()[0]} "
                          "(the deployment's settings; not configurable at launch)",
              config_schema={})
    def _fixed(context: InitResourceContext):
        with res.process_config_and_initialize_cm() as value:
            yield value

    _fixed.fixed_value = res  # type: ignore[attr-defined]
    return _fixed
