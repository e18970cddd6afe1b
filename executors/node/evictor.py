"""Eviction of offline work from a GPU, through the cluster interface.

``CallbackEvictor`` is the simulated path (the callback gets the GPU and the reason and
returns the jobs it stopped); ``SlurmEvictor`` requeues the GPU's offline Slurm jobs with
a ``requeue(slurm_job_id)`` callable — the Slurm dispatcher's requeue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evicted:
    job_id: int | None          # the feature store's offline job id, when known
    slurm_job_id: int | None = None
    ok: bool = True
    detail: str = ""


class Evictor(Protocol):
    def evict(self, gpu_id: int, reason: str) -> list[Evicted]:
        """Stop every offline job on ``gpu_id`` now; what was stopped (or failed to be)."""
        ...


class CallbackEvictor:
    def __init__(self, callback: Callable[[int, str], list[int] | None]):
        self._cb = callback

    def evict(self, gpu_id: int, reason: str) -> list[Evicted]:
        return [Evicted(j) for j in (self._cb(gpu_id, reason) or [])]


class SlurmEvictor:
    """``jobs_on_gpu(gpu_id) -> [(job_id | None, slurm_job_id)]``; ``requeue(slurm_job_id)`` does the work."""

    def __init__(self, jobs_on_gpu: Callable[[int], list[tuple[int | None, int]]], requeue: Callable[[int], object]):
        self._jobs_on_gpu = jobs_on_gpu
        self._requeue = requeue

    def evict(self, gpu_id: int, reason: str) -> list[Evicted]:
        return [self.evict_job(job_id, slurm_id) for job_id, slurm_id in self._jobs_on_gpu(gpu_id)]

    def evict_job(self, job_id: int | None, slurm_id: int) -> Evicted:
        """Stop one job (the xCUDA check evicts only the job that broke the plan, not its GPU's others)."""
        try:
            self._requeue(slurm_id)
            return Evicted(job_id, slurm_id)
        except Exception as exc:  # one failed requeue must not stop the others
            log.error("requeue of Slurm job %s failed: %s", slurm_id, exc)
            return Evicted(job_id, slurm_id, ok=False, detail=str(exc))


def store_jobs_on_gpu(store, with_slurm_id: bool = True) -> Callable[[int], list[tuple[int | None, int | None]]]:
    """RUNNING offline jobs placed on a GPU by the latest dispatched round, with their Slurm ids
    (only jobs that have one unless ``with_slurm_id`` is False)."""
    # imported here: the evictors themselves run where no database library is installed
    from executors.store.rounds import running_in_latest_dispatch

    def lookup(gpu_id: int) -> list[tuple[int | None, int | None]]:
        with store.session() as s:
            rows = running_in_latest_dispatch(s, [gpu_id])
        return [(r.job_id, None if r.slurm_job_id is None else int(r.slurm_job_id)) for r in rows
                if r.slurm_job_id is not None or not with_slurm_id]

    return lookup
