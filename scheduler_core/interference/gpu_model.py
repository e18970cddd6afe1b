"""The simulated GPU: an online replica's load, an offline job at an MPS share, and what the device reports.

One model for every simulated path, on scalars or on arrays of GPUs:

- the per-GPU simulated cluster behind the Dagster pipeline (:mod:`executors.simulated.cluster`),
- the vectorized trace-driven simulator (:mod:`scheduler_core.simulator.fleet`),
- the node agent's simulated GPUs (``muxflow node-agent --simulated``), which drive it with the
  request rate scraped from the real replica and the placement Slurm really runs.

The chain (paper §2.2, §4.3, §7.1): the replica's request rate over its capacity on the GPU type
is its load; the load gives the replica's own utilization, SM activity, memory bandwidth and
latency (:mod:`scheduler_core.online.load`); an offline job at an MPS share co-runs through the
calibrated interference model (:func:`scheduler_core.interference.pairs.colocate`), which gives its
normalized throughput and the replica's slowdown; the device totals and the SM clock follow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np

from scheduler_core.domain import GpuTypeSpec
from scheduler_core.interference.pairs import (
    InterferenceParams,
    WorkloadTraits,
    colocate_terms,
    online_slowdown,
    share_contention,
)
from scheduler_core.online.load import (
    base_latency_ms,
    capacity_qps,
    latency_at_load_ms,
    load_at,
    sm_at_load_pct,
    util_at_load_pct,
)
from scheduler_core.workloads import OnlineFamily, WorkloadCatalog


def clock_frac(sm_activity_pct, clock_drop_frac):
    """SM clock as a fraction of its maximum: power-capped cards sag above 40 % SM activity."""
    return 1.0 - clock_drop_frac * np.maximum(0.0, (np.asarray(sm_activity_pct) / 100.0 - 0.4) / 0.6)


@dataclass(frozen=True)
class OnlineModel:
    """One online replica on one GPU type; every field a scalar or an array with one value per GPU."""

    capacity_qps: object      # requests/s at full load on this GPU type
    util_at_peak_pct: object
    sm_need: object           # SM fraction busy at full load
    mem_bw: object            # memory-bandwidth fraction at full load
    base_latency_ms: object   # service time alone on this GPU type, no queueing
    mem_bytes: object
    sensitivity: object       # interference traits of the family's analogue (scheduler_core.workloads)
    pressure: object

    @classmethod
    def of(cls, family: OnlineFamily, traits: WorkloadTraits, spec: GpuTypeSpec,
           mem_bytes: float | None = None) -> OnlineModel:
        """``family`` on ``spec``; ``traits`` its catalog traits; ``mem_bytes`` the replica's (default: the family's)."""
        return cls(capacity_qps(family, spec), family.gpu_util_at_peak_pct, family.sm_need_at_peak, traits.mem_bw,
                   base_latency_ms(family, spec), float(family.mem_bytes if mem_bytes is None else mem_bytes),
                   traits.sensitivity, traits.pressure)

    @classmethod
    def stack(cls, models: Sequence[OnlineModel]) -> OnlineModel:
        """One model over many GPUs (arrays), for the vectorized simulator."""
        return cls(*(np.array([getattr(m, f.name) for m in models], dtype=float) for f in fields(cls)))

    def take(self, idx) -> OnlineModel:
        return OnlineModel(*(np.asarray(getattr(self, f.name))[idx] for f in fields(self)))

    @property
    def traits(self) -> WorkloadTraits:
        return WorkloadTraits(self.sensitivity, self.pressure, self.sm_need, self.mem_bw)


@dataclass(frozen=True)
class OnlineAlone:
    """What the replica does at ``qps`` with the GPU to itself (its own share of the device)."""

    qps: object
    load: object
    util_pct: object
    sm_pct: object
    mem_bytes: object
    bw_pct: object
    latency_ms: object        # solo latency at this load

    def take(self, idx) -> OnlineAlone:
        return OnlineAlone(*(np.asarray(getattr(self, f.name))[idx] for f in fields(self)))


def online_alone(model: OnlineModel, qps) -> OnlineAlone:
    """The replica's own metrics at request rate ``qps`` (paper §2.2: load follows the request rate)."""
    load = load_at(qps, model.capacity_qps)
    return OnlineAlone(
        qps=qps, load=load, util_pct=util_at_load_pct(load, model.util_at_peak_pct),
        sm_pct=sm_at_load_pct(load, model.sm_need), mem_bytes=model.mem_bytes,
        bw_pct=100.0 * model.mem_bw * load, latency_ms=latency_at_load_ms(load, model.base_latency_ms),
    )


