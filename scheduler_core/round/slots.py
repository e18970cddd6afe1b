"""Several offline jobs per GPU: slots, their MPS shares, memory quotas and online budget (beyond the paper).

The paper shares each GPU between one online service and one offline job and
names several offline jobs per GPU as future work (§8); Mudi runs up to three
training jobs beside a service, splitting the offline share evenly (§5.5).
Here a round opens ``b_i`` *slots* on GPU ``i`` (1 ≤ b_i ≤ ``max_jobs_per_gpu``)
and every slot of a GPU is alike, so the matching stays a b-matching — GPU
``i`` takes up to ``b_i`` jobs, each pair with its own weight — solved exactly
and certified like the one-job matching.

A slot of a GPU with offline share ``P`` (dynamic SM, §4.3) and memory quota
``Q`` has:

- MPS share ``⌊P / b⌋`` and xCUDA memory quota ``⌊Q / b⌋``: the jobs' shares
  and quotas together stay within the GPU's, whoever takes the slots;
- an online budget of ``allowance / b``, checked against the job's predicted
  slowdown *at the whole offline share P* (each job as if it alone used every
  offline SM: an over-estimate of its part), so that the slowdowns of all the
  slots add up to at most the allowance — a conservative composition rule;
- throughput = the pair prediction at ``⌊P / b⌋`` × ``corunner_efficiency`` per
  other slot (the throughput an offline job keeps beside another offline job
  under MPS isolation, a constant).

``muxflow simulate composition`` scores this rule against the simulated GPU
running the jobs together (:mod:`scheduler_core.interference.composition`; docs/EVALUATION.md):
it under-promises throughput and its slowdown bound is almost never below the truth.

With ``b_i = 1`` a slot is the paper's pair, with its share fallback levels.
How many slots a GPU gets is a rule (:func:`slot_counts`): one, unless the
round has more jobs than one-slot capacity; then the GPUs with the largest
offline share are split, just enough for every job, and a GPU already running
several jobs keeps its slots (no restart merely to merge them). A split that
does not pay by the predictions is undone (:func:`worthwhile_splits`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler_core.domain import GpuHealth, JobCandidate


@dataclass(frozen=True, eq=False)
class SlotLayout:
    """Slot columns of a round's graph: each belongs to one eligible GPU."""

    gpu: np.ndarray  # (c,) index of its GPU among the eligible ones
    count: np.ndarray  # (c,) slots opened on that GPU (b)
    first: np.ndarray  # (n,) first slot column of each GPU

    @property
    def n_slots(self) -> int:
        return int(self.gpu.size)

    @classmethod
    def of(cls, counts: np.ndarray) -> SlotLayout:
        counts = np.asarray(counts, dtype=np.int64)
        gpu = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
        first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if counts.size else counts
        return cls(gpu, counts[gpu], first)


def running_per_gpu(elig, jobs: list[JobCandidate]) -> np.ndarray:
    """(n,) how many of the round's jobs run on each eligible GPU."""
    pos = {g.gpu_id: i for i, g in enumerate(elig)}
    out = np.zeros(len(elig), dtype=np.int64)
    for job in jobs:
        i = pos.get(job.current_gpu_id) if job.current_gpu_id is not None else None
        if i is not None:
            out[i] += 1
    return out


