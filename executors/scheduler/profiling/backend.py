"""Profiling and sampling as a deployment does them: the controllers of this package with an executor — the
profile partition for Slurm (:class:`SlurmProfiler`, the :class:`executors.cluster.Profiler` of a Slurm
deployment). Settings are given (the deployment's, pipelines/settings.py); ``MUXFLOW_PROFILING_*`` /
``MUXFLOW_SAMPLING_*`` are read only by callers that have none (docs/PROFILING.md).

On Slurm, a user's job is profiled in its own Slurm job (:mod:`executors.scheduler.profiling.windows`: Slurm runs it as its
owner), and MuxFlow's own reference workloads (co-location samples) run as the unprivileged reference account,
through a client with that account's token: neither ever runs with MuxFlow's identity (docs/SECURITY.md).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from executors.scheduler.profiling.runs import ProfileExecutor
from executors.scheduler.profiling.sampling import ColocationSampler, SamplingSummary
from executors.scheduler.profiling.settings import ProfilingSettings, SamplingSettings
from executors.scheduler.profiling.slurm_exec import SlurmProfileExecutor
from executors.scheduler.profiling.solo import ProfilingSummary, SoloProfiler
from executors.scheduler.profiling.windows import SlurmProfileWindows, WindowProfiler
from executors.scheduler.slurm.config import SlurmConfig
from executors.slurm.errors import SlurmError
from executors.slurm.jwt import unverified_claims
from executors.store import repo
from executors.store.db import Store

log = logging.getLogger(__name__)


class NoReferenceAccount(RuntimeError):
    """Sampling on Slurm without the unprivileged account MuxFlow's reference workloads run as."""


def slurm_executor(backend, partition: str) -> SlurmProfileExecutor:
    """The profile partition as an executor of MuxFlow's own reference workloads, submitted as the reference account
    (never as MuxFlow's identity)."""
    if backend.reference_client_factory is None:
        raise NoReferenceAccount("co-location sampling on Slurm needs slurm_reference_jwt_file (MUXFLOW_SLURM_"
                                 "REFERENCE_JWT_FILE): a token of the unprivileged account MuxFlow's reference "
                                 "workloads run as (docs/SECURITY.md)")
    client = backend.reference_client_factory()
    return SlurmProfileExecutor(client, partition=partition, retry_deadline_s=backend.retry_deadline_s,
                                report_owner=_uid_of_token_user(client))


def _uid_of_token_user(client) -> int | None:
    """The uid of the account a REST client's token names, on this host (None: unknown here)."""
    import pwd


    try:
        name = client.settings.user_name or unverified_claims(client.settings.current_token() or "").get("sun")
        return pwd.getpwnam(str(name)).pw_uid if name else None
    except (KeyError, ValueError, OSError, SlurmError):
        return None


def window_executor(backend, settings: ProfilingSettings) -> SlurmProfileWindows:
    """The profile partition as the place users' jobs are profiled in place (their profiling windows)."""
    key = backend.plan_key() if callable(backend.plan_key) else backend.plan_key
    return SlurmProfileWindows(backend.client_factory(), key, partition=settings.partition,
                               retry_deadline_s=backend.retry_deadline_s)


def partition_gpu_types(client, partition: str) -> list[str]:
    """GPU types of the nodes in ``partition`` that can take work."""
    return sorted({n.gpu_type for n in client.list_nodes()
                   if partition in n.partitions and n.gpu_type and n.usable})


def profile_with(executor: ProfileExecutor, store: Store, seed: int, settings: ProfilingSettings) -> ProfilingSummary:
    summary = SoloProfiler(store, executor, settings, seed).run()
    log.info("solo profiling: %d profiled, %d failed, %d still profiling", len(summary.profiled),
             len(summary.failed), len(summary.in_progress))
    return summary


