"""The one simulated GPU model: scalar and vectorized calls agree; unknown job types get traits from their profile."""

from __future__ import annotations

import numpy as np
import pytest

from executors.data.calibration import default_catalog
from scheduler_core.gpu_specs import get_spec
from scheduler_core.interference.gpu_model import (
    PACE_FLOOR,
    OnlineModel,
    alone_as_shared,
    offline_traits,
    on_one_gpu,
    online_alone,
    traits_from_profile,
    with_offline,
    with_offline_jobs,
    xcuda_pace,
)
from scheduler_core.interference.pairs import WorkloadTraits
from scheduler_core.workloads import ONLINE_FAMILIES

CATALOG = default_catalog()


def _model(family: str, gpu: str) -> OnlineModel:
    return OnlineModel.of(ONLINE_FAMILIES[family], CATALOG.online[family], get_spec(gpu))


def test_vectorized_over_gpus_equals_one_gpu_at_a_time() -> None:
    kinds = [("cnn", "t4"), ("transformer", "a10"), ("recommender", "t4"), ("lm", "a100")]
    stacked = OnlineModel.stack([_model(f, g) for f, g in kinds])
    qps = np.array([30.0, 150.0, 400.0, 0.0])
    job = CATALOG.offline["ResNet-18 (batch size 16)"].traits
    pct, duty = np.array([30, 50, 70, 90]), np.array([1.0, 0.5, 1.0, 0.0])
    many = with_offline(online_alone(stacked, qps), stacked, job, pct, duty, 2e9)
    for i, (f, g) in enumerate(kinds):
        one = with_offline(online_alone(_model(f, g), qps[i]), _model(f, g), job, int(pct[i]), float(duty[i]), 2e9)
        for name in ("util_pct", "sm_pct", "mem_bytes", "bw_pct", "norm_tput", "slowdown"):
            assert float(np.asarray(getattr(many, name))[i]) == pytest.approx(float(getattr(one, name)), rel=1e-12)
    taken = online_alone(stacked, qps).take(np.array([2]))
    assert float(taken.qps[0]) == 400.0 and float(taken.load[0]) == 1.0  # beyond capacity: full load


def test_an_idle_job_adds_memory_only_and_an_empty_gpu_is_the_replica() -> None:
    m = _model("cnn", "t4")
    on = online_alone(m, 50.0)
    job = CATALOG.offline["ResNet-50 (batch size 64)"].traits
    idle = with_offline(on, m, job, 60, 0.0, 3e9)
    assert float(idle.sm_pct) == pytest.approx(float(on.sm_pct)) and float(idle.slowdown) == 1.0
    assert float(idle.mem_bytes) == pytest.approx(float(on.mem_bytes) + 3e9)
    alone = alone_as_shared(on)
    assert alone.sm_pct is on.sm_pct and alone.slowdown == 1.0


def test_more_requests_more_sm_and_a_slower_replica_beside_a_job() -> None:
    m = _model("transformer", "t4")
    job = CATALOG.offline["Transformer (batch size 32)"].traits
    low, high = (with_offline(online_alone(m, q), m, job, 50, 1.0, 0.0) for q in (20.0, 180.0))
    assert float(high.sm_pct) > float(low.sm_pct) and float(high.slowdown) >= float(low.slowdown) > 1.0
    assert float(high.norm_tput) < float(low.norm_tput)


def test_a_job_of_unknown_type_gets_traits_from_its_profile() -> None:
    for known in sorted(CATALOG.offline)[::5]:
        want = CATALOG.offline[known].traits
        # what a solo profiling run of that workload measures: its own SM footprint and bandwidth share
        tr = traits_from_profile(100.0 * want.sm_need, 100.0 * want.mem_bw, CATALOG)
        # the profile measures footprint and bandwidth; sensitivity and pressure from the nearest catalog workload
        assert tr.sm_need == pytest.approx(want.sm_need) and tr.mem_bw == pytest.approx(want.mem_bw)
        assert (tr.sensitivity, tr.pressure) == (want.sensitivity, want.pressure)
    label = offline_traits("my-own-training-script", CATALOG, {"sm_activity_pct": 41.0, "mem_bw_util_pct": 22.0})
    assert label.sm_need == pytest.approx(0.41) and label.mem_bw == pytest.approx(0.22)
    assert offline_traits("my-own-training-script", CATALOG, None) is None
    assert offline_traits("ResNet-50 (batch size 64)", CATALOG, None) == CATALOG.offline["ResNet-50 (batch size 64)"].traits


