"""Steps of the pipeline that work on the store: profile new jobs, collect samples, train.

Profiling and sampling here use the simulated GPU models (labelled
``simulated`` in the store); the real profiler on the ``profile`` partition
replaces them on a cluster with GPUs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from sqlalchemy import select

from executors.simulated.cluster import rng_stream
from executors.simulated.profiling import colocation_samples, offline_profile
from executors.store import models as m
from executors.store import repo
from executors.store.db import Store
from executors.store.jobs import transition
from scheduler_core.domain import JobState, OfflineFeatures, OnlineFeatures
from scheduler_core.features import offline_vector, online_vector, pair_matrix
from scheduler_core.gpu_specs import get_spec
from scheduler_core.predictor import PredictorConfig, should_promote, train
from scheduler_core.workloads import WorkloadCatalog

log = logging.getLogger(__name__)


def profile_new_jobs(store: Store, catalog: WorkloadCatalog, seed: int = 0) -> int:
    """SUBMITTED → PROFILING → PENDING with a solo profile per allowed GPU type (simulated)."""
    rng = rng_stream(seed, "profiling")
    done = 0
    with store.session() as s:
        ids = [j.id for j in repo.jobs_in_states(s, [JobState.SUBMITTED])]
    for job_id in ids:
        with store.session() as s:
            job = transition(s, job_id, JobState.PROFILING, "simulated solo profiling")
            try:
                for gtype in job.allowed_gpu_types:
                    repo.save_profile(s, job.id, gtype, offline_profile(catalog, job.job_type, gtype, rng), "simulated")
            except KeyError as exc:
                transition(s, job_id, JobState.FAILED, f"profiling failed: {exc}")
                continue
            transition(s, job_id, JobState.PENDING, "profiled")
            done += 1
    return done


def collect_samples(store: Store, catalog: WorkloadCatalog, per_type: int, seed: int = 0) -> dict[str, int]:
    counts = {}
    with store.session() as s:
        services = [(v.name, v.model_family, float(v.mem_bytes)) for v in s.scalars(select(m.OnlineService))]
        gtypes = sorted(repo.gpu_type_names(s))
        for gtype in gtypes:
            rng = rng_stream(seed, f"samples-{gtype}")
            samples = colocation_samples(catalog, gtype, services, sorted(catalog.offline), per_type, rng)
            counts[gtype] = repo.add_samples(s, samples)
    return counts


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


def training_matrix(rows: list[m.ColocationSample], gpu_type: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    spec = get_spec(gpu_type)
    on = np.stack([online_vector(OnlineFeatures(**r.online_features), spec.memory_bytes, spec.max_sm_clock_mhz) for r in rows])
    off = np.stack([offline_vector(OfflineFeatures(**r.offline_features), spec.memory_bytes, spec.max_sm_clock_mhz) for r in rows])
    x = pair_matrix(on, off, [r.sm_pct for r in rows])
    return x, np.array([r.offline_norm_tput for r in rows]), np.array([r.online_slowdown for r in rows])


def train_predictors(store: Store, cfg: PredictorConfig = PredictorConfig()) -> list[TrainOutcome]:
    out = []
    with store.session() as s:
        gtypes = sorted(repo.gpu_type_names(s))
    for gtype in gtypes:
        with store.session() as s:
            rows = repo.samples_for(s, gtype)
            if len(rows) < 10:
                log.warning("GPU type %s has %d co-location samples; not training", gtype, len(rows))
                continue
            x, y_t, y_s = training_matrix(rows, gtype)
            model, report = train(x, y_t, y_s, cfg)
            cur = repo.current_model(s, gtype)
            promote = should_promote(report, cur.holdout_mae_tput if cur else None)
            methods = {r.method for r in rows}
            trained_on = "simulated" if methods == {"simulated"} else ("measured" if "simulated" not in methods else "mixed")
            row = repo.save_model(s, gtype, model, cfg, report, promote, trained_on)
            out.append(TrainOutcome(gtype, row.version, report.n_train, report.n_holdout, report.holdout_mae_tput,
                                    report.holdout_mae_slowdown, promote, trained_on))
    return out