def sample_with(executor: ProfileExecutor | None, gpu_types: list[str], store: Store, per_type: int, seed: int,
                settings: SamplingSettings) -> tuple[dict[str, int], SamplingSummary]:
    """Measure within the budget on the GPU types (of ``gpu_types``) below ``per_type`` training samples;
    then, with ``bootstrap_simulated``, top every GPU type up to ``per_type`` with simulated samples.
    Returns the training samples added per GPU type, and the runs' summary."""
    with store.session() as s:
        known = repo.gpu_type_names(s)
        before = {g: repo.sample_count(s, g) for g in known}
    types = [g for g in gpu_types if g in known and before[g] < per_type]
    summary = (ColocationSampler(store, executor, settings, seed).run(types) if types and executor is not None
               else SamplingSummary())
    if settings.bootstrap_simulated:
        from executors.data.calibration import default_catalog
        from executors.simulated.profiler import collect_samples

        collect_samples(store, default_catalog(), per_type, seed, top_up=True)
    with store.session() as s:
        added = {g: repo.sample_count(s, g) - before[g] for g in sorted(known)}
    return added, summary


def profile_on_slurm(backend, store: Store, seed: int, settings: ProfilingSettings | None = None) -> ProfilingSummary:
    """New jobs profiled in their own profiling windows on the profile partition."""
    settings = settings or ProfilingSettings.from_env(os.environ)
    summary = WindowProfiler(store, window_executor(backend, settings), settings, seed).run()
    log.info("solo profiling: %d profiled, %d failed, %d still profiling", len(summary.profiled),
             len(summary.failed), len(summary.in_progress))
    return summary


def sample_on_slurm(backend, store: Store, per_type: int, seed: int,
                    settings: SamplingSettings | None = None) -> tuple[dict[str, int], SamplingSummary]:
    settings = settings or SamplingSettings.from_env(os.environ)
    try:
        ex = slurm_executor(backend, settings.partition)
        types = partition_gpu_types(ex.client, settings.partition)
    except NoReferenceAccount as exc:
        log.warning("co-location sampling on Slurm skipped: %s", exc)
        ex, types = None, []
    except Exception as exc:  # Slurm down: the bootstrap still runs
        log.warning("co-location sampling skipped: cannot list the %s partition: %s", settings.partition, exc)
        ex, types = None, []
    return sample_with(ex, types, store, per_type, seed, settings)


@dataclass
class SlurmProfiler:
    """Solo profiles and co-location samples on Slurm's profile partition (:class:`executors.cluster.Profiler`)."""

    client_factory: Callable[[], object]
    retry_deadline_s: float = 60.0
    simulated = False  # profiles measured on the partition's nodes (GPU metrics simulated where they have no GPU)
    profiling: ProfilingSettings = field(default_factory=ProfilingSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    plan_key: bytes | Callable[[], bytes] = b""  # signs the profiling windows' plans (read when first needed)
    # MuxFlow's reference workloads run as this client's (unprivileged) account; None: no sampling on Slurm
    reference_client_factory: Callable[[], object] | None = None

    @classmethod
    def from_config(cls, config: SlurmConfig) -> SlurmProfiler:
        """The profiler of a deployment's Slurm configuration (its client, retry deadline, profiling and sampling,
        plan key and reference account)."""
        return cls(config.client, config.retry_deadline_s, config.profiling, config.sampling, config.plan_key,
                   config.reference_client if config.reference_jwt_file else None)

    def profile_new_jobs(self, store: Store, seed: int) -> int:
        """New jobs profiled in their own windows on the profile partition (docs/PROFILING.md); how many were."""
        return len(profile_on_slurm(self, store, seed, self.profiling).profiled)

    def collect_samples(self, store: Store, per_type: int, seed: int) -> dict[str, int]:
        """Samples measured on the profile partition within the GPU-time budget, topped up with simulated ones
        while a GPU type has fewer than ``per_type``; how many were added per GPU type."""
        return sample_on_slurm(self, store, per_type, seed, self.sampling)[0]
