"""How well the interference models predict measured pairs, within a GPU type and across types.

Two models are compared on the same pairs (docs/CALIBRATION.md):

- *before*: per-job sensitivity/pressure fitted on the training types' pairs
  (:func:`scheduler_core.interference.calibrate`), applied unchanged to the test type;
- *after*: the transferable model (:mod:`scheduler_core.interference_transfer`) with the test
  type's measured profiles (solo iteration times and stressor probes), and *zero-shot* with
  profiles synthesized from the nearest training type (what an unmeasured type gets).

Pairs with the stressor are probes, so they are never scored. A constant (the training mean)
is the floor every model has to beat.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from scheduler_core.interference import PairMeasurement, calibrate
from scheduler_core.interference_transfer import (
    PairErrors,
    TransferModel,
    TypeProfiles,
    fit_roofline,
    fit_transfer,
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

    def as_dict(self) -> dict:
        return {"train": list(self.train), "test": self.test, "constant": self.constant.as_dict(),
                "before": self.before.as_dict(), "after": self.after.as_dict(),
                "zero_shot": self.zero_shot.as_dict()}


def _scored(model: TransferModel, prof: TypeProfiles, pairs: list[PairMeasurement]) -> list[float]:
    return [model.predict(prof, p.workload, p.partner) for p in pairs]


def leave_one_type_out(types: Mapping[str, TypeData], stressor: str) -> list[TransferReport]:
    """Train on every type but one, test on that one; one report per test type."""
    out = []
    for test in sorted(types):
        train = tuple(g for g in sorted(types) if g != test)
        usable = [g for g in train if stressor in types[g].iter_times_s]
        if not usable or stressor not in types[test].iter_times_s:
            continue
        model = fit_transfer([(types[g].profiles(stressor), list(types[g].pairs)) for g in usable], stressor)
        train_pairs = [p for g in train for p in types[g].pairs]
        before = calibrate(train_pairs)
        mean = float(np.mean([p.norm_tput for p in train_pairs]))
        measured = types[test].profiles(stressor)
        synth = synthesized_for(types, usable, test, types[test].speed, stressor)
        pairs = [p for p in training_pairs(types[test].pairs, stressor)
                 if all(j in before.sensitivity and j in synth.jobs for j in (p.workload, p.partner))]
        true = [p.norm_tput for p in pairs]
        out.append(TransferReport(
            train, test,
            constant=pair_errors([mean] * len(pairs), true),
            before=pair_errors([before.predict(p.workload, p.partner) for p in pairs], true),
            after=pair_errors(_scored(model, measured, pairs), true),
            zero_shot=pair_errors(_scored(model, synth, pairs), true)))
    return out


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
    prof = td.profiles(stressor)
    model = fit_transfer([(prof, train)], stressor)
    offsets = residual_offsets(model, prof, train)
    test = [p for p in test if p.workload in before.sensitivity and p.partner in before.pressure]
    true = [p.norm_tput for p in test]
    mean = float(np.mean([p.norm_tput for p in train]))
    return WithinTypeReport(
        td.gpu_type, len(train), constant=pair_errors([mean] * len(test), true),
        before=pair_errors([before.predict(p.workload, p.partner) for p in test], true),
        after=pair_errors(_scored(model, prof, test), true),
        refined=pair_errors([model.predict(prof, p.workload, p.partner, offsets) for p in test], true))
