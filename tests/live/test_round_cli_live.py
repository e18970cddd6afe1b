"""``muxflow round --once`` on Slurm, as an operator runs it by hand, on a dev cluster of its own.

A plain ``sbatch -p offline --gres=mps:N`` job is picked up and profiled; node agents with simulated GPUs
write the online metrics the round needs; ``round --once`` places the job through slurmrestd (PLACED in
the store, released in Slurm on the planned node); once Slurm runs it, the next ``round --once`` first
brings the store in line (PLACED → RUNNING at Slurm's start time) and keeps the job where it is. A job
submitted after the round starts through ``round --fill`` on a GPU with no offline job, without a round.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from executors.store import models as m
from executors.store.db import Store
from tests.processes import processes
from tests.live.conftest import make_private_cluster

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
SPEC = "muxflow: type='ResNet-18 (batch size 16)' mem=1GiB gpu-types=t4,a10 ckpt={d}/ckpt steps=1000"


def _cli(env: dict, *args: str) -> str:
    out = subprocess.run([PY, "-m", "pipelines.cli", *args], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, f"muxflow {' '.join(args)}: {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _sbatch(env: dict, script: Path, output: Path, comment: str) -> int:
    """A plain ``sbatch -p offline --gres=mps:30`` with MuxFlow's comment, as a user types it; its job id."""
    out = subprocess.run(["sbatch", "-p", "offline", "--gres=mps:30", "-o", str(output), f"--comment={comment}",
                          str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def _wait(what: str, check, timeout_s: float = 60.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if (value := check()):
            return value
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")


def test_round_once_places_a_plain_sbatch_job_on_slurm_and_follows_it(dev_cluster, tmp_path: Path) -> None:
    with make_private_cluster() as live, processes(tmp_path) as procs:
        lay = live.layout
        db = f"sqlite:///{tmp_path / 'store.db'}"
        env = {**os.environ, "MUXFLOW_DATABASE_URL": db, "SLURM_CONF": str(lay.slurm_conf),
               "MUXFLOW_SLURM_URL": f"unix:{lay.rest_socket}", "MUXFLOW_SLURM_PLAN_KEY_FILE": str(lay.node_plan_key_file)}
        env.pop("MUXFLOW_SETTINGS", None)
        _cli(env, "db", "upgrade")
        _cli(env, "slurm", "register-nodes", "--state-dir", str(lay.state_dir))
        _cli(env, "online", "register", "--name", "svc", "--family", "cnn", "--qps-min", "20", "--qps-max", "60",
             "--mem", "2GiB", "--gpu-ids", ",".join(str(i) for i in range(1, 9)))
        for node in ("mx-t4-1", "mx-a10-1"):  # the online metrics a round needs
            procs.start(f"agent-{node}", [PY, "-m", "pipelines.cli", "--db", db, "node-agent", "--node", node,
                                          "--simulated", "--evict", "record", "--interval-ms", "200", "--no-shm",
                                          "--partial-every", "2"], env=env, cwd=REPO)
        work = live.job_dir("round-cli")
        script = work / "job.sh"
        script.write_text("#!/bin/sh\nsleep 120\n")
        script.chmod(0o755)
        sid = _sbatch(env, script, work / "out-%j", SPEC.format(d=work))
        _cli(env, "slurm", "pickup", "--state-dir", str(lay.state_dir))
        _cli(env, "profile")
        _cli(env, "sample", "--per-type", "300")
        _cli(env, "train", "--epochs", "30")
        store = Store(db)

        def metrics_ready() -> bool:
            with store.session() as s:
                healthy = s.scalar(select(func.count()).select_from(m.Gpu).where(m.Gpu.health == "Healthy"))
                rows = s.scalar(select(func.count(func.distinct(m.GpuMetricMinute.gpu_id)))
                                .where(m.GpuMetricMinute.online_sm_activity_pct.is_not(None)))
            return healthy == 8 and rows == 8

        _wait("online metrics of every GPU", metrics_ready, 90)
        slurm = {**env, "MUXFLOW_CLUSTER": "slurm", "MUXFLOW_SLURM_URL": f"unix:{lay.rest_socket}",
                 "MUXFLOW_ROUND_PERIOD_S": "60"}
        first = _cli(slurm, "round", "--once")
        assert "(Slurm cluster)" in first and "placements 1 " in first, first
        with store.session() as s:
            job = s.scalars(select(m.OfflineJob).where(m.OfflineJob.slurm_job_id == sid)).one()
            placed = s.scalars(select(m.Placement).where(m.Placement.job_id == job.id)).one()
            node = s.get(m.Gpu, placed.gpu_id).node.name
            # The round books what the cluster reports after dispatching: Slurm may have started the job by then.
            first_state = job.state
            assert first_state in ("PLACED", "RUNNING"), (job.state, job.state_reason)
        with live.client() as c:
            running = live.wait_job(c, sid, lambda j: j.state == "RUNNING", "Slurm to start the placed job", 60)
        assert running.nodes == (node,) and running.mps_pct == placed.sm_pct

        second = _cli(slurm, "round", "--once")
        if first_state == "PLACED":
            assert "job states followed the cluster first: {'RUNNING': 1}" in second, second
        assert "'keep': 1" in second and "'start': 0" in second, second
        with store.session() as s:
            job = s.get(m.OfflineJob, job.id)
            assert job.state == "RUNNING" and job.started_utc is not None
            moves = [(t.from_state, t.to_state) for t in s.scalars(
                select(m.JobTransition).where(m.JobTransition.job_id == job.id).order_by(m.JobTransition.id))]
        assert moves[-2:] == [("PENDING", "PLACED"), ("PLACED", "RUNNING")], moves

        # Between rounds: a job submitted now starts on a free GPU through a fill, not at the next round.
        late_sid = _sbatch(env, script, work / "late-%j", SPEC.format(d=work / "late"))
        _cli(env, "slurm", "pickup", "--state-dir", str(lay.state_dir))
        _cli(env, "profile")
        with store.session() as s:
            late = s.scalars(select(m.OfflineJob).where(m.OfflineJob.slurm_job_id == late_sid)).one()
            assert late.state == "PENDING", (late.state, late.state_reason)
        fill = _cli(slurm, "round", "--fill")
        assert "fill 1 " in fill and " 1 placed" in fill and f"start job {late.id} " in fill, fill
        assert "dispatched ok 1 failed 0" in fill, fill
        with store.session() as s:
            row = s.scalars(select(m.SchedulingRound).where(m.SchedulingRound.seq == 1)).one()
            late_placed = s.scalars(select(m.Placement).where(m.Placement.round_id == row.id)).one()
            late_node = s.get(m.Gpu, late_placed.gpu_id).node.name
            assert s.get(m.OfflineJob, late.id).state == "PLACED" and late_placed.gpu_id != placed.gpu_id
        with live.client() as c:
            ran = live.wait_job(c, late_sid, lambda j: j.state == "RUNNING", "Slurm to start the filled job", 60)
        assert ran.nodes == (late_node,) and ran.mps_pct == late_placed.sm_pct
        assert "no fill: " in _cli(slurm, "round", "--fill")  # nothing waits any more
        assert not procs.dead(), procs.dead()
