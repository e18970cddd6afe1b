"""Explicit configuration of the Dagster deployment (one object, passed to ``build_definitions``).

Where it comes from, each layer over the one before (as every tool that reads both a file and the
environment does: flags > environment > file > defaults):

1. the defaults below;
2. a settings file: ``MUXFLOW_SETTINGS`` (the path of a JSON file with any of the fields below), else
   ``$DAGSTER_HOME/muxflow.json`` where it exists (written by the main job, ``make run``, so that
   ``make ui`` shows the cluster the main job ran);
3. every ``MUXFLOW_*`` variable that is set (``ENV_VARS``, ``MUXFLOW_DATABASE_URL``, ``SLURM_CONF``;
   ``MUXFLOW_PROFILING_*`` / ``MUXFLOW_SAMPLING_*`` merged over the file's ``profiling`` / ``sampling``);
4. the command line's flags (``flags``: the CLI's ``muxflow --db``).

A variable that overrides a value the file set to something else is said once per process on stderr
(``settings: MUXFLOW_CLUSTER=slurm overrides cluster=simulated from /path/muxflow.json``; passwords in URLs
masked).

Nothing here connects to anything: resources open the store and the cluster
when a run uses them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from assets.resources import ClusterResource
from executors.cluster import round_period_error
from executors.scheduler.profiling.settings import ProfilingSettings, SamplingSettings, overrides_from_env
from executors.scheduler.profiling.settings import SettingsError as ProfilingSettingsError
from executors.scheduler.slurm.config import SlurmConfig, SlurmConfigError
from executors.store.db import ENV_URL, default_url
from scheduler_core.round.clock import DEFAULT_PERIOD_S, RoundClock

SETTINGS_FILE = "muxflow.json"
RENAMED = ("MUXFLOW_SLURM_REST_URL", "MUXFLOW_SLURM_REST_SOCKET")  # one variable now: MUXFLOW_SLURM_URL
DEFAULT_ROUNDS_START = dt.datetime(2026, 1, 5, tzinfo=dt.timezone.utc)


class SettingsError(ValueError):
    """Invalid deployment configuration."""


@dataclass(frozen=True)
class MuxflowSettings:
    db_url: str
    cluster: str = "simulated"  # simulated | slurm
    slurm_url: str | None = None  # http(s)://host:port (JWT) or unix:/path/slurmrestd.sock (rest_auth/local)
    slurm_api_version: str = "auto"  # the newest version slurmrestd and MuxFlow both speak (its OpenAPI document)
    slurm_jwt_file: str | None = None  # file holding the token, re-read on every request (else $SLURM_JWT)
    slurm_user: str | None = None  # X-SLURM-USER-NAME (default: the token's sun claim)
    slurm_conf: str | None = None  # slurm.conf for `scontrol requeuehold` (no REST requeue); default $SLURM_CONF
    slurm_retry_deadline_s: float = 60.0
    # The key that signs each plan MuxFlow writes into a job's comment (the nodes' Prologs and agents hold the same
    # key; docs/SECURITY.md). Mode 0600, owned by the account MuxFlow runs as.
    slurm_plan_key_file: str | None = None
    # A token of an unprivileged account MuxFlow's own reference workloads (co-location samples) run as on the
    # profile partition: never MuxFlow's identity, root or SlurmUser (docs/SECURITY.md).
    slurm_reference_jwt_file: str | None = None
    xcuda_gains: tuple[float, float, float] = (1.0, 20.0, 0.0)  # kp, ki, kd sent with every placement
    # Place shares naming the planned GPU (mps:<model>g<i>:<pct>) on per-GPU-typed nodes. Slurm 22.05 cannot
    # move such a share to another GPU later: only where jobs do not move (docs/SLURM.md).
    slurm_name_gpus: bool = False
    # The round period: a round plans each window of this length (paper: 15 minutes). It must divide a
    # day; the simulated cluster needs whole minutes. Sensors tick every sensor_interval_s (the round
    # sensor at most a third of the period).
    round_period_s: int = DEFAULT_PERIOD_S
    sensor_interval_s: int = 30
    sensors_running: bool = False  # the sensors start with the daemon (else an operator turns them on)
    # Slurm's profile partition: overrides of executors.scheduler.profiling.settings.ProfilingSettings / SamplingSettings
    # (bound_s, iterations, partition, budget_gpu_s, …; MUXFLOW_PROFILING_* / MUXFLOW_SAMPLING_*).
    profiling: dict = dataclasses.field(default_factory=dict)
    sampling: dict = dataclasses.field(default_factory=dict)
    gpu_types: tuple[str, ...] = ("a10", "t4")
    rounds_start: dt.datetime = DEFAULT_ROUNDS_START
    # Exclusive end of the round partitions; None = open-ended (a live cluster). The main
    # job sets it to the end of its simulated hours, so the UI lists just those windows.
    rounds_end: dt.datetime | None = None
    seed: int = 0
    samples_per_type: int = 2000
    max_holdout_mae: float = 0.10  # asset check bound on a predictor's held-out MAE of normalized throughput
    migration_penalty: float = 0.05
    # Offline jobs a round may put on one GPU, each with its own MPS share (scheduler_core.round.slots; 1: the paper).
    max_jobs_per_gpu: int = 1
    epochs: int | None = None  # predictor training epochs; None: the network's (scheduler_core.prediction.config)
    predictor_hidden: int | None = None  # the MLP's hidden units per layer; None: the default (32; the paper's 64)
    report_dir: str = ".muxflow/report"
    warmup_minutes: int = 60  # simulated cluster: online-only history recorded before its first round
    # Prometheus endpoints (docs/OBSERVABILITY.md): each node agent's, and the scheduler's (`muxflow metrics serve`,
    # the Dagster code location); 0: off. The bind address of both.
    node_metrics_port: int = 9410
    scheduler_metrics_port: int = 9411
    metrics_host: str = "0.0.0.0"

    def __post_init__(self) -> None:
        if self.cluster not in ("simulated", "slurm"):
            raise SettingsError(f"cluster must be 'simulated' or 'slurm', got {self.cluster!r}")
        if self.cluster == "slurm" and not self.slurm_url:
            raise SettingsError("cluster 'slurm' needs slurm_url (MUXFLOW_SLURM_URL)")
        if not self.gpu_types or len(set(self.gpu_types)) != len(self.gpu_types):
            raise SettingsError(f"gpu_types must be a non-empty list of distinct names, got {self.gpu_types!r}")
        try:
            clock = RoundClock(self.round_period_s)
        except ValueError as exc:
            raise SettingsError(f"round_period_s: {exc}") from exc
        why = round_period_error(self.round_period_s, self.cluster == "simulated")
        if why:
            raise SettingsError(f"round_period_s: {why}")
        if self.sensor_interval_s < 1:
            raise SettingsError("sensor_interval_s must be >= 1")
        for name in ("node_metrics_port", "scheduler_metrics_port"):
            port = getattr(self, name)
            if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
                raise SettingsError(f"{name} must be a TCP port 0-65535 (0: off), got {port!r}")
        if not self.metrics_host:
            raise SettingsError("metrics_host must not be empty (0.0.0.0: every interface, 127.0.0.1: this host)")
        try:
            self.slurm_config()
        except SlurmConfigError as exc:
            raise SettingsError(str(exc)) from exc
        for name in ("rounds_start", "rounds_end"):
            t = getattr(self, name)
            if t is None:
                continue
            if t.tzinfo is None:
                raise SettingsError(f"{name} must carry a time zone (UTC)")
            if not clock.is_window_start(t):
                raise SettingsError(f"{name} must be the start of a round window ({self.round_period_s} s, "
                                    f"aligned to midnight UTC), got {t.isoformat()}")
        if self.rounds_end is not None and self.rounds_end <= self.rounds_start:
            raise SettingsError("rounds_end must be after rounds_start")
        if not 1 <= self.max_jobs_per_gpu <= 8:
            raise SettingsError(f"max_jobs_per_gpu must be between 1 and 8, got {self.max_jobs_per_gpu!r}")
        if not 0 < self.max_holdout_mae:
            raise SettingsError("max_holdout_mae must be > 0")
        if self.predictor_hidden is not None and self.predictor_hidden < 1:
            raise SettingsError(f"predictor_hidden must be >= 1, got {self.predictor_hidden!r}")
        if self.samples_per_type < 10 or (self.epochs is not None and self.epochs < 1) or self.migration_penalty < 0 or self.warmup_minutes < 15:
            raise SettingsError("samples_per_type >= 10, epochs >= 1, migration_penalty >= 0 and "
                                "warmup_minutes >= 15 are required")

    def check_secrets(self, path: Path | None = None) -> None:
        """What a long-running process checks at start-up (docs/SECURITY.md): the Slurm credentials' files are their
        owner's alone, and a settings file ``path`` that names a store password is too. :class:`SettingsError`."""
        if path is not None and _URL_PASSWORD.search(self.db_url or ""):
            try:
                mode = path.stat().st_mode
            except OSError:
                mode = 0
            if mode & 0o077:
                raise SettingsError(f"settings file {path}: it names the store's password and its mode "
                                    f"{mode & 0o777:04o} lets others read it; chmod 600 {path}")
        if self.cluster == "slurm":
            try:
                self.slurm_config().check_secrets()
            except SlurmConfigError as exc:
                raise SettingsError(str(exc)) from exc

    def slurm_config(self, *, default_url: str | None = None, default_conf: str | None = None) -> SlurmConfig:
        """The Slurm part of these settings: the one object the cluster resource, the CLI and the node agent
        build their Slurm client and backend from (``default_url``/``default_conf``: the dev cluster's, where
        the settings name no Slurm URL; then its slurm.conf goes with its REST socket, over $SLURM_CONF, so that
        ``scontrol`` never talks to another cluster than the REST calls)."""
        return SlurmConfig.build(
            url=self.slurm_url or default_url, api_version=self.slurm_api_version, jwt_file=self.slurm_jwt_file,
            user=self.slurm_user, conf=self._slurm_conf(default_url, default_conf),
            retry_deadline_s=self.slurm_retry_deadline_s, plan_key_file=self.slurm_plan_key_file,
            reference_jwt_file=self.slurm_reference_jwt_file,
            name_gpus=self.slurm_name_gpus, gains=self.xcuda_gains, profiling=self.profiling, sampling=self.sampling)

    def _slurm_conf(self, default_url: str | None, default_conf: str | None) -> str | None:
        if self.slurm_url is None and default_url is not None and default_conf is not None:
            return default_conf
        return self.slurm_conf or default_conf

    def cluster_resource(self):
        """The cluster resource these settings describe: what Dagster runs and the CLI both use."""
        kp, ki, kd = self.xcuda_gains
        return ClusterResource(
            kind=self.cluster, seed=self.seed, slurm_url=self.slurm_url, warmup_minutes=self.warmup_minutes,
            slurm_api_version=self.slurm_api_version, slurm_jwt_file=self.slurm_jwt_file, slurm_user=self.slurm_user,
            slurm_conf=self.slurm_conf, slurm_retry_deadline_s=self.slurm_retry_deadline_s,
            slurm_plan_key_file=self.slurm_plan_key_file, slurm_reference_jwt_file=self.slurm_reference_jwt_file,
            xcuda_kp=kp, xcuda_ki=ki, xcuda_kd=kd, slurm_name_gpus=self.slurm_name_gpus,
            profiling=dict(self.profiling), sampling=dict(self.sampling),
        )

    @property
    def round_clock(self) -> RoundClock:
        return RoundClock(self.round_period_s)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["gpu_types"] = list(self.gpu_types)
        d["xcuda_gains"] = list(self.xcuda_gains)
        d["rounds_start"] = self.rounds_start.isoformat()
        d["rounds_end"] = self.rounds_end.isoformat() if self.rounds_end else None
        return d

    @classmethod
    def from_json(cls, d: dict) -> MuxflowSettings:
        try:
            return cls(**_from_json_values(d))
        except TypeError as exc:
            raise SettingsError(str(exc)) from exc


