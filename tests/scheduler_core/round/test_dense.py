"""The fast round (grouped predictions, class-level matching) against the dense reference (every pair, KM).

Random clusters with every health state, running jobs, migration penalties,
memory quotas, allowed types and duplicate GPUs/jobs: the plans must reach the
same optimum, with the same feasible pairs, and come certified.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_core.domain import Action, GpuCandidate, GpuHealth, JobCandidate, OfflineFeatures, OnlineFeatures
from scheduler_core.prediction.features import N_FEATURES
from scheduler_core.prediction.predictor import PredictorConfig, train
from scheduler_core.round.plan import RoundConfig, plan_round
from scheduler_core.online.dynamic_sm import SmPolicy
from scheduler_core.round.dense import dense_weights, plan_round_dense

GIB = 1024**3


class SmoothStub:
    """A deterministic smooth function of all 16 features (no torch): varied weights and slowdowns."""

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        self.a = rng.normal(0, 1, N_FEATURES)
        self.b = rng.normal(0, 1, N_FEATURES)
        self.scale = np.array([50, 50, 50, 0.5, 50, 2, 300, 0.5, 50, 50, 50, 0.5, 50, 2, 0.5, 50.0])
        self.rows = 0

    def predict(self, x):
        self.rows += x.shape[0]
        z = (x - self.scale) / self.scale
        tput = 1.0 / (1.0 + np.exp(-(z @ self.a)))
        slow = 1.0 + 0.5 / (1.0 + np.exp(-(z @ self.b)))
        return np.clip(tput - 0.05, 0.0, 1.0), slow


def random_cluster(seed: int, n: int, m: int, running: float = 0.3):
    rng = np.random.default_rng(seed)
    onlines = [OnlineFeatures(float(rng.uniform(10, 70)), float(rng.uniform(5, 60)), float(rng.uniform(5, 40)),
                              float(rng.uniform(1, 6)) * GIB, float(rng.uniform(5, 60)), float(rng.uniform(3, 30)),
                              float(rng.uniform(50, 500)), float(rng.uniform(1200, 1590))) for _ in range(max(1, n // 3))]
    profiles = [OfflineFeatures(float(rng.uniform(60, 100)), float(rng.uniform(30, 95)), float(rng.uniform(20, 60)),
                                float(rng.uniform(1, 5)) * GIB, float(rng.uniform(20, 90)), float(rng.uniform(0.05, 1)),
                                float(rng.uniform(1100, 1500))) for _ in range(4)]
    healths = [GpuHealth.HEALTHY] * 6 + [GpuHealth.UNHEALTHY, GpuHealth.OVERLIMIT, GpuHealth.INIT, GpuHealth.DISABLED]
    gpus = []
    for i in range(n):
        gpus.append(GpuCandidate(
            gpu_id=i + 1, gpu_type=["t4", "a10"][int(rng.integers(2))], memory_bytes=16 * GIB, max_sm_clock_mhz=1590,
            health=healths[int(rng.integers(len(healths)))], service_name=f"svc{i % 3}",
            online=onlines[int(rng.integers(len(onlines)))],  # replicas share features: duplicates
            forecast_sm_pct=float(rng.choice([10.0, 25.0, 40.0, float(rng.uniform(0, 90))])),
            forecast_mem_bytes=float(rng.uniform(1, 12)) * GIB, slowdown_allowance=float(rng.choice([0.05, 0.2, 0.5])),
        ))
    jobs = []
    for j in range(m):
        types = [("t4", "a10"), ("t4",), ("a10",)][int(rng.integers(3))]
        jobs.append(JobCandidate(
            job_id=1000 + j, mem_bytes=int(rng.choice([2, 4, 7])) * GIB, allowed_gpu_types=frozenset(types),
            profiles={t: profiles[int(rng.integers(len(profiles)))] for t in ("t4", "a10") if rng.random() < 0.9},
        ))
    free = list(rng.permutation(n))
    for j in range(m):
        if rng.random() < running and free:
            i = int(free.pop())
            pct = int(rng.integers(1, 10) * 10)
            gpus[i] = replace(gpus[i], current_job_id=jobs[j].job_id, current_sm_pct=pct)
            jobs[j] = replace(jobs[j], current_gpu_id=gpus[i].gpu_id, current_sm_pct=pct)
    return gpus, jobs


def check_plan(result, gpus, jobs, predictors, cfg) -> None:
    elig, _tput, _slow, feasible, _adj, sm, _quota = dense_weights(gpus, jobs, predictors, cfg)
    pos = {g.gpu_id: i for i, g in enumerate(elig)}
    jpos = {job.job_id: j for j, job in enumerate(jobs)}
    assert len({p.gpu_id for p in result.placements}) == len(result.placements)
    assert len({p.job_id for p in result.placements}) == len(result.placements)
    for p in result.placements:
        assert feasible[pos[p.gpu_id], jpos[p.job_id]], "an infeasible pair was placed"
    acted = [a.job_id for a in result.actions]
    assert len(acted) == len(set(acted))
    running = {job.job_id for job in jobs if job.current_gpu_id is not None}
    placed = {p.job_id for p in result.placements}
    assert {a.job_id for a in result.actions if a.action == Action.EVICT} == running - placed


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31 - 1), st.integers(0, 30), st.integers(0, 25), st.sampled_from([0.0, 0.05, 0.3]),
       st.sampled_from([0, 2]))
def test_fast_round_equals_dense_reference(seed, n, m, penalty, fallback_levels) -> None:
    gpus, jobs = random_cluster(seed, n, m)
    preds = {"t4": SmoothStub(seed), "a10": SmoothStub(seed + 1)}
    cfg = RoundConfig(migration_penalty=penalty, sm=SmPolicy(fallback_levels=fallback_levels))
    fast = plan_round(gpus, jobs, preds, cfg)
    dense = plan_round_dense(gpus, jobs, preds, cfg)
    assert fast.certified_optimal and fast.optimality_gap_bound <= 1e-6
    assert fast.matching_objective == pytest.approx(dense.matching_objective, abs=1e-9)
    assert fast.feasible_pairs == dense.feasible_pairs
    assert fast.gpus_considered == dense.gpus_considered
    if penalty == 0.0:
        assert fast.objective == pytest.approx(dense.objective, abs=1e-9)
    check_plan(fast, gpus, jobs, preds, cfg)
    # Every pair runs at the share its weight was predicted at: the dense reference's.
    _e, _t, _s, _f, _a, pct, _q = dense_weights(gpus, jobs, preds, cfg)
    epos = {g.gpu_id: i for i, g in enumerate(_e)}
    jpos = {job.job_id: j for j, job in enumerate(jobs)}
    kept = {a.job_id for a in fast.actions if a.action == Action.KEEP}
    for p in fast.placements:
        if p.job_id not in kept:
            assert p.sm_pct == pct[epos[p.gpu_id], jpos[p.job_id]]


def synthetic_pairs(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` pair-feature rows over the features' usual ranges, with a smooth throughput and slowdown."""
    rng = np.random.default_rng(seed)
    x = np.column_stack([rng.uniform(0, 100, (n, 3)), rng.uniform(0, 0.5, n), rng.uniform(0, 100, n),
                         rng.uniform(0, 4, n), rng.uniform(0, 600, n), rng.uniform(0.6, 1.0, n),
                         rng.uniform(0, 100, (n, 3)), rng.uniform(0, 0.4, n), rng.uniform(0, 100, n),
                         rng.uniform(-3, 0.5, n), rng.uniform(0.6, 1.0, n), rng.uniform(0, 100, n)])
    yt = np.clip(0.3 + 0.6 * x[:, -1] / 100 - 0.2 * x[:, 1] / 100, 0, 1)
    ys = 1 + 0.3 * x[:, -1] / 100 * x[:, 1] / 100
    return x, yt, ys


