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

Nothing in the model is a constant of one GPU type either. What is particular to a type is measured
on it: its profiles; its **anchor** (:meth:`TransferModel.anchor`), the model's median miss on the
type's own probe pairs, added to every pair there; and its **spread**
(:meth:`TransferModel.probe_scale`), which scales its prediction :class:`Interval`. The interval's
quantiles come from leave-one-type-out residuals (:mod:`scheduler_core.interference.errors`). Each
training type's pairs are weighed by the type's measured noise (:func:`noise_weights`), so a noisy
type neither outvotes nor drags the clean ones.

A job without a probe on a type falls back to the sub-model without it (fitted on the same pairs).
A GPU type without any measurement gets *synthesized* profiles (:func:`synthesize_profiles`): the
probes of the measured type nearest in speed, scaled by how the job's GPU-busy fraction changes
between the two types under a roofline split of its iteration time (host time + GPU work / speed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from scheduler_core.interference.pairs import Calibration, PairMeasurement

PROBE, ITER = "probe", "iter"
# Counters a profile may carry, in percent (OfflineFeatures' names).
COUNTERS = ("gpu_util_pct", "sm_activity_pct", "sm_occupancy_pct", "mem_bw_util_pct")
RIDGE = 0.01
MIN_FIT_PAIRS = 20
NOISE_PASSES = 3  # fits that estimate each type's noise before the final one
SHRINK_PAIRS = 10.0  # a job's own residual counts n / (n + 10) after n pairs (residual_offsets)
ANCHOR_SHRINK = 5.0  # a type's probe anchor counts n / (n + 5) after n probe pairs
MIN_SCALE = 0.02  # floor of a type's probe residuals' spread (log-odds): no type is taken as noiseless
_X_CLIP = (0.01, 0.99)  # for the logit of a measured throughput (x = 1 would be log 0)


def log_odds_of(x: float) -> float:
    """log(1/x − 1) of a normalized throughput, clipped away from 0 and 1."""
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
            sens[PROBE] = log_odds_of(self.probe_tput)
        if self.probe_partner_tput is not None:
            pres[PROBE] = log_odds_of(self.probe_partner_tput)
        return sens, pres


@dataclass(frozen=True)
class TypeProfiles:
    """Profiles of the jobs on one GPU type, with the stressor's solo iteration time there."""

    gpu_type: str
    stressor: str
    stressor_iter_time_s: float
    jobs: Mapping[str, JobProfile]
    # Added to every pair's predicted log-odds on this type: the model's mean miss on the type's own
    # measured probes (TransferModel.anchor); 0 until anchored.
    log_odds_shift: float = 0.0


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
    type_weights: Mapping[str, float] = field(default_factory=dict)  # per-pair weight of each training type

    def _pick(self, f: Mapping[str, float]) -> SubModel:
        for sm in self.submodels:
            if all(k in f for k in sm.keys):
                return sm
        raise ValueError(f"no sub-model fits a profile with features {sorted(f)}")

    def traits(self, profiles: TypeProfiles, job: str) -> tuple[float, float]:
        """(σ, π) of one job on the profiles' GPU type."""
        fs, fp = profiles.jobs[job].features(profiles.stressor_iter_time_s)
        return math.exp(self._pick(fs).log_sens(fs)), math.exp(self._pick(fp).log_pres(fp))

    def calibration(self, profiles: TypeProfiles, factor: float = 1.0,
                    offsets: Mapping[str, tuple[float, float]] | None = None) -> Calibration:
        """σ and π of every profiled job on that type.

        ``factor`` scales both (see :func:`interval_factor`); ``offsets`` are per-job log
        corrections from that type's own pairs (:func:`residual_offsets`).
        """
        sens, pres = {}, {}
        for job in profiles.jobs:
            s, p = self.traits(profiles, job)
            ds, dp = (offsets or {}).get(job, (0.0, 0.0))
            sens[job], pres[job] = s * factor * math.exp(ds), p * factor * math.exp(dp)
        return Calibration(sens, pres)

    def log_odds(self, profiles: TypeProfiles, workload: str, partner: str,
                 offsets: Mapping[str, tuple[float, float]] | None = None) -> float:
        """log(σ_A·π_B) = log(1/x − 1), where the prediction intervals live."""
        sa, _ = self.traits(profiles, workload)
        _, pb = self.traits(profiles, partner)
        log_corr = (offsets or {}).get(workload, (0.0, 0.0))[0] + (offsets or {}).get(partner, (0.0, 0.0))[1]
        return math.log(sa * pb) + profiles.log_odds_shift + log_corr

    def probe_residuals(self, profiles: TypeProfiles) -> list[float]:
        """Measured minus predicted log-odds of the type's own probe pairs (job beside the stressor, and
        the stressor beside the job); synthesized probes measure nothing and are skipped."""
        base = replace(profiles, log_odds_shift=0.0)
        r = self.stressor
        if r not in base.jobs:
            return []
        out = []
        for job, prof in sorted(base.jobs.items()):
            if prof.synthesized:
                continue
            if prof.probe_tput is not None:
                out.append(log_odds_of(prof.probe_tput) - self.log_odds(base, job, r))
            if prof.probe_partner_tput is not None and job != r:
                out.append(log_odds_of(prof.probe_partner_tput) - self.log_odds(base, r, job))
        return out

    def probe_scale(self, profiles: TypeProfiles) -> float | None:
        """How widely the type's pairs scatter around the model's, as far as its own probes tell: the
        square root of their residuals' standard deviation (log-odds); None with fewer than 3 measured
        probe pairs.

        Probes are features, so their residuals understate a pair's miss, and more so on a type the
        model fits well; the square root pools the type's own spread with a shared width (docs/
        CALIBRATION.md compares it with no scaling and with the spread itself on every held-out type).
        """
        res = np.asarray(self.probe_residuals(profiles))
        if len(res) < 3:
            return None
        return math.sqrt(max(float(np.std(res)), MIN_SCALE))

    def anchor(self, profiles: TypeProfiles) -> TypeProfiles:
        """The profiles with the type's level anchored on its own probes.

        The probes are pairs measured on the type; they are features, never fitted targets, so the
        model's mean miss on them says how far its shared coefficients are off the type's level of
        contention — a GPU whose jobs contend more (or less) than the training types' did. That miss,
        shrunk by n / (n + 5) for n probe pairs, is added to every pair on the type.
        """
        res = self.probe_residuals(profiles)
        shift = len(res) / (len(res) + ANCHOR_SHRINK) * float(np.median(res)) if res else 0.0
        return replace(profiles, log_odds_shift=shift)

    def predict(self, profiles: TypeProfiles, workload: str, partner: str,
                offsets: Mapping[str, tuple[float, float]] | None = None) -> float:
        return 1.0 / (1.0 + math.exp(self.log_odds(profiles, workload, partner, offsets)))

    def as_dict(self) -> dict:
        return {"stressor": self.stressor,
                "type_weights": {g: round(w, 4) for g, w in sorted(self.type_weights.items())},
                "submodels": [
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
    xs, xp, y, types = [], [], [], []
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
                types.append(prof.gpu_type)
    return (np.array(xs).reshape(-1, len(keys)), np.array(xp).reshape(-1, len(keys)), np.array(y),
            np.array(types, dtype=object))


def _fit_submodel(xs: np.ndarray, xp: np.ndarray, y: np.ndarray, keys: tuple[str, ...],
                  weights: np.ndarray | None = None) -> SubModel:
    from scipy.optimize import least_squares

    X = np.hstack([np.ones((len(y), 1)), xs, xp])
    sw = np.sqrt(np.ones(len(y)) if weights is None else weights)
    start = np.linalg.lstsq(X * sw[:, None], np.log(1.0 / np.clip(y, *_X_CLIP) - 1.0) * sw, rcond=None)[0]

    def residuals(w: np.ndarray) -> np.ndarray:
        pred = 1.0 / (1.0 + np.exp(np.clip(X @ w, -30.0, 30.0)))
        return np.concatenate([sw * (pred - y) / y, math.sqrt(RIDGE) * w[1:]])

    w = least_squares(residuals, start).x
    k = len(keys)
    return SubModel(keys, float(w[0]), tuple(float(v) for v in w[1:1 + k]), tuple(float(v) for v in w[1 + k:]),
                    len(y))


def _submodel_residuals(sm: SubModel, xs: np.ndarray, xp: np.ndarray, y: np.ndarray) -> np.ndarray:
    z = sm.intercept + xs @ np.array(sm.sens_coef) + xp @ np.array(sm.pres_coef)
    return (1.0 / (1.0 + np.exp(np.clip(z, -30.0, 30.0))) - y) / y


def noise_weights(types: np.ndarray, rel_resid: np.ndarray) -> dict[str, float]:
    """Per-pair weight of each type: every type counts as much as the others in total, less where it is noisy.

    A type's noise is the mean squared relative residual of its pairs under a fit that weighs every
    type equally; its pairs are weighed 1 / (pairs × noise), normalized to a mean of 1 per pair. A
    type with many pairs does not outvote the others, and a noisy one does not drag the clean ones.
    """
    names = sorted(set(types.tolist()))
    noise = {g: max(float(np.mean(rel_resid[types == g] ** 2)), 1e-4) for g in names}
    raw = {g: 1.0 / (int(np.sum(types == g)) * noise[g]) for g in names}
    scale = len(types) / sum(raw[g] * int(np.sum(types == g)) for g in names)
    return {g: raw[g] * scale for g in names}


def fit_transfer(data: list[tuple[TypeProfiles, list[PairMeasurement]]], stressor: str) -> TransferModel:
    """Fit on the measured types in ``data`` ((profiles, pairs) per type); pairs with the stressor are skipped.

    Every type first weighs the same in total, then each is reweighed by its measured noise
    (:func:`noise_weights`, estimated on the most informative sub-model, ``NOISE_PASSES`` times).
    """
    data = [(prof, training_pairs(pairs, stressor)) for prof, pairs in data]
    shared = None
    for prof, _ in data:
        for jp in prof.jobs.values():
            have = set(jp.counters) & set(COUNTERS)
            shared = have if shared is None else shared & have
    counters = tuple(c for c in COUNTERS if c in (shared or set()))
    candidates = [(PROBE, ITER, *counters), (ITER, *counters), (PROBE, ITER), (ITER,)]
    rows = {keys: _rows(data, keys) for keys in dict.fromkeys(candidates)}  # de-duplicated, order kept
    rows = {keys: r for keys, r in rows.items() if len(r[2]) >= MIN_FIT_PAIRS}
    if (ITER,) not in rows:
        raise ValueError(f"too few measured pairs to fit the interference model (need {MIN_FIT_PAIRS} "
                         f"pairs of profiled jobs, not counting pairs with the stressor {stressor!r})")

    def per_pair(tw: dict[str, float], types: np.ndarray) -> np.ndarray:
        return np.array([tw.get(g, 1.0) for g in types.tolist()])

    first_keys = next(iter(rows))
    xs, xp, y, types = rows[first_keys]
    tw = noise_weights(types, np.ones(len(y)))  # equal noise: each type's pairs weigh 1 / its count
    for _ in range(NOISE_PASSES):  # a noisy type distorts the first fit: re-estimate on the reweighed one
        sm = _fit_submodel(xs, xp, y, first_keys, per_pair(tw, types))
        tw = noise_weights(types, _submodel_residuals(sm, xs, xp, y))
    subs = [_fit_submodel(xs, xp, y, keys, per_pair(tw, types)) for keys, (xs, xp, y, types) in rows.items()]
    return TransferModel(stressor, tuple(subs), tw)


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
            y.append(log_odds_of(p.norm_tput) - model.log_odds(profiles, p.workload, p.partner))
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


# --- Prediction intervals -----------------------------------------------------------------------

INTERVAL_LEVEL = 0.8


@dataclass(frozen=True)
class Interval:
    """How far a type's measured pairs fall from the model's, in log-odds L = log(1/x − 1) = log σ_A·π_B.

    ``lo`` and ``hi`` are the (1 − level)/2 and (1 + level)/2 quantiles of (L_measured − L_predicted) /
    scale over pairs of GPU types the model was **not** fitted on (leave one type out), so an interval
    says how sure the model is on a type it has not seen, not how well it fits the ones it has. The
    scale is the held-out type's probe scale (:meth:`TransferModel.probe_scale`): a type whose own
    probes scatter more around the model gets a wider interval. ``ref_scale`` stands in for a type
    without measured probes (the held-out types' mean; 1 where residuals were not scaled).
    """

    level: float
    lo: float
    hi: float
    n: int  # residuals it rests on
    types: tuple[str, ...] = ()  # the held-out types they came from
    ref_scale: float = 1.0

    def width(self, scale: float | None = None) -> tuple[float, float]:
        """(lo, hi) in log-odds on a type of probe scale ``scale`` (None: ``ref_scale``)."""
        s = self.ref_scale if scale is None else scale
        return self.lo * s, self.hi * s

    def bounds(self, log_odds: float, scale: float | None = None) -> tuple[float, float]:
        """(lowest, highest) normalized throughput of a pair predicted at ``log_odds``."""
        lo, hi = self.width(scale)
        return 1.0 / (1.0 + math.exp(log_odds + hi)), 1.0 / (1.0 + math.exp(log_odds + lo))

    def factor(self, side: str, scale: float | None = None) -> float:
        """Factor on every σ and π that moves every pair to the interval's low (``pessimistic``) or
        high (``optimistic``) end of throughput: σπ × e^hi or × e^lo."""
        lo, hi = self.width(scale)
        return math.exp((hi if side == "pessimistic" else lo) / 2.0)

    def as_dict(self) -> dict:
        lo, hi = self.width()
        return {"level": self.level, "log_odds_lo": round(lo, 4), "log_odds_hi": round(hi, 4),
                "scaled_lo": round(self.lo, 4), "scaled_hi": round(self.hi, 4), "ref_scale": round(self.ref_scale, 4),
                "residuals": self.n, "from_types": list(self.types)}


def interval_from(residuals: Mapping[str, tuple[Iterable[float], float]],
                  level: float = INTERVAL_LEVEL) -> Interval | None:
    """Quantiles of held-out log-odds residuals, each divided by its type's scale, each held-out type
    weighing the same (None: no residuals). ``residuals``: type → (residuals, that type's scale).

    A type with many pairs does not set the interval alone: each residual weighs 1 / its type's count.
    """
    vals, wts, types, scales = [], [], [], []
    for g, (rs, scale) in sorted(residuals.items()):
        rs = [float(r) / scale for r in rs if math.isfinite(r)]
        if rs:
            vals += rs
            wts += [1.0 / len(rs)] * len(rs)
            types.append(g)
            scales.append(scale)
    if not vals:
        return None
    order = np.argsort(vals)
    v, w = np.asarray(vals)[order], np.asarray(wts)[order]
    cdf = (np.cumsum(w) - 0.5 * w) / w.sum()
    q = (1.0 - level) / 2.0
    return Interval(level, float(np.interp(q, cdf, v)), float(np.interp(1.0 - q, cdf, v)), len(vals), tuple(types),
                    float(np.mean(scales)))


def coverage(interval: Interval | None, log_odds_pred: Iterable[float], true: Iterable[float],
             scale: float | None = None) -> float:
    """Share of measured pairs inside the interval around their predictions (NaN without an interval)."""
    pred, t = list(log_odds_pred), list(true)
    if interval is None or not t:
        return float("nan")
    inside = [lo <= x <= hi for x, (lo, hi) in zip(t, (interval.bounds(p, scale) for p in pred))]
    return float(np.mean(inside))


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

