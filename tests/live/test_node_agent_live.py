"""The node agent on a Slurm node of the dev cluster: a real replica's load on a simulated GPU that follows
the placement Slurm really runs, and an eviction the store shows (docs/NODE_AGENT.md).

One test, on a cluster of its own (``private_cluster``: its MPS shares and jobs are nobody else's):

1. a real ``serve`` replica (CPU, 10 QPS) with its Prometheus endpoint, registered on GPU 0 of
   ``mx-t4-1`` with ``muxflow online register --endpoint``;
2. a plain ``sbatch`` offline job, picked up and placed on that GPU at 70 % by the dispatcher;
3. ``muxflow node-agent --node mx-t4-1 --simulated --evict scontrol`` as a subprocess, writing the
   minute in progress every 2 s;
4. the minute rows carry the replica's real rate and latency, the simulated split (labelled
   simulated) and the job; a scripted burst (``POST /load``) drives the GPU to Overlimit; the
   agent requeues the Slurm job held and the store shows the eviction and the job EVICTED.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys

import httpx
from click.testing import CliRunner
from sqlalchemy import select

from executors.scheduler.slurm.pickup import import_submissions
from executors.store import models as m
from executors.store.jobs import transition
from pipelines.cli import main
from scheduler_core.domain import Action, JobState, PlanAction
from tests.live.conftest import cancel_quietly, wait_for
from tests.live.muxflow_helpers import (
    GOOD_COMMENT,
    REPO,
    backend,
    make_pending,
    make_store,
    register,
    sbatch,
    write_script,
)

NODE, GPU_INDEX, SHARE_PCT = "mx-t4-1", 0, 70
CALM_QPS, BURST_QPS = 10, 300


def _stop(proc: subprocess.Popen, timeout_s: float = 30.0) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.stderr.read() if proc.stderr else ""


def test_replica_load_drives_the_simulated_gpu_of_a_slurm_node_to_an_eviction(private_cluster, private_tmp) -> None:
    live = private_cluster
    store, url = make_store(private_tmp)
    gpus = register(store, live)
    gpu_id = gpus[(NODE, GPU_INDEX)]
    procs: list[subprocess.Popen] = []
    sids: list[int] = []
    try:
        # 1. the replica, and its endpoint registered on the GPU
        ready = private_tmp / "replica.json"
        replica = subprocess.Popen(
            [sys.executable, "-m", "executors.job.workloads.serve", "--family", "cnn", "--qps", str(CALM_QPS),
             "--metrics-port", "0", "--ready", str(ready)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(replica)
        wait_for("the replica to be ready", lambda: ready.exists() or replica.poll() is not None, 90)
        assert replica.poll() is None, _stop(replica)
        metrics_url = json.loads(ready.read_text())["metrics_url"]
        r = CliRunner().invoke(main, ["--db", url, "online", "register", "--name", "search", "--family", "cnn",
                                      "--qps-min", "5", "--qps-max", "20", "--mem", "3.5GiB",
                                      "--gpu-ids", str(gpu_id), "--endpoint", metrics_url])
        assert r.exit_code == 0, r.output

        # 2. a plain sbatch offline job, picked up and placed on that GPU
        d = live.job_dir("node-agent")
        script = write_script(d, "sleep 600\n")
        sid = sbatch(live, script, "-p", "offline", "--gres=mps:10", "-J", f"mx-agent{os.getpid()}",
                     f"--output={d}/%j.out", f"--comment={GOOD_COMMENT.format(name='agent')}")
        sids.append(sid)
        with live.client() as c:
            import_submissions(store, c, None, only=[sid])
        with store.session() as s:
            job_id = s.scalars(select(m.OfflineJob.id).where(m.OfflineJob.slurm_job_id == sid)).one()
        make_pending(store, [job_id])
        (res,) = backend(live).cluster(store).dispatch(
            [PlanAction(Action.START, job_id, gpu_id, None, SHARE_PCT)], dt.datetime.now(dt.UTC))
        assert res.ok, res.detail
        with store.session() as s:  # what the job-state sync does when it sees the release and the start
            transition(s, job_id, JobState.PLACED, "test: released on its planned GPU")
        with live.client() as c:
            live.wait_job(c, sid, lambda j: j.state == "RUNNING", "the placed job to run", timeout_s=60)
        with store.session() as s:
            transition(s, job_id, JobState.RUNNING, "test: Slurm started it")

        # 3. the node agent with simulated GPUs that follow Slurm and the replica
        env = {**os.environ, **live.cluster.slurm_env(live.layout), "PATH": os.environ["PATH"] + ":" +
               live.cluster.slurm_env(live.layout)["PATH"], "MUXFLOW_SLURM_URL": f"unix:{live.layout.rest_socket}",
               "MUXFLOW_SLURM_PLAN_KEY_FILE": str(live.layout.node_plan_key_file),
               "PYTHONUNBUFFERED": "1"}
        agent = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "--db", url, "node-agent", "--node", NODE, "--simulated",
             "--evict", "scontrol", "--no-shm", "--interval-ms", "50", "--scrape-interval", "1",
             "--placement-poll", "1", "--partial-every", "2", "--sim-noise-pct", "0",
             "--sim-xcuda-target", "0"],  # a job xCUDA does not pace: the burst takes the GPU over Overlimit
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(agent)

        def calm_row():
            assert agent.poll() is None, _stop(agent)[-3000:]
            with store.session() as s:
                rows = s.scalars(select(m.GpuMetricMinute).where(
                    m.GpuMetricMinute.gpu_id == gpu_id, m.GpuMetricMinute.offline_job_id == job_id,
                    m.GpuMetricMinute.online_qps.is_not(None))).all()
                return next((row for row in rows if row.online_qps > 0 and row.online_latency_ms), None)

        row = wait_for("a minute row with the replica's rate and the job", calm_row, 120)
        assert row.source == "simulated" and row.health in ("Healthy", "Init")
        assert 0.3 * CALM_QPS < row.online_qps < 3 * CALM_QPS  # the real replica's rate, from its counters
        assert 0.0 < row.online_latency_ms < 1000.0 and row.online_latency_p99_ms >= row.online_latency_ms * 0.5
        assert row.online_sm_activity_pct is not None and row.sm_activity_pct > row.online_sm_activity_pct + 30.0
        assert row.mem_used_bytes > row.online_mem_used_bytes > 0  # the job's memory beside the replica's
        with store.session() as s:
            assert s.get(m.Gpu, gpu_id).health == "Healthy"

        # 4. a request burst on the replica: Overlimit, requeued held, EVICTED in the store
        assert httpx.post(metrics_url.replace("/metrics", "/load"), json={"qps": BURST_QPS}).status_code == 200
        with live.client() as c:
            held = live.wait_job(c, sid, lambda j: j.held, "the agent to requeue the job held", timeout_s=90)
        assert held.state == "PENDING"

        def evicted():
            assert agent.poll() is None, _stop(agent)[-3000:]
            with store.session() as s:
                job = s.get(m.OfflineJob, job_id)
                ev = s.scalars(select(m.Eviction).where(m.Eviction.job_id == job_id)).all()
                return (job.state, job.state_reason, ev) if job.state == "EVICTED" and ev else None

        state, reason, (ev,) = wait_for("the store to show the eviction", evicted, 30)
        assert "Overlimit" in reason and "sm_activity" in reason
        assert (ev.gpu_id, ev.health, ev.source) == (gpu_id, "Overlimit", "simulated")
        def overlimit_row():
            with store.session() as s:  # the minute of the eviction, written within 2 s
                return s.scalars(select(m.GpuMetricMinute).where(m.GpuMetricMinute.gpu_id == gpu_id,
                                                                 m.GpuMetricMinute.health == "Overlimit")).first()

        hot = wait_for("the minute row of the eviction", overlimit_row, 30)
        assert hot.online_qps > row.online_qps and hot.online_sm_activity_pct > row.online_sm_activity_pct
        err = _stop(agent)
        assert agent.returncode == 0, err[-3000:]
        assert "evicted" in err and str(job_id) in err
    finally:
        for p in procs:
            _stop(p)
        cancel_quietly(live, sids)
