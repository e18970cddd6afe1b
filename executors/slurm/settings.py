"""How the REST client reaches slurmrestd: API version, transport (unix socket or TCP) and JWT credentials.

Built from the deployment's :class:`executors.scheduler.slurm.config.SlurmConfig` (or by the dev cluster for itself)."""

from __future__ import annotations

from dataclasses import dataclass

from executors.slurm.api import AUTO, DEFAULT_API_VERSION, api_version
from executors.slurm.errors import TokenFileError
from executors.slurm.jwt import unverified_claims
from executors.slurm.plan import read_private_file


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
        if self.api_version != AUTO:
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
            text = read_token_file(self.token_file)
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


def read_token_file(path: str) -> str:
    """A JWT file's token, refused (:class:`TokenFileError`) unless it is a regular file that only its owner (this
    user, or root) can read: whoever reads it acts in Slurm as the token's user."""
    return read_private_file(path, "JWT file", TokenFileError)
