"""Seeded instances and harnesses of the scheduling benchmarks (``muxflow bench round | predictor | forecast``).

- :func:`make_instance`: a synthetic cluster for one round — 200 online services over the
  GPUs, 50 offline job types, 3 GPU types — and :func:`bench_predictors`, one real MLP per
  GPU type trained on simulated co-location samples;
- :func:`run_fast` / :func:`run_dense`: one round through the production planner, or the
  dense baseline (every pair through the MLP, then ``linear_sum_assignment``), with timings
  and peak memory;
- :func:`forecast_traces`: simulated diurnal SM traces for the forecaster's backtest.

Every number is from the simulated cluster's models (no GPU is used).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np

from executors.data.calibration import default_catalog
from executors.machine import rss_peak_mb
from executors.scheduler.predictors import training_matrix
from executors.simulated.cluster import rng_stream
from executors.simulated.profiling import colocation_samples, offline_profile, online_features
from scheduler_core.domain import GpuCandidate, GpuHealth, JobCandidate
from scheduler_core.gpu_specs import get_spec
from scheduler_core.online.load import diurnal_qps, simulated_sm_trace
from scheduler_core.prediction.predictor import PredictorConfig, one_torch_thread, train
from scheduler_core.round.check import plan_violations
from scheduler_core.round.dense import plan_round_dense
from scheduler_core.round.plan import plan_round
from scheduler_core.workloads import ONLINE_FAMILIES

BENCH_GPU_TYPES = ("t4", "a10", "a100")
N_SERVICES = 200
N_JOB_TYPES = 50


def set_threads() -> int:
    import torch

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    return torch.get_num_threads()


# -- seeded instance generator --------------------------------------------------------


@dataclass(frozen=True)
class BenchService:
    name: str
    family: str
    gpu_type: str
    mem_bytes: float
    slowdown_allowance: float
    load_now: float  # mean load of its replicas this interval (diurnal phase)


@dataclass(frozen=True)
class BenchJobType:
    name: str
    base_type: str  # Gavel job type whose traits it has
    mem_bytes: int


def bench_services(seed: int, n_services: int = N_SERVICES, gpu_types=BENCH_GPU_TYPES) -> list[BenchService]:
    """Online services: family, GPU type, memory, slowdown allowance and this interval's load."""
    rng = rng_stream(seed, "bench-services")
    fams = sorted(ONLINE_FAMILIES)
    out = []
    for s in range(n_services):
        fam = fams[int(rng.integers(len(fams)))]
        peak_hour = float(rng.uniform(0, 24))
        # Load now: a point of a daily cycle between a quiet and a busy level (paper Fig. 2).
        lo, hi = float(rng.uniform(0.05, 0.3)), float(rng.uniform(0.5, 0.95))
        load = float(diurnal_qps(14.0, lo, hi, peak_hour))
        out.append(BenchService(
            name=f"svc-{s:03d}-{fam}", family=fam, gpu_type=gpu_types[int(rng.integers(len(gpu_types)))],
            mem_bytes=ONLINE_FAMILIES[fam].mem_bytes * float(rng.uniform(0.8, 1.3)),
            slowdown_allowance=float(rng.choice([0.1, 0.15, 0.2, 0.25, 0.3])), load_now=load,
        ))
    return out


def bench_job_types(catalog, n_types: int = N_JOB_TYPES) -> list[BenchJobType]:
    """``n_types`` job types: the Gavel types, then variants of them with 1.6× the memory."""
    base = sorted(catalog.offline)
    out = []
    for v in range(math.ceil(n_types / len(base))):
        for b in base:
            if len(out) == n_types:
                break
            mem = int(catalog.offline_workload(b).mem_bytes * (1.0 + 0.6 * v))
            out.append(BenchJobType(b if v == 0 else f"{b} v{v}", b, mem))
    return out


