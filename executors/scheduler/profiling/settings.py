"""Settings of solo profiling and co-location sampling (docs/PROFILING.md).

Plain data, validated when built. ``from_env`` reads ``MUXFLOW_PROFILING_*`` /
``MUXFLOW_SAMPLING_*`` and is called by entry points (the CLI, the Slurm
backend when a pipeline step runs), never at import.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from executors.job.workloads.models import SIZES

METRICS_KINDS = ("auto", "nvml", "simulated")


class SettingsError(ValueError):
    """A profiling or sampling setting that cannot be used; the message names it."""


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise SettingsError(f"{name}: must be a positive number, got {value!r}")


def deadline_s(profile_seconds: float, bound_s: float) -> float:
    """When a run that has not stopped by itself is stopped: a margin before its bound, not before
    ``profile_seconds``."""
    return max(profile_seconds, bound_s - min(30.0, 0.1 * bound_s))


@dataclass(frozen=True)
class ProfilingSettings:
    """Solo profiling of new offline jobs on the profile partition (paper §6: < 10 minutes a job)."""

    bound_s: float = 600.0               # a run that has not ended this long after it started fails
    iterations: int = 20                 # measured iterations (after warm-up)
    warmup_iterations: int = 2
    profile_seconds: float = 120.0       # the runtime stops after this even if iterations are missing
    reuse_profiles: bool = False         # a job type profiled on a GPU type reuses that profile
    partition: str = "profile"
    metrics: str = "auto"                # auto: NVML where a GPU is visible, else the simulated model
    # shared by the MuxFlow host and the profile nodes; MuxFlow's alone (never /tmp: profiling.runs.prepare_run_dir)
    profile_dir: str = "/var/lib/muxflow/profiling"
    node_python: str = sys.executable    # the python with muxflow installed on the profile nodes
    wait_s: float | None = None          # how long one call waits for runs (None: the bound + queue time)
    max_queue_s: float = 3600.0          # a run not started on the partition by then fails
    poll_s: float = 1.0
    interval_ms: float = 50.0            # GPU metric sampling period during the run

    def __post_init__(self) -> None:
        _positive("bound_s", self.bound_s)
        _positive("profile_seconds", self.profile_seconds)
        _positive("max_queue_s", self.max_queue_s)
        _positive("poll_s", self.poll_s)
        _positive("interval_ms", self.interval_ms)
        if self.wait_s is not None and (not math.isfinite(self.wait_s) or self.wait_s < 0):
            raise SettingsError(f"wait_s: must be >= 0, got {self.wait_s!r}")
        if not isinstance(self.iterations, int) or self.iterations < 1:
            raise SettingsError(f"iterations: must be an integer >= 1, got {self.iterations!r}")
        if not isinstance(self.warmup_iterations, int) or self.warmup_iterations < 0:
            raise SettingsError(f"warmup_iterations: must be an integer >= 0, got {self.warmup_iterations!r}")
        if self.profile_seconds >= self.bound_s:
            raise SettingsError(f"profile_seconds ({self.profile_seconds}) must be below bound_s ({self.bound_s}): "
                                "the job must be able to stop by itself within the bound")
        if self.metrics not in METRICS_KINDS:
            raise SettingsError(f"metrics: expected one of {', '.join(METRICS_KINDS)}, got {self.metrics!r}")
        if not self.partition:
            raise SettingsError("partition: must not be empty")
        if not self.profile_dir.startswith("/"):
            raise SettingsError(f"profile_dir: must be an absolute path, got {self.profile_dir!r}")

    @property
    def deadline_s(self) -> float:
        """When the probe stops a job that has not stopped by itself (a margin before the bound)."""
        return deadline_s(self.profile_seconds, self.bound_s)

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: Any) -> ProfilingSettings:
        return replace(cls(), **overrides_from_env(cls, "MUXFLOW_PROFILING_", env), **overrides)


@dataclass(frozen=True)
class SamplingSettings:
    """Co-location sampling on the profile partition (paper §6: ~2,000 samples per GPU type)."""

    budget_gpu_s: float = 1800.0         # GPU time one collection may spend (30 GPU-minutes)
    window_s: float = 30.0               # length of each measurement (solo service, solo job, each SM %)
    setup_s: float = 20.0                # start-up of the processes per measurement (budget accounting)
    sm_pcts: tuple[int, ...] = (10, 20, 30, 40, 50, 60, 70, 80, 90)
    size: str = "gpu"                    # reference workload size (tiny on CPU test clusters)
    qps_scale: float = 1.0               # the service's mean QPS × this is the load measured
    bootstrap_simulated: bool = True     # top GPU types up with simulated samples until measured ones exist
    partition: str = "profile"
    metrics: str = "auto"
    profile_dir: str = "/var/lib/muxflow/profiling"
    node_python: str = sys.executable
    wait_s: float | None = None          # None: until every run's bound
    poll_s: float = 1.0
    mps: str = "auto"                    # auto: use MPS when a GPU and nvidia-cuda-mps-control exist; off

    def __post_init__(self) -> None:
        if not (math.isfinite(self.budget_gpu_s) and self.budget_gpu_s >= 0):
            raise SettingsError(f"budget_gpu_s: must be >= 0, got {self.budget_gpu_s!r}")
        _positive("window_s", self.window_s)
        _positive("qps_scale", self.qps_scale)
        _positive("poll_s", self.poll_s)
        if self.setup_s < 0:
            raise SettingsError(f"setup_s: must be >= 0, got {self.setup_s!r}")
        if not self.sm_pcts or any(not isinstance(p, int) or not 1 <= p <= 100 for p in self.sm_pcts):
            raise SettingsError(f"sm_pcts: integers within 1..100, got {self.sm_pcts!r}")
        if self.metrics not in METRICS_KINDS:
            raise SettingsError(f"metrics: expected one of {', '.join(METRICS_KINDS)}, got {self.metrics!r}")
        if self.mps not in ("auto", "off"):
            raise SettingsError(f"mps: expected auto or off, got {self.mps!r}")
        if not self.profile_dir.startswith("/"):
            raise SettingsError(f"profile_dir: must be an absolute path, got {self.profile_dir!r}")

        if self.size not in SIZES:
            raise SettingsError(f"size: expected one of {', '.join(SIZES)}, got {self.size!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: Any) -> SamplingSettings:
        return replace(cls(), **overrides_from_env(cls, "MUXFLOW_SAMPLING_", env), **overrides)


def overrides_from_env(cls: type, prefix: str, env: Mapping[str, str]) -> dict[str, Any]:
    """``<prefix><FIELD>`` for every field, parsed by the field's type."""
    out: dict[str, Any] = {}
    for f in fields(cls):
        raw = env.get(prefix + f.name.upper())
        if raw is None or raw.strip() == "":
            continue
        text = raw.strip()
        default = getattr(cls(), f.name)
        name = prefix + f.name.upper()
        try:
            if isinstance(default, bool):
                if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
                    raise ValueError(text)
                out[f.name] = text.lower() in ("1", "true", "yes")
            elif isinstance(default, int):
                out[f.name] = int(text)
            elif isinstance(default, float) or default is None:
                out[f.name] = float(text)
            elif isinstance(default, tuple):
                out[f.name] = tuple(int(x) for x in text.split(",") if x.strip())
            else:
                out[f.name] = text
        except ValueError:
            raise SettingsError(f"{name}: cannot parse {raw!r}") from None
    return out