def test_xcuda_paces_the_job_to_hold_the_gpu_at_its_target_and_only_then() -> None:
    m = _model("cnn", "t4")
    job = CATALOG.offline["ResNet-50 (batch size 64)"].traits
    qps = np.array([20.0, 120.0, 180.0, 250.0])
    on = online_alone(m, qps)
    free = with_offline(on, m, job, 80, 1.0, 0.0)
    paced = with_offline(on, m, job, 80, 1.0, 0.0, target_util=0.9)
    over = np.asarray(free.sm_pct) > 90.0
    assert over.any() and (~over).any()  # the loads straddle the target
    # Below the target nothing changes; above it the GPU sits at the target, the job runs slower
    # and hurts the replica less.
    np.testing.assert_allclose(np.asarray(paced.sm_pct)[~over], np.asarray(free.sm_pct)[~over])
    np.testing.assert_allclose(np.asarray(paced.pace)[~over], 1.0)
    np.testing.assert_allclose(np.asarray(paced.sm_pct)[over], 90.0, atol=1e-9)
    assert (np.asarray(paced.norm_tput)[over] < np.asarray(free.norm_tput)[over]).all()
    assert (np.asarray(paced.slowdown)[over] < np.asarray(free.slowdown)[over]).all()
    assert (np.asarray(paced.pace)[over] < 1.0).all()


def test_a_replica_over_the_target_alone_leaves_the_job_only_the_floor() -> None:
    m = _model("cnn", "t4")
    job = CATALOG.offline["ResNet-50 (batch size 64)"].traits
    on = online_alone(m, 400.0)  # the replica alone is at full load
    assert float(on.sm_pct) > 50.0
    paced = with_offline(on, m, job, 60, 1.0, 0.0, target_util=float(on.sm_pct) / 100.0 - 0.05)
    assert float(paced.pace) == pytest.approx(PACE_FLOOR)
    assert xcuda_pace(np.array([10.0]), np.array([0.5]), np.array([0.0]), np.array([0.8]), 0.9)[0] == 1.0  # idle job
    np.testing.assert_allclose(xcuda_pace(np.array([95.0, 10.0]), 0.5, 1.0, 0.5, None), 1.0)  # no target, no pacing


def test_one_job_per_gpu_is_the_pair_model_exactly_and_co_runners_press_on_each_other() -> None:
    kinds = [("cnn", "t4"), ("transformer", "t4"), ("recommender", "a10")]
    stacked = OnlineModel.stack([_model(f, g) for f, g in kinds])
    on = online_alone(stacked, np.array([60.0, 90.0, 200.0]))
    names = ["ResNet-18 (batch size 16)", "Transformer (batch size 32)", "ResNet-50 (batch size 64)"]
    jobs = WorkloadTraits(*(np.array([getattr(CATALOG.offline[n].traits, f) for n in names])
                            for f in ("sensitivity", "pressure", "sm_need", "mem_bw")))
    pct, duty = np.array([30.0, 40.0, 50.0]), np.array([1.0, 0.5, 1.0])
    pair = with_offline(on, stacked, jobs, pct, duty, 1e9)
    alone = with_offline_jobs(on, stacked, np.arange(3), jobs, pct, duty, 1e9)
    for name in ("util_pct", "sm_pct", "mem_bytes", "bw_pct", "slowdown", "norm_tput"):
        assert np.array_equal(np.asarray(getattr(pair, name)), getattr(alone, name)), name
    # All three jobs on GPU 0, under 100 % of SMs together: each runs slower than with the GPU to itself
    # (its co-runners press on it), the replica slows down more than beside any one of them, and the
    # device adds up their memory and SM activity.
    g = np.zeros(3, dtype=np.int64)
    together = with_offline_jobs(on, stacked, g, jobs, pct, np.ones(3), 1e9)
    each = [with_offline_jobs(on.take([0]), stacked.take([0]), np.zeros(1, dtype=np.int64),
                              WorkloadTraits(*(np.asarray(getattr(jobs, f))[[i]] for f in
                                               ("sensitivity", "pressure", "sm_need", "mem_bw"))),
                              pct[[i]], np.ones(1), 1e9) for i in range(3)]
    for i in range(3):
        assert together.norm_tput[i] < each[i].norm_tput[0]
        assert together.slowdown[0] > each[i].slowdown[0] > 1.0
        assert together.sm_pct[0] > each[i].sm_pct[0]
    assert together.mem_bytes[0] == pytest.approx(float(on.mem_bytes[0]) + 3e9)
    # GPUs without a job are their replica alone.
    assert together.slowdown[1] == together.slowdown[2] == 1.0 and together.sm_pct[1] == on.sm_pct[1]


