"""How to reach slurmrestd: API version, transport (unix socket or TCP) and JWT credentials."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from executors.slurm.api import DEFAULT_API_VERSION, api_version
from executors.slurm.jwt import unverified_claims

ENV_API_VERSION = "MUXFLOW_SLURM_API_VERSION"
ENV_REST_SOCKET = "MUXFLOW_SLURM_REST_SOCKET"
ENV_REST_URL = "MUXFLOW_SLURM_REST_URL"
ENV_USER = "MUXFLOW_SLURM_USER"
ENV_TOKEN_FILE = "MUXFLOW_SLURM_JWT_FILE"
ENV_TOKEN = "SLURM_JWT"  # what `scontrol token` prints, the usual way to hand a token over


@dataclass(frozen=True)
class SlurmRestSettings:
    """Exactly one of ``unix_socket`` (rest_auth/local) or ``url`` (usually with a JWT).

    ``token_file`` is read on every request so an operator can rotate tokens
    without restarting MuxFlow. ``user_name`` defaults to the token's ``sun``
    claim; slurmrestd 22.05 needs it in ``X-SLURM-USER-NAME``.
    """

    api_version: str = DEFAULT_API_VERSION
    unix_socket: str | None = None
    url: str | None = None
    user_name: str | None = None
    token: str | None = None
    token_file: str | None = None
    timeout_s: float = 15.0

    def __post_init__(self) -> None:
        api_version(self.api_version)  # validates the name
        if (self.unix_socket is None) == (self.url is None):
            raise ValueError("slurm rest: set exactly one of unix_socket or url")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"slurm rest: url must start with http:// or https://, got {self.url!r}")
        if self.token is not None and self.token_file is not None:
            raise ValueError("slurm rest: set token or token_file, not both")
        if self.timeout_s <= 0:
            raise ValueError("slurm rest: timeout_s must be positive")

    @property
    def endpoint(self) -> str:
        return f"unix:{self.unix_socket}" if self.unix_socket else str(self.url)

    def current_token(self) -> str | None:
        if self.token_file is not None:
            text = Path(self.token_file).read_text().strip()
            # Accept the `SLURM_JWT=…` line `scontrol token` prints as well as the bare token.
            return text.split("=", 1)[1] if text.startswith("SLURM_JWT=") else text
        return self.token

    def auth_headers(self) -> dict[str, str]:
        token = self.current_token()
        if not token:
            return {}
        user = self.user_name
        if user is None:
            try:
                user = str(unverified_claims(token).get("sun") or "") or None
            except ValueError:
                user = None
        headers = {"X-SLURM-USER-TOKEN": token}
        if user:
            headers["X-SLURM-USER-NAME"] = user
        return headers

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, default_socket: str | None = None) -> SlurmRestSettings:
        """Settings from ``MUXFLOW_SLURM_*`` variables (and ``SLURM_JWT``); called by entry points only."""
        url = env.get(ENV_REST_URL) or None
        sock = env.get(ENV_REST_SOCKET) or (None if url else default_socket)
        return cls(
            api_version=env.get(ENV_API_VERSION) or DEFAULT_API_VERSION,
            unix_socket=sock,
            url=url,
            user_name=env.get(ENV_USER) or None,
            token=None if env.get(ENV_TOKEN_FILE) else (env.get(ENV_TOKEN) or None),
            token_file=env.get(ENV_TOKEN_FILE) or None,
        )
