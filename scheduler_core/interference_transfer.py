"""Co-location interference that carries over between GPU types (docs/CALIBRATION.md).

Per-job sensitivity σ and pressure π fitted on one GPU type (:func:`interference.calibrate`)
predict another type's measured pairs barely better than a constant: how much a job suffers and
inflicts depends on how it uses *that* GPU (a job that is GPU-bound on a K80 can be host-bound on
a P100). This model therefore explains a pair's normalized throughput through what profiling
measures about each job on the GPU type in question (paper §6 profiles every job on every type):

- its solo iteration time ``t``, relative to the stressor's on the same type;
- a **stressor probe**: one short co-located run next to a fixed reference job R, giving the job's
  normalized throughput beside R and R's beside the job. These are the sensitivity and pressure
  probes of Bubble-Up (Mars et al., MICRO 2011), measured with the same method as the pairs: one run
  per job and type instead of one per pair;
- hardware counters (GPU utilization, SM activity and occupancy, memory-bandwidth utilization,
  in percent) where the profiler recorded them for every job.

The model keeps the full-sharing form of :func:`interference.colocate`, x_A = 1 / (1 + σ_A π_B), with

    log σ_A = c/2 + a · φσ_A        log π_B = c/2 + b · φπ_B

φσ = (log(1/x(A|R) − 1), log t_A/t_R, counters/100), φπ = (log(1/x(R|B) − 1), log t_B/t_R,
counters/100). ``c``, ``a`` and ``b`` are shared by every GPU type: nothing in the model is a free
parameter of one job on one type, so it applies to any job profiled on any type. Coefficients are
fitted by least squares on relative error (MAPE is the reported metric, and the logit of a
throughput near 1 would dominate a fit in logit space), with a small ridge on the slopes.

A job without a probe on a type falls back to the sub-model without it (fitted on the same pairs).
A GPU type without any measurement gets *synthesized* profiles (:func:`synthesize_profiles`): the
probes of the measured type nearest in speed, scaled by how the job's GPU-busy fraction changes
between the two types under a roofline split of its iteration time (host time + GPU work / speed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from scheduler_core.interference import Calibration, PairMeasurement

PROBE, ITER = "probe", "iter"
# Counters a profile may carry, in percent (OfflineFeatures' names).
COUNTERS = ("gpu_util_pct", "sm_activity_pct", "sm_occupancy_pct", "mem_bw_util_pct")
RIDGE = 0.01
MIN_FIT_PAIRS = 20
SHRINK_PAIRS = 10.0  # a job's own residual counts n / (n + 10) after n pairs (residual_offsets)
_X_CLIP = (0.01, 0.99)  # for the logit of a measured throughput (x = 1 would be log 0)


def _logit(x: float) -> float:
    x = min(max(x, _X_CLIP[0]), _X_CLIP[1])
    return math.log(1.0 / x - 1.0)


@dataclass(frozen=True)
class JobProfile:
    """What profiling measured about one job on one GPU type."""

    iter_time_s: float
    probe_tput: float | None = None  # the job's normalized throughput next to the stressor
    probe_partner_tput: float | None = None  # the stressor's normalized throughput next to the job
    counters: Mapping[str, float] = field(default_factory=dict)
    synthesized: bool = False  # probes carried over from another type (no measurement here)

    def features(self, stressor_iter_time_s: float) -> tuple[dict[str, float], dict[str, float]]:
        """(σ-side, π-side) feature values by name; a feature the profile lacks is absent."""
        common = {ITER: math.log(self.iter_time_s / stressor_iter_time_s)}
        common.update({k: v / 100.0 for k, v in self.counters.items() if k in COUNTERS})
        sens, pres = dict(common), dict(common)
        if self.probe_tput is not None:
            sens[PROBE] = _logit(self.probe_tput)
        if self.probe_partner_tput is not None:
            pres[PROBE] = _logit(self.probe_partner_tput)
        return sens, pres


@dataclass(frozen=True)
class TypeProfiles:
    """Profiles of the jobs on one GPU type, with the stressor's solo iteration time there."""

    gpu_type: str
    stressor: str
    stressor_iter_time_s: float
    jobs: Mapping[str, JobProfile]


