"""The simulator's fleet, the pipeline's simulated cluster and the node agent's simulated GPU are one model.

All three run one GPU with the same online service and the same offline job at the
same MPS share, without load noise or bursts; minute by minute they must report
the same utilization, SM activity, memory, online latency and job progress (the
node agent's GPU, sampled at each minute's start, follows the job while the
cluster runs it).
"""

from __future__ import annotations

import datetime as dt

import pytest

from executors.data.calibration import default_catalog
from executors.node.placements import OfflineOnGpu, StaticPlacements
from executors.node.simgpu import Replica, SimulatedGpu
from executors.simulated.cluster import SimGpuSpec, SimJobSpec, SimServiceSpec, SimSettings, SimulatedCluster
from scheduler_core.domain import Action, PlanAction
from scheduler_core.gpu_specs import get_spec
from scheduler_core.interference.gpu_model import OnlineModel
from scheduler_core.rng import rng_stream
from scheduler_core.simulator import ServiceSpec, SimConfig
from scheduler_core.simulator.fleet import Fleet, hour_of_day
from scheduler_core.simulator.workload import build_jobs
from scheduler_core.workloads import ONLINE_FAMILIES
from tests.scheduler_core.simulator.conftest import trace_job

JOB = "Transformer (batch size 32)"
START = dt.datetime(2026, 1, 5, tzinfo=dt.timezone.utc)


def three_models(family: str, pct: int, target: float | None = 0.9, slo_scale: float | None = None):
    """One GPU with the service and the job at ``pct`` three ways, without load noise or bursts: the simulator's
    fleet, the pipeline's cluster (both started) and the node agent's simulated GPU (with the job's placement)."""
    catalog = default_catalog()
    cfg = SimConfig(gpus=1, hours=3.0, qps_noise_frac=0.0, burst_prob_per_min=0.0, mean_job_hours=2.0,
                    services=(ServiceSpec("svc", family, 40.0, 180.0, 2.0),), xcuda_target_util=target,
                    slo_scale=slo_scale)
    jobs = build_jobs([trace_job(1, 1000, job_type=JOB)], catalog, cfg, rng_stream(0, "trace-repeat"))
    fleet = Fleet(cfg, catalog, jobs, "mps", protection=True)
    fleet.admit(0.0)
    fleet.apply([PlanAction(Action.START, 0, 0, None, pct)], 0.0)

    svc = SimServiceSpec("svc", family, 40.0, 180.0, 2.0, ONLINE_FAMILIES[family].mem_bytes, cfg.service_slos_ms()[0])
    cluster = SimulatedCluster([SimGpuSpec(0, "t4", svc)], catalog,
                               SimSettings(qps_noise_frac=0.0, burst_prob_per_min=0.0, xcuda_target_util=target))
    cluster.register_job(SimJobSpec(0, JOB, float(jobs.total_steps[0]), 0.0, int(jobs.mem_bytes[0])))
    assert cluster.dispatch([PlanAction(Action.START, 0, 0, None, pct)], START)[0].ok

    fam, spec = ONLINE_FAMILIES[family], get_spec("t4")
    placements = StaticPlacements()
    node_gpu = SimulatedGpu(0, spec, OnlineModel.of(fam, catalog.online[family], spec, svc.mem_bytes),
                            Replica("svc", family, svc.mem_bytes, 40.0, 180.0, 2.0), placements, noise_pct=0.0,
                            warmup_s=SimSettings().startup_s, xcuda_target_util=target)
    on_gpu = OfflineOnGpu(0, None, pct, int(jobs.mem_bytes[0]), catalog.offline[JOB].traits, START.timestamp())
    return fleet, cluster, node_gpu, placements, on_gpu


@pytest.mark.parametrize("family,pct,target,evicted", [
    ("cnn", 40, 0.9, False), ("transformer", 30, 0.9, False), ("recommender", 25, 0.9, False),
    ("transformer", 70, None, True), ("transformer", 70, 0.9, False)])
