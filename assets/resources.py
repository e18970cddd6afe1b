"""Dagster resources: the feature store, the cluster and the predictor store.

Thin handles over the adapters in ``executors``. Which implementation a run
gets is configuration (``pipelines.settings``), resolved when the run starts;
importing this module opens nothing.
"""


from dagster import ConfigurableResource, Failure, InitResourceContext, ResourceDependency
from pydantic import PrivateAttr

from executors import steps
from executors.cluster import ClusterBackend
from executors.store.db import Store
from executors.store.migrate import current_revision, head_revision
from scheduler_core.predictor import PredictorConfig


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
    slurm_api_version: str = "v0.0.38"
    slurm_socket: str | None = None  # a unix socket instead of slurm_url
    slurm_jwt_file: str | None = None  # file holding the token (else $SLURM_JWT at run time)
    slurm_user: str | None = None  # X-SLURM-USER-NAME (default: the token's sun claim)
    slurm_conf: str | None = None  # for `scontrol requeuehold` (no REST requeue); default $SLURM_CONF
    slurm_retry_deadline_s: float = 60.0

    def backend(self) -> ClusterBackend:
        if self.kind == "simulated":
            from executors.simulated.backend import SimulatedBackend
            from executors.simulated.cluster import SimSettings

            return SimulatedBackend(SimSettings(seed=self.seed), warmup_minutes=self.warmup_minutes)
        if self.kind == "slurm":
            return self._slurm_backend()
        raise Failure(description=f"unknown cluster kind {self.kind!r}")

    def _slurm_backend(self) -> ClusterBackend:
        import os

        from executors.slurm.backend import SlurmBackend
        from executors.slurm.client import SlurmRestClient
        from executors.slurm.scontrol import ScontrolRequeue
        from executors.slurm.settings import SlurmRestSettings

        url, sock = self.slurm_url, self.slurm_socket
        if url and url.startswith("unix:"):
            url, sock = None, url[len("unix:"):]
            if sock.startswith("//"):  # unix:///run/slurmrestd.sock
                sock = sock[2:]
        try:
            settings = SlurmRestSettings(
                api_version=self.slurm_api_version, unix_socket=sock, url=None if sock else url,
                user_name=self.slurm_user, token_file=self.slurm_jwt_file,
                token=None if (sock or self.slurm_jwt_file) else (os.environ.get("SLURM_JWT") or None),
            )
        except ValueError as exc:
            raise Failure(description=f"cluster 'slurm': {exc}") from exc
        requeue = ScontrolRequeue(self.slurm_conf or os.environ.get("SLURM_CONF"))
        return SlurmBackend(lambda: SlurmRestClient(settings, requeue_fallback=requeue),
                            retry_deadline_s=self.slurm_retry_deadline_s)


class PredictorStoreResource(ConfigurableResource):
    """Versioned speed predictors, kept in the feature store (``predictor_models``)."""

    feature_store: ResourceDependency[FeatureStoreResource]
    epochs: int = 250
    seed: int = 0
    max_holdout_mae: float = 0.10

    def config(self) -> PredictorConfig:
        return PredictorConfig(epochs=self.epochs, seed=self.seed)

    def train_candidate(self, gpu_type: str) -> steps.TrainOutcome:
        return steps.train_candidate(self.feature_store.store, gpu_type, self.config())

    def promote_latest(self, gpu_type: str) -> steps.Promotion:
        from executors.store import repo

        with self.feature_store.store.session() as s:
            version = repo.latest_model_version(s, gpu_type)
        if version is None:
            raise Failure(description=f"no trained model for GPU type {gpu_type}: materialize its candidate first")
        return steps.promote(self.feature_store.store, gpu_type, version, self.max_holdout_mae)