@dataclass(frozen=True)
class SubModel:
    keys: tuple[str, ...]
    intercept: float
    sens_coef: tuple[float, ...]
    pres_coef: tuple[float, ...]
    n_pairs: int

    def log_sens(self, f: Mapping[str, float]) -> float:
        return self.intercept / 2.0 + sum(c * f[k] for c, k in zip(self.sens_coef, self.keys))

    def log_pres(self, f: Mapping[str, float]) -> float:
        return self.intercept / 2.0 + sum(c * f[k] for c, k in zip(self.pres_coef, self.keys))


@dataclass(frozen=True)
class TransferModel:
    stressor: str
    submodels: tuple[SubModel, ...]  # most informative first

    def _pick(self, f: Mapping[str, float]) -> SubModel:
        for sm in self.submodels:
            if all(k in f for k in sm.keys):
                return sm
        raise ValueError(f"no sub-model fits a profile with features {sorted(f)}")

    def traits(self, profile: JobProfile, stressor_iter_time_s: float) -> tuple[float, float]:
        """(σ, π) of one job on its GPU type."""
        fs, fp = profile.features(stressor_iter_time_s)
        return math.exp(self._pick(fs).log_sens(fs)), math.exp(self._pick(fp).log_pres(fp))

    def calibration(self, profiles: TypeProfiles, factor: float = 1.0,
                    offsets: Mapping[str, tuple[float, float]] | None = None) -> Calibration:
        """σ and π of every profiled job on that type.

        ``factor`` scales both (see :func:`pessimistic_factor`); ``offsets`` are per-job log
        corrections from that type's own pairs (:func:`residual_offsets`).
        """
        sens, pres = {}, {}
        for job, prof in profiles.jobs.items():
            s, p = self.traits(prof, profiles.stressor_iter_time_s)
            ds, dp = (offsets or {}).get(job, (0.0, 0.0))
            sens[job], pres[job] = s * factor * math.exp(ds), p * factor * math.exp(dp)
        return Calibration(sens, pres)

    def predict(self, profiles: TypeProfiles, workload: str, partner: str,
                offsets: Mapping[str, tuple[float, float]] | None = None) -> float:
        sa, _ = self.traits(profiles.jobs[workload], profiles.stressor_iter_time_s)
        _, pb = self.traits(profiles.jobs[partner], profiles.stressor_iter_time_s)
        log_corr = (offsets or {}).get(workload, (0.0, 0.0))[0] + (offsets or {}).get(partner, (0.0, 0.0))[1]
        return 1.0 / (1.0 + sa * pb * math.exp(log_corr))

    def as_dict(self) -> dict:
        return {"stressor": self.stressor, "submodels": [
            {"features": list(sm.keys), "intercept": round(sm.intercept, 4),
             "sensitivity": [round(c, 4) for c in sm.sens_coef], "pressure": [round(c, 4) for c in sm.pres_coef],
             "pairs": sm.n_pairs} for sm in self.submodels]}


def measured_profiles(gpu_type: str, iter_times_s: Mapping[str, float], pairs: Iterable[PairMeasurement],
                      stressor: str, counters: Mapping[str, Mapping[str, float]] | None = None) -> TypeProfiles:
    """Profiles from one type's measurements: the probes are the pairs with the stressor."""
    if stressor not in iter_times_s:
        raise ValueError(f"{gpu_type}: the stressor {stressor!r} has no solo measurement")
    beside, of_stressor = {}, {}
    for p in pairs:
        if p.partner == stressor:
            beside[p.workload] = p.norm_tput
        if p.workload == stressor:
            of_stressor[p.partner] = p.norm_tput
    counters = counters or {}
    jobs = {job: JobProfile(t, beside.get(job), of_stressor.get(job), dict(counters.get(job, {})))
            for job, t in iter_times_s.items()}
    return TypeProfiles(gpu_type, stressor, iter_times_s[stressor], jobs)


def training_pairs(pairs: Iterable[PairMeasurement], stressor: str) -> list[PairMeasurement]:
    """Pairs usable as targets: a pair with the stressor is a probe (a feature), never a target."""
    return [p for p in pairs if stressor not in (p.workload, p.partner)]


