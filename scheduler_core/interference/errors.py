"""How well the interference models predict measured pairs, within a GPU type and across types.

Two models are compared on the same pairs (docs/CALIBRATION.md):

- *before*: per-job sensitivity/pressure fitted on the training types' pairs
  (:func:`scheduler_core.interference.pairs.calibrate`), applied unchanged to the test type;
- *after*: the transferable model (:mod:`scheduler_core.interference.transfer`) with the test
  type's measured profiles (solo iteration times and stressor probes), and *zero-shot* with
  profiles synthesized from the nearest training type (what an unmeasured type gets).

Pairs with the stressor are probes, so they are never scored. A constant (the training mean)
is the floor every model has to beat.

Leaving one type out is also where the model's prediction intervals come from: the residuals on
each held-out type, in log-odds and scaled by that type's probe spread, give the 80 % interval of
the model fitted on every type (:func:`model_interval`); a held-out type's coverage is scored with
the interval built from the *other* held-out types only. ``subsets=True`` repeats every split for
each non-empty subset of the other types.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from itertools import combinations

import numpy as np

from scheduler_core.interference.pairs import PairMeasurement, calibrate
from scheduler_core.interference.transfer import (
    INTERVAL_LEVEL,
    Interval,
    PairErrors,
    TypeProfiles,
    coverage,
    fit_roofline,
    fit_transfer,
    interval_from,
    log_odds_of,
    measured_profiles,
    nearest_type,
    pair_errors,
    residual_offsets,
    synthesize_profiles,
    training_pairs,
)


@dataclass(frozen=True)
class TypeData:
    """One GPU type's measurements: solo iteration times, pairs, optional counters, relative speed."""

    gpu_type: str
    iter_times_s: Mapping[str, float]
    pairs: tuple[PairMeasurement, ...]
    speed: float  # training throughput relative to the P100 (GPU spec, or the stressor's measured ratio)
    counters: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def profiles(self, stressor: str) -> TypeProfiles:
        return measured_profiles(self.gpu_type, self.iter_times_s, self.pairs, stressor, self.counters)


def synthesized_for(types: Mapping[str, TypeData], sources: list[str], gpu_type: str, speed: float,
                    stressor: str) -> TypeProfiles:
    """Profiles on ``gpu_type`` carried over from the nearest-speed type among ``sources``."""
    speeds = {g: types[g].speed for g in types}
    roof = fit_roofline({g: types[g].iter_times_s for g in types}, speeds)
    src = nearest_type(speeds, [g for g in sources if stressor in types[g].iter_times_s], speed)
    return synthesize_profiles(types[src].profiles(stressor), gpu_type, speeds[src], speed, roof)


@dataclass(frozen=True)
class TransferReport:
    train: tuple[str, ...]
    test: str
    constant: PairErrors
    before: PairErrors
    after: PairErrors
    zero_shot: PairErrors
    # Share of the test type's pairs inside the 80 % interval built from the *other* held-out types'
    # residuals (NaN where no other type could be held out).
    after_coverage: float = float("nan")
    zero_shot_coverage: float = float("nan")

    def as_dict(self) -> dict:
        def cov(v: float) -> float | None:
            return None if math.isnan(v) else round(v, 4)

        return {"train": list(self.train), "test": self.test, "constant": self.constant.as_dict(),
                "before": self.before.as_dict(),
                "after": {**self.after.as_dict(), "coverage_80": cov(self.after_coverage)},
                "zero_shot": {**self.zero_shot.as_dict(), "coverage_80": cov(self.zero_shot_coverage)}}


@dataclass(frozen=True)
class _Fold:
    """One train → test split: its errors and the log-odds predictions and truths behind them."""

    report: TransferReport
    true: list[float]
    after: list[float]  # predicted log-odds, measured profiles
    zero_shot: list[float]  # predicted log-odds, synthesized profiles
    scale: float | None  # the test type's probe scale under the fold's model (None: too few probes)

    def residuals(self, which: str) -> tuple[list[float], float]:
        """Held-out log-odds residuals and the scale they are measured in (zero-shot: unscaled, the
        type is taken as unmeasured)."""
        scale = (self.scale or 1.0) if which == "after" else 1.0
        return [log_odds_of(x) - p for x, p in zip(self.true, getattr(self, which))], scale

    def covered(self, intervals: Mapping[str, Interval | None]) -> TransferReport:
        return replace(self.report, after_coverage=coverage(intervals["after"], self.after, self.true, self.scale),
                       zero_shot_coverage=coverage(intervals["zero_shot"], self.zero_shot, self.true, 1.0))


