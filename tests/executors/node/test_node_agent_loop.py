"""SysMonitor loop and error detector on the simulated backend, driven by replayed sequences.

The agent is ticked by hand with a fake clock: no threads, no sleeping.
"""

from __future__ import annotations

import datetime as dt

import pytest

from executors.node.agent import AgentConfig, GpuBinding, MemorySink, NodeAgent, to_sysmonitor_sample
from executors.node.detector import ErrorDetector, FakeMpsControl
from executors.node.evictor import CallbackEvictor, SlurmEvictor
from executors.node.sampler import RawSample, SimulatedSampler
from executors.node.xcuda import shm
from scheduler_core.guard.sysmonitor import SysMonitorConfig

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc).timestamp()


class FakeClock:
    def __init__(self, t: float = T0):
        self.t = t

    def epoch(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t - T0


def s(sm: float = 30.0, util: float = 40.0, clock: float = 1600.0, mem_frac: float = 0.3, idle: bool = False) -> RawSample:
    return RawSample(gpu_util_pct=util, sm_activity_pct=sm, sm_occupancy_pct=sm / 2, mem_used_bytes=mem_frac * 24e9,
                     mem_total_bytes=24e9, mem_bw_util_pct=10.0, sm_clock_mhz=clock, sm_clock_max_mhz=1700.0,
                     power_w=120.0, temperature_c=55.0, clock_idle=idle)


CALM, HOT = s(), s(sm=99.0)


class Rig:
    """One simulated GPU (index 0, store id 11) with a fake MPS and recording evictor."""

    def __init__(self, tmp_path=None, replay=None, interval_s: float = 1.0, base_hold_s: float = 10.0, mps=None):
        self.clock = FakeClock()
        self.sampler = SimulatedSampler(replay={0: replay or [CALM]})
        self.sink = MemorySink()
        self.evicted: list[tuple[int, str]] = []
        self.mps = mps or FakeMpsControl(alive=True)
        self.detector = ErrorDetector(self.mps, probe_interval_s=1.0)
        path = None if tmp_path is None else tmp_path / "muxflow-gpu-0"
        cfg = AgentConfig(interval_s=interval_s, sysmonitor=SysMonitorConfig(base_hold_s=base_hold_s))
        self.agent = NodeAgent(self.sampler, [GpuBinding(11, 0, path, clock_threshold_mhz=1400.0)],
                               CallbackEvictor(self._evict), self.sink, cfg, clock=self.clock,
                               detectors={0: self.detector})
        self.loop = self.agent.loops[0]

    def _evict(self, gpu_id: int, reason: str) -> list[int]:
        self.evicted.append((gpu_id, reason))
        return [101]

    def run(self, samples: list[RawSample | None], dt_s: float = 1.0) -> list[str]:
        """Tick once per sample (override), ``dt_s`` apart; the health after each tick."""
        out = []
        for x in samples:
            self.sampler.set_override(0, x)
            self.agent.tick()
            out.append(self.loop.monitor.state.value)
            self.clock.t += dt_s
        return out


def test_overlimit_evicts_on_the_same_sample_and_is_recorded():
    rig = Rig()
    states = rig.run([CALM, CALM, HOT])
    assert states == ["Healthy", "Healthy", "Overlimit"]
    assert len(rig.evicted) == 1 and rig.evicted[0][0] == 11
    assert "sm_activity 99.0% >= 97%" in rig.evicted[0][1]
    (ev,) = rig.sink.evictions
    assert (ev.gpu_id, ev.job_id, ev.health, ev.ok) == (11, 101, "Overlimit", True)
    assert [h.health for h in rig.sink.healths] == ["Healthy", "Overlimit"]
    assert rig.sink.healths[-1].overlimit_entries_utc == (dt.datetime.fromtimestamp(T0 + 2, dt.timezone.utc),)


def test_oscillating_load_evicts_once_and_backs_off():
    rig = Rig(base_hold_s=10.0)
    rig.run([CALM, HOT, CALM, HOT, CALM, HOT] + [CALM] * 12)
    assert len(rig.evicted) == 1
    assert [h.health for h in rig.sink.healths] == ["Healthy", "Overlimit", "Unhealthy", "Healthy"]
    # second entry within two hours: the hold doubles (20 s of calm samples instead of 10)
    rig.run([HOT])
    states = rig.run([CALM] * 25)
    assert len(rig.evicted) == 2
    assert states.index("Unhealthy") == 20


def test_idle_low_clock_is_not_throttling():
    idle = s(sm=0.0, util=0.0, clock=210.0, idle=True)
    assert to_sysmonitor_sample(idle, 5.0).sm_clock_frac == 1.0
    busy = s(sm=60.0, util=70.0, clock=1020.0)
    assert to_sysmonitor_sample(busy, 5.0).sm_clock_frac == pytest.approx(0.6)
    assert to_sysmonitor_sample(RawSample(), 5.0) is None
    rig = Rig()
    assert rig.run([idle] * 5) == ["Healthy"] * 5 and not rig.evicted
    assert rig.run([busy]) == ["Overlimit"]  # a throttled clock under load is Overlimit


def test_gaps_do_not_change_health():
    rig = Rig()
    assert rig.run([CALM, None, None, RawSample(power_w=5.0), CALM]) == ["Healthy"] * 5
    assert rig.loop.gaps == 2 and rig.loop.samples == 3


def test_minutes_are_flushed_with_coverage(tmp_path):
    rig = Rig(tmp_path, interval_s=1.0)
    rig.run([CALM] * 30 + [None] * 30 + [s(sm=50.0)] * 60)  # minute 1: half the samples; minute 2: full
    rig.agent.shutdown()  # flushes the (empty) current minute
    rows = rig.sink.rows
    assert [r.minute_utc for r in rows] == [dt.datetime.fromtimestamp(T0 + k * 60, dt.timezone.utc) for k in (0, 1)]
    assert rows[0].sm_activity_pct == pytest.approx(30.0) and rows[1].sm_activity_pct == pytest.approx(50.0)
    assert [round(c, 3) for _, c in rig.loop.coverage_log] == [0.5, 1.0]
    assert rig.sink.sources == {"simulated"} and rig.sampler.closed


def test_shm_record_follows_every_sample(tmp_path):
    rig = Rig(tmp_path)
    rig.run([s(sm=42.0, clock=1500.0, util=55.0)])
    rec = shm.decode((tmp_path / "muxflow-gpu-0").read_bytes())
    assert rec.gpu_index == 0 and rec.seq == 2
    assert rec.sample.u_sm == pytest.approx(0.42) and rec.sample.sm_clock_mhz == 1500.0
    assert rec.sample.clock_threshold_mhz == 1400.0 and rec.sample.clock_max_mhz == 1700.0
    assert rec.sample.gpu_util == pytest.approx(0.55) and rec.sample.mem_used_bytes == int(0.3 * 24e9)
    rig.run([s(sm=10.0)])
    rec2 = shm.decode((tmp_path / "muxflow-gpu-0").read_bytes())
    assert rec2.seq == 4 and rec2.sample.u_sm == pytest.approx(0.10) and rec2.timestamp_ns >= rec.timestamp_ns
    rig.run([None])  # a gap leaves the last record (xCUDA treats it as stale after XCUDA_SHM_STALE_MS)
    assert shm.decode((tmp_path / "muxflow-gpu-0").read_bytes()).seq == 4


# -- error detector on replayed event sequences ------------------------------------------------------

def test_xid31_evicts_resets_mps_and_holds_init_until_probe_answers():
    rig = Rig()
    rig.run([CALM, CALM])
    rig.sampler.add_xid(rig.clock.t, 0, 31)
    rig.mps.revive_on_reset = False
    rig.mps.hung = True  # MPS hangs with the fault and stays broken after the reset for a while
    states = rig.run([HOT, CALM, CALM])
    assert states == ["Init", "Init", "Init"]  # HOT is not stepped while recovering: no second eviction
    assert rig.mps.resets == 1 and len(rig.evicted) == 1 and "xid 31, mps_hang" in rig.evicted[0][1]
    err, hang = rig.sink.errors  # both patterns seen on the same sample, one eviction and one reset
    assert (err.gpu_id, err.kind, err.xid) == (11, "xid", 31) and hang.kind == "mps_hang"
    rig.mps.hung = False
    assert rig.run([CALM, CALM]) == ["Healthy", "Healthy"]
    assert [h.health for h in rig.sink.healths] == ["Healthy", "Init", "Healthy"]


def test_non_fatal_xid_is_ignored():
    rig = Rig()
    rig.sampler.add_xid(rig.clock.t, 0, 94 + 1000)
    assert rig.run([CALM, CALM]) == ["Healthy", "Healthy"]
    assert not rig.sink.errors and rig.mps.resets == 0


def test_mps_server_crash_detected_when_the_process_goes():
    rig = Rig()
    rig.run([CALM, CALM])
    rig.mps.alive = False
    states = rig.run([CALM, CALM, CALM])
    assert states[0] == "Init" and states[-1] == "Healthy"  # reset revives it; probe answers a second later
    assert [e.kind for e in rig.sink.errors] == ["mps_server_crash"]
    assert rig.mps.resets == 1 and len(rig.evicted) == 1


def test_mps_hang_detected_by_probe_timeout():
    rig = Rig()
    rig.run([CALM])
    rig.mps.hung = True
    rig.run([CALM, CALM])
    assert [e.kind for e in rig.sink.errors] == ["mps_hang"]
    assert rig.mps.resets == 1


def test_no_mps_configured_means_no_mps_faults():
    rig = Rig(mps=FakeMpsControl(alive=None))
    assert rig.run([CALM] * 3) == ["Healthy"] * 3 and not rig.sink.errors


def test_xid79_disables_the_gpu_for_good():
    rig = Rig()
    rig.run([CALM])
    rig.sampler.add_xid(rig.clock.t, 0, 79)
    assert rig.run([CALM, HOT, CALM]) == ["Disabled"] * 3
    assert len(rig.evicted) == 1 and rig.mps.resets == 0
    assert rig.sink.healths[-1].health == "Disabled"


def test_replayed_sequence_end_to_end():
    """A recorded sequence: warm-up, a load spike, a page fault, recovery."""
    seq = [CALM] * 3 + [s(sm=92.0)] * 2 + [HOT] + [CALM] * 14
    rig = Rig(replay=seq, base_hold_s=5.0)
    rig.sampler.add_xid(T0 + 12, 0, 31)
    states = []
    for _ in seq:
        rig.agent.tick()
        states.append(rig.loop.monitor.state.value)
        rig.clock.t += 1.0
    assert states[:6] == ["Healthy"] * 3 + ["Unhealthy"] * 2 + ["Overlimit"]
    assert states[12] == "Init" and states[-1] == "Healthy"
    assert [e.kind for e in rig.sink.errors] == ["xid"] and len(rig.evicted) == 2


def test_slurm_evictor_requeues_each_job_and_survives_a_failure():
    calls = []

    def requeue(jid: int) -> None:
        calls.append(jid)
        if jid == 2:
            raise RuntimeError("slurm says no")

    ev = SlurmEvictor(lambda gpu: [(10, 1), (20, 2), (None, 3)], requeue)
    out = ev.evict(5, "Overlimit")
    assert calls == [1, 2, 3]
    assert [(e.job_id, e.slurm_job_id, e.ok) for e in out] == [(10, 1, True), (20, 2, False), (None, 3, True)]


def test_eviction_exception_is_recorded_not_raised():
    rig = Rig()

    def boom(gpu_id, reason):
        raise RuntimeError("cluster unreachable")

    rig.agent.loops[0].evictor = CallbackEvictor(boom)
    assert rig.run([CALM, HOT]) == ["Healthy", "Overlimit"]
    (ev,) = rig.sink.evictions
    assert not ev.ok and "cluster unreachable" in ev.reason
