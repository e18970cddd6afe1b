"""The node agent's Prometheus endpoint, scraped over HTTP as Prometheus does: GPU series under dcgm-exporter's
names, each placed job's share and quota with its Slurm job id and owner, the replica's latency against its
allowance, and the evictions."""

from __future__ import annotations

import datetime as dt
import urllib.request

import pytest
from sqlalchemy import select

from executors.metrics_http import serve
from executors.node.agent import AgentConfig
from executors.node.placements import OfflineOnGpu, StaticPlacements
from executors.node.sampler import RawSample, SimulatedSampler
from executors.node.wiring import SourceConfig, build_agent, node_gpus, node_metrics
from executors.store import models as m
from tests.executors.node.test_node_store import CALM, HOT, T0, FakeClock
from tests.prometheus_helpers import one, parse_series

__all__ = ["CALM", "HOT", "node"]

NODE = "sim-t4-000"


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """``GET /metrics`` as Prometheus does: sample name → [(labels, value)]."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        return parse_series(r.read().decode())


@pytest.fixture()
def node(cluster_store):
    """The t4 node: GPU 0 hosts a replica and runs job A (Slurm 9001, 70 %, 2 GiB); GPU 1 runs job B; the agent's
    sampler replays a calm GPU, hot on GPU 0 when told."""
    store = cluster_store
    pairs = node_gpus(store, NODE)
    with store.session() as s:
        j1, j2 = [j.id for j in s.scalars(select(m.OfflineJob).order_by(m.OfflineJob.id)).all()[:2]]
        s.get(m.OfflineJob, j1).run_as_user = "alice"
        s.get(m.OfflineJob, j1).slurm_job_id = 9001
        svc = s.scalars(select(m.ServiceInstance).where(m.ServiceInstance.gpu_id == pairs[0][0].id)).one().service
        svc_name, allowance, slo_ms = svc.name, svc.slowdown_allowance, svc.latency_slo_ms
        job_type = s.get(m.OfflineJob, j1).job_type
    placements = StaticPlacements({0: (OfflineOnGpu(j1, 9001, 70, 2 << 30, None, T0),),
                                   1: (OfflineOnGpu(j2, None, 30, 1 << 30, None, T0),)})
    sampler = SimulatedSampler(replay={g.gpu_index: [CALM] for g, _ in pairs})
    clock = FakeClock()
    agent = build_agent(store, NODE, simulated=True, cfg=AgentConfig(interval_s=1.0), shm_dir=None,
                        evict_callback=lambda gpu_id, reason: [j1], sampler=sampler, clock=clock,
                        placements=placements, sources=SourceConfig(placements="none", scrape_s=3600.0))
    server = serve(node_metrics(store, NODE, agent), "127.0.0.1", 0, refresh_s=0.0)  # a scrape sees the ticks before it
    try:
        yield dict(store=store, agent=agent, sampler=sampler, clock=clock, port=server.port, pairs=pairs, j1=j1,
                   j2=j2, service=svc_name, allowance=allowance, slo_ms=slo_ms, job_type=job_type)
    finally:
        server.close()
        agent.shutdown()


def test_gpus_jobs_and_the_agent_are_published_with_their_labels(node) -> None:
    agent, clock = node["agent"], node["clock"]
    node["sampler"].add_xid(T0 + 2, 1, 57)  # a non-fatal XID: counted, nothing evicted
    for _ in range(5):
        agent.tick()
        clock.t += 1.0
    got = scrape(node["port"])
    uuid0 = next(g.uuid for g, _ in node["pairs"] if g.gpu_index == 0)
    gpu0 = dict(gpu="0", UUID=uuid0, modelName="t4", Hostname=NODE, source="simulated")
    assert one(got, "DCGM_FI_DEV_GPU_UTIL", **gpu0) == CALM.gpu_util_pct
    assert one(got, "DCGM_FI_PROF_SM_ACTIVE", **gpu0) == pytest.approx(CALM.sm_activity_pct / 100)
    assert one(got, "DCGM_FI_DEV_FB_USED", **gpu0) == pytest.approx(CALM.mem_used_bytes / 2**20)
    free_mib = (CALM.mem_total_bytes - CALM.mem_used_bytes) / 2**20
    assert one(got, "DCGM_FI_DEV_FB_FREE", **gpu0) == pytest.approx(free_mib)
    assert one(got, "DCGM_FI_DEV_POWER_USAGE", **gpu0) == CALM.power_w
    assert one(got, "DCGM_FI_DEV_SM_CLOCK", **gpu0) == CALM.sm_clock_mhz
    assert len(got["DCGM_FI_DEV_GPU_UTIL"]) == len(node["pairs"])
    assert one(got, "muxflow_gpu_health", node=NODE, gpu="0", state="Healthy") == 1.0
    assert one(got, "muxflow_gpu_health", node=NODE, gpu="0", state="Overlimit") == 0.0
    assert one(got, "muxflow_gpu_burst_guard", node=NODE, gpu="0") == 0.0  # no burst (no reference yet)
    assert one(got, "muxflow_gpu_xid_errors_total", gpu="1") == 1.0 and one(got, "muxflow_gpu_xid_errors_total",
                                                                             gpu="0") == 0.0
    assert one(got, "muxflow_gpu_samples_total", gpu="0") == 5.0
    assert one(got, "muxflow_gpu_last_sample_timestamp_seconds", gpu="0") == T0 + 4
    job = dict(node=NODE, gpu="0", gpu_uuid=uuid0, hpc_job="9001", job_id=str(node["j1"]), user="alice",
               job_type=node["job_type"])
    assert one(got, "muxflow_job_sm_share_ratio", **job) == pytest.approx(0.7)
    assert one(got, "muxflow_job_memory_quota_bytes", **job) == 2 << 30
    assert one(got, "muxflow_job_sm_share_ratio", gpu="1", hpc_job="", job_id=str(node["j2"])) == pytest.approx(0.3)
    assert one(got, "muxflow_node_agent_ticks_total", node=NODE) == 5.0
    assert "muxflow_job_evictions_total" not in got


def test_an_eviction_and_the_gpu_state_show(node) -> None:
    agent, clock, sampler = node["agent"], node["clock"], node["sampler"]
    for k in range(3):
        sampler.set_override(0, HOT if k == 1 else CALM)
        agent.tick()
        clock.t += 1.0
    got = scrape(node["port"])
    assert one(got, "muxflow_gpu_health", gpu="0", state="Overlimit") == 1.0
    assert one(got, "muxflow_gpu_evictions_total", gpu="0") == 1.0
    agent.loops[0].bursting = True  # what a burst sets (the guard's own tests drive it from a replica's rate)
    assert one(scrape(node["port"]), "muxflow_gpu_burst_guard", gpu="0") == 1.0
    assert one(got, "muxflow_job_evictions_total", node=NODE, job_id=str(node["j1"])) == 1.0


def test_a_replicas_minutes_over_its_allowance_and_slo_are_counted(node) -> None:
    """The last whole minute's latency against the solo latency: slowdown, and the minutes over the allowance."""
    from dataclasses import replace

    agent = node["agent"]
    loop = agent.loops[0]
    solo = 10.0
    fast = dict(online_qps=50.0, online_latency_ms=solo * (1 + node["allowance"] / 2), online_latency_p99_ms=20.0,
                online_solo_latency_ms=solo)
    slow = dict(fast, online_latency_ms=solo * (1 + node["allowance"] * 2), online_latency_p99_ms=node["slo_ms"] * 2)
    for i, values in enumerate((fast, slow, slow)):
        base = _row(loop.b.gpu_id, i)
        for listen in loop.minute_listeners:
            listen(replace(base, **values))
        loop.last_row = replace(base, **values)
    got = scrape(node["port"])
    svc = dict(service=node["service"], node=NODE, gpu="0")
    assert one(got, "muxflow_service_requests_per_second", **svc) == 50.0
    assert one(got, "muxflow_service_latency_avg_seconds", **svc) == pytest.approx(slow["online_latency_ms"] / 1000)
    assert one(got, "muxflow_service_slowdown_ratio", **svc) == pytest.approx(node["allowance"] * 2)
    assert one(got, "muxflow_service_slowdown_allowance_ratio", **svc) == pytest.approx(node["allowance"])
    assert one(got, "muxflow_service_latency_slo_seconds", **svc) == pytest.approx(node["slo_ms"] / 1000)
    assert one(got, "muxflow_service_over_allowance_seconds_total", **svc) == 120.0
    assert one(got, "muxflow_service_slo_violation_seconds_total", **svc) == 120.0
    assert "muxflow_service_requests_per_second" not in {n for n, rows in got.items() for lab, _ in rows
                                                         if lab.get("gpu") == "1"}