def _from_json_values(d: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a settings file's JSON object as MuxflowSettings takes them (tuples, times); unknown keys refused."""
    known = {f.name for f in dataclasses.fields(MuxflowSettings)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise SettingsError(f"unknown settings: {', '.join(unknown)}")
    out = dict(d)
    for name in ("gpu_types", "xcuda_gains"):
        if isinstance(out.get(name), list):
            out[name] = tuple(out[name])
    for name in ("rounds_start", "rounds_end"):
        if out.get(name) is not None:
            out[name] = _parse_time(out[name], name)
    return out


def _parse_time(v: str | dt.datetime, name: str = "rounds_start") -> dt.datetime:
    if isinstance(v, dt.datetime):
        return v
    try:
        t = dt.datetime.fromisoformat(v)
    except ValueError as exc:
        raise SettingsError(f"{name}: not an ISO time: {v!r}") from exc
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def _flag(v: str) -> bool:
    if v.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if v.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected 1/0, true/false, yes/no or on/off, got {v!r}")


def write_settings(settings: MuxflowSettings, dagster_home: Path) -> Path:
    """``dagster_home``/muxflow.json, mode 0600 (an operator's file: its db_url may hold a password), replaced
    whole (a reader never sees half of it)."""
    dagster_home.mkdir(parents=True, exist_ok=True)
    path = dagster_home / SETTINGS_FILE
    fd, tmp = tempfile.mkstemp(dir=dagster_home, prefix=f".{SETTINGS_FILE}.")  # created 0600
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(json.dumps(settings.to_json(), indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


ENV_VARS: dict[str, tuple[str, Callable[[str], Any]]] = {  # variable -> (setting, parser); docs/CONFIGURATION.md
    "MUXFLOW_CLUSTER": ("cluster", str), "MUXFLOW_SLURM_URL": ("slurm_url", str),
    "MUXFLOW_GPU_TYPES": ("gpu_types", lambda v: tuple(x.strip() for x in v.split(",") if x.strip())),
    "MUXFLOW_ROUNDS_START": ("rounds_start", _parse_time),
    "MUXFLOW_ROUNDS_END": ("rounds_end", lambda v: _parse_time(v, "rounds_end")), "MUXFLOW_SEED": ("seed", int),
    "MUXFLOW_SAMPLES_PER_TYPE": ("samples_per_type", int), "MUXFLOW_MAX_HOLDOUT_MAE": ("max_holdout_mae", float),
    "MUXFLOW_MIGRATION_PENALTY": ("migration_penalty", float), "MUXFLOW_EPOCHS": ("epochs", int),
    "MUXFLOW_PREDICTOR_HIDDEN": ("predictor_hidden", int),
    "MUXFLOW_MAX_JOBS_PER_GPU": ("max_jobs_per_gpu", int),
    "MUXFLOW_REPORT_DIR": ("report_dir", str),
    "MUXFLOW_SLURM_API_VERSION": ("slurm_api_version", str), "MUXFLOW_SLURM_JWT_FILE": ("slurm_jwt_file", str),
    "MUXFLOW_SLURM_USER": ("slurm_user", str), "SLURM_CONF": ("slurm_conf", str),
    "MUXFLOW_SLURM_RETRY_DEADLINE_S": ("slurm_retry_deadline_s", float),
    "MUXFLOW_SLURM_PLAN_KEY_FILE": ("slurm_plan_key_file", str),
    "MUXFLOW_SLURM_REFERENCE_JWT_FILE": ("slurm_reference_jwt_file", str),
    "MUXFLOW_XCUDA_GAINS": ("xcuda_gains", lambda v: tuple(float(x) for x in v.split(","))),
    "MUXFLOW_ROUND_PERIOD_S": ("round_period_s", int), "MUXFLOW_SENSOR_INTERVAL_S": ("sensor_interval_s", int),
    "MUXFLOW_SENSORS_RUNNING": ("sensors_running", _flag), "MUXFLOW_SLURM_NAME_GPUS": ("slurm_name_gpus", _flag),
    "MUXFLOW_NODE_METRICS_PORT": ("node_metrics_port", int),
    "MUXFLOW_SCHEDULER_METRICS_PORT": ("scheduler_metrics_port", int),
    "MUXFLOW_METRICS_HOST": ("metrics_host", str),
}


PROFILING_PREFIX, SAMPLING_PREFIX = "MUXFLOW_PROFILING_", "MUXFLOW_SAMPLING_"


def environment_variables() -> list[str]:
    """Every variable ``load_settings`` reads (``make test`` unsets them: the tests' settings are their own)."""
    names = ["MUXFLOW_SETTINGS", ENV_URL, *ENV_VARS, *RENAMED]
    for prefix, cls in ((PROFILING_PREFIX, ProfilingSettings), (SAMPLING_PREFIX, SamplingSettings)):
        names += [prefix + f.name.upper() for f in dataclasses.fields(cls)]
    return names


def settings_file(environ: Mapping[str, str] | None = None) -> Path | None:
    """The settings file in effect: ``MUXFLOW_SETTINGS``, else ``$DAGSTER_HOME/muxflow.json`` where it exists."""
    env = os.environ if environ is None else environ
    if env.get("MUXFLOW_SETTINGS"):
        return Path(env["MUXFLOW_SETTINGS"])
    if env.get("DAGSTER_HOME"):
        candidate = Path(env["DAGSTER_HOME"]) / SETTINGS_FILE
        if candidate.exists():
            return candidate
    return None


_URL_PASSWORD = re.compile(r"(://[^/:@\s]*):[^@/\s]*@")


def mask_secrets(text: str) -> str:
    """``text`` with the password of every URL in it masked: ``postgresql+psycopg2://user:***@host/db``."""
    return _URL_PASSWORD.sub(r"\1:***@", text)


_NOTICES_SHOWN: set[str] = set()  # what this process has said already


def _notice(message: str) -> None:
    """One line on stderr, once per process (every command and code location loads the settings more than once)."""
    if message in _NOTICES_SHOWN:
        return
    _NOTICES_SHOWN.add(message)
    print(f"settings: {message}", file=sys.stderr, flush=True)


def _shown(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(_shown(x) for x in v)
    if isinstance(v, dt.datetime):
        return v.isoformat()
    return mask_secrets(str(v))


def _same(name: str, a: Any, b: Any) -> bool:
    if name == "db_url" and isinstance(a, str) and isinstance(b, str):  # one SQLite file, relative or not
        a, b = (_absolute_sqlite(u) for u in (a, b))
    if isinstance(a, list):
        a = tuple(a)
    if isinstance(b, list):
        b = tuple(b)
    return a == b


def _absolute_sqlite(url: str) -> str:
    prefix = "sqlite:///"
    if url.startswith(prefix) and url[len(prefix):] not in ("", ":memory:"):
        return prefix + str(Path(url[len(prefix):]).resolve())
    return url


def load_settings(environ: Mapping[str, str] | None = None, *,
                  flags: Mapping[str, Any] | None = None) -> MuxflowSettings:
    """The deployment's settings: defaults < the settings file < the environment < ``flags`` (the command line's
    options; None: not given). An environment variable that overrides a value the file set is said once."""
    env = os.environ if environ is None else environ
    for old in RENAMED:
        if env.get(old):
            raise SettingsError(f"{old} is no longer read: set MUXFLOW_SLURM_URL (http(s)://host:port, or "
                                f"unix:/path/to/slurmrestd.sock for a unix socket)")
    path = settings_file(env)
    d: dict[str, Any] = {}
    if path is not None:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SettingsError(f"cannot read settings file {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise SettingsError(f"settings file {path}: expected a JSON object of settings")
        d = {k: v for k, v in _from_json_values(data).items() if v is not None}  # null: not set

    def say(var: str, setting: str, before: Any, value: Any) -> None:
        """``var`` sets ``setting`` to ``value``: said when the file had set it to something else."""
        if before is not None and not _same(setting, before, value):
            _notice(f"{var}={mask_secrets(env[var].strip())} overrides {setting}={_shown(before)} from {path}")

    if env.get(ENV_URL):
        say(ENV_URL, "db_url", d.get("db_url"), env[ENV_URL])
        d["db_url"] = env[ENV_URL]
    d.setdefault("db_url", default_url())
    for var, (name, fn) in ENV_VARS.items():
        if var in env:
            try:
                value = fn(env[var])
            except ValueError as exc:
                raise SettingsError(f"{var}={env[var]!r}: {exc}") from exc
            say(var, name, d.get(name), value)
            d[name] = value
    for key, prefix, cls in (("profiling", PROFILING_PREFIX, ProfilingSettings),
                             ("sampling", SAMPLING_PREFIX, SamplingSettings)):
        try:
            over = overrides_from_env(cls, prefix, env)
        except ProfilingSettingsError as exc:
            raise SettingsError(str(exc)) from exc
        base = d.get(key, {})
        if not isinstance(base, dict):
            raise SettingsError(f"{key}: expected an object of {cls.__name__} fields, got {base!r}")
        for name, value in over.items():
            say(prefix + name.upper(), f"{key}.{name}", base.get(name), value)
        d[key] = {**base, **over}
    d.update({k: v for k, v in (flags or {}).items() if v is not None})
    try:
        return MuxflowSettings(**d)
    except TypeError as exc:
        raise SettingsError(str(exc)) from exc
