"""Refit the interference model and the simulated predictors from measured co-location samples.

``muxflow calibrate refit --data FILE`` (pipelines/cli/calibrate.py) runs :func:`refit_report`:
the installed measurements (bundled + ``MUXFLOW_MEASUREMENTS``) before, those plus ``FILE``
after, and for both

- the interference model's errors: leave one measured GPU type out, and within each type;
- on ``FILE``'s own pairs: the installed model (from the file's profiles only) against the refit;
- the speed predictors (paper §5) trained on each simulated GPU type's samples, tested on every
  type's samples, under the per-job P100 fit that every type borrowed before the transferable
  model, and under the transferable model before and after the refit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from executors.data.calibration import TRANSFER, Calibrator, installed_calibrator, model_errors
from executors.data.measurements import load_file
from executors.scheduler.predictors import training_matrix
from executors.simulated.evaluation import PREDICTOR_EPOCHS, PREDICTOR_SAMPLES, services_of, train_on_samples
from executors.simulated.profiling import colocation_samples
from scheduler_core.interference.transfer import PairErrors, pair_errors, training_pairs
from scheduler_core.rng import rng_stream
from scheduler_core.simulator import SimConfig

SIMULATED_TYPES = ("t4", "a10", "a100", "h100")
TEST_SAMPLES = 500


@dataclass(frozen=True)
class PredictorCell:
    train: str
    test: str
    mae_tput: float
    mae_slowdown: float
    accepted: float  # share of the test samples inside the range the model accepts

    def as_dict(self) -> dict:
        return {"train": self.train, "test": self.test, "mae_tput": round(self.mae_tput, 4),
                "mae_slowdown": round(self.mae_slowdown, 4), "accepted": round(self.accepted, 3)}


def predictor_matrix(calibrator: Calibrator, calibration: str, types: list[str], samples: int = PREDICTOR_SAMPLES,
                     epochs: int = PREDICTOR_EPOCHS, seed: int = 0) -> list[PredictorCell]:
    """Train one predictor per type on its own samples; score it on fresh samples of every type.

    The diagonal is the held-out error on the type it was trained on; the rest is how the predictor
    does on a type it never saw (rows outside its accepted input range are refused, as in a round).
    """
    cfg = SimConfig(gpus=1, seed=seed)
    cats = {g: calibrator.catalog_for(calibration, g) for g in types}
    models = {g: train_on_samples(cats[g], g, cfg, samples, epochs, f"refit-train-{g}")[0] for g in types}
    out = []
    for h in types:
        rows = colocation_samples(cats[h], h, services_of(cfg), sorted(cats[h].offline), TEST_SAMPLES,
                                  rng_stream(seed, f"refit-test-{h}"), cfg.interference)
        x, yt, ys = training_matrix(rows, h)
        for g in types:
            ok = models[g].accepts(x)
            if ok.any():
                e = models[g].errors(x[ok], yt[ok], ys[ok])
                out.append(PredictorCell(g, h, e.mae_tput, e.mae_slowdown, float(ok.mean())))
            else:
                out.append(PredictorCell(g, h, float("nan"), float("nan"), 0.0))
    return out


def _on_pairs(calibrator: Calibrator, files_types: list[str], profiles_from: Calibrator) -> dict[str, PairErrors]:
    """Errors on the named types' pairs: ``calibrator``'s model with ``profiles_from``'s profiles."""
    out = {}
    model = calibrator.transfer_model()
    for g in files_types:
        data = profiles_from.type_data[g]
        prof = model.anchor(data.profiles(model.stressor))
        offsets = calibrator.type_offsets(g) if g in calibrator.mset.types else {}
        pairs = [p for p in training_pairs(data.pairs, model.stressor)
                 if p.workload in prof.jobs and p.partner in prof.jobs]
        out[g] = pair_errors([model.predict(prof, p.workload, p.partner, offsets) for p in pairs],
                             [p.norm_tput for p in pairs])
    return out


def refit_report(files: list[str], types: list[str] | None = None, samples: int = PREDICTOR_SAMPLES,
                 epochs: int = PREDICTOR_EPOCHS, seed: int = 0, with_predictors: bool = True) -> dict:
    before = installed_calibrator()
    added = [load_file(f) for f in files]
    mset = before.mset
    for m in added:
        mset = mset.merged(m)
    after = Calibrator(mset)
    file_types = sorted({g for m in added for g in m.types})
    after.transfer_model()  # fails early, with the reason, when the data cannot be fitted
    report = {
        "files": list(files), "file_types": file_types,
        "before": model_errors(before), "after": model_errors(after),
        "on_file_pairs": {
            "installed": {g: e.as_dict() for g, e in _on_pairs(before, file_types, after).items()},
            "refit": {g: e.as_dict() for g, e in _on_pairs(after, file_types, after).items()},
        },
        "same_measurements": before.fingerprint() == after.fingerprint(),
    }
    if with_predictors:
        types = list(types or SIMULATED_TYPES)
        runs = {"p100 per-job fit (every type borrows it)": (before, "p100"),
                "transfer, installed": (before, TRANSFER), "transfer, refit": (after, TRANSFER)}
        if report["same_measurements"]:
            del runs["transfer, installed"]
        report["predictors"] = {
            name: [cell.as_dict() for cell in predictor_matrix(c, cal, types, samples, epochs, seed)]
            for name, (c, cal) in runs.items()}
    return report


def diagonal_and_off(cells: list[dict]) -> tuple[float, float]:
    """Mean MAE of normalized throughput on the trained type, and on the other types."""
    diag = [c["mae_tput"] for c in cells if c["train"] == c["test"]]
    off = [c["mae_tput"] for c in cells if c["train"] != c["test"] and c["accepted"] > 0]
    return float(np.mean(diag)) if diag else float("nan"), float(np.mean(off)) if off else float("nan")