def test_fast_round_with_a_real_mlp_matches_dense_bit_for_bit() -> None:
    torch.set_num_threads(1)
    x, yt, ys = synthetic_pairs()
    model, _ = train(x, yt, ys, PredictorConfig(epochs=3, seed=1))
    gpus, jobs = random_cluster(5, 60, 45)
    preds = {"t4": model, "a10": model}
    cfg = RoundConfig(migration_penalty=0.05)
    fast = plan_round(gpus, jobs, preds, cfg)
    dense = plan_round_dense(gpus, jobs, preds, cfg)
    assert fast.certified_optimal
    assert fast.matching_objective == dense.matching_objective or abs(fast.matching_objective - dense.matching_objective) < 1e-9
    elig, tput, _slow, _f, _a, _sm, _q = dense_weights(gpus, jobs, preds, cfg)
    pos = {g.gpu_id: i for i, g in enumerate(elig)}
    jpos = {j.job_id: k for k, j in enumerate(jobs)}
    for p in fast.placements:  # the fast path's predictions are the dense ones, exactly
        assert p.predicted_norm_tput == tput[pos[p.gpu_id], jpos[p.job_id]]


def test_predictions_are_made_once_per_distinct_input() -> None:
    gpus, jobs = random_cluster(3, 30, 40, running=0.0)
    stub = {"t4": SmoothStub(1), "a10": SmoothStub(2)}
    res = plan_round(gpus, jobs, stub)
    made = stub["t4"].rows + stub["a10"].rows
    assert made == res.stats["predicted_pairs"]
    # At most (distinct GPU inputs) × (distinct profiles), far fewer than GPUs × jobs.
    assert made <= res.stats["distinct_gpu_rows"] * 4 < 30 * 40
    assert res.stats["classes"] < len(jobs)


def test_gpu_with_out_of_range_features_is_left_out_not_fatal() -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(1)
    x = np.column_stack([rng.uniform(0, 100, (200, 3)), rng.uniform(0, 0.5, 200), rng.uniform(0, 100, 200),
                         rng.uniform(0, 4, 200), rng.uniform(0, 600, 200), rng.uniform(0.6, 1.0, 200),
                         rng.uniform(0, 100, (200, 3)), rng.uniform(0, 0.4, 200), rng.uniform(0, 100, 200),
                         rng.uniform(-3, 0.5, 200), rng.uniform(0.6, 1.0, 200), rng.uniform(0, 100, 200)])
    model, _ = train(x, np.full(200, 0.6), np.full(200, 1.05), PredictorConfig(epochs=2, seed=0))
    gpus, jobs = random_cluster(7, 6, 3, running=0.0)
    gpus = [replace(g, health=GpuHealth.HEALTHY, gpu_type="t4", forecast_mem_bytes=GIB) for g in gpus]
    jobs = [replace(j, allowed_gpu_types=frozenset({"t4"}), mem_bytes=GIB) for j in jobs]
    bad = replace(gpus[0], online=replace(gpus[0].online, qps=1e6))  # far outside the training range
    res = plan_round([bad, *gpus[1:]], jobs, {"t4": model})
    assert res.stats["gpus_out_of_range"] == 1
    assert bad.gpu_id not in {p.gpu_id for p in res.placements}
    assert res.certified_optimal
