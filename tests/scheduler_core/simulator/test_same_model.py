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


@pytest.mark.parametrize("family,pct,target,evicted", [
    ("cnn", 40, 0.9, False), ("transformer", 30, 0.9, False), ("recommender", 25, 0.9, False),
    ("transformer", 70, None, True), ("transformer", 70, 0.9, False)])
def test_fleet_cluster_and_node_gpu_agree_minute_by_minute(family, pct, target, evicted) -> None:
    catalog = default_catalog()
    cfg = SimConfig(gpus=1, hours=3.0, qps_noise_frac=0.0, burst_prob_per_min=0.0, mean_job_hours=2.0,
                    services=(ServiceSpec("svc", family, 40.0, 180.0, 2.0),), xcuda_target_util=target)
    jobs = build_jobs([trace_job(1, 1000, job_type=JOB)], catalog, cfg, rng_stream(0, "trace-repeat"))
    fleet = Fleet(cfg, catalog, jobs, "mps", protection=True)
    fleet.admit(0.0)
    fleet.apply([PlanAction(Action.START, 0, 0, None, pct)], 0.0)

    svc = SimServiceSpec("svc", family, 40.0, 180.0, 2.0, ONLINE_FAMILIES[family].mem_bytes)
    cluster = SimulatedCluster([SimGpuSpec(0, "t4", svc)], catalog,
                               SimSettings(qps_noise_frac=0.0, burst_prob_per_min=0.0, xcuda_target_util=target))
    cluster.register_job(SimJobSpec(0, JOB, float(jobs.total_steps[0]), 0.0, int(jobs.mem_bytes[0])))
    assert cluster.dispatch([PlanAction(Action.START, 0, 0, None, pct)], START)[0].ok

    fam = ONLINE_FAMILIES[family]
    placements = StaticPlacements()
    node_gpu = SimulatedGpu(0, get_spec("t4"), OnlineModel.of(fam, catalog.online[family], get_spec("t4"), svc.mem_bytes),
                            Replica("svc", family, svc.mem_bytes, 40.0, 180.0, 2.0), placements, noise_pct=0.0,
                            warmup_s=SimSettings().startup_s, xcuda_target_util=target)
    on_gpu = OfflineOnGpu(0, None, pct, int(jobs.mem_bytes[0]), catalog.offline[JOB].traits, START.timestamp())

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