def slot_counts(elig, jobs: list[JobCandidate], offline_pct: np.ndarray, quota_bytes: np.ndarray,
                cfg) -> np.ndarray:
    """(n,) slots per eligible GPU for this round (see the module docstring)."""
    n = len(elig)
    k_max = cfg.max_jobs_per_gpu
    counts = np.ones(n, dtype=np.int64)
    if k_max <= 1 or n == 0:
        return counts
    min_pct = cfg.sm.min_pct
    # A GPU can take b slots only if each keeps at least the policy's smallest share.
    fits = np.clip(np.asarray(offline_pct, dtype=np.int64) // max(1, min_pct), 1, k_max)
    healthy = np.array([g.health == GpuHealth.HEALTHY for g in elig], dtype=bool)
    running = running_per_gpu(elig, jobs)
    # Jobs running together keep their slots (each its MPS share) as long as the shares allow.
    counts = np.clip(running, 1, np.where(healthy, fits, k_max))
    # Demand: jobs some eligible GPU could host at all (an allowed type, memory within a quota).
    types = {g.gpu_type for g in elig}
    largest = float(np.max(quota_bytes)) if n else 0.0
    demand = sum(1 for j in jobs if j.allowed_gpu_types & types and j.mem_bytes <= largest)
    need = demand - int(counts.sum())
    if need <= 0:
        return counts
    # Split the GPUs with the most offline SMs first: their slots keep the largest shares.
    order = np.lexsort((np.arange(n), -np.asarray(offline_pct, dtype=float)))
    for i in order:
        if need <= 0:
            break
        if not healthy[i] or fits[i] <= counts[i]:
            continue
        need -= int(fits[i] - counts[i])
        counts[i] = fits[i]
    return counts


def worthwhile_splits(counts: np.ndarray, running: np.ndarray, best_slot: np.ndarray,
                      best_alone: np.ndarray) -> np.ndarray:
    """(n,) slot counts after undoing the splits that do not pay.

    A GPU :func:`slot_counts` split for waiting jobs stays split into ``b`` slots only if ``b``
    jobs of the best class its slots can take (``best_slot``: the best feasible weight on one of
    its slots, −inf for none) add up to more predicted throughput than its best job alone
    (``best_alone``: the best weight with one slot). The slot rule's budget is conservative
    (docs/EVALUATION.md: composition), so a split GPU can be left with no feasible job at all,
    and a share ``⌊P / b⌋`` often yields less in all than ``P``. Slots held by running jobs stay.
    """
    keep_min = np.maximum(np.asarray(running, dtype=np.int64), 1)
    with np.errstate(invalid="ignore"):
        pays = np.asarray(best_slot, dtype=float) * counts > np.asarray(best_alone, dtype=float)
    return np.where((counts > keep_min) & ~pays, keep_min, counts)


def slot_shares(levels: np.ndarray, layout: SlotLayout, min_pct: int) -> tuple[np.ndarray, np.ndarray]:
    """(tput shares, slowdown shares), each (levels × slots), −1 where a slot has no such level.

    ``levels``: (levels × n) the one-job shares of each GPU (level 0 = its offline share P).
    A one-slot GPU keeps its levels. A slot of a GPU split ``b`` ways runs at ⌊P / b⌋
    (no fallback levels), and its online slowdown is predicted at P.
    """
    n_levels = levels.shape[0]
    g, b = layout.gpu, layout.count
    tput = levels[:, g].astype(np.int64).copy()
    slow = tput.copy()
    multi = b > 1
    if multi.any():
        whole = levels[0, g[multi]]
        share = whole // b[multi]
        ok = share >= min_pct
        tput[0, multi] = np.where(ok, share, -1)
        slow[0, multi] = np.where(ok, whole, -1)
        if n_levels > 1:
            tput[1:, multi] = -1
            slow[1:, multi] = -1
    return tput, slow


def keeps_share(job: JobCandidate, planned_pct: int, cfg, slots_on_gpu: int = 1) -> bool:
    """Whether a job staying on its GPU keeps its running MPS share (else it is restarted with the planned one).

    Alone on its GPU it keeps a share up to ``resize_threshold_pct`` above the planned one
    (SysMonitor protects the service meanwhile); beside other jobs only one no larger than
    its slot's, so the jobs' shares together stay within the GPU's offline share.
    """
    if job.current_sm_pct is None:
        return False
    if slots_on_gpu > 1:
        return job.current_sm_pct <= planned_pct
    return job.current_sm_pct - planned_pct <= cfg.resize_threshold_pct