def test_fleet_cluster_and_node_gpu_agree_minute_by_minute(family, pct, target, evicted) -> None:
    fleet, cluster, node_gpu, placements, on_gpu = three_models(family, pct, target)

    report = cluster.advance(START, 120)
    for minute, row in enumerate(report.metrics):
        m = fleet.step(minute, hour_of_day(minute * 60.0), minute * 60.0)
        placements.set(0, [on_gpu] if row.offline_job_id == 0 else [])
        n = node_gpu((START + dt.timedelta(minutes=minute)).timestamp())
        for got, want in ((n.gpu_util_pct, row.gpu_util_pct), (n.sm_activity_pct, row.sm_activity_pct),
                          (n.mem_used_bytes, row.mem_used_bytes), (n.mem_bw_util_pct, row.mem_bw_util_pct),
                          (n.sm_clock_mhz, row.sm_clock_mhz), (n.online_qps, row.online_qps),
                          (n.online_latency_ms, row.online_latency_ms),
                          (n.online_solo_latency_ms, row.online_solo_latency_ms),
                          (n.online_gpu_util_pct, row.online_gpu_util_pct),
                          (n.online_sm_activity_pct, row.online_sm_activity_pct),
                          (n.online_mem_used_bytes, row.online_mem_used_bytes),
                          (n.online_mem_bw_util_pct, row.online_mem_bw_util_pct)):
            assert got == pytest.approx(want, rel=1e-9), minute
        assert m.qps[0] == pytest.approx(row.online_qps, rel=1e-9), minute
        assert m.solo_latency_ms[0] == pytest.approx(row.online_solo_latency_ms, rel=1e-9), minute
        assert m.util_pct[0] == pytest.approx(row.gpu_util_pct, rel=1e-9), minute
        assert m.sm_pct[0] == pytest.approx(row.sm_activity_pct, rel=1e-9)
        assert m.mem_frac[0] * fleet.mem_total[0] == pytest.approx(row.mem_used_bytes, rel=1e-9)
        assert m.latency_ms[0] == pytest.approx(row.online_latency_ms, rel=1e-9)
        assert m.solo_latency_ms[0] == pytest.approx(row.online_solo_latency_ms, rel=1e-9)
        assert m.qps[0] == pytest.approx(row.online_qps, rel=1e-9)
    assert fleet.steps_done[0] == pytest.approx(report.progress[0][0], rel=1e-9)
    assert int(fleet.evictions[0]) == len(report.evictions) == int(evicted)
    if evicted:
        assert fleet.steps_done[0] == 0.0 and report.evictions[0].at_utc == START + dt.timedelta(minutes=2)
    else:
        assert fleet.steps_done[0] > 0
    if target is not None:  # paced: the GPU never goes over xCUDA's target
        assert max(r.sm_activity_pct for r in report.metrics) <= 100.0 * target + 1e-6


@pytest.mark.parametrize("slo_scale, paced", [(0.5, True), (10.0, False)])
def test_a_burst_is_guarded_alike_in_the_fleet_the_cluster_and_on_the_node(slo_scale, paced) -> None:
    """An 8-minute 1.6x burst two hours in, on a replica over its SLO (scale 0.5: its p99 alone is over it) or well
    within it (10): the fleet and the cluster pace the job to xCUDA's floor in the same minutes, or in none, and
    report the same GPU, latency and progress; the node's GPU, told what the agent's guard decided, agrees."""
    fleet, cluster, node_gpu, placements, on_gpu = three_models("transformer", 30, slo_scale=slo_scale)

    rows, guarded = [], []
    for minute in range(150):
        if minute == 120:  # the burst begins in both (each draws its bursts from its own stream)
            fleet.burst_left[0] = cluster._gpus[0].burst_left = 9
        rows += cluster.advance(START + dt.timedelta(minutes=minute), 1).metrics
        m = fleet.step(minute, hour_of_day(minute * 60.0), minute * 60.0)
        guarded.append(m.burst_paced)
        row = rows[-1]
        placements.set(0, [on_gpu])
        node_gpu.set_burst(bool(m.burst_paced))
        n = node_gpu((START + dt.timedelta(minutes=minute)).timestamp())
        assert m.latency_ms[0] == pytest.approx(row.online_latency_ms, rel=1e-9), minute
        assert m.sm_pct[0] == pytest.approx(row.sm_activity_pct, rel=1e-9), minute
        assert n.sm_activity_pct == pytest.approx(row.sm_activity_pct, rel=1e-9), minute
        assert n.online_latency_ms == pytest.approx(row.online_latency_ms, rel=1e-9), minute
    assert fleet.steps_done[0] == pytest.approx(cluster._jobs[0].steps_done, rel=1e-9)
    burst = list(range(120, 128))
    assert [k for k, g in enumerate(guarded) if g] == (burst if paced else [])
    for k in burst:  # paced: the replica at its latency alone, the job at xCUDA's floor; else slowed by the job
        slowdown = rows[k].online_latency_ms / rows[k].online_solo_latency_ms
        assert (slowdown < 1.02) if paced else (slowdown > 1.02), k
