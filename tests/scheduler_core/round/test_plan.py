"""One scheduling round (paper Alg. 1) on hand-built GPUs and jobs with a stub predictor."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scheduler_core.domain import (
    Action,
    GpuCandidate,
    GpuHealth,
    JobCandidate,
    OfflineFeatures,
    OnlineFeatures,
)
from scheduler_core.online.dynamic_sm import SmPolicy
from scheduler_core.round.plan import RoundConfig, from_snapshot, mem_quota_bytes, plan_round, snapshot

GIB = 1024**3


class StubPredictor:
    """Deterministic in the SM % column only: tput = a·sm/100, slowdown = 1 + b·sm/100."""

    def __init__(self, a: float = 1.0, b: float = 0.1):
        self.a, self.b = a, b
        self.calls = 0

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.calls += 1
        assert x.ndim == 2 and x.shape[1] == 16
        sm = x[:, -1] / 100.0
        return np.clip(self.a * sm, 0.0, 1.0), 1.0 + self.b * sm


ONLINE = OnlineFeatures(
    gpu_util_pct=40.0, sm_activity_pct=25.0, sm_occupancy_pct=20.0, mem_used_bytes=2 * GIB,
    mem_bw_util_pct=15.0, latency_ms=12.0, qps=300.0, sm_clock_mhz=1400.0,
)
PROFILE = OfflineFeatures(
    gpu_util_pct=95.0, sm_activity_pct=70.0, sm_occupancy_pct=45.0, mem_used_bytes=3 * GIB,
    mem_bw_util_pct=40.0, iter_time_s=0.2, sm_clock_mhz=1300.0,
)


def gpu(gpu_id: int, forecast_sm_pct: float = 20.0, health: GpuHealth = GpuHealth.HEALTHY, gpu_type: str = "t4",
        allowance: float = 0.5, current_job_id: int | None = None, current_sm_pct: int | None = None,
        forecast_mem_bytes: float = 2 * GIB) -> GpuCandidate:
    return GpuCandidate(
        gpu_id=gpu_id, gpu_type=gpu_type, memory_bytes=16 * GIB, max_sm_clock_mhz=1590, health=health,
        service_name="svc", online=ONLINE, forecast_sm_pct=forecast_sm_pct, forecast_mem_bytes=forecast_mem_bytes,
        slowdown_allowance=allowance, current_job_id=current_job_id, current_sm_pct=current_sm_pct,
    )


def job(job_id: int, mem_bytes: int = 2 * GIB, types: tuple[str, ...] = ("t4", "a10"),
        profiles: tuple[str, ...] | None = None, current_gpu_id: int | None = None,
        current_sm_pct: int | None = None) -> JobCandidate:
    return JobCandidate(
        job_id=job_id, mem_bytes=mem_bytes, allowed_gpu_types=frozenset(types),
        profiles={t: PROFILE for t in (profiles if profiles is not None else types)},
        current_gpu_id=current_gpu_id, current_sm_pct=current_sm_pct,
    )


PREDICTORS = {"t4": StubPredictor(), "a10": StubPredictor()}


def placed(result) -> dict[int, int]:
    return {p.job_id: p.gpu_id for p in result.placements}


def actions(result) -> dict[int, tuple]:
    return {a.job_id: (a.action, a.gpu_id, a.from_gpu_id, a.sm_pct) for a in result.actions}


def test_start_on_healthy_gpu_with_dynamic_sm() -> None:
    # forecast 20 % online SMs, headroom 10 → offline gets 70 %.
    result = plan_round([gpu(1, forecast_sm_pct=20.0)], [job(10)], PREDICTORS)
    assert actions(result) == {10: (Action.START, 1, None, 70)}
    (p,) = result.placements
    assert p.sm_pct == 70
    assert p.predicted_norm_tput == pytest.approx(0.7)
    assert p.predicted_online_slowdown == pytest.approx(1.07)
    assert p.mem_quota_bytes == mem_quota_bytes(gpu(1), RoundConfig())
    assert result.objective == pytest.approx(0.7)
    assert (result.gpus_considered, result.jobs_considered, result.feasible_pairs) == (1, 1, 1)


@pytest.mark.parametrize("health", [GpuHealth.INIT, GpuHealth.UNHEALTHY, GpuHealth.OVERLIMIT, GpuHealth.DISABLED])
def test_non_healthy_gpu_gets_no_new_job(health: GpuHealth) -> None:
    # The non-healthy GPU would be the better one (more free SMs) if it were eligible.
    gpus = [gpu(1, forecast_sm_pct=0.0, health=health), gpu(2, forecast_sm_pct=60.0)]
    result = plan_round(gpus, [job(10), job(11)], PREDICTORS)
    assert set(placed(result).values()) == {2}
    assert len(result.placements) == 1


def test_only_non_healthy_gpus_means_no_placements() -> None:
    gpus = [gpu(i, health=h) for i, h in enumerate([GpuHealth.INIT, GpuHealth.UNHEALTHY, GpuHealth.OVERLIMIT], 1)]
    result = plan_round(gpus, [job(10)], PREDICTORS)
    assert result.placements == [] and result.actions == []


def test_job_on_unhealthy_gpu_can_be_kept_but_no_new_job_joins() -> None:
    gpus = [gpu(1, health=GpuHealth.UNHEALTHY, current_job_id=10, current_sm_pct=70)]
    jobs = [job(10, current_gpu_id=1, current_sm_pct=70), job(11)]
    result = plan_round(gpus, jobs, PREDICTORS)
    assert actions(result) == {10: (Action.KEEP, 1, 1, 70)}
    assert result.feasible_pairs == 1  # only the running job may use the Unhealthy GPU


def test_job_on_overlimit_gpu_is_evicted() -> None:
    gpus = [gpu(1, health=GpuHealth.OVERLIMIT, current_job_id=10, current_sm_pct=70)]
    result = plan_round(gpus, [job(10, current_gpu_id=1, current_sm_pct=70)], PREDICTORS)
    assert actions(result) == {10: (Action.EVICT, None, 1, None)}
    assert result.placements == []


def test_memory_over_quota_is_infeasible() -> None:
    g = gpu(1)
    quota = mem_quota_bytes(g, RoundConfig())
    assert quota == int(0.4 * 16 * GIB)  # 40 % of device memory; free memory is larger
    result = plan_round([g], [job(10, mem_bytes=quota + 1), job(11, mem_bytes=quota)], PREDICTORS)
    assert placed(result) == {11: 1}


def test_quota_limited_by_forecast_online_memory() -> None:
    # 16 GiB − 13 GiB online − 0.5 GiB reserve = 2.5 GiB < 40 % of 16 GiB.
    g = gpu(1, forecast_mem_bytes=13 * GIB)
    assert mem_quota_bytes(g, RoundConfig()) == int(2.5 * GIB)
    assert plan_round([g], [job(10, mem_bytes=3 * GIB)], PREDICTORS).placements == []
    assert placed(plan_round([g], [job(10, mem_bytes=2 * GIB)], PREDICTORS)) == {10: 1}


def test_disallowed_gpu_type_is_infeasible() -> None:
    gpus = [gpu(1, gpu_type="t4", forecast_sm_pct=0.0), gpu(2, gpu_type="a10", forecast_sm_pct=70.0)]
    result = plan_round(gpus, [job(10, types=("a10",))], PREDICTORS)
    assert placed(result) == {10: 2}
    assert result.feasible_pairs == 1


def test_missing_profile_is_infeasible() -> None:
    result = plan_round([gpu(1)], [job(10, types=("t4",), profiles=())], PREDICTORS)
    assert result.placements == [] and result.feasible_pairs == 0


def test_gpu_type_without_predictor_is_skipped() -> None:
    result = plan_round([gpu(1, gpu_type="a100")], [job(10, types=("a100",))], PREDICTORS)
    assert result.gpus_considered == 0 and result.placements == []


PAPER_SM = RoundConfig(sm=SmPolicy(fallback_levels=0))  # the dynamic share only (paper §4.3)


def test_slowdown_over_allowance_is_infeasible() -> None:
    preds = {"t4": StubPredictor(a=1.0, b=0.5)}
    # GPU 1: sm 70 → slowdown 1.35 > 1.2 (infeasible). GPU 2: sm 10 → slowdown 1.05 (feasible).
    gpus = [gpu(1, forecast_sm_pct=20.0, allowance=0.2), gpu(2, forecast_sm_pct=80.0, allowance=0.2)]
    result = plan_round(gpus, [job(10, types=("t4",))], preds, PAPER_SM)
    assert placed(result) == {10: 2}
    assert result.feasible_pairs == 1
    assert result.placements[0].predicted_online_slowdown == pytest.approx(1.05)
    # With a generous allowance the better GPU is feasible and chosen.
    gpus = [gpu(1, forecast_sm_pct=20.0, allowance=0.4), gpu(2, forecast_sm_pct=80.0, allowance=0.4)]
    assert placed(plan_round(gpus, [job(10, types=("t4",))], preds, PAPER_SM)) == {10: 1}


def test_a_pair_over_the_allowance_falls_back_to_a_smaller_share() -> None:
    preds = {"t4": StubPredictor(a=1.0, b=0.5)}
    gpus = [gpu(1, forecast_sm_pct=20.0, allowance=0.2), gpu(2, forecast_sm_pct=80.0, allowance=0.2)]
    result = plan_round(gpus, [job(10, types=("t4",))], preds)  # levels 70, 55, 40, 25 on GPU 1
    # 70 % and 55 % are over the allowance; 40 % is the largest share within it (slowdown 1.2),
    # worth 0.4 — more than GPU 2's 0.1 at its dynamic 10 %.
    assert placed(result) == {10: 1}
    (p,) = result.placements
    assert p.sm_pct == 40 and p.predicted_norm_tput == pytest.approx(0.4)
    assert p.predicted_online_slowdown == pytest.approx(1.2)
    assert result.feasible_pairs == 2


def test_zero_throughput_is_infeasible() -> None:
    result = plan_round([gpu(1)], [job(10, types=("t4",))], {"t4": StubPredictor(a=0.0)})
    assert result.placements == [] and result.feasible_pairs == 0


def test_best_matching_across_gpus_and_jobs() -> None:
    gpus = [gpu(1, forecast_sm_pct=20.0), gpu(2, forecast_sm_pct=50.0), gpu(3, forecast_sm_pct=75.0)]
    jobs = [job(10, types=("t4",)), job(11, types=("t4",))]
    result = plan_round(gpus, jobs, PREDICTORS)
    assert set(placed(result).values()) == {1, 2}  # the two GPUs with most free SMs
    assert result.objective == pytest.approx(0.7 + 0.4)


@pytest.mark.parametrize(
    ("current_pct", "expected_action", "expected_pct"),
    [
        (50, Action.KEEP, 50),  # below the plan: keep the running share
        (70, Action.KEEP, 70),
        (85, Action.KEEP, 85),  # exceeds the plan (70) by 15 = threshold: keep
        (86, Action.MIGRATE, 70),  # exceeds by 16 > 15: restart in place with the planned share
    ],
)
def test_keep_and_resize_threshold(current_pct: int, expected_action: Action, expected_pct: int) -> None:
    gpus = [gpu(1, forecast_sm_pct=20.0, current_job_id=10, current_sm_pct=current_pct)]
    result = plan_round(gpus, [job(10, current_gpu_id=1, current_sm_pct=current_pct)], PREDICTORS)
    assert actions(result) == {10: (expected_action, 1, 1, expected_pct)}
    assert result.placements[0].sm_pct == expected_pct


def test_resize_threshold_is_configurable() -> None:
    gpus = [gpu(1, forecast_sm_pct=20.0, current_job_id=10, current_sm_pct=80)]
    jobs = [job(10, current_gpu_id=1, current_sm_pct=80)]
    assert actions(plan_round(gpus, jobs, PREDICTORS, RoundConfig(resize_threshold_pct=5)))[10][0] == Action.MIGRATE
    assert actions(plan_round(gpus, jobs, PREDICTORS, RoundConfig(resize_threshold_pct=15)))[10][0] == Action.KEEP


def test_migrate_to_better_gpu_and_evict_unmatched() -> None:
    gpus = [
        gpu(1, forecast_sm_pct=80.0, current_job_id=10, current_sm_pct=10),  # only 10 % SMs left here
        gpu(2, forecast_sm_pct=20.0),
        gpu(3, health=GpuHealth.OVERLIMIT, current_job_id=11, current_sm_pct=50),
    ]
    jobs = [job(10, current_gpu_id=1, current_sm_pct=10), job(11, current_gpu_id=3, current_sm_pct=50), job(12)]
    result = plan_round(gpus, jobs, PREDICTORS)
    acts = actions(result)
    # Two usable GPUs, three jobs: 10 and 11/12 share them; whichever is left unmatched and running is evicted.
    assert len(result.placements) == 2
    assert set(placed(result).values()) == {1, 2}
    for job_id, (action, gpu_id, from_gpu, _pct) in acts.items():
        current = {10: 1, 11: 3, 12: None}[job_id]
        if action == Action.EVICT:
            assert current is not None and gpu_id is None and from_gpu == current
            assert job_id not in placed(result)
        elif current is None:
            assert action == Action.START
        elif gpu_id == current:
            assert action in (Action.KEEP, Action.MIGRATE)
        else:
            assert action == Action.MIGRATE and from_gpu == current
    # Every job currently running gets exactly one action; the new job at most one.
    assert {10, 11} <= set(acts)
    assert len(result.actions) == len(acts)


def test_single_job_migrates_to_much_better_gpu() -> None:
    gpus = [gpu(1, forecast_sm_pct=80.0, current_job_id=10, current_sm_pct=10), gpu(2, forecast_sm_pct=20.0)]
    result = plan_round(gpus, [job(10, current_gpu_id=1, current_sm_pct=10)], PREDICTORS)
    assert actions(result) == {10: (Action.MIGRATE, 2, 1, 70)}


def test_migration_penalty_keeps_job_in_place_when_gain_is_small() -> None:
    # Running on GPU 1 at 60 % (tput 0.6); GPU 2 offers 70 % (tput 0.7).
    gpus = [gpu(1, forecast_sm_pct=30.0, current_job_id=10, current_sm_pct=60), gpu(2, forecast_sm_pct=20.0)]
    jobs = [job(10, current_gpu_id=1, current_sm_pct=60)]
    no_penalty = plan_round(gpus, jobs, PREDICTORS, RoundConfig(migration_penalty=0.0))
    assert actions(no_penalty) == {10: (Action.MIGRATE, 2, 1, 70)}
    penalised = plan_round(gpus, jobs, PREDICTORS, RoundConfig(migration_penalty=0.2))
    assert actions(penalised) == {10: (Action.KEEP, 1, 1, 60)}
    # The reported throughput and objective are the predictions, not the penalised weights.
    assert penalised.placements[0].predicted_norm_tput == pytest.approx(0.6)
    assert penalised.objective == pytest.approx(0.6)


def test_migration_penalty_does_not_block_a_large_gain() -> None:
    gpus = [gpu(1, forecast_sm_pct=80.0, current_job_id=10, current_sm_pct=10), gpu(2, forecast_sm_pct=20.0)]
    jobs = [job(10, current_gpu_id=1, current_sm_pct=10)]
    result = plan_round(gpus, jobs, PREDICTORS, RoundConfig(migration_penalty=0.2))
    assert actions(result) == {10: (Action.MIGRATE, 2, 1, 70)}


def test_one_batched_predict_call_per_gpu_type() -> None:
    preds = {"t4": StubPredictor(), "a10": StubPredictor()}
    gpus = [gpu(i, gpu_type="t4" if i % 2 else "a10") for i in range(1, 7)]
    plan_round(gpus, [job(j) for j in range(10, 15)], preds)
    assert preds["t4"].calls == 1 and preds["a10"].calls == 1


def _mixed_inputs() -> tuple[list[GpuCandidate], list[JobCandidate]]:
    gpus = [
        gpu(1, forecast_sm_pct=20.0, gpu_type="t4", current_job_id=10, current_sm_pct=60),
        gpu(2, forecast_sm_pct=45.5, gpu_type="a10"),
        gpu(3, forecast_sm_pct=10.0, gpu_type="a10", health=GpuHealth.UNHEALTHY),
        gpu(4, forecast_sm_pct=70.0, gpu_type="t4", health=GpuHealth.OVERLIMIT, current_job_id=11, current_sm_pct=30),
        gpu(5, forecast_sm_pct=5.0, gpu_type="t4", allowance=0.05),
    ]
    jobs = [
        job(10, current_gpu_id=1, current_sm_pct=60),
        job(11, types=("t4",), current_gpu_id=4, current_sm_pct=30),
        job(12, types=("a10",), mem_bytes=5 * GIB),
        job(13, mem_bytes=9 * GIB),
        job(14, types=("t4",), profiles=("t4",)),
    ]
    return gpus, jobs


def test_snapshot_round_trip_reproduces_identical_plan() -> None:
    gpus, jobs = _mixed_inputs()
    snap = json.loads(json.dumps(snapshot(gpus, jobs)))  # must survive JSON storage
    gpus2, jobs2 = from_snapshot(snap)
    assert gpus2 == gpus
    assert jobs2 == jobs
    cfg = RoundConfig(migration_penalty=0.05)
    a = plan_round(gpus, jobs, PREDICTORS, cfg)
    b = plan_round(gpus2, jobs2, PREDICTORS, cfg)
    assert a.placements == b.placements
    assert a.actions == b.actions
    assert a.objective == b.objective
    assert a.feasible_pairs == b.feasible_pairs
    assert a.placements, "the example should place something"


def test_running_job_stays_on_its_gpu_when_an_equal_one_is_free() -> None:
    # GPUs 1 and 2 are identical; the job runs on 2. Moving it gains nothing, so it stays (penalty 0 = paper).
    gpus = [gpu(1, forecast_sm_pct=20.0), gpu(2, forecast_sm_pct=20.0, current_job_id=10, current_sm_pct=70)]
    result = plan_round(gpus, [job(11), job(10, current_gpu_id=2, current_sm_pct=70)], PREDICTORS)
    assert actions(result)[10] == (Action.KEEP, 2, 2, 70)
    assert actions(result)[11] == (Action.START, 1, None, 70)


def test_round_reports_its_optimality_certificate() -> None:
    gpus, jobs = _mixed_inputs()
    result = plan_round(gpus, jobs, PREDICTORS, RoundConfig(migration_penalty=0.05))
    assert result.certified_optimal
    assert result.optimality_gap_bound is not None and result.optimality_gap_bound <= 1e-6
    cert = result.stats["certificate"]
    assert cert["ok"] and cert["pairs_checked"] == result.feasible_pairs
    assert result.matching_objective == pytest.approx(cert["value"])
    assert set(result.timings_s) >= {"features", "prediction", "feasibility", "matching", "plan", "total"}


def test_round_config_survives_json() -> None:
    from dataclasses import asdict

    from scheduler_core.matching.assignment import SolverConfig
    from scheduler_core.online.dynamic_sm import SmPolicy

    cfg = RoundConfig(sm=SmPolicy(headroom_pct=5.0), migration_penalty=0.05, solver=SolverConfig(auction_eps=0.02))
    back = RoundConfig(**json.loads(json.dumps(asdict(cfg))))
    assert back == cfg
    # A stored config from before the solver settings existed still loads.
    old = asdict(RoundConfig())
    old.pop("solver")
    assert RoundConfig(**old) == RoundConfig()


def test_job_on_unhealthy_gpu_is_not_restarted_there() -> None:
    # Planned share 70 %; the job runs at 90 %: keeping it needs a restart at 70 %, which
    # would be new work on an Unhealthy GPU. It moves to a Healthy GPU, or is evicted.
    sick = gpu(1, forecast_sm_pct=20.0, health=GpuHealth.UNHEALTHY, current_job_id=10, current_sm_pct=90)
    running = job(10, current_gpu_id=1, current_sm_pct=90)
    assert actions(plan_round([sick], [running], PREDICTORS)) == {10: (Action.EVICT, None, 1, None)}
    moved = plan_round([sick, gpu(2, forecast_sm_pct=40.0)], [running], PREDICTORS)
    assert actions(moved) == {10: (Action.MIGRATE, 2, 1, 50)}
    # Within the threshold it stays as it runs.
    ok = gpu(1, forecast_sm_pct=20.0, health=GpuHealth.UNHEALTHY, current_job_id=10, current_sm_pct=80)
    assert actions(plan_round([ok], [job(10, current_gpu_id=1, current_sm_pct=80)], PREDICTORS)) == {
        10: (Action.KEEP, 1, 1, 80)}