def test_xcuda_paces_the_jobs_of_a_gpu_together_to_its_target() -> None:
    m = OnlineModel.stack([_model("cnn", "t4")])
    on = online_alone(m, np.array([150.0]))
    tr = CATALOG.offline["ResNet-50 (batch size 64)"].traits
    jobs = WorkloadTraits(*(np.full(2, getattr(tr, f)) for f in ("sensitivity", "pressure", "sm_need", "mem_bw")))
    free = with_offline_jobs(on, m, np.zeros(2, dtype=np.int64), jobs, np.array([40.0, 40.0]), np.ones(2), 0.0)
    paced = with_offline_jobs(on, m, np.zeros(2, dtype=np.int64), jobs, np.array([40.0, 40.0]), np.ones(2), 0.0,
                              target_util=0.9)
    assert free.sm_pct[0] > 90.0  # unpaced, the two jobs would take the GPU past the target
    assert paced.sm_pct[0] == pytest.approx(90.0) and 0.0 < paced.pace[0] < 1.0
    assert np.allclose(paced.norm_tput, free.norm_tput * paced.pace[0])


def test_one_gpu_with_a_list_of_jobs_is_the_pair_model_or_the_k_job_model() -> None:
    m = _model("transformer", "t4")
    on = online_alone(m, 120.0)
    a, b = (CATALOG.offline[k].traits for k in ("ResNet-18 (batch size 16)", "ResNet-50 (batch size 64)"))
    none, tput = on_one_gpu(on, m, [], [], [], [])
    assert tput.size == 0 and none.slowdown == 1.0 and none.sm_pct == on.sm_pct
    one, tput = on_one_gpu(on, m, [a], [60.0], [1.0], [2e9], target_util=0.9)
    pair = with_offline(on, m, a, 60.0, 1.0, 2e9, target_util=0.9)
    for name in ("util_pct", "sm_pct", "mem_bytes", "bw_pct", "norm_tput", "slowdown", "pace"):
        assert getattr(one, name) == pytest.approx(float(getattr(pair, name)), rel=1e-12), name
    assert tput.tolist() == pytest.approx([float(pair.norm_tput)])
    two, tput = on_one_gpu(on, m, [a, b], [30.0, 40.0], [1.0, 1.0], [2e9, 3e9], target_util=0.9)
    stacked = OnlineModel.stack([m])
    ref = with_offline_jobs(online_alone(stacked, np.array([120.0])), stacked, np.zeros(2, dtype=np.int64),
                            WorkloadTraits(*(np.array([getattr(a, f), getattr(b, f)])
                                             for f in ("sensitivity", "pressure", "sm_need", "mem_bw"))),
                            np.array([30.0, 40.0]), np.ones(2), np.array([2e9, 3e9]), target_util=0.9)
    assert tput.tolist() == pytest.approx(ref.norm_tput.tolist(), rel=1e-12)
    assert two.norm_tput == pytest.approx(float(ref.norm_tput.sum())) and two.slowdown == pytest.approx(ref.slowdown[0])
    assert two.mem_bytes == pytest.approx(float(on.mem_bytes) + 5e9)