def _fold(types: Mapping[str, TypeData], train: tuple[str, ...], test: str, stressor: str) -> _Fold | None:
    usable = [g for g in train if stressor in types[g].iter_times_s]
    if not usable or stressor not in types[test].iter_times_s:
        return None
    model = fit_transfer([(types[g].profiles(stressor), list(types[g].pairs)) for g in usable], stressor)
    train_pairs = [p for g in train for p in types[g].pairs]
    before = calibrate(train_pairs)
    mean = float(np.mean([p.norm_tput for p in train_pairs]))
    measured = model.anchor(types[test].profiles(stressor))
    synth = synthesized_for(types, usable, test, types[test].speed, stressor)
    pairs = [p for p in training_pairs(types[test].pairs, stressor)
             if all(j in before.sensitivity and j in synth.jobs for j in (p.workload, p.partner))]
    true = [p.norm_tput for p in pairs]
    after = [model.log_odds(measured, p.workload, p.partner) for p in pairs]
    zero = [model.log_odds(synth, p.workload, p.partner) for p in pairs]
    report = TransferReport(
        train, test,
        constant=pair_errors([mean] * len(pairs), true),
        before=pair_errors([before.predict(p.workload, p.partner) for p in pairs], true),
        after=pair_errors(_tput(after), true),
        zero_shot=pair_errors(_tput(zero), true))
    return _Fold(report, true, after, zero, model.probe_scale(measured))


def _tput(log_odds: list[float]) -> list[float]:
    return [1.0 / (1.0 + math.exp(v)) for v in log_odds]


def held_out_intervals(folds: Mapping[str, _Fold], level: float = INTERVAL_LEVEL,
                       without: str | None = None) -> dict[str, Interval | None]:
    """Intervals (measured and zero-shot profiles) from the held-out residuals of every fold but ``without``'s."""
    return {which: interval_from({g: f.residuals(which) for g, f in folds.items() if g != without}, level)
            for which in ("after", "zero_shot")}


def leave_one_type_out(types: Mapping[str, TypeData], stressor: str, subsets: bool = False,
                       folds: Mapping[str, _Fold] | None = None) -> list[TransferReport]:
    """Train on every type but one, test on that one; one report per test type.

    Each report's coverage is that of the interval built from the other test types' residuals, so
    a type's own pairs never widen or narrow its interval. With ``subsets``, one report per test
    type and non-empty subset of the other types (every subset's model scored the same way).
    ``folds``: :func:`held_out_folds` of the same types, where the caller already has them.
    """
    folds = held_out_folds(types, stressor) if folds is None else folds
    out = []
    for test in sorted(types):
        others = tuple(g for g in sorted(types) if g != test)
        trains = [c for k in range(1, len(others) + 1) for c in combinations(others, k)] if subsets else [others]
        intervals = held_out_intervals(folds, without=test)
        for train in trains:
            fold = folds.get(test) if train == others else _fold(types, train, test, stressor)
            if fold is not None:
                out.append(fold.covered(intervals))
    return out


def held_out_folds(types: Mapping[str, TypeData], stressor: str) -> dict[str, _Fold]:
    """Each type held out from a model fitted on all the others: the splits that both the
    leave-one-type-out reports and the fitted model's intervals rest on (one model fit each)."""
    folds = {}
    for test in sorted(types):
        fold = _fold(types, tuple(g for g in sorted(types) if g != test), test, stressor)
        if fold is not None:
            folds[test] = fold
    return folds


def model_interval(types: Mapping[str, TypeData], stressor: str, level: float = INTERVAL_LEVEL,
                   folds: Mapping[str, _Fold] | None = None) -> dict[str, Interval | None]:
    """The intervals of the model fitted on every type: from every type's held-out residuals."""
    return held_out_intervals(held_out_folds(types, stressor) if folds is None else folds, level)


@dataclass(frozen=True)
class WithinTypeReport:
    gpu_type: str
    n_train: int
    constant: PairErrors
    before: PairErrors
    after: PairErrors  # features only
    refined: PairErrors  # features + per-job residuals from the type's training pairs

    def as_dict(self) -> dict:
        return {"gpu_type": self.gpu_type, "n_train": self.n_train, "constant": self.constant.as_dict(),
                "before": self.before.as_dict(), "after": self.after.as_dict(), "refined": self.refined.as_dict()}


def within_type(td: TypeData, stressor: str, holdout_frac: float = 0.2, seed: int = 0) -> WithinTypeReport:
    """Hold out whole unordered pairs (both directions), as :func:`interference.holdout_error` does.

    Both models are scored on the same held-out pairs; the stressor's pairs stay in as probes.
    """
    rng = np.random.default_rng(seed)
    keys = sorted({tuple(sorted((p.workload, p.partner))) for p in td.pairs if stressor not in (p.workload, p.partner)})
    order = rng.permutation(len(keys))
    held = {keys[i] for i in order[: max(1, int(len(keys) * holdout_frac))]}
    train = [p for p in td.pairs if tuple(sorted((p.workload, p.partner))) not in held]
    test = [p for p in td.pairs if tuple(sorted((p.workload, p.partner))) in held]
    before = calibrate(train)
    model = fit_transfer([(td.profiles(stressor), train)], stressor)
    prof = model.anchor(td.profiles(stressor))
    offsets = residual_offsets(model, prof, train)
    test = [p for p in test if p.workload in before.sensitivity and p.partner in before.pressure]
    true = [p.norm_tput for p in test]
    mean = float(np.mean([p.norm_tput for p in train]))
    return WithinTypeReport(
        td.gpu_type, len(train), constant=pair_errors([mean] * len(test), true),
        before=pair_errors([before.predict(p.workload, p.partner) for p in test], true),
        after=pair_errors([model.predict(prof, p.workload, p.partner) for p in test], true),
        refined=pair_errors([model.predict(prof, p.workload, p.partner, offsets) for p in test], true))
