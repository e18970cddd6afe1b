"""Any training script is a job, on the live dev cluster (docs/SLURM.md, docs/PROFILING.md):

- a plain ``sbatch`` whose comment has no ``type`` is picked up and profiled in its own window on the profile
  partition; with no GPU its metrics are the generic offline job's, and the job's reason says so;
- a job with a free label whose script cannot run fails in its window with Slurm's exit code;
- ``mem=99999TiB`` is rejected at pick-up and the Slurm job cancelled, with the reason in its comment;
- ``muxflow jobs list`` on Slurm lists a held submission not imported yet.
"""

from __future__ import annotations

import os
import subprocess
import sys

from sqlalchemy import select

from executors.scheduler.slurm.pickup import import_submissions
from executors.store import models as m
from tests.live.muxflow_helpers import REPO, make_store, register, sbatch
from tests.live.test_profiling_live import (  # noqa: F401  (fixture)
    _SUBMITTED,
    PY,
    USER,
    _cancel_at_teardown,  # noqa: F401  (autouse: what _SUBMITTED holds)
    measuring,
    root_backend,
    user_script,
)


def _submit(dev_cluster, d, name: str, body: str, spec: str) -> int:
    sid = sbatch(dev_cluster, user_script(d, f"{name}.sh", body), "-p", "offline", "--gres=mps:10", "-J", name,
                 f"--output={d}/%j.out", f"--comment=muxflow: {spec}", user=USER)
    _SUBMITTED.append(sid)
    return sid


def test_any_script_is_a_job_and_one_that_cannot_run_fails_with_the_reason(dev_cluster, root_backend,
                                                                          private_tmp) -> None:
    store, _ = make_store(private_tmp)
    register(store, dev_cluster)
    d = dev_cluster.user_dir("free-label", USER)
    pid = os.getpid()
    unlabelled = _submit(dev_cluster, d, f"mx-nolabel{pid}",
                         f"cd {REPO}\nexec {PY} -m executors.job.workloads.train --family cnn --size tiny "
                         f"--ckpt {d}/ckpt --steps 100000\n", f"mem=2GiB gpu-types=t4 ckpt={d}/ckpt steps=1000")
    broken = _submit(dev_cluster, d, f"mx-broken{pid}", "exec /nonexistent/bin/trainer --epochs 3\n",
                     "type='my own model' mem=1GiB gpu-types=t4 ckpt=/ckpt/x steps=10")
    huge = _submit(dev_cluster, d, f"mx-huge{pid}", "true\n",
                   "type=big mem=99999TiB gpu-types=t4,a10 ckpt=/ckpt/y steps=10")
    with dev_cluster.client() as c:
        rep = import_submissions(store, c, only=[unlabelled, broken, huge])
    # refused at pick-up: no GPU it may use has that much memory
    [(sid, reason)] = rep.rejected
    assert sid == huge and reason == ("rejected: mem: 99,999 TiB is more than any allowed GPU type has "
                                      "(a10 24 GiB, t4 15 GiB)")
    with dev_cluster.client() as c:
        gone = dev_cluster.wait_job(c, huge, lambda j: j.finished, "the rejected job cancelled")
    assert gone.state == "CANCELLED" and gone.comment == f"muxflow {reason}"

    with measuring(dev_cluster, store):
        assert root_backend.profile_new_jobs(store, seed=0) == 1
    with store.session() as s:
        jobs = {j.slurm_job_id: j for j in s.scalars(select(m.OfflineJob))}
        good, bad = jobs[unlabelled], jobs[broken]
        assert good.job_type == "" and bad.job_type == "my own model"
        assert good.state == "PENDING" and good.state_reason.startswith(
            "profiled on t4 (GPU metrics SIMULATED as a generic offline job (no label: no simulated model"), \
            good.state_reason
        p = s.scalars(select(m.JobProfile).where(m.JobProfile.job_id == good.id)).one()
        assert (p.source, p.method) == ("simulated", "simulated-metrics") and p.iterations > 0
        run = s.scalars(select(m.ProfilingRun).where(m.ProfilingRun.job_id == good.id)).one()
        assert run.report["metrics_generic"] is True and "generic" in run.reason
        # the generic job's memory is the job's own need
        assert abs(p.mem_used_bytes / (2 * 1024**3) - 1) < 0.2, p.mem_used_bytes
        assert bad.state == "FAILED" and bad.state_reason.startswith(
            "failed in the cluster during its profiling window (FAILED") and "exit code 127" in bad.state_reason, \
            bad.state_reason


def test_jobs_list_shows_a_held_submission_not_imported_yet(dev_cluster, private_tmp) -> None:
    _store, url = make_store(private_tmp)
    d = dev_cluster.job_dir("held-list")
    sid = _submit(dev_cluster, d, f"mx-held{os.getpid()}", "true\n", "mem=1GiB gpu-types=t4 ckpt=/ckpt/h steps=5")
    env = {**os.environ, "MUXFLOW_CLUSTER": "slurm", "MUXFLOW_SLURM_URL": f"unix:{dev_cluster.layout.rest_socket}",
           "MUXFLOW_DATABASE_URL": url}
    for k in ("MUXFLOW_SETTINGS", "DAGSTER_HOME"):
        env.pop(k, None)
    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "jobs", "list"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    [line] = [ln for ln in out.stdout.splitlines() if f"Slurm job {sid}," in ln]
    assert " HELD " in line and f"mx-held{os.getpid()}" in line and "held for pick-up" in line