@dataclass(frozen=True)
class Shared:
    """Device totals with an offline job co-running, its normalized throughput and the replica's slowdown."""

    util_pct: object
    sm_pct: object
    mem_bytes: object
    bw_pct: object
    norm_tput: object         # the job's normalized throughput, after xCUDA's pacing
    slowdown: object          # ≥ 1: online latency = solo latency × slowdown
    pace: object = 1.0        # fraction of its kernels xCUDA let the job launch (1: unpaced)


# xCUDA's floor on an offline process's launch rate over what it asks for (executors/node/xcuda: min_rate
# 10 launches/s against a typical 1,000–2,000): a paced job never stops completely.
PACE_FLOOR = 0.01
# xCUDA's default target GPU load (XCUDA_TARGET_UTIL, executors/node/xcuda/src/config.c).
XCUDA_TARGET_UTIL = 0.9


def xcuda_pace(online_sm_pct, off_sm_used_frac, duty, norm_tput, target_util):
    """Fraction of its kernels xCUDA lets an offline job launch to hold the GPU's load at ``target_util``.

    The production xCUDA (executors/node/xcuda, :mod:`scheduler_core.guard.xcuda_control`) paces each offline
    process's kernel launches with a PID so that the GPU load ``U_GPU = U_SM · a_C`` stays at its
    target (default 0.9; ``a_C`` = 1 without clock information, the node agent's default). The PID
    settles in well under a second (20 ms periods), so over a minute its effect is its steady state:
    the job's SM footprint — linear in the fraction of time it runs kernels (:func:`_sm_footprint`) —
    scaled down until the GPU's SM activity is at the target, and no further than ``PACE_FLOOR``.
    ``target_util`` None: no pacing (1 everywhere).
    """
    return _pace(online_sm_pct, _sm_footprint(off_sm_used_frac, duty, norm_tput), target_util)


def _sm_footprint(off_sm_used_frac, duty, norm_tput):
    """SM activity (%) an offline job adds while it runs ``duty`` of the time: its usable SM fraction
    (min(share, its own need)) × its running time × (0.6 + 0.4 × its normalized throughput)."""
    return 100.0 * np.asarray(off_sm_used_frac) * np.asarray(duty) * (0.6 + 0.4 * np.asarray(norm_tput))


