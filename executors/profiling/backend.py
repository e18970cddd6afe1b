"""Profiling and sampling as a cluster backend does them (``SlurmBackend.profile_new_jobs`` /
``collect_samples`` delegate here): the controllers of this package with an executor — the profile
partition for Slurm. Settings come from ``MUXFLOW_PROFILING_*`` / ``MUXFLOW_SAMPLING_*`` when the
step runs (docs/PROFILING.md), unless given.
"""

from __future__ import annotations

import logging
import os

from executors.profiling.runs import ProfileExecutor
from executors.profiling.sampling import ColocationSampler, SamplingSummary
from executors.profiling.settings import ProfilingSettings, SamplingSettings
from executors.profiling.slurm_exec import ScontrolScripts, SlurmProfileExecutor
from executors.profiling.solo import ProfilingSummary, SoloProfiler
from executors.store import repo
from executors.store.db import Store

log = logging.getLogger(__name__)


def _executor(backend, partition: str) -> SlurmProfileExecutor:
    client = backend.client_factory()
    # the client's requeue fallback knows the slurm.conf the scontrol commands need
    conf = getattr(getattr(client, "requeue_fallback", None), "slurm_conf", None)
    return SlurmProfileExecutor(client, ScontrolScripts(conf), partition=partition,
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


def sample_with(executor: ProfileExecutor, gpu_types: list[str], store: Store, per_type: int, seed: int,
                settings: SamplingSettings) -> tuple[dict[str, int], SamplingSummary]:
    """Measure within the budget on the GPU types (of ``gpu_types``) below ``per_type`` training samples;
    then, with ``bootstrap_simulated``, top every GPU type up to ``per_type`` with simulated samples.
    Returns the training samples added per GPU type, and the runs' summary."""
    with store.session() as s:
        known = repo.gpu_type_names(s)
        before = {g: repo.sample_count(s, g) for g in known}
    types = [g for g in gpu_types if g in known and before[g] < per_type]
    summary = ColocationSampler(store, executor, settings, seed).run(types) if types else SamplingSummary()
    if settings.bootstrap_simulated:
        from executors import steps
        from executors.simulated.calibration import default_catalog

        steps.collect_samples(store, default_catalog(), per_type, seed, top_up=True)
    with store.session() as s:
        added = {g: repo.sample_count(s, g) - before[g] for g in sorted(known)}
    return added, summary


def profile_on_slurm(backend, store: Store, seed: int, settings: ProfilingSettings | None = None) -> ProfilingSummary:
    settings = settings or ProfilingSettings.from_env(os.environ)
    return profile_with(_executor(backend, settings.partition), store, seed, settings)


def sample_on_slurm(backend, store: Store, per_type: int, seed: int,
                    settings: SamplingSettings | None = None) -> tuple[dict[str, int], SamplingSummary]:
    settings = settings or SamplingSettings.from_env(os.environ)
    ex = _executor(backend, settings.partition)
    try:
        types = partition_gpu_types(ex.client, settings.partition)
    except Exception as exc:  # Slurm down: the bootstrap still runs
        log.warning("co-location sampling skipped: cannot list the %s partition: %s", settings.partition, exc)
        types = []
    return sample_with(ex, types, store, per_type, seed, settings)
