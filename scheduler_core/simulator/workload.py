"""From a Philly-format trace to the simulator's single-GPU offline jobs.

Documented choices (docs/EVALUATION.md):

- **Scale factor > 1.** A job of scale factor *k* becomes *k* independent
  single-GPU workers, each running 1/*k* of the job's steps: the same work,
  without gang scheduling or communication. MuxFlow places one offline worker
  per shared GPU and the paper does not say how it placed the trace's
  distributed jobs; this keeps every job's GPU work while every policy sees the
  same single-GPU units.
- **Repetition** (paper §7.1). The trace is repeated until ``jobs`` workers
  exist (copies arrive up to 30 minutes after the original, from the
  ``trace-repeat`` stream), then cut to exactly ``jobs`` in arrival order.
- **Time compression.** Arrivals are scaled linearly into ``arrival_hours``;
  solo durations (steps over measured solo steps/s on the reference GPU) are
  scaled by one factor and clipped to [``MIN_JOB_S``, ``max_job_hours``], the
  factor chosen so that the mean *after* the clip is ``mean_job_hours``
  (:func:`scale_durations`; the paper fits its traces into 24 hours the same
  way; relative sizes are kept between the clips). Scaling the mean first and
  clipping after would shrink a heavy-tailed trace: its many short jobs land on
  the floor and its long ones on the cap, and the mean falls well below the
  one asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler_core.simulator.config import SimConfig
from scheduler_core.trace import TraceError, TraceJob
from scheduler_core.workloads import WorkloadCatalog


@dataclass(frozen=True, eq=False)
class JobTable:
    """One row per simulated single-GPU offline job, sorted by arrival."""

    job_type: np.ndarray  # (m,) int index into ``types``
    types: list[str]
    arrival_s: np.ndarray  # (m,) float, from simulation start
    total_steps: np.ndarray  # (m,) float
    mem_bytes: np.ndarray  # (m,) int64
    trace_line: np.ndarray  # (m,) int: line of the trace the job came from
    worker: np.ndarray  # (m,) int: worker index within its trace job (scale factor split)
    copy: np.ndarray  # (m,) int: repetition of the trace

    @property
    def size(self) -> int:
        return int(self.arrival_s.shape[0])


MIN_JOB_S = 60.0  # shortest solo duration after scaling


def scale_durations(solo_s: np.ndarray, mean_s: float, floor_s: float, cap_s: float) -> np.ndarray:
    """``clip(f · solo_s, floor_s, cap_s)`` with the one factor ``f`` that makes its mean ``mean_s``.

    The clipped mean is continuous and non-decreasing in ``f`` (``floor_s`` when every job is at the
    floor, ``cap_s`` when every job is at the cap), so bisection on ``log f`` finds it. A mean at or
    beyond either clip puts every job there.
    """
    x = np.asarray(solo_s, dtype=float)
    if not (x.size and np.all(np.isfinite(x)) and np.all(x >= 0) and x.max() > 0):
        raise ValueError("solo durations must be finite, non-negative and not all 0")
    if not 0 < floor_s <= cap_s:
        raise ValueError(f"need 0 < floor ({floor_s}) <= cap ({cap_s})")
    if mean_s <= floor_s:
        return np.full(x.shape, floor_s)
    if mean_s >= cap_s:
        return np.full(x.shape, cap_s)
    lo, hi = np.log(floor_s / x.max()), np.log(cap_s / x[x > 0].min())  # mean floor_s at lo, cap_s at hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if np.clip(x * np.exp(mid), floor_s, cap_s).mean() < mean_s:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return np.clip(x * np.exp(0.5 * (lo + hi)), floor_s, cap_s)


def build_jobs(trace: list[TraceJob], catalog: WorkloadCatalog, cfg: SimConfig,
               rng: np.random.Generator) -> JobTable:
    if not trace:
        raise ValueError("the trace has no jobs")
    for tj in trace:
        if tj.job_type not in catalog.offline:
            raise TraceError(tj.line_no, f"job type {tj.job_type!r} has no workload profile "
                                         f"(known: {', '.join(sorted(catalog.offline))})")
    types = sorted({tj.job_type for tj in trace})
    tpos = {t: i for i, t in enumerate(types)}
    # Scale-factor split: k workers with 1/k of the steps each.
    base_type, base_arr, base_steps, base_line, base_worker = [], [], [], [], []
    for tj in trace:
        for w in range(tj.scale_factor):
            base_type.append(tpos[tj.job_type])
            base_arr.append(tj.arrival_s)
            base_steps.append(tj.total_steps / tj.scale_factor)
            base_line.append(tj.line_no)
            base_worker.append(w)
    n_base = len(base_type)
    target = cfg.jobs if cfg.jobs is not None else n_base
    copies = -(-target // n_base)
    reps = np.repeat(np.arange(copies), n_base)
    arr = np.tile(np.asarray(base_arr, dtype=float), copies)
    jitter = rng.uniform(0.0, 1800.0, size=arr.size)
    arr = arr + np.where(reps > 0, jitter, 0.0)
    order = np.argsort(arr, kind="stable")[:target]
    job_type = np.tile(np.asarray(base_type, dtype=np.int64), copies)[order]
    arr, reps = arr[order], reps[order]
    steps = np.tile(np.asarray(base_steps, dtype=float), copies)[order]
    line = np.tile(np.asarray(base_line, dtype=np.int64), copies)[order]
    worker = np.tile(np.asarray(base_worker, dtype=np.int64), copies)[order]
    # Time compression of arrivals.
    span = float(arr.max() - arr.min())
    arrival = (arr - arr.min()) * (cfg.arrival_hours * 3600.0 / span) if span > 0 else np.zeros_like(arr)
    # Duration scaling on the reference GPU's measured solo speed.
    sps = np.array([catalog.offline[t].solo_steps_per_s_p100 for t in types])[job_type]
    solo_s = steps / sps
    scaled = scale_durations(solo_s, cfg.mean_job_hours * 3600.0, MIN_JOB_S, cfg.max_job_hours * 3600.0)
    mem = np.array([catalog.offline[t].mem_bytes for t in types], dtype=np.int64)[job_type]
    return JobTable(job_type, types, arrival, scaled * sps, mem, line, worker, reps)