def test_a_gpu_without_a_reading_has_no_made_up_value(cluster_store) -> None:
    """NaN (not available, e.g. occupancy without GPM) gives no series, never a 0."""
    store = cluster_store
    pairs = node_gpus(store, NODE)
    no_gpm = RawSample(40.0, 30.0, float("nan"), 6e9, 24e9, 10.0, 1600.0, 1700.0, float("nan"), 55.0)
    sampler = SimulatedSampler(replay={g.gpu_index: [no_gpm] for g, _ in pairs})
    agent = build_agent(store, NODE, simulated=True, cfg=AgentConfig(interval_s=1.0), shm_dir=None,
                        sampler=sampler, clock=FakeClock(), placements=StaticPlacements(),
                        sources=SourceConfig(placements="none", scrape_s=3600.0))
    server = serve(node_metrics(store, NODE, agent), "127.0.0.1", 0, refresh_s=0.0)  # a scrape sees the ticks before it
    try:
        agent.tick()
        got = scrape(server.port)
    finally:
        server.close()
        agent.shutdown()
    assert "DCGM_FI_PROF_SM_OCCUPANCY" not in got and "DCGM_FI_DEV_POWER_USAGE" not in got
    assert len(got["DCGM_FI_DEV_GPU_UTIL"]) == len(pairs)


