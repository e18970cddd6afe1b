"""What MuxFlow asks of Slurm, independent of the slurmrestd API version.

A :class:`BatchJob` or :class:`JobUpdate` is plain data; the per-version payload
builders in :mod:`executors.slurm.api` turn it into a request body (docs/DESIGN.md §3
steps 1 and 6: submit held, then place with ``--gres=mps:<pct>`` on a node and
release).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from executors.slurm.errors import PayloadError
from executors.slurm.hostlist import expand_hostlist, parse_gres

# The POSIX signals slurmrestd v0.0.38 accepts by name (its ``signal`` enum).
SIGNAL_NAMES = ("HUP", "INT", "QUIT", "ABRT", "KILL", "ALRM", "TERM", "USR1", "USR2",
                "URG", "CONT", "STOP", "TSTP", "TTIN", "TTOU")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JOB_NAME_BAD = re.compile(r"[\n\r\t]")
# ``sbatch --dependency``: one or more ``<type>:<job id>[:<job id>…]`` joined by ``,`` (all) or ``?`` (any).
_DEPENDENCY = re.compile(r"^(after|afterany|afterok|afternotok|aftercorr|afterburstbuffer)(:\d+)+"
                         r"([,?](after|afterany|afterok|afternotok|aftercorr|afterburstbuffer)(:\d+)+)*$|^singleton$")
DEFAULT_ENVIRONMENT = MappingProxyType({"PATH": "/usr/local/bin:/usr/bin:/bin"})


def signal_name(name: str) -> str:
    """``"SIGUSR1"``/``"usr1"`` → ``"USR1"``; unknown names raise :class:`PayloadError`."""
    n = name.strip().upper()
    n = n[3:] if n.startswith("SIG") else n
    if n not in SIGNAL_NAMES:
        raise PayloadError(f"signal: unknown signal {name!r}; expected one of {', '.join(SIGNAL_NAMES)}")
    return n


def _check_gres(text: str, what: str) -> str:
    try:
        items = parse_gres(text)
    except ValueError as exc:
        raise PayloadError(f"{what}: {exc}") from exc
    if not items or any(g.count <= 0 for g in items):
        raise PayloadError(f"{what}: expected e.g. 'mps:30' or 'gpu:t4:1', got {text!r}")
    return text


def _check_nodelist(text: str, what: str) -> str:
    try:
        names = expand_hostlist(text)
    except ValueError as exc:
        raise PayloadError(f"{what}: {exc}") from exc
    if not names:
        raise PayloadError(f"{what}: empty node list")
    return text


@dataclass(frozen=True)
class JobSignal:
    """``sbatch --signal=[B:]<name>[@<before_end_s>]``: warn a job before its time limit.

    ``batch_only`` (the ``B:`` prefix: signal the batch shell only) cannot be
    expressed in v0.0.38, whose parser rejects the prefix; see docs/SLURM.md.
    """

    name: str
    before_end_s: int | None = None
    batch_only: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", signal_name(self.name))
        if self.before_end_s is not None and not (0 <= self.before_end_s <= 0xFFFF):
            raise PayloadError(f"signal: before_end_s must be within 0..65535, got {self.before_end_s}")


@dataclass(frozen=True)
class BatchJob:
    """A batch job to submit. ``gres_per_node`` is in ``--gres`` form (``mps:30``)."""

    name: str
    script: str
    partition: str
    environment: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_ENVIRONMENT))
    working_dir: str | None = None
    hold: bool = False
    gres_per_node: str | None = None
    nodelist: str | None = None
    requeue: bool = True
    signal: JobSignal | None = None
    stdout_path: str | None = None
    stderr_path: str | None = None
    time_limit_min: int | None = None
    comment: str | None = None
    dependency: str | None = None  # ``afterok:41`` etc.: the job stays pending until it is satisfied

    def __post_init__(self) -> None:
        if not self.name or _JOB_NAME_BAD.search(self.name):
            raise PayloadError(f"name: must be a non-empty single line, got {self.name!r}")
        if not self.script.startswith("#!"):
            raise PayloadError("script: must start with an interpreter line ('#!/bin/sh')")
        if not self.partition:
            raise PayloadError("partition: must be set")
        for key, value in self.environment.items():
            if not _ENV_NAME.match(key):
                raise PayloadError(f"environment: bad variable name {key!r}")
            if not isinstance(value, str):
                raise PayloadError(f"environment: value of {key} must be a string")
        object.__setattr__(self, "environment", MappingProxyType(dict(self.environment)))
        if self.gres_per_node is not None:
            _check_gres(self.gres_per_node, "gres_per_node")
        if self.nodelist is not None:
            _check_nodelist(self.nodelist, "nodelist")
        if self.time_limit_min is not None and self.time_limit_min <= 0:
            raise PayloadError(f"time_limit_min: must be positive, got {self.time_limit_min}")
        if self.working_dir is not None and not self.working_dir.startswith("/"):
            raise PayloadError(f"working_dir: must be absolute, got {self.working_dir!r}")
        if self.dependency is not None and not _DEPENDENCY.match(self.dependency):
            raise PayloadError(f"dependency: expected e.g. 'afterok:41' or 'afterany:41:42', got {self.dependency!r}")


@dataclass(frozen=True)
class JobUpdate:
    """Changes to a pending job: where it may run, its partition, its GRES, its comment (where MuxFlow writes the
    signed plan, executors.slurm.plan), and hold (True) / release (False).

    ``eligible_now`` clears a begin-time delay: Slurm holds a requeued job
    back for about two minutes (EligibleTime = requeue + 120 s), which a
    migration must not wait for.
    """

    nodelist: str | None = None
    gres_per_node: str | None = None
    hold: bool | None = None
    comment: str | None = None
    eligible_now: bool = False
    partition: str | None = None

    @property
    def empty(self) -> bool:
        return (self.nodelist is None and self.gres_per_node is None and self.hold is None and self.comment is None
                and not self.eligible_now and self.partition is None)

    def __post_init__(self) -> None:
        if self.empty:
            raise PayloadError("job update: nothing to change")
        if self.gres_per_node is not None:
            _check_gres(self.gres_per_node, "gres_per_node")
        if self.nodelist is not None:
            _check_nodelist(self.nodelist, "nodelist")
