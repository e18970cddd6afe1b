"""The node agent's online columns: a simulated GPU following a real replica's rate and the placed job,
rows with the endpoint's rate and latencies, labelled gaps, and the minute in progress written early.

Hand-ticked with a fake clock; the replica is the reference service's real metrics registry
behind a fake fetch (``test_scrape.py`` covers real HTTP).
"""

from __future__ import annotations

import re

import pytest

from executors.data.calibration import default_catalog
from executors.node.agent import AgentConfig, GpuBinding, MemorySink, NodeAgent
from executors.node.evictor import CallbackEvictor
from executors.node.online import OnlineAccounting
from executors.node.placements import OfflineOnGpu, StaticPlacements
from executors.node.sampler import SimulatedSampler
from executors.node.scrape import ReplicaScraper, Scrapers
from executors.node.simgpu import Replica, SimulatedGpu
from scheduler_core.gpu_specs import get_spec
from scheduler_core.interference.gpu_model import OnlineModel
from scheduler_core.online.load import diurnal_qps
from scheduler_core.workloads import ONLINE_FAMILIES
from tests.executors.node.test_node_agent_loop import T0, FakeClock
from tests.executors.node.test_scrape import Replica as FakeReplica

JOB_TYPE = "ResNet-50 (batch size 64)"
URL = "http://replica:9100/metrics"