def _rows(data: list[tuple[TypeProfiles, list[PairMeasurement]]], keys: tuple[str, ...]):
    xs, xp, y = [], [], []
    for prof, pairs in data:
        feats = {j: p.features(prof.stressor_iter_time_s) for j, p in prof.jobs.items()}
        for p in pairs:
            if p.workload not in feats or p.partner not in feats:
                continue
            fs, fp = feats[p.workload][0], feats[p.partner][1]
            if all(k in fs for k in keys) and all(k in fp for k in keys):
                xs.append([fs[k] for k in keys])
                xp.append([fp[k] for k in keys])
                y.append(p.norm_tput)
    return np.array(xs).reshape(-1, len(keys)), np.array(xp).reshape(-1, len(keys)), np.array(y)


def _fit_submodel(xs: np.ndarray, xp: np.ndarray, y: np.ndarray, keys: tuple[str, ...]) -> SubModel:
    from scipy.optimize import least_squares

    X = np.hstack([np.ones((len(y), 1)), xs, xp])
    start = np.linalg.lstsq(X, np.log(1.0 / np.clip(y, *_X_CLIP) - 1.0), rcond=None)[0]

    def residuals(w: np.ndarray) -> np.ndarray:
        pred = 1.0 / (1.0 + np.exp(np.clip(X @ w, -30.0, 30.0)))
        return np.concatenate([(pred - y) / y, math.sqrt(RIDGE) * w[1:]])

    w = least_squares(residuals, start).x
    k = len(keys)
    return SubModel(keys, float(w[0]), tuple(float(v) for v in w[1:1 + k]), tuple(float(v) for v in w[1 + k:]),
                    len(y))


def fit_transfer(data: list[tuple[TypeProfiles, list[PairMeasurement]]], stressor: str) -> TransferModel:
    """Fit on the measured types in ``data`` ((profiles, pairs) per type); pairs with the stressor are skipped."""
    data = [(prof, training_pairs(pairs, stressor)) for prof, pairs in data]
    shared = None
    for prof, _ in data:
        for jp in prof.jobs.values():
            have = set(jp.counters) & set(COUNTERS)
            shared = have if shared is None else shared & have
    counters = tuple(c for c in COUNTERS if c in (shared or set()))
    candidates = [(PROBE, ITER, *counters), (ITER, *counters), (PROBE, ITER), (ITER,)]
    subs = []
    for keys in dict.fromkeys(candidates):  # de-duplicated, order kept
        xs, xp, y = _rows(data, keys)
        if len(y) >= MIN_FIT_PAIRS:
            subs.append(_fit_submodel(xs, xp, y, keys))
    if not subs or subs[-1].keys != (ITER,):
        raise ValueError(f"too few measured pairs to fit the interference model (need {MIN_FIT_PAIRS} "
                         f"pairs of profiled jobs, not counting pairs with the stressor {stressor!r})")
    return TransferModel(stressor, tuple(subs))


def residual_offsets(model: TransferModel, profiles: TypeProfiles, pairs: Iterable[PairMeasurement],
                     shrink: float = SHRINK_PAIRS) -> dict[str, tuple[float, float]]:
    """Per-job log corrections of σ and π from a type's own pairs, shrunk towards 0.

    Where a type has pair measurements, what the features miss about a job is estimated from its
    residuals, trusted in proportion n / (n + ``shrink``) for a job in n pairs (ridge). A type with
    no pairs keeps the features' prediction: the model itself has no per-job parameter.
    """
    jobs = sorted(profiles.jobs)
    idx = {j: i for i, j in enumerate(jobs)}
    n = len(jobs)
    rows, y = [], []
    for p in training_pairs(pairs, model.stressor):
        if p.workload in idx and p.partner in idx:
            row = np.zeros(2 * n)
            row[idx[p.workload]] = row[n + idx[p.partner]] = 1.0
            rows.append(row)
            y.append(_logit(p.norm_tput) - math.log(1.0 / model.predict(profiles, p.workload, p.partner) - 1.0))
    if not rows:
        return {}
    x = np.array(rows)
    d = np.linalg.solve(x.T @ x + shrink * np.eye(2 * n), x.T @ np.array(y))
    return {j: (float(d[i]), float(d[n + i])) for j, i in idx.items() if x[:, i].any() or x[:, n + i].any()}


# --- GPU types without measurements ------------------------------------------------------------


@dataclass(frozen=True)
class Roofline:
    """Solo iteration time split into host time and GPU work: t(type) = host_s + work / speed(type)."""

    host_s: Mapping[str, float]
    work: Mapping[str, float]

    def iter_time_s(self, job: str, speed: float) -> float:
        return self.host_s[job] + self.work[job] / speed

    def busy_frac(self, job: str, speed: float) -> float:
        """Fraction of the iteration the GPU is busy with the job (≈ the profiler's GPU utilization)."""
        gpu = self.work[job] / speed
        return max(0.02, gpu / (self.host_s[job] + gpu))


