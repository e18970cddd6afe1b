"""Calibrate the simulated GPU's interference model on measured co-location samples (docs/CALIBRATION.md).

Measurements: the bundled Gavel K80/P100 pairs plus a site's own files
(:mod:`executors.data.measurements`, ``MUXFLOW_MEASUREMENTS``). From them, one workload
catalog per *calibration* and GPU type:

- ``transfer`` (the default): the transferable model (:mod:`scheduler_core.interference.transfer`)
  fitted on every measured type, applied to each job's profile on the GPU type in question —
  measured profiles where the type was measured, profiles synthesized from the measured type
  nearest in speed otherwise (T4, L4, A10, L40S, A100, H100, H200 until a site measures them);
- ``pessimistic`` and ``optimistic``: ``transfer`` moved to the low and the high end of its 80 %
  prediction interval (every σ·π × e^hi or × e^lo), the interval built from the residuals on measured
  types the model was not fitted on — for a measured type the measured-profile interval, for one
  nobody measured the zero-shot one;
- one per measured type (``k80``, ``p100``, …): that type's per-job σ/π fit, used unchanged on
  every GPU type (what every simulated result used before the transferable model).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from executors.data.measurements import MeasurementSet, installed
from scheduler_core.gpu_specs import GPU_SPECS
from scheduler_core.interference.errors import (
    TransferReport,
    TypeData,
    WithinTypeReport,
    held_out_folds,
    leave_one_type_out,
    model_interval,
    synthesized_for,
    within_type,
)
from scheduler_core.interference.pairs import (
    Calibration,
    HoldoutReport,
    calibrate,
    holdout_error,
)
from scheduler_core.interference.transfer import (
    Interval,
    JobProfile,
    TransferModel,
    TypeProfiles,
    fit_transfer,
    residual_offsets,
)
from scheduler_core.workloads import WorkloadCatalog, build_catalog

DATA_DIR = Path(__file__).resolve().parent / "gavel"
COLOCATION_FILE = DATA_DIR / "colocation_throughputs_k80_p100.json"
SAMPLE_TRACE = DATA_DIR / "philly_vc_0e4a51.sample.trace"
REFERENCE_GPU = "p100"
TRANSFER, PESSIMISTIC, OPTIMISTIC = "transfer", "pessimistic", "optimistic"
INTERVAL_CALIBRATIONS = (OPTIMISTIC, TRANSFER, PESSIMISTIC)  # low, central, high interference


class Calibrator:
    """Every calibration fitted on one measurement set, each computed once."""

    def __init__(self, mset: MeasurementSet):
        self.mset = mset
        self.stressor = mset.stressor
        self._memo: dict[tuple, object] = {}

    def _once(self, key: tuple, make):
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    @property
    def type_data(self) -> dict[str, TypeData]:
        return self._once(("data",), self.mset.type_data)

    def measured_types(self) -> list[str]:
        return sorted(self.mset.types)

    def calibrations(self) -> list[str]:
        return [*self.measured_types(), *INTERVAL_CALIBRATIONS]

    def calibration_for(self, gpu_type: str = REFERENCE_GPU) -> Calibration:
        """The per-job σ/π fit of one measured type."""
        if gpu_type not in self.mset.types:
            raise KeyError(f"no measurements of GPU type {gpu_type!r} (measured: {', '.join(self.measured_types())})")
        return self._once(("per-job", gpu_type), lambda: calibrate(list(self.mset.types[gpu_type].pairs)))

    def holdout_reports(self, seed: int = 0) -> list[HoldoutReport]:
        """Within-type hold-out error of the per-job σ/π fit, per measured type."""
        return [holdout_error(list(t.pairs), g, seed=seed) for g, t in sorted(self.mset.types.items())]

    def transfer_model(self) -> TransferModel:
        def fit() -> TransferModel:
            data = self.type_data
            usable = [g for g in sorted(data) if self.stressor in data[g].iter_times_s]
            return fit_transfer([(data[g].profiles(self.stressor), list(data[g].pairs)) for g in usable],
                                self.stressor)

        return self._once(("model",), fit)

    def speed(self, gpu_type: str) -> float:
        data = self.type_data
        return data[gpu_type].speed if gpu_type in data else GPU_SPECS[gpu_type].relative_speed

    def type_profiles(self, gpu_type: str) -> TypeProfiles:
        """Every job's profile on ``gpu_type``: measured where it was, synthesized from the nearest type otherwise."""
        return self._once(("profiles", gpu_type), lambda: self._profiles(gpu_type))

    def _profiles(self, gpu_type: str) -> TypeProfiles:
        data = self.type_data
        sources = [g for g in sorted(data) if g != gpu_type and self.stressor in data[g].iter_times_s]
        synth = synthesized_for(data, sources, gpu_type, self.speed(gpu_type), self.stressor) if sources else None
        if gpu_type not in data:
            if synth is None:
                raise ValueError(f"no measured type to carry profiles over to {gpu_type!r} from")
            return synth
        measured = data[gpu_type].profiles(self.stressor)
        model = self.transfer_model()
        if synth is None:
            return model.anchor(measured)
        jobs = dict(synth.jobs)
        for job, prof in measured.jobs.items():
            carried = synth.jobs.get(job)
            if carried is not None and prof.probe_tput is None and prof.probe_partner_tput is None:
                # Measured solo but never next to the stressor (e.g. it did not fit in memory with it).
                prof = JobProfile(prof.iter_time_s, carried.probe_tput, carried.probe_partner_tput, prof.counters,
                                  True)
            jobs[job] = prof
        return model.anchor(TypeProfiles(gpu_type, measured.stressor, measured.stressor_iter_time_s, jobs))

    def type_offsets(self, gpu_type: str) -> dict[str, tuple[float, float]]:
        """Per-job corrections from the type's own pairs (none for a type without measurements)."""
        if gpu_type not in self.mset.types:
            return {}
        return self._once(("offsets", gpu_type), lambda: residual_offsets(
            self.transfer_model(), self.type_profiles(gpu_type), self.mset.types[gpu_type].pairs))

    def _folds(self):
        """Each measured type held out from a model fitted on the others: fitted once, shared by the
        leave-one-type-out reports and the intervals."""
        return self._once(("folds",), lambda: held_out_folds(self.type_data, self.stressor))

    def transfer_reports(self) -> tuple[TransferReport, ...]:
        """Leave-one-GPU-type-out errors of the per-job fit (before) and the transferable model (after)."""
        return self._once(("loto",), lambda: tuple(
            leave_one_type_out(self.type_data, self.stressor, folds=self._folds())))

    def subset_reports(self) -> tuple[TransferReport, ...]:
        """Leave one type out, trained on every non-empty subset of the other measured types."""
        return self._once(("loto-subsets",), lambda: tuple(
            leave_one_type_out(self.type_data, self.stressor, subsets=True, folds=self._folds())))

    def within_type_reports(self) -> tuple[WithinTypeReport, ...]:
        data = self.type_data
        return self._once(("within",), lambda: tuple(
            within_type(data[g], self.stressor) for g in sorted(data) if self.stressor in data[g].iter_times_s))

    def intervals(self) -> dict[str, Interval | None]:
        """The fitted model's 80 % intervals: ``after`` (measured profiles), ``zero_shot`` (synthesized)."""
        return self._once(("intervals",), lambda: model_interval(self.type_data, self.stressor,
                                                                 folds=self._folds()))

    def interval_for(self, gpu_type: str) -> tuple[Interval, float | None]:
        """The interval that applies on ``gpu_type``, with the type's scale: measured-profile (scaled by the
        type's own probes) where it was measured, zero-shot otherwise."""
        measured = gpu_type in self.mset.types
        iv = self.intervals()["after" if measured else "zero_shot"]
        if iv is None:
            raise ValueError("the interference model's interval needs at least two measured GPU types "
                             f"(measured: {', '.join(self.measured_types())})")
        scale = self.transfer_model().probe_scale(self.type_profiles(gpu_type)) if measured else None
        return iv, scale

    def catalog_for(self, calibration: str = TRANSFER, gpu_type: str | None = None) -> WorkloadCatalog:
        """Workload traits under one calibration, on one GPU type (None: on the reference type, with a
        per-type catalog for every known and measured type, see :meth:`WorkloadCatalog.for_gpu`)."""
        calibration = calibration.lower()
        if calibration not in self.calibrations():
            raise ValueError(f"unknown calibration {calibration!r} (known: {', '.join(self.calibrations())})")
        gpu_type = None if gpu_type is None else gpu_type.lower()
        return self._once(("catalog", calibration, gpu_type), lambda: self._catalog(calibration, gpu_type))

    def _catalog(self, calibration: str, gpu_type: str | None) -> WorkloadCatalog:
        solo = dict(self.mset.types[REFERENCE_GPU].solo_steps_per_s)
        model = self.transfer_model()
        if calibration not in INTERVAL_CALIBRATIONS:
            own = self.calibration_for(calibration)
            # A job the type never measured in a pair (e.g. it did not fit in memory beside others)
            # takes the transferable model's traits on that type.
            filler = model.calibration(self.type_profiles(calibration), 1.0, self.type_offsets(calibration))
            merged = Calibration({**filler.sensitivity, **own.sensitivity}, {**filler.pressure, **own.pressure})
            return build_catalog(merged, solo, gpu_type=gpu_type, calibration_name=calibration)
        if gpu_type is None:
            per_type = {g: self.catalog_for(calibration, g)
                        for g in sorted(set(GPU_SPECS) | set(self.measured_types()))}
            ref = per_type[REFERENCE_GPU]
            return WorkloadCatalog(ref.offline, ref.online, REFERENCE_GPU, calibration, per_type)
        if calibration == TRANSFER:
            factor = 1.0
        else:
            iv, scale = self.interval_for(gpu_type)
            factor = iv.factor(calibration, scale)
        traits = model.calibration(self.type_profiles(gpu_type), factor, self.type_offsets(gpu_type))
        return build_catalog(traits, solo, gpu_type=gpu_type, calibration_name=calibration)

    def fingerprint(self) -> str:
        """Changes whenever the measurements (hence every fitted calibration) change: for caches."""
        m = self.mset
        blob = json.dumps([m.stressor, sorted((g, sorted(t.solo_steps_per_s.items()),
                                               [(p.workload, p.partner, p.norm_tput) for p in t.pairs])
                                              for g, t in m.types.items())])
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def model_errors(c: Calibrator) -> dict:
    """The interference model, its held-out errors (every training subset), intervals and their factors."""
    intervals = c.intervals()
    return {"measured_types": c.measured_types(), "sources": list(c.mset.sources), "stressor": c.stressor,
            "model": c.transfer_model().as_dict(),
            "leave_one_type_out": [r.as_dict() for r in c.transfer_reports()],
            "leave_one_type_out_subsets": [r.as_dict() for r in c.subset_reports()],
            "within_type": [r.as_dict() for r in c.within_type_reports()],
            "intervals": {k: None if v is None else {
                **v.as_dict(), "factor_optimistic": round(v.factor(OPTIMISTIC), 4),
                "factor_pessimistic": round(v.factor(PESSIMISTIC), 4)} for k, v in intervals.items()}}


@functools.lru_cache(maxsize=1)
def installed_calibrator() -> Calibrator:
    """Fitted on the installed measurements (bundled + ``MUXFLOW_MEASUREMENTS``), once per process."""
    return Calibrator(installed())


def reset() -> None:
    """Forget the fitted calibrations (after ``MUXFLOW_MEASUREMENTS`` changed in this process)."""
    installed_calibrator.cache_clear()


# The installed calibrator's answers, for the rest of the chain.
def measurements() -> MeasurementSet:
    return installed_calibrator().mset


def calibrations() -> list[str]:
    return installed_calibrator().calibrations()


def calibration_for(gpu_type: str = REFERENCE_GPU) -> Calibration:
    return installed_calibrator().calibration_for(gpu_type)


def holdout_reports(seed: int = 0) -> list[HoldoutReport]:
    return installed_calibrator().holdout_reports(seed)


def catalog_for(calibration: str = TRANSFER, gpu_type: str | None = None) -> WorkloadCatalog:
    return installed_calibrator().catalog_for(calibration, gpu_type)


def default_catalog() -> WorkloadCatalog:
    """The ``transfer`` calibration on the reference type, with every type's own catalog (``for_gpu``)."""
    return installed_calibrator().catalog_for(TRANSFER)
