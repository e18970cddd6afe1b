"""Errors raised by the Slurm adapters, carrying Slurm's own messages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Slurm error numbers that slurmrestd reports in ``errors`` although the call
# did what was asked. ESLURM_JOB_HELD (2042) comes back with every submission
# made with ``hold``: "Job is in held state, pending scheduler release".
INFORMATIONAL_ERROR_NUMBERS = frozenset({2042})


@dataclass(frozen=True)
class SlurmErrorEntry:
    """One element of slurmrestd's ``errors`` (or ``warnings``) list."""

    message: str
    number: int | None = None
    description: str = ""
    source: str = ""

    @classmethod
    def parse(cls, raw: Any) -> SlurmErrorEntry:
        if not isinstance(raw, dict):
            return cls(message=str(raw))
        # v0.0.38 spells the number "error_number" or "error_code" depending on
        # the code path; v0.0.40 uses "error_number" throughout.
        number = raw.get("error_number", raw.get("error_code"))
        return cls(
            message=str(raw.get("error") or raw.get("description") or ""),
            number=int(number) if isinstance(number, int | float) else None,
            description=str(raw.get("description") or ""),
            source=str(raw.get("source") or ""),
        )

    @property
    def informational(self) -> bool:
        return self.number in INFORMATIONAL_ERROR_NUMBERS

    def __str__(self) -> str:
        text = self.message or "unknown error"
        if self.description and self.description != self.message:
            text = f"{text}: {self.description}"
        if self.number not in (None, 0, -1):
            text = f"{text} (slurm error {self.number})"
        return text


class SlurmError(Exception):
    """Base of every error the Slurm adapters raise."""


class SlurmRestError(SlurmError):
    """slurmrestd refused or failed a request; ``errors`` holds Slurm's messages.

    slurmrestd 22.05 answers a body it cannot parse with HTTP 200 and a filled
    ``errors`` list, so the HTTP status alone never decides success.
    """

    def __init__(self, method: str, path: str, status_code: int, errors: list[SlurmErrorEntry],
                 body_excerpt: str = ""):
        self.method = method
        self.path = path
        self.status_code = status_code
        self.errors = errors
        self.body_excerpt = body_excerpt
        detail = "; ".join(str(e) for e in errors) if errors else (body_excerpt or "no error message")
        super().__init__(f"{method} {path}: HTTP {status_code}: {detail}")

    @property
    def numbers(self) -> set[int]:
        return {e.number for e in self.errors if e.number is not None}


class SlurmAuthError(SlurmRestError):
    """slurmrestd rejected the credentials (HTTP 401/403)."""


class TokenFileError(SlurmError):
    """The JWT file cannot be used: missing, or open to others (a job or user who reads it acts as MuxFlow)."""


class SlurmTransportError(SlurmError):
    """slurmrestd could not be reached (socket missing, connection refused, timeout)."""


class SlurmUnsupported(SlurmError):
    """The configured OpenAPI version cannot express the requested operation."""


class PayloadError(SlurmError, ValueError):
    """A job spec that cannot be turned into a request body for the API version."""