def fit_roofline(iter_times_s: Mapping[str, Mapping[str, float]], speeds: Mapping[str, float]) -> Roofline:
    """Non-negative least squares per job over the types that measured it (solo times only).

    A job measured on one type only is taken as GPU-bound there (host time 0).
    """
    from scipy.optimize import nnls

    host, work = {}, {}
    for job in sorted({j for times in iter_times_s.values() for j in times}):
        ts = [(speeds[g], times[job]) for g, times in iter_times_s.items() if job in times and g in speeds]
        if not ts:
            continue
        a = np.array([[1.0, 1.0 / s] for s, _ in ts])
        (h, w), _ = nnls(a, np.array([t for _, t in ts]))
        if w <= 0.0:  # no GPU work left: speed did not matter where it was measured
            h, w = 0.0, float(np.mean([t * s for s, t in ts]))
        host[job], work[job] = float(h), float(w)
    return Roofline(host, work)


def synthesize_profiles(source: TypeProfiles, gpu_type: str, source_speed: float, speed: float,
                        roofline: Roofline) -> TypeProfiles:
    """Profiles on a type that measured nothing, carried over from ``source``.

    From the time-slicing contention argument (a job's slowdown grows with how busy it keeps the
    GPU, σ ∝ busy fraction, and so does the pressure it exerts), a probe's σ·π product scales by the
    change of both jobs' GPU-busy fractions; iteration times come from the roofline. Counters are
    not carried over (they were measured on another GPU).
    """
    jobs = {job: (prof, roofline.busy_frac(job, speed) / roofline.busy_frac(job, source_speed))
            for job, prof in source.jobs.items() if job in roofline.work}
    stressor = source.stressor
    if stressor in jobs:
        stressor_ratio, stressor_time = jobs[stressor][1], roofline.iter_time_s(stressor, speed)
    else:
        stressor_ratio, stressor_time = 1.0, source.stressor_iter_time_s * source_speed / speed

    def scaled(x: float | None, ratio: float) -> float | None:
        return None if x is None else 1.0 / (1.0 + (1.0 / min(max(x, 1e-6), 1.0) - 1.0) * ratio)

    out = {job: JobProfile(roofline.iter_time_s(job, speed), scaled(prof.probe_tput, r * stressor_ratio),
                           scaled(prof.probe_partner_tput, r * stressor_ratio), {}, True)
           for job, (prof, r) in jobs.items()}
    return TypeProfiles(gpu_type, stressor, stressor_time, out)


def nearest_type(speeds: Mapping[str, float], candidates: Iterable[str], speed: float) -> str:
    """The candidate type whose speed is closest to ``speed`` on a log scale."""
    return min(sorted(candidates), key=lambda g: abs(math.log(speeds[g] / speed)))


def pessimistic_factor(overestimate: float) -> float:
    """Factor on σ and π that lowers a typical pair (x = 0.5) by ``overestimate`` (a fraction).

    x' = 1 / (1 + f²·σπ) = 0.5·(1 − e) at σπ = 1 gives f = sqrt(1 / (0.5·(1 − e)) − 1).
    """
    e = min(max(overestimate, 0.0), 0.9)
    return math.sqrt(1.0 / (0.5 * (1.0 - e)) - 1.0)


# --- Errors ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairErrors:
    n: int
    mae: float
    mape: float
    overestimate_p90: float  # 90th percentile of (predicted − measured) / predicted, ≥ 0

    def as_dict(self) -> dict:
        return {"pairs": self.n, "mae": round(self.mae, 4), "mape": round(self.mape, 4),
                "overestimate_p90": round(self.overestimate_p90, 4)}


def pair_errors(pred: Iterable[float], true: Iterable[float]) -> PairErrors:
    p, t = np.asarray(list(pred), dtype=float), np.asarray(list(true), dtype=float)
    if p.size == 0:
        return PairErrors(0, float("nan"), float("nan"), float("nan"))
    over = np.maximum(0.0, (p - t) / p)
    return PairErrors(int(p.size), float(np.mean(np.abs(p - t))), float(np.mean(np.abs(p - t) / t)),
                      float(np.quantile(over, 0.9)))

