"""The Slurm cluster backend's profiling and sampling (``SlurmBackend.profile_new_jobs`` /
``collect_samples`` delegate here): the controllers of this package with the profile partition
as executor. Settings come from ``MUXFLOW_PROFILING_*`` / ``MUXFLOW_SAMPLING_*`` when the step
runs (docs/PROFILING.md), unless given.
"""

from __future__ import annotations

import logging
import os

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


def profile_on_slurm(backend, store: Store, seed: int, settings: ProfilingSettings | None = None) -> ProfilingSummary:
    settings = settings or ProfilingSettings.from_env(os.environ)
    summary = SoloProfiler(store, _executor(backend, settings.partition), settings, seed).run()
    log.info("solo profiling: %d profiled, %d failed, %d still profiling", len(summary.profiled),
             len(summary.failed), len(summary.in_progress))
    return summary


def sample_on_slurm(backend, store: Store, per_type: int, seed: int,
                    settings: SamplingSettings | None = None) -> tuple[dict[str, int], SamplingSummary]:
    """Measure within the budget on GPU types below ``per_type`` training samples; then (bootstrap) top up
    with simulated samples. Returns training samples added per GPU type, and the run summary."""
    settings = settings or SamplingSettings.from_env(os.environ)
    ex = _executor(backend, settings.partition)
    with store.session() as s:
        known = repo.gpu_type_names(s)
        below = {g for g in known if repo.sample_count(s, g) < per_type}
        before = {g: repo.sample_count(s, g) for g in known}
    try:
        types = [g for g in partition_gpu_types(ex.client, settings.partition) if g in below]
    except Exception as exc:  # Slurm down: the bootstrap below still runs
        log.warning("co-location sampling skipped: cannot list the %s partition: %s", settings.partition, exc)
        types = []
    summary = ColocationSampler(store, ex, settings, seed).run(types) if types else SamplingSummary()
    if settings.bootstrap_simulated:
        from executors import steps
        from executors.simulated.calibration import default_catalog

        steps.collect_samples(store, default_catalog(), per_type, seed, top_up=True)
    with store.session() as s:
        added = {g: repo.sample_count(s, g) - before[g] for g in sorted(known)}
    return added, summary