class Rig:
    """One simulated T4 with a cnn replica at ``qps`` (a real registry), a job placeable at 70 %."""

    def __init__(self, qps: float = 10.0, endpoint: bool = True, partial_every_s: float | None = None,
                 service: bool = True, xcuda_target_util: float | None = 0.9, mps_split_gaps: bool = False,
                 shm_path=None, slo_ms: float | None = None):
        catalog = default_catalog()
        spec, fam = get_spec("t4"), ONLINE_FAMILIES["cnn"]
        self.clock = FakeClock()
        self.qps = qps
        self.replica = FakeReplica(qps)
        self.placements = StaticPlacements()
        self.job = OfflineOnGpu(42, 9042, 70, 2 << 30, catalog.offline[JOB_TYPE].traits, T0)
        rep = Replica("svc", "cnn", 3.5 * (1 << 30), 5.0, 20.0, 20.0, URL if endpoint else None) if service else None
        self.scraper = ReplicaScraper(URL, interval_s=5.0, clock=self.clock.epoch, fetch=self.replica.fetch,
                                      solo=lambda: not self.placements.on_gpu(0))
        scrapers = Scrapers({0: self.scraper} if endpoint and service else {})
        self.gpu = SimulatedGpu(0, spec, OnlineModel.of(fam, catalog.online["cnn"], spec, 3.5 * (1 << 30)) if service
                                else None, rep, self.placements,
                                self.scraper.current_qps if endpoint else None, noise_pct=0.0,
                                xcuda_target_util=xcuda_target_util, mps_split_gaps=mps_split_gaps)
        self.sink = MemorySink()
        self.evicted: list[tuple[int, float]] = []
        cfg = AgentConfig(interval_s=1.0, partial_every_s=partial_every_s)
        self.agent = NodeAgent(SimulatedSampler(models={0: self.gpu}), [GpuBinding(11, 0, shm_path)],
                               CallbackEvictor(self._evict), self.sink, cfg, clock=self.clock,
                               placements=self.placements,
                               accounting=OnlineAccounting({0: rep} if rep else {}, scrapers, solo_window_s=3600.0),
                               rates={0: self.scraper.current} if endpoint and service else None,
                               slos={0: slo_ms})
        self.agent.loops[0].burst_listeners.append(self.gpu.set_burst)  # as the node's wiring connects them

    def _evict(self, gpu_id: int, reason: str) -> list[int]:
        self.evicted.append((gpu_id, self.clock.t))
        jobs = [j.job_id for j in self.placements.on_gpu(0)]
        self.placements.set(0, [])
        return jobs

    def run(self, seconds: int) -> None:
        """One sample a second; the replica serves ``qps`` requests of 10 ms a second; a scrape every 5 s."""
        for _ in range(seconds):
            self.replica.serve([0.010] * int(self.qps))
            if int(self.clock.t - T0) % 5 == 0:
                self.scraper.scrape_once()
            self.agent.tick()
            self.clock.t += 1.0

    def rows(self) -> dict[int, object]:
        return {int((r.minute_utc.timestamp() - T0) // 60): r for r in self.sink.rows}


def test_a_burst_on_the_replica_drives_its_gpu_to_overlimit_and_evicts_on_that_sample() -> None:
    rig = Rig(qps=10.0, xcuda_target_util=None)  # a job xCUDA does not pace
    rig.placements.set(0, [rig.job])
    rig.run(30)
    assert rig.agent.loops[0].monitor.state.value == "Healthy" and not rig.evicted
    calm = rig.gpu(rig.clock.t)
    assert 60.0 < calm.sm_activity_pct < 85.0  # the job at 70 % beside a light replica
    rig.replica.target.set(250.0)
    rig.qps = 250.0
    rig.run(12)
    # the scrape at +35 s is the first to see the burst; the sample right after it enters Overlimit and evicts
    assert [t - T0 for _, t in rig.evicted] == [35.0]
    assert rig.agent.loops[0].monitor.state.value == "Overlimit"
    ev = rig.sink.evictions[0]
    assert ev.job_id == 42 and "sm_activity" in ev.reason and ev.health == "Overlimit"


def test_a_burst_beside_a_paced_job_turns_the_gpu_unhealthy_and_the_job_stays() -> None:
    rig = Rig(qps=10.0)
    rig.placements.set(0, [rig.job])
    rig.run(30)
    assert rig.agent.loops[0].monitor.state.value == "Healthy"
    rig.replica.target.set(250.0)
    rig.qps = 250.0
    rig.run(30)
    # xCUDA holds the GPU at its 0.9 target: SysMonitor sees Unhealthy (no new work), never Overlimit
    assert not rig.evicted and rig.sink.evictions == []
    assert rig.agent.loops[0].monitor.state.value == "Unhealthy"
    assert rig.gpu(rig.clock.t).sm_activity_pct == pytest.approx(90.0)


def test_rows_carry_the_endpoint_rate_latency_and_the_job_with_gaps_labelled() -> None:
    rig = Rig(qps=20.0)
    rig.run(90)                                   # minute 0 alone; the job arrives at +90 s
    rig.placements.set(0, [rig.job])
    rig.run(91)                                   # the first sample of minute 3 closes minute 2
    rows = rig.rows()
    r0, r2 = rows[0], rows[2]
    assert r0.online_qps == pytest.approx(20.0) and r0.online_latency_ms == pytest.approx(10.0)
    assert 7.5 <= r0.online_latency_p99_ms <= 10.0
    assert r0.online_solo_latency_ms == pytest.approx(10.0) and r0.offline_job_id is None
    assert r0.online_gap_reason is None
    assert r0.online_sm_activity_pct == pytest.approx(r0.sm_activity_pct) and r0.online_mem_used_bytes == 3.5 * (1 << 30)
    # with the job: the simulated split, the job's id, the solo latency from the minutes without it
    assert r2.offline_job_id == 42 and r2.sm_activity_pct > r2.online_sm_activity_pct + 40.0
    assert r2.online_solo_latency_ms == pytest.approx(10.0) and r2.online_qps == pytest.approx(20.0)
    assert r2.mem_used_bytes == r2.online_mem_used_bytes + (2 << 30)


def test_under_mps_a_shared_minute_has_no_online_split_but_keeps_the_rate_and_says_why() -> None:
    rig = Rig(qps=20.0, mps_split_gaps=True)
    rig.run(90)
    rig.placements.set(0, [rig.job])
    rig.run(91)
    rows = rig.rows()
    r0, r2 = rows[0], rows[2]
    assert r0.online_sm_activity_pct == pytest.approx(r0.sm_activity_pct) and r0.online_gap_reason is None
    assert r2.offline_job_id == 42 and r2.sm_activity_pct > 40.0  # the device totals are still measured
    assert r2.online_sm_activity_pct is None and r2.online_gpu_util_pct is None and r2.online_mem_bw_util_pct is None
    assert r2.online_mem_used_bytes == 3.5 * (1 << 30)  # the driver reports memory per MPS client
    assert r2.online_qps == pytest.approx(20.0)  # the endpoint is unaffected: what the round estimates from
    assert "NVML reports every MPS client's kernels as the MPS server's" in r2.online_gap_reason


def test_a_down_endpoint_leaves_the_rate_null_with_its_reason_never_zero() -> None:
    rig = Rig(qps=20.0)
    rig.replica.down = True
    rig.run(65)
    r = rig.rows()[0]
    assert r.online_qps is None and r.online_latency_ms is None and r.online_solo_latency_ms is None
    assert "no scrape of http://replica:9100/metrics" in r.online_gap_reason
    assert "ConnectError" in r.online_gap_reason
    assert r.online_sm_activity_pct is not None  # the GPU split is still the model's (driven by the daily cycle)
    assert rig.gpu.qps_source == "daily cycle"


def test_a_simulated_replica_without_endpoint_and_a_gpu_without_service() -> None:
    rig = Rig(endpoint=False)
    rig.run(61)
    r = rig.rows()[0]
    assert r.online_qps == pytest.approx(float(diurnal_qps(12.0, 5.0, 20.0, 20.0)), rel=0.01)  # registered cycle
    assert r.online_latency_ms is not None and r.online_latency_p99_ms is None
    assert r.online_gap_reason == "p99 latency: not modelled (simulated replica without a metrics endpoint)"
    bare = Rig(service=False)
    bare.placements.set(0, [bare.job])
    bare.run(61)
    r = bare.rows()[0]
    assert r.online_gpu_util_pct is None and r.online_qps is None and r.offline_job_id == 42
    assert r.online_gap_reason == "no online service registered on this GPU"
    assert r.sm_activity_pct > 60.0  # the job alone still loads the GPU


def test_the_minute_in_progress_is_written_early_and_replaced() -> None:
    rig = Rig(qps=20.0, partial_every_s=10.0)
    rig.run(25)
    (early,) = rig.sink.rows
    assert early.minute_utc.timestamp() == T0 and early.online_qps == pytest.approx(20.0)
    rig.run(46)                                   # minute 0 closed, minute 1 written 10 s in
    rows = rig.rows()
    assert sorted(rows) == [0, 1] and len(rig.sink.rows) == 2  # replaced, never duplicated
    assert rows[1].online_qps == pytest.approx(20.0)


def test_two_jobs_on_a_gpu_are_modelled_together_and_the_minute_names_the_larger_share() -> None:
    from dataclasses import replace

    rig = Rig(qps=10.0, endpoint=False, xcuda_target_util=None)
    small = replace(rig.job, job_id=43, slurm_job_id=9043, sm_pct=30)
    rig.placements.set(0, [replace(rig.job, sm_pct=40), small])
    rig.run(61)
    both = rig.gpu(T0 + 30.0)
    rig.placements.set(0, [replace(rig.job, sm_pct=40)])
    one = rig.gpu(T0 + 30.0)
    # the second job adds its SMs, memory and pressure on the replica
    assert both.sm_activity_pct > one.sm_activity_pct
    assert both.mem_used_bytes == pytest.approx(one.mem_used_bytes + (2 << 30))
    assert both.online_latency_ms > one.online_latency_ms
    assert rig.rows()[0].offline_job_id == 42  # 40 % against 30 %


def test_a_burst_over_the_replicas_recent_rate_paces_its_job_to_xcudas_floor_until_it_ends(tmp_path, caplog) -> None:
    """Six quiet minutes make the reference; a 2x burst, seen at the next scrape, lowers xCUDA's target in the GPU
    record so the job stalls at the floor (SysMonitor stays Healthy, nothing is evicted); the burst's minutes stay
    out of the reference, and the target comes back when the rate does."""
    from executors.node.xcuda.shm import decode
    from scheduler_core.guard.burst import BURST_TARGET_UTIL

    rec = tmp_path / "muxflow-gpu-0"
    rig = Rig(qps=12.0, shm_path=rec)
    rig.placements.set(0, [rig.job])
    loop = rig.agent.loops[0]
    rig.run(6 * 60)
    assert loop.burst.reference[0] == pytest.approx(12.0, rel=0.05) and not loop.bursting
    assert decode(rec.read_bytes()).sample.target_util == 0.0  # xCUDA's own default
    shared = rig.gpu(rig.clock.t).sm_activity_pct
    with caplog.at_level("INFO", logger="executors.node.agent"):
        rig.replica.target.set(24.0)
        rig.qps = 24.0
        rig.run(5)
        assert not loop.bursting  # the last scrape still shows the quiet rate
        rig.run(6)
    assert loop.bursting and loop.bursts == 1 and loop.snapshot().burst is True
    assert decode(rec.read_bytes()).sample.target_util == BURST_TARGET_UTIL
    alone = rig.gpu.online.sm_need * 100.0  # no more than the replica's own SM need is left busy
    paced = rig.gpu(rig.clock.t).sm_activity_pct
    assert paced < shared and paced <= alone + 2.0
    assert any(re.search(r"GPU 11: online burst: 24\.0 req/s against 12\.\d recently \(\+\d+ %\): its offline work is "
                         r"paced to xCUDA's floor", r.getMessage()) for r in caplog.records)
    rig.run(3 * 60)  # three minutes of burst: still guarded, the reference still the quiet one
    assert loop.bursting and loop.burst.reference[0] == pytest.approx(12.0, rel=0.05)
    assert loop.monitor.state.value == "Healthy" and not rig.evicted
    rig.replica.target.set(12.0)
    rig.qps = 12.0
    rig.run(12)
    assert not loop.bursting and loop.snapshot().burst is False
    assert decode(rec.read_bytes()).sample.target_util == 0.0
    assert rig.gpu(rig.clock.t).sm_activity_pct == pytest.approx(shared, abs=1.0)


@pytest.mark.parametrize("slo_ms, guarded", [(5.0, True), (50.0, False)])
def test_a_burst_pauses_the_job_only_on_a_replica_over_its_slo(slo_ms: float, guarded: bool) -> None:
    """The replica serves 10 ms requests: over a 5 ms SLO a burst pauses its job; within a 50 ms SLO the job goes on
    beside it (a service within its SLO loses nothing to its neighbour worth a pause)."""
    rig = Rig(qps=12.0, slo_ms=slo_ms)
    rig.placements.set(0, [rig.job])
    loop = rig.agent.loops[0]
    rig.run(6 * 60)
    rig.replica.target.set(24.0)
    rig.qps = 24.0
    rig.run(60)
    assert loop.bursting is guarded and loop.bursts == int(guarded)
    assert rig.gpu.burst is guarded  # what the simulated job's xCUDA follows