def make_instance(n_gpus: int, n_jobs: int, seed: int = 0, running_frac: float = 0.0,
                  n_services: int = N_SERVICES, n_job_types: int = N_JOB_TYPES, distinct_profiles: bool = False):
    """A seeded round: ``n_gpus`` online GPUs (replicas of the services) and ``n_jobs`` offline jobs.

    Each job type is profiled once per GPU type and its jobs share that profile
    (a profiling cache keyed by job type); ``distinct_profiles`` profiles every
    job separately instead (measurement noise makes each one different).
    ``running_frac`` of the jobs are already running, one per GPU.
    """
    catalog = default_catalog()
    services = bench_services(seed, n_services)
    rng = rng_stream(seed, "bench-gpus")
    # Replica counts: uneven (a few big services), every service at least one GPU.
    share = rng.dirichlet(np.full(len(services), 0.8))
    counts = np.ones(len(services), dtype=int) if n_gpus >= len(services) else np.zeros(len(services), dtype=int)
    counts += rng.multinomial(n_gpus - int(counts.sum()), share)
    health_p = {GpuHealth.HEALTHY: 0.96, GpuHealth.UNHEALTHY: 0.02, GpuHealth.OVERLIMIT: 0.01, GpuHealth.INIT: 0.01}
    states, probs = list(health_p), np.array(list(health_p.values()))
    gpus = []
    for svc, count in zip(services, counts):
        spec = get_spec(svc.gpu_type)
        for _ in range(int(count)):
            load = float(np.clip(svc.load_now * rng.uniform(0.85, 1.15), 0.02, 0.98))
            f = online_features(catalog, svc.family, svc.gpu_type, load, svc.mem_bytes, rng)
            gpus.append(GpuCandidate(
                gpu_id=len(gpus), gpu_type=svc.gpu_type, memory_bytes=spec.memory_bytes,
                max_sm_clock_mhz=spec.max_sm_clock_mhz, health=states[int(rng.choice(len(states), p=probs))],
                service_name=svc.name, online=f, forecast_sm_pct=f.sm_activity_pct * float(rng.uniform(1.0, 1.15)),
                forecast_mem_bytes=svc.mem_bytes * 1.05, slowdown_allowance=svc.slowdown_allowance,
            ))
    jrng = rng_stream(seed, "bench-jobs")
    jtypes = bench_job_types(catalog, n_job_types)
    profiles = {(jt.name, t): offline_profile(catalog, jt.base_type, t, jrng) for jt in jtypes for t in BENCH_GPU_TYPES}
    weights = 1.0 / np.arange(1, len(jtypes) + 1) ** 0.8  # a few popular job types
    weights /= weights.sum()
    allowed_sets = [frozenset(BENCH_GPU_TYPES), frozenset({"a10", "a100"}), frozenset({"t4", "a10"}),
                    frozenset({"a100"})]
    allowed_p = np.array([0.7, 0.15, 0.1, 0.05])
    jobs = []
    for j in range(n_jobs):
        jt = jtypes[int(jrng.choice(len(jtypes), p=weights))]
        allowed = allowed_sets[int(jrng.choice(len(allowed_sets), p=allowed_p))]
        if distinct_profiles:
            profs = {t: offline_profile(catalog, jt.base_type, t, jrng) for t in BENCH_GPU_TYPES}
        else:
            profs = {t: profiles[(jt.name, t)] for t in BENCH_GPU_TYPES}
        jobs.append(JobCandidate(job_id=100_000 + j, mem_bytes=jt.mem_bytes, allowed_gpu_types=allowed,
                                 profiles=profs, priority=0))
    if running_frac > 0:
        gpus, jobs = _place_running(gpus, jobs, running_frac, rng_stream(seed, "bench-running"))
    return gpus, jobs


def _place_running(gpus, jobs, frac, rng):
    """Put ``frac`` of the jobs on GPUs (one each) as if a previous round had placed them."""
    from dataclasses import replace


    hosts = [i for i, g in enumerate(gpus) if g.health in (GpuHealth.HEALTHY, GpuHealth.UNHEALTHY, GpuHealth.OVERLIMIT)]
    n_run = min(int(round(frac * len(jobs))), len(hosts))
    chosen_jobs = rng.choice(len(jobs), n_run, replace=False)
    chosen_gpus = rng.choice(hosts, n_run, replace=False)
    gpus, jobs = list(gpus), list(jobs)
    for j, i in zip(chosen_jobs, chosen_gpus):
        pct = int(rng.integers(2, 9) * 10)
        gpus[i] = replace(gpus[i], current_job_id=jobs[j].job_id, current_sm_pct=pct)
        jobs[j] = replace(jobs[j], current_gpu_id=gpus[i].gpu_id, current_sm_pct=pct)
    return gpus, jobs


def bench_predictors(seed: int = 0, samples_per_type: int = 2000, epochs: int | None = None, gpu_types=BENCH_GPU_TYPES,
                     cfg_overrides: dict | None = None):
    """One MLP per GPU type on simulated co-location samples of the bench services and job types.

    Returns ({type: model}, {type: (report, seconds)}, {type: (x, y_tput, y_slowdown)}).
    """
    catalog = default_catalog()
    services = [(s.name, s.family, s.mem_bytes) for s in bench_services(seed)]
    models, reports, data = {}, {}, {}
    # Large predict batches do gain from threads; training does not (one_torch_thread).
    with one_torch_thread():
        _train_each(gpu_types, catalog, services, seed, samples_per_type, epochs, cfg_overrides, models, reports, data)
    return models, reports, data