def _row(gpu_id: int, minute: int):
    from executors.node.aggregate import AgentMetricRow

    return AgentMetricRow(gpu_id=gpu_id, minute_utc=dt.datetime.fromtimestamp(T0 + 60 * minute, dt.timezone.utc),
                          gpu_util_pct=40.0, sm_activity_pct=30.0, sm_occupancy_pct=15.0, mem_used_bytes=6e9,
                          mem_total_bytes=24e9, sm_clock_mhz=1600.0, health="Healthy", mem_bw_util_pct=10.0,
                          power_w=120.0, temperature_c=55.0, online_gpu_util_pct=None, online_sm_activity_pct=None,
                          online_mem_used_bytes=None, online_mem_bw_util_pct=None, online_qps=None,
                          online_latency_ms=None, online_solo_latency_ms=None, offline_job_id=None)


def test_the_exposition_passes_promtool(node) -> None:
    """``promtool check metrics``: Prometheus' own linter of the text format (names, types, help, units)."""
    from tests.prometheus_helpers import promtool

    for k in range(3):
        node["sampler"].set_override(0, HOT if k == 1 else CALM)
        node["agent"].tick()
        node["clock"].t += 1.0
    with urllib.request.urlopen(f"http://127.0.0.1:{node['port']}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert "muxflow_job_evictions_total" in text
    out = promtool("check", "metrics", stdin=text)
    # dcgm-exporter's own label names (modelName, Hostname) are camelCase; kept so its dashboards work. Nothing else
    # may be reported.
    problems = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    dcgm_labels = [ln for ln in problems if ln.startswith("DCGM_FI_") and "label names should be written in "
                   "'snake_case' not 'camelCase'" in ln]
    assert problems == dcgm_labels, problems
    assert out.returncode in ((0,) if not problems else (3,)), out


def test_xcudas_counters_of_a_placed_job_are_summed_over_its_processes(node) -> None:
    """Two processes of Slurm job 9001 publish: launches, waits and memory add up; the rate is the paced one's;
    one in fallback makes the job's fallback 1."""
    from executors.node.metrics import NodeAgentCollector
    from executors.node.wiring import node_metrics
    from executors.node.xcuda.stats import XcudaStats

    asked: list = []
    procs = [XcudaStats(11, 1, False, False, 1000, 40, 2_000_000_000, 250.0, 3 << 20, 4 << 20, 1 << 30, 0),
             XcudaStats(12, 1, True, False, 500, 10, 500_000_000, 2000.0, 1 << 20, 1 << 20, 1 << 30, 2)]
    base = node_metrics(node["store"], NODE, node["agent"])
    collector = NodeAgentCollector(node["agent"], NODE, base.gpus.values(), base.services, base.jobs,
                                   lambda jobs: asked.append(jobs) or {9001: procs})
    server = serve(collector, "127.0.0.1", 0)
    try:
        node["agent"].tick()
        got = scrape(server.port)
    finally:
        server.close()
    assert asked == [[(9001, "alice")]]  # only the placed Slurm jobs, with their owners
    job = dict(hpc_job="9001", user="alice")
    assert one(got, "muxflow_job_memory_charged_bytes", **job) == 4 << 20
    assert one(got, "muxflow_job_xcuda_launches_total", **job) == 1500
    assert one(got, "muxflow_job_xcuda_waits_total", **job) == 50
    assert one(got, "muxflow_job_xcuda_wait_seconds_total", **job) == pytest.approx(2.5)
    assert one(got, "muxflow_job_xcuda_launch_rate_limit", **job) == 2250.0
    assert one(got, "muxflow_job_xcuda_fallback", **job) == 1.0 and one(got, "muxflow_job_xcuda_processes", **job) == 2
    assert "muxflow_job_xcuda_launches_total" not in {n for n, rows in got.items() for lab, _ in rows
                                                      if lab.get("gpu") == "1"}  # job B publishes nothing


def test_the_agent_reads_xcuda_counters_of_the_jobs_own_processes_only(tmp_path) -> None:
    """/proc and the job directory as on a node: the records of the job's processes that run as its user."""
    import os
    import pwd

    from executors.node.wiring import _xcuda_counters
    from executors.node.xcuda.stats import XcudaStats, encode
    from tests.executors.node.test_xcuda_check import UPTIME_S, fake_proc, stepd

    nobody = pwd.getpwnam("nobody").pw_uid
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "uptime").write_text(f"{UPTIME_S:.2f} 1.00\n")
    fake_proc(proc, 1, 0, "systemd", uid=0)
    stepd(proc, 200, 77)
    fake_proc(proc, 201, 200, "bash", job=77, uid=nobody)
    fake_proc(proc, 202, 201, "python", job=77, uid=nobody)
    fake_proc(proc, 300, 1, "python", job=78, uid=nobody)     # another job's process
    jobs = tmp_path / "jobs"
    (jobs / "77").mkdir(parents=True)
    jobs.chmod(0o755)
    os.chown(jobs / "77", nobody, nobody)
    for pid in (202, 300):
        f = jobs / "77" / f"xcuda-{pid}.stats"
        f.write_bytes(encode(XcudaStats(pid, 1, False, True, pid, 0, 0, 0.0, 0, 0, None, 0)))
        os.chown(f, nobody, nobody)
    read = _xcuda_counters(jobs, proc)
    got = read([(77, "nobody")])
    assert [r.pid for r in got[77]] == [202]
    assert read([(77, "root")]) == {}  # the directory is not root's: refused, logged, left out
    assert read([]) == {}


def test_the_scrape_benchmark_reports_both_sides() -> None:
    import json

    from click.testing import CliRunner

    from pipelines.cli.bench import bench_node_metrics

    res = CliRunner().invoke(bench_node_metrics, ["--gpus", "2", "--jobs-per-gpu", "2", "--scrapes", "10", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    with_x, without = out["with_xcuda_counters"], out["without_xcuda_counters"]
    assert with_x["series"] > without["series"] > 0 and with_x["median_ms"] > 0 and without["p99_ms"] > 0