def _pace(online_sm_pct, full, target_util):
    """:func:`xcuda_pace` from the offline work's whole SM footprint ``full`` (%) on the GPU; ``target_util`` a
    number, or one per GPU (the node agent lowers a GPU's in an online burst, :mod:`scheduler_core.guard.burst`)."""
    if target_util is None:
        return np.ones(np.shape(np.asarray(online_sm_pct) + np.asarray(full)))
    room = 100.0 * np.asarray(target_util, dtype=float) - np.asarray(online_sm_pct, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        pace = np.where(full > 0, room / np.where(full > 0, full, 1.0), 1.0)
    return np.clip(pace, PACE_FLOOR, 1.0)


@dataclass(frozen=True)
class SharedJobs:
    """Several GPUs, each with its offline jobs: device totals and slowdown per GPU, throughput per job."""

    util_pct: np.ndarray      # (n,) per GPU
    sm_pct: np.ndarray
    mem_bytes: np.ndarray
    bw_pct: np.ndarray
    slowdown: np.ndarray      # (n,) ≥ 1: the replica's latency = solo latency × slowdown
    pace: np.ndarray          # (n,) the fraction of their kernels xCUDA lets the GPU's offline jobs launch
    norm_tput: np.ndarray     # (m,) per job, after pacing


def with_offline_jobs(online: OnlineAlone, model: OnlineModel, gpu, jobs: WorkloadTraits, sm_pct, duty,
                      job_mem_bytes, params: InterferenceParams = InterferenceParams(),
                      target_util: float | None = None) -> SharedJobs:
    """Offline jobs ``jobs`` (arrays, one entry per job) on GPUs ``gpu`` (index into the ``n`` GPUs of
    ``online`` and ``model``), each at its own MPS share, beside each GPU's replica.

    With one job per GPU this is :func:`with_offline` exactly. With several (beyond the paper; Mudi
    runs up to three beside a service), each job meets the online service as in the pair model and
    also its co-runners: their pressure (π · activity · the fraction of the time they run) adds to
    the online pressure in its throughput, at the contention of its share against theirs
    (:func:`scheduler_core.interference.pairs.share_contention`: memory-system contention only while the
    shares together fit in the SMs). The replica's slowdown takes the jobs' contention terms and SM
    footprints summed over the GPU, weighted by how much of the time each ran; its SM
    oversubscription counts the footprints together. xCUDA paces every job of a GPU alike, to hold
    the GPU's total SM activity at the target (:func:`xcuda_pace`). Device totals add the jobs'
    footprints (utilization as independent busy fractions). Co-runners' pressure uses their
    unpaced running time: an upper bound where xCUDA throttles.
    """
    g = np.asarray(gpu, dtype=np.int64)
    n = int(np.asarray(online.load).size)
    m = g.size
    sm_pct, duty = _vec(sm_pct, (m,)), _vec(duty, (m,))
    per = lambda x: _vec(x, (n,))  # noqa: E731
    load, on_sm, on_util = per(online.load), per(online.sm_pct), per(online.util_pct)
    p = np.clip(sm_pct / 100.0, 0.0, 1.0)
    need = _vec(jobs.sm_need, (m,))
    activity = np.minimum(p, need) / need
    # Co-runners: the GPU's summed pressure and shares, less the job's own.
    press = np.asarray(jobs.pressure, dtype=float) * activity * duty
    by = _ByGpu(g, n)
    press_gpu, share_gpu = by.sum(press), by.sum(p)
    others = share_gpu[g] - p
    corunner = share_contention(p, others, params) * (press_gpu[g] - press)
    on_tr = model.traits
    on_job = WorkloadTraits(*(per(v)[g] for v in (on_tr.sensitivity, on_tr.pressure, on_tr.sm_need, on_tr.mem_bw)))
    terms = colocate_terms(on_job, load[g], jobs, sm_pct, params, corunner)
    tput = terms.norm_tput
    used = np.minimum(sm_pct / 100.0, need)
    full = by.sum(_sm_footprint(used, duty, tput))
    pace = _pace(on_sm, full, target_util)
    ran = duty * pace[g]
    # The replica's slowdown: the jobs' terms weighted by their running time relative to the GPU's busiest.
    ran_max = by.max(ran)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(ran_max[g] > 0, ran / np.where(ran_max[g] > 0, ran_max[g], 1.0), 0.0)
    term, e_sum = by.sum(terms.online_term * w), by.sum(terms.e_off * w)
    slow = 1.0 + (online_slowdown(term, per(model.sm_need) * np.clip(load, 0.0, 1.0), e_sum, params) - 1.0) * ran_max
    # Device totals.
    idle = by.prod(1.0 - 0.95 * ran * np.minimum(1.0, tput / 0.6))
    sm_add = by.sum(_sm_footprint(used, ran, tput))
    bw_add = by.sum(100.0 * np.asarray(jobs.mem_bw, dtype=float) * ran * tput)
    mem_add = by.sum(_vec(job_mem_bytes, (m,)))
    util = 100.0 * (1.0 - (1.0 - on_util / 100.0) * idle)
    sm = np.minimum(100.0, on_sm + sm_add)
    bw = np.minimum(100.0, per(online.bw_pct) + bw_add)
    return SharedJobs(util, sm, per(online.mem_bytes) + mem_add, bw, slow, pace, tput * pace[g])


def _vec(x, shape: tuple) -> np.ndarray:
    """``x`` as a float array of ``shape`` (a scalar repeated); cheaper than ``np.broadcast_to`` on small arrays."""
    a = np.asarray(x, dtype=float)
    if a.shape == shape:
        return a
    return np.full(shape, a.item()) if a.size == 1 else np.broadcast_to(a, shape)


class _ByGpu:
    """Per-GPU sums, products and maxima of per-job values; the values themselves where every GPU has
    exactly one job, in order (the pair model: :func:`with_offline`), which is the same result."""

    def __init__(self, g: np.ndarray, n: int):
        self.g, self.n = g, n
        self.one_each = g.size == n and bool(np.array_equal(g, np.arange(n)))

    def _at(self, op, start: float, v) -> np.ndarray:
        v = _vec(v, self.g.shape)
        if self.one_each:
            return v
        out = np.full(self.n, start)
        op.at(out, self.g, v)
        return out

    def sum(self, v) -> np.ndarray:
        return self._at(np.add, 0.0, v)

    def prod(self, v) -> np.ndarray:
        return self._at(np.multiply, 1.0, v)

    def max(self, v) -> np.ndarray:
        return self._at(np.maximum, 0.0, v)


def with_offline(online: OnlineAlone, model: OnlineModel, job: WorkloadTraits, sm_pct, duty, job_mem_bytes,
                 params: InterferenceParams = InterferenceParams(), target_util: float | None = None) -> Shared:
    """An offline job with traits ``job`` at MPS share ``sm_pct`` beside the replica (paper §4.3).

    ``duty`` is the fraction of the time the job ran kernels (0 while it starts or loads its
    checkpoint): it scales its footprint and the slowdown it causes, not its throughput while running.
    ``target_util``: xCUDA's target GPU load (:func:`xcuda_pace`); the pace scales the job's footprint,
    the slowdown it causes and its throughput alike. None: no pacing. Scalars or arrays (one GPU and
    its job per element): :func:`with_offline_jobs` with one job per GPU.
    """
    parts = [*(getattr(online, f.name) for f in fields(online)), *(getattr(model, f.name) for f in fields(model)),
             *(getattr(job, f.name) for f in fields(job)), sm_pct, duty, job_mem_bytes]
    shape = np.broadcast_shapes(*(np.shape(x) for x in parts))
    flat = lambda x: _vec(x, shape).ravel()  # noqa: E731
    one = lambda cls, obj: cls(*(flat(getattr(obj, f.name)) for f in fields(obj)))  # noqa: E731
    size = int(np.prod(shape))
    got = with_offline_jobs(one(OnlineAlone, online), one(OnlineModel, model), np.arange(size),
                            one(WorkloadTraits, job), flat(sm_pct), flat(duty), flat(job_mem_bytes), params,
                            target_util)
    back = lambda x: np.reshape(x, shape)[()]  # noqa: E731
    return Shared(back(got.util_pct), back(got.sm_pct), back(got.mem_bytes), back(got.bw_pct), back(got.norm_tput),
                  back(got.slowdown), back(got.pace))


def on_one_gpu(online: OnlineAlone, model: OnlineModel, jobs: Sequence[WorkloadTraits], sm_pct: Sequence[float],
               duty: Sequence[float], job_mem_bytes: Sequence[float], params: InterferenceParams = InterferenceParams(),
               target_util: float | None = None) -> tuple[Shared, np.ndarray]:
    """One GPU (scalar ``online`` and ``model``) with its offline jobs, any number of them (lists, one entry per
    job): the GPU's :class:`Shared` totals (``norm_tput``: the jobs' sum) and each job's normalized throughput.

    No job: the replica alone (:func:`alone_as_shared`). Otherwise :func:`with_offline_jobs` on the one GPU,
    which with one job is :func:`with_offline`.
    """
    if not jobs:
        return alone_as_shared(online), np.zeros(0)
    one = lambda cls, obj: cls(*(np.atleast_1d(np.asarray(getattr(obj, f.name), dtype=float))  # noqa: E731
                                 for f in fields(obj)))
    stacked = WorkloadTraits(*(np.array([getattr(t, f.name) for t in jobs], dtype=float)
                               for f in fields(WorkloadTraits)))
    got = with_offline_jobs(one(OnlineAlone, online), one(OnlineModel, model), np.zeros(len(jobs), dtype=np.int64),
                            stacked, np.asarray(sm_pct, dtype=float), np.asarray(duty, dtype=float),
                            np.asarray(job_mem_bytes, dtype=float), params, target_util)
    tput = np.asarray(got.norm_tput, dtype=float)
    return Shared(float(got.util_pct[0]), float(got.sm_pct[0]), float(got.mem_bytes[0]), float(got.bw_pct[0]),
                  float(tput.sum()), float(got.slowdown[0]), float(got.pace[0])), tput


def alone_as_shared(online: OnlineAlone) -> Shared:
    """The device totals of a GPU with no offline work: the replica's own."""
    return Shared(online.util_pct, online.sm_pct, online.mem_bytes, online.bw_pct, 0.0, 1.0)


def traits_from_profile(sm_activity_pct: float, mem_bw_util_pct: float, catalog: WorkloadCatalog) -> WorkloadTraits:
    """Interference traits of an offline job whose type the catalog does not know, from its solo profile.

    A job's type is a free label (paper §6: the predictor sees profiles, not names). The profile
    measures the job's own SM footprint and memory-bandwidth share directly; its sensitivity and
    pressure are those of the catalog workload nearest in that (SM, bandwidth) space, since both
    grow with how much of the GPU a job occupies (:func:`scheduler_core.workloads.build_catalog`).
    """
    sm_need = float(np.clip(sm_activity_pct / 100.0, 0.05, 1.0))
    mem_bw = float(np.clip(mem_bw_util_pct / 100.0, 0.01, 1.0))
    if not catalog.offline:
        raise ValueError("the workload catalog has no offline workloads to compare a profile with")
    nearest = min(catalog.offline.values(),
                  key=lambda w: ((w.traits.sm_need - sm_need) ** 2 + (w.traits.mem_bw - mem_bw) ** 2, w.job_type))
    return WorkloadTraits(nearest.traits.sensitivity, nearest.traits.pressure, sm_need, mem_bw)


def offline_traits(job_type: str, catalog: WorkloadCatalog,
                   profile: Mapping[str, float] | None = None) -> WorkloadTraits | None:
    """A job's traits: the catalog's for a type it knows, else derived from its profile; None without either."""
    wl = catalog.offline.get(job_type)
    if wl is not None:
        return wl.traits
    if profile is None:
        return None
    return traits_from_profile(float(profile["sm_activity_pct"]), float(profile["mem_bw_util_pct"]), catalog)