def _train_each(gpu_types, catalog, services, seed, samples_per_type, epochs, cfg_overrides, models, reports, data):
    for t in gpu_types:
        rng = rng_stream(seed, f"bench-samples-{t}")
        samples = colocation_samples(catalog, t, services, sorted(catalog.offline), samples_per_type, rng)
        x, yt, ys = training_matrix(samples, t)
        cfg = PredictorConfig(epochs=epochs, seed=seed, **(cfg_overrides or {}))
        t0 = time.perf_counter()
        model, report = train(x, yt, ys, cfg)
        reports[t] = (report, time.perf_counter() - t0)
        models[t] = model
        data[t] = (x, yt, ys)


# -- bench round ------------------------------------------------------------------------


def round_figures(res, wall: float) -> dict:
    t = res.timings_s
    predict = t.get("features", 0.0) + t.get("prediction", 0.0) + t.get("feasibility", 0.0)
    out = {
        "predict_s": round(predict, 3),
        "match_s": round(t.get("matching", 0.0), 3),
        "plan_s": round(t.get("plan", 0.0), 3),
        "total_s": round(wall, 3),
        "objective": res.objective,
        "matching_objective": res.matching_objective,
        "placements": len(res.placements),
        "feasible_pairs": res.feasible_pairs,
        "actions": res.action_counts(),
    }
    return out


def run_fast(gpus, jobs, models, cfg) -> dict:
    t0 = time.perf_counter()
    res = plan_round(gpus, jobs, models, cfg)
    wall = time.perf_counter() - t0
    out = round_figures(res, wall)
    # The plan checked again, independently of the planner (the Dagster asset check's rules).
    out["plan_violations"] = len(plan_violations(gpus, jobs, res.placements, res.actions, cfg.sm))
    s = res.stats
    out.update({
        "certified_optimal": res.certified_optimal,
        "optimality_gap_bound": res.optimality_gap_bound,
        "pairs_certified": s["certificate"]["pairs_checked"],
        "distinct_gpu_rows": s["distinct_gpu_rows"], "distinct_job_profiles": s["distinct_profiles"],
        "job_classes": s["classes"], "predicted_pairs": s["predicted_pairs"],
        "gpus_out_of_range": s["gpus_out_of_range"], "profiles_out_of_range": s["profiles_out_of_range"],
        "solver": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in s["solver"].items()},
        "timings_s": {k: round(v, 3) for k, v in res.timings_s.items()},
    })
    return out, res


def run_dense(gpus, jobs, models, cfg) -> dict:
    t0 = time.perf_counter()
    res = plan_round_dense(gpus, jobs, models, cfg)
    return round_figures(res, time.perf_counter() - t0), res


def compare(gpus, jobs, models, cfg, fast: dict, fast_res) -> dict:
    dense, dense_res = run_dense(gpus, jobs, models, cfg)
    # Same optimum: the matching objective (what both maximise) must agree.
    a, b = fast_res.matching_objective, dense_res.matching_objective
    dense.update({
        "speedup": round(dense["total_s"] / max(fast["total_s"], 1e-9), 1),
        "objectives_equal": bool(abs(a - b) <= 1e-6),
        "objective_diff": a - b,
        "peak_rss_mb_after": round(rss_peak_mb(), 1),
    })
    return dense


# -- bench predictor ----------------------------------------------------------------------

FIG12_HIDDEN = (32, 64, 128, 256, 512, 1024)
# The paper's network, reported beside the default by `muxflow bench predictor`.
PAPER_HIDDEN, PAPER_EPOCHS = 64, 250
FIG12_LAYERS = (2, 3, 4, 5, 6, 7, 8)


def report_row(report, seconds: float) -> dict:
    return {
        "n_train": report.n_train, "n_holdout": report.n_holdout,
        "mae_tput": round(report.holdout_mae_tput, 4), "mape_tput_pct": round(100 * report.holdout_mape_tput, 2),
        "mae_slowdown": round(report.holdout_mae_slowdown, 4),
        "mape_slowdown_pct": round(100 * report.holdout_mape_slowdown, 2),
        "train_s": round(seconds, 2),
    }


def forecast_traces(n_gpus: int, days: int, seed: int) -> np.ndarray:
    """Per-minute SM activity of ``n_gpus`` simulated online GPUs over ``days`` days (seeded)."""
    rng = rng_stream(seed, "bench-forecast")
    fams = sorted(ONLINE_FAMILIES)
    return np.stack([
        simulated_sm_trace(days * 1440, ONLINE_FAMILIES[fams[i % len(fams)]], rng,
                           qps_lo_frac=float(rng.uniform(0.05, 0.3)), qps_hi_frac=float(rng.uniform(0.5, 0.95)),
                           peak_hour_utc=float(rng.uniform(0, 24)))
        for i in range(n_gpus)
    ])
