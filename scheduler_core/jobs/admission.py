"""Which jobs compete in a round when there are more than its GPUs can take: shortest remaining first.

The matching (paper §5) maximizes the summed normalized throughput of what it places. While
every job fits, that is the whole story. Under overload it is blind to how close each job is to
finishing: it keeps a long job running beside a queue of short ones, and the average job
completion time grows with every hour the short ones wait (Salus's SRTF wins there). Admission
restores the order that minimizes the average completion time on one machine — shortest
remaining processing time first (SRPT) — without giving up the matching:

- ``capacity`` is what the round can place: the eligible GPUs' offline slots.
- When more jobs than ``capacity × (1 + slack)`` wait or run, only that many compete, those with
  the shortest remaining solo time; the matching then places them for the most throughput (the
  slack leaves it room to choose and to fill GPUs where a short job does not fit).
- A running job keeps its place against waiting jobs unless they are clearly shorter: its
  remaining time counts ``preempt_ratio`` times (0.5: a job must have at most half its remaining
  work to displace it). A displaced job is checkpointed and waits (:class:`Action.EVICT` in the
  plan), as a migration's checkpoint half.
- Jobs whose remaining time is unknown count as the median of the known ones; when no job's is
  known nothing is trimmed and the round is the paper's.

Remaining time is the job's solo time for the work it has left: the simulator knows it from the
trace (as Salus's SRTF does); the pipeline derives it from the steps the user declared, the steps
the job has reported (its checkpoints and progress) and its profiled iteration time
(:func:`remaining_solo_s`), and leaves it unknown where those are missing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scheduler_core.domain import GpuCandidate, JobCandidate, OfflineFeatures
from scheduler_core.round.weights import eligible_gpus


@dataclass(frozen=True)
class AdmissionPolicy:
    # "srpt": trim to the shortest remaining under overload; "all": every job competes (the paper).
    order: str = "srpt"
    slack: float = 0.0
    preempt_ratio: float = 0.5

    def __post_init__(self) -> None:
        if self.order not in ("srpt", "all"):
            raise ValueError(f"admission order must be 'srpt' or 'all', got {self.order!r}")
        if not self.slack >= 0 or not math.isfinite(self.slack):
            raise ValueError("admission slack must be a finite number >= 0")
        if not 0.0 < self.preempt_ratio <= 1.0:
            raise ValueError("preempt_ratio must lie in (0, 1]")


def capacity(gpus: list[GpuCandidate], predictors, jobs_per_gpu: int) -> int:
    """Offline slots a round can fill: its eligible GPUs (:func:`~scheduler_core.round.weights.eligible_gpus`:
    a predictor for their type; Healthy, or Unhealthy keeping a running job) times the jobs each may host."""
    return len(eligible_gpus(gpus, predictors)) * jobs_per_gpu


def admit(jobs: list[JobCandidate], slots: int, policy: AdmissionPolicy) -> tuple[list[JobCandidate],
                                                                                   list[JobCandidate]]:
    """(competing, deferred): ``jobs`` split as described in the module docstring; both keep ``jobs``' order."""
    limit = int(math.ceil(slots * (1.0 + policy.slack)))
    if policy.order == "all" or len(jobs) <= limit:
        return list(jobs), []
    rem = np.array([np.nan if j.remaining_s is None else float(j.remaining_s) for j in jobs], dtype=float)
    known = np.isfinite(rem)
    if not known.any():
        return list(jobs), []
    rem = np.where(known, np.maximum(rem, 0.0), float(np.median(rem[known])))
    running = np.array([j.current_gpu_id is not None for j in jobs])
    key = np.where(running, rem * policy.preempt_ratio, rem)
    order = np.lexsort((np.arange(len(jobs)), key))  # shortest first, ties in queue order
    keep = np.zeros(len(jobs), dtype=bool)
    keep[order[:limit]] = True
    return [j for j, k in zip(jobs, keep) if k], [j for j, k in zip(jobs, keep) if not k]


def remaining_solo_s(total_steps: float | None, steps_done: float | None,
                     profiles: dict[str, OfflineFeatures]) -> float | None:
    """Seconds of work a job has left alone on its fastest profiled GPU type: the steps left times its
    shortest profiled iteration time. None (unknown) without a declared step count or a usable profile."""
    iters = [p.iter_time_s for p in profiles.values()
             if p.iter_time_s is not None and math.isfinite(p.iter_time_s) and p.iter_time_s > 0]
    if not iters or total_steps is None or not math.isfinite(total_steps) or total_steps <= 0:
        return None
    done = steps_done if steps_done is not None and math.isfinite(steps_done) else 0.0
    return max(0.0, float(total_steps) - max(0.0, float(done))) * min(iters)
