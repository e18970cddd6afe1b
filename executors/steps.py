"""Steps of the pipeline that work on the store: profile new jobs, collect samples, train.

Profiling and sampling here use the simulated GPU models (labelled
``simulated`` in the store); the real profiler on the ``profile`` partition
replaces them on a cluster with GPUs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np
from executors.simulated.cluster import rng_stream
from executors.simulated.profiling import colocation_samples, offline_profile
from executors.store import inventory
from executors.store import models as m
from executors.store import repo
from executors.store.db import Store
from executors.store.jobs import transition
from scheduler_core.domain import JobState, OfflineFeatures, OnlineFeatures
from scheduler_core.prediction.features import offline_vector, online_vector, pair_matrix
from scheduler_core.gpu_specs import get_spec
from scheduler_core.prediction.predictor import PredictorConfig, TrainingReport, should_promote, train
from scheduler_core.workloads import WorkloadCatalog

log = logging.getLogger(__name__)


def profile_new_jobs(store: Store, catalog: WorkloadCatalog, seed: int = 0) -> int:
    """SUBMITTED → PROFILING → PENDING with a solo profile per allowed GPU type (simulated)."""
    done = 0
    with store.session() as s:
        ids = [j.id for j in repo.jobs_in_states(s, [JobState.SUBMITTED])]
    for job_id in ids:
        with store.session() as s:
            job = transition(s, job_id, JobState.PROFILING, "simulated solo profiling")
            rng = rng_stream(seed, f"profiling-job-{job_id}")  # per job: the same profile whichever run takes it
            try:
                for gtype in job.allowed_gpu_types:
                    repo.save_profile(s, job.id, gtype, offline_profile(catalog, job.job_type, gtype, rng), "simulated")
            except KeyError as exc:
                transition(s, job_id, JobState.FAILED, f"profiling failed: {exc}")
                continue
            transition(s, job_id, JobState.PENDING, "profiled")
            done += 1
    return done


def collect_samples(
    store: Store, catalog: WorkloadCatalog, per_type: int, seed: int = 0, top_up: bool = False
) -> dict[str, int]:
    """Simulated co-location samples per GPU type: ``per_type`` more, or (``top_up``) up to ``per_type`` in all."""
    counts = {}
    with store.session() as s:
        services = [(v.name, v.model_family, float(v.mem_bytes)) for v in inventory.online_services(s, by="id")]
        gtypes = sorted(repo.gpu_type_names(s))
        for gtype in gtypes:
            have = repo.sample_count(s, gtype)
            want = max(0, per_type - have) if top_up else per_type
            if want == 0 or not services:
                counts[gtype] = 0
                continue
            # A new stream per batch (named by how many samples exist), so top-ups add new samples.
            rng = rng_stream(seed, f"samples-{gtype}" if have == 0 else f"samples-{gtype}-{have}")
            samples = colocation_samples(catalog, gtype, services, sorted(catalog.offline), want, rng)
            counts[gtype] = repo.add_samples(s, samples)
    return counts


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
