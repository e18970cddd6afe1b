"""The speed predictors' steps on the feature store: train a GPU type's candidate on its co-location samples, check
it on held-out samples, promote it (docs/DESIGN.md §3 step 4).

Where the profiles and samples come from is the cluster's profiler (``executors.cluster.Profiler``): the profile
partition on Slurm (``executors.scheduler.profiling``), the simulated GPU model on the simulated cluster
(``executors.simulated.profiler``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np

from executors.store import models as m
from executors.store import repo
from executors.store.db import Store
from scheduler_core.domain import OfflineFeatures, OnlineFeatures
from scheduler_core.gpu_specs import get_spec
from scheduler_core.prediction.features import offline_vector, online_vector, pair_matrix
from scheduler_core.prediction.predictor import PredictorConfig, TrainingReport, should_promote, train

log = logging.getLogger(__name__)


MIN_SAMPLES = 10


class InsufficientSamples(ValueError):
    """Too few co-location samples to train a GPU type's model."""


@dataclass(frozen=True)
class TrainOutcome:
    gpu_type: str
    version: int
    n_train: int
    n_holdout: int
    holdout_mae_tput: float
    holdout_mae_slowdown: float
    promoted: bool
    trained_on: str
    holdout_mape_tput: float | None = None


def training_matrix(rows: list[m.ColocationSample], gpu_type: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    spec = get_spec(gpu_type)
    on = np.stack([online_vector(OnlineFeatures(**r.online_features), spec.memory_bytes, spec.max_sm_clock_mhz) for r in rows])
    off = np.stack([offline_vector(OfflineFeatures(**r.offline_features), spec.memory_bytes, spec.max_sm_clock_mhz) for r in rows])
    x = pair_matrix(on, off, [r.sm_pct for r in rows])
    return x, np.array([r.offline_norm_tput for r in rows]), np.array([r.online_slowdown for r in rows])


def train_candidate(store: Store, gpu_type: str, cfg: PredictorConfig = PredictorConfig()) -> TrainOutcome:
    """Train a model for one GPU type on all its samples and store it as an unpromoted version."""
    with store.session() as s:
        if gpu_type not in repo.gpu_type_names(s):
            raise KeyError(f"unknown GPU type {gpu_type!r}")
        rows = repo.samples_for(s, gpu_type)
        if len(rows) < MIN_SAMPLES:
            raise InsufficientSamples(f"GPU type {gpu_type} has {len(rows)} co-location samples; need {MIN_SAMPLES}")
        x, y_t, y_s = training_matrix(rows, gpu_type)
        model, report = train(x, y_t, y_s, cfg)
        methods = {r.method for r in rows}
        trained_on = "simulated" if methods == {"simulated"} else ("measured" if "simulated" not in methods else "mixed")
        row = repo.save_model(s, gpu_type, model, cfg, report, False, trained_on)
        return TrainOutcome(gpu_type, row.version, report.n_train, report.n_holdout, report.holdout_mae_tput,
                            report.holdout_mae_slowdown, False, trained_on, row.holdout_mape_tput)


@dataclass(frozen=True)
class Promotion:
    gpu_type: str
    version: int
    promoted: bool
    reason: str
    previous_version: int | None


def promote(store: Store, gpu_type: str, version: int, max_holdout_mae: float | None = None) -> Promotion:
    """Promote a stored version if its held-out error is within the bound and no worse than the current model's."""
    with store.session() as s:
        cand = repo.model_row(s, gpu_type, version)
        cur = repo.current_model(s, gpu_type)
        prev = cur.version if cur else None
        if cur is not None and cur.version == version:
            return Promotion(gpu_type, version, True, "already the promoted model", prev)
        if max_holdout_mae is not None and cand.holdout_mae_tput > max_holdout_mae:
            return Promotion(gpu_type, version, False,
                             f"held-out MAE {cand.holdout_mae_tput:.4f} exceeds the bound {max_holdout_mae}", prev)
        report = TrainingReport(cand.n_train, cand.n_holdout, cand.holdout_mae_tput, cand.holdout_mae_slowdown,
                                float("nan"), cand.feature_ranges)
        if not should_promote(report, cur.holdout_mae_tput if cur else None):
            return Promotion(gpu_type, version, False,
                             f"held-out MAE {cand.holdout_mae_tput:.4f} is worse than v{prev}'s {cur.holdout_mae_tput:.4f}",
                             prev)
        repo.set_promoted(s, gpu_type, version)
        return Promotion(gpu_type, version, True,
                         "first model" if cur is None else f"held-out MAE {cand.holdout_mae_tput:.4f} <= v{prev}'s "
                         f"{cur.holdout_mae_tput:.4f}", prev)


def train_predictors(store: Store, cfg: PredictorConfig = PredictorConfig()) -> list[TrainOutcome]:
    """Train every GPU type that has enough samples and promote each model that is no worse than the current."""
    out = []
    with store.session() as s:
        gtypes = sorted(repo.gpu_type_names(s))
    for gtype in gtypes:
        try:
            t = train_candidate(store, gtype, cfg)
        except InsufficientSamples as exc:
            log.warning("%s; not training", exc)
            continue
        p = promote(store, gtype, t.version)
        out.append(replace(t, promoted=p.promoted))
    return out
