"""One Slurm configuration: how to reach slurmrestd, how long to retry, what a placement carries, how to profile.

Dagster's cluster resource, the CLI (``muxflow round``, ``muxflow slurm …``, ``muxflow profile --real``) and
the node agent all build their Slurm client and backend from a :class:`SlurmConfig`, and only from it. The
deployment's settings (``pipelines.settings``: a JSON file or ``MUXFLOW_*`` variables, docs/CONFIGURATION.md)
produce it; nothing here reads the environment except the JWT, named by ``token_env`` and read when a client
is built (a secret is not written into a settings file).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from executors.scheduler.profiling.settings import ProfilingSettings, SamplingSettings
from executors.scheduler.profiling.settings import SettingsError as ProfilingSettingsError
from executors.scheduler.slurm.backend import SlurmBackend, XcudaGains
from executors.slurm.api import AUTO
from executors.slurm.client import SlurmRestClient
from executors.slurm.errors import TokenFileError
from executors.slurm.plan import KeyFileError, read_key
from executors.slurm.scontrol import ScontrolRequeue
from executors.slurm.settings import SlurmRestSettings, read_token_file


class SlurmConfigError(ValueError):
    """A Slurm setting that cannot be used; the message names it."""


@dataclass(frozen=True)
class SlurmConfig:
    """Everything MuxFlow needs to work with one Slurm cluster; validated when built."""

    url: str | None = None  # http(s)://host:port (JWT) or unix:/path/slurmrestd.sock (rest_auth/local)
    api_version: str = AUTO  # the newest version slurmrestd and MuxFlow both speak (its OpenAPI document)
    jwt_file: str | None = None  # file holding the token, re-read on every request (rotation without restart)
    token_env: str = "SLURM_JWT"  # else the token is this environment variable's (what `scontrol token` prints)
    user: str | None = None  # X-SLURM-USER-NAME (default: the token's sun claim)
    conf: str | None = None  # slurm.conf for `scontrol` (requeue-hold, admin comment on 22.05); else $SLURM_CONF
    timeout_s: float = 15.0  # one REST request
    retry_deadline_s: float = 60.0  # how long Slurm may not answer before a plan is left pending
    plan_key_file: str | None = None  # the key that signs the plans written into jobs' comments (plan.py)
    reference_jwt_file: str | None = None  # token of the unprivileged account reference workloads run as
    name_gpus: bool = False  # shares name the planned GPU (docs/SLURM.md: only where jobs do not move)
    gains: XcudaGains = field(default_factory=XcudaGains)  # xCUDA's PID gains, sent with every placement
    profiling: ProfilingSettings = field(default_factory=ProfilingSettings)  # the profile partition's dry runs
    sampling: SamplingSettings = field(default_factory=SamplingSettings)  # and its co-location samples

    def __post_init__(self) -> None:
        if not self.retry_deadline_s > 0:
            raise SlurmConfigError(f"slurm_retry_deadline_s must be positive, got {self.retry_deadline_s!r}")
        if self.url:
            self.rest_settings(token="")  # validates the endpoint, the API version and the timeout

    def with_defaults(self, url: str | None, conf: str | None) -> SlurmConfig:
        """This configuration, with ``url`` and ``conf`` where it names none (the dev cluster's, for the CLI)."""
        return replace(self, url=self.url or url, conf=self.conf or conf)

    @classmethod
    def build(cls, *, gains: tuple[float, float, float] | XcudaGains = (1.0, 20.0, 0.0),
              profiling: Mapping | None = None, sampling: Mapping | None = None, **fields) -> SlurmConfig:
        """From plain values (a settings file, Dagster config): gains as (kp, ki, kd), profiling and sampling
        as overrides of their defaults. Every error is a :class:`SlurmConfigError` naming the setting."""
        try:
            if not isinstance(gains, XcudaGains) and len(gains) != 3:
                raise ValueError(f"three gains [kp, ki, kd], got {list(gains)!r}")
            g = gains if isinstance(gains, XcudaGains) else XcudaGains(*gains)
        except (TypeError, ValueError) as exc:
            raise SlurmConfigError(f"xcuda_gains: {exc}") from exc
        parts = {}
        for name, cls_, over in (("profiling", ProfilingSettings, profiling), ("sampling", SamplingSettings, sampling)):
            try:
                parts[name] = cls_(**dict(over or {}))
            except (ProfilingSettingsError, TypeError) as exc:
                raise SlurmConfigError(f"{name}: {exc}") from exc
        return cls(gains=g, **parts, **fields)

    @property
    def socket(self) -> str | None:
        """The unix socket path of a ``unix:`` URL (``unix:/p`` or ``unix:///p``), else None."""
        if not self.url or not self.url.startswith("unix:"):
            return None
        path = self.url[len("unix:"):]
        return path[2:] if path.startswith("//") else path

    def rest_settings(self, *, token: str | None = None) -> SlurmRestSettings:
        """How the REST client connects. The token: the JWT file's (read per request), else ``token_env``'s
        when talking TCP; a unix socket authenticates by the caller's uid (rest_auth/local)."""
        if not self.url:
            raise SlurmConfigError("slurm_url is not set (MUXFLOW_SLURM_URL: http(s)://host:port or "
                                   "unix:/path/to/slurmrestd.sock)")
        sock = self.socket
        if token is None and not sock and not self.jwt_file:
            token = os.environ.get(self.token_env) or None
        try:
            return SlurmRestSettings(api_version=self.api_version, unix_socket=sock, url=None if sock else self.url,
                                     user_name=self.user, token=token or None, token_file=self.jwt_file,
                                     timeout_s=self.timeout_s)
        except ValueError as exc:
            raise SlurmConfigError(str(exc).replace("slurm rest:", "slurm:")) from exc

    def client(self) -> SlurmRestClient:
        """A new REST client (close it, or use it as a context manager)."""
        return SlurmRestClient(self.rest_settings(), requeue_fallback=ScontrolRequeue(self.conf_path))

    def reference_client(self) -> SlurmRestClient:
        """A REST client acting as the unprivileged account MuxFlow's reference workloads run as (its token in
        ``reference_jwt_file``): what submits co-location sampling runs, so that they never run as MuxFlow."""
        if not self.reference_jwt_file:
            raise SlurmConfigError("slurm_reference_jwt_file is not set (MUXFLOW_SLURM_REFERENCE_JWT_FILE)")
        if not self.url or self.socket:
            raise SlurmConfigError("slurm_reference_jwt_file needs slurm_url over TCP (http(s)://host:port): on a "
                                   "unix socket slurmrestd acts as the connecting process's user, not the token's")
        try:
            settings = SlurmRestSettings(api_version=self.api_version, url=self.url, token_file=self.reference_jwt_file,
                                         timeout_s=self.timeout_s)
        except ValueError as exc:
            raise SlurmConfigError(str(exc).replace("slurm rest:", "slurm:")) from exc
        return SlurmRestClient(settings)

    @property
    def conf_path(self) -> str | None:
        return self.conf or os.environ.get("SLURM_CONF") or None

    def plan_key(self) -> bytes:
        """The key that signs plans (executors.slurm.plan), read from ``plan_key_file`` and refused when others could
        read or change it."""
        if not self.plan_key_file:
            raise SlurmConfigError("slurm_plan_key_file is not set (MUXFLOW_SLURM_PLAN_KEY_FILE): MuxFlow signs every "
                                   "plan it writes into a job's comment with it (docs/SECURITY.md)")
        try:
            return read_key(self.plan_key_file)
        except KeyFileError as exc:
            raise SlurmConfigError(f"slurm_plan_key_file: {exc}") from exc

    def check_secrets(self) -> None:
        """Refuse, at start-up, a JWT or key file that group or others can read (or that another user owns): whoever
        reads one acts as MuxFlow, or as its reference account, or signs plans (docs/SECURITY.md)."""
        try:
            for path in (self.jwt_file, self.reference_jwt_file):
                if path:
                    read_token_file(path)
        except TokenFileError as exc:
            raise SlurmConfigError(str(exc)) from exc
        if self.plan_key_file:
            self.plan_key()

    def backend(self) -> SlurmBackend:
        """Dispatch and job-state sync on this cluster (a new client for every use)."""
        return SlurmBackend(self.client, retry_deadline_s=self.retry_deadline_s, gains=self.gains,
                            name_gpus=self.name_gpus, plan_key=self.plan_key)
