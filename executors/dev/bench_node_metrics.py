"""What a Prometheus scrape of the node agent costs (``muxflow bench node-metrics``): a node of simulated GPUs, each
with jobs placed on it whose processes publish xCUDA counters, scraped over HTTP as Prometheus does.

Everything a scrape reads is real and on this machine: the agent's loops after some ticks, the placements, the
store (SQLite, for the labels), a ``/proc`` tree of the jobs' processes (written as the kernel shows it) and each
process's counters file in its job's directory, read as the job user's input. Only the GPUs are simulated.
"""

from __future__ import annotations

import os
import pwd
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from executors.machine import describe
from executors.metrics_http import serve
from executors.node.agent import AgentConfig
from executors.node.placements import OfflineOnGpu, StaticPlacements
from executors.node.sampler import RawSample, SimulatedSampler
from executors.node.wiring import SourceConfig, build_agent, node_gpus, node_metrics
from executors.node.xcuda.stats import XcudaStats, encode
from executors.scheduler.submission import JobSpec, submit
from executors.simulated.setup import init_simulated_cluster
from executors.store.db import Store
from executors.store.migrate import upgrade

UPTIME_S = 10_000.0


def _proc(root: Path, pid: int, ppid: int, comm: str, uid: int, cmdline: str, env: dict[str, str]) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    hz = os.sysconf("SC_CLK_TCK")
    start = int((UPTIME_S - 60) * hz)
    d.joinpath("stat").write_text(f"{pid} ({comm}) S {ppid} " + " ".join(["0"] * 17) + f" {start} 0 0\n")
    d.joinpath("status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    d.joinpath("cmdline").write_bytes(cmdline.encode() + b"\0")
    d.joinpath("environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")


def run_node_metrics_bench(gpus: int = 8, jobs_per_gpu: int = 4, procs_per_job: int = 2, scrapes: int = 200,
                           seed: int = 0) -> dict[str, Any]:
    user = pwd.getpwnam("nobody")
    with tempfile.TemporaryDirectory(prefix="muxflow-bench-metrics-") as tmp:
        base = Path(tmp)
        url = f"sqlite:///{base / 'store.db'}"
        upgrade(url)
        store = Store(url)
        with store.session() as s:
            init_simulated_cluster(s, {"a10": gpus}, 1, gpus_per_node=gpus, seed=seed)
        node = "sim-a10-000"
        with store.session() as s:
            jobs = [submit(s, JobSpec(name=f"bench-{k}", command="python train.py", job_type="",
                                      mem_bytes=2 << 30, allowed_gpu_types=("a10",), checkpoint_dir="",
                                      total_steps=None), None) for k in range(gpus * jobs_per_gpu)]
            for j in jobs:
                j.run_as_user = user.pw_name
            s.flush()
            ids = [j.id for j in jobs]
        proc_root, job_dir = base / "proc", base / "jobs"
        proc_root.mkdir()
        proc_root.joinpath("uptime").write_text(f"{UPTIME_S:.2f} 1.00\n")
        job_dir.mkdir(mode=0o755)
        _proc(proc_root, 1, 0, "systemd", 0, "/sbin/init", {})
        placed: dict[int, list[OfflineOnGpu]] = {}
        pid = 1000
        for k, job_id in enumerate(ids):
            sid, gpu = 5000 + k, k // jobs_per_gpu
            placed.setdefault(gpu, []).append(OfflineOnGpu(job_id, sid, 100 // jobs_per_gpu, 2 << 30, None, 0.0))
            stepd, pid = pid, pid + 1
            _proc(proc_root, stepd, 1, "slurmstepd", 0, f"slurmstepd: [{sid}.batch]", {})
            d = job_dir / str(sid)
            d.mkdir()
            os.chown(d, user.pw_uid, user.pw_gid)
            parent = stepd
            for _ in range(procs_per_job):
                _proc(proc_root, pid, parent, "python", user.pw_uid, "python train.py", {"SLURM_JOB_ID": str(sid)})
                f = d / f"xcuda-{pid}.stats"
                f.write_bytes(encode(XcudaStats(pid, 1, False, False, 10_000, 100, 10**8, 500.0, 1 << 30, 1 << 30,
                                                2 << 30, 0)))
                os.chown(f, user.pw_uid, user.pw_gid)
                parent, pid = pid, pid + 1
        pairs = node_gpus(store, node)
        calm = RawSample(40.0, 30.0, 15.0, 6e9, 24e9, 10.0, 1600.0, 1700.0, 120.0, 55.0)
        agent = build_agent(store, node, simulated=True, cfg=AgentConfig(interval_s=1.0), shm_dir=None,
                            sampler=SimulatedSampler(replay={g.gpu_index: [calm] for g, _ in pairs}),
                            placements=StaticPlacements({g: tuple(js) for g, js in placed.items()}),
                            sources=SourceConfig(placements="none", scrape_s=3600.0))
        try:
            for _ in range(10):
                agent.tick()
            out: dict[str, Any] = {}
            for label, jd in (("with_xcuda_counters", job_dir), ("without_xcuda_counters", None)):
                server = serve(node_metrics(store, node, agent, str(jd) if jd else None, str(proc_root)),
                               "127.0.0.1", 0, refresh_s=0.0)  # every scrape collects: that is the cost measured
                try:
                    times, size, text = [], 0, ""
                    for i in range(scrapes + 5):
                        t0 = time.perf_counter()
                        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=30) as r:
                            text = r.read().decode()
                        if i >= 5:  # the first few warm the store's label cache
                            times.append(time.perf_counter() - t0)
                        size = len(text)
                finally:
                    server.close()
                times.sort()
                out[label] = {
                    "median_ms": round(1000 * statistics.median(times), 2),
                    "p99_ms": round(1000 * times[min(len(times) - 1, int(0.99 * len(times)))], 2),
                    "bytes": size,
                    "series": sum(1 for ln in text.splitlines() if ln and not ln.startswith("#")),
                }
            published = out["with_xcuda_counters"]["series"]
            assert "muxflow_job_xcuda_launches_total" in text or published > out["without_xcuda_counters"]["series"]
        finally:
            agent.shutdown()
            store.dispose()
    return {"benchmark": "node agent /metrics scrape", "machine": describe(), "gpus": gpus,
            "jobs_per_gpu": jobs_per_gpu, "processes_per_job": procs_per_job, "scrapes": scrapes,
            "gpu_metrics": "simulated GPUs (the sampler replays one reading); /proc and job files real on disk",
            **out}
