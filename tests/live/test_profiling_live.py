"""Real profiling on the live dev Slurm cluster, with the simulated GPU-metrics model (no GPU).

- A plain ``sbatch -p offline`` job is picked up and profiled by ``SlurmProfiler.profile_new_jobs``:
  a copy of its batch script runs on the ``profile`` partition in profiling mode, the profile
  lands in the store, the job becomes PENDING while its own Slurm job stays held.
- A crashing job and a job that never reports an iteration are FAILED with the right reasons,
  which ``muxflow jobs list`` shows.
- ``SlurmProfiler.collect_samples`` measures one co-location point on the profile partition.

The profiling copies run as the REST identity; the venv lives under /root, so the backend
talks to slurmrestd with a root JWT (docs/PROFILING.md, "Who runs the copy").
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys

import pytest
from sqlalchemy import select

from executors.profiling.backend import SlurmProfiler, slurm_executor
from executors.profiling.solo import ProfilingSummary, SoloProfiler
from executors.profiling.settings import ProfilingSettings, SamplingSettings
from executors.slurm.client import SlurmRestClient
from executors.slurm.pickup import import_submissions
from executors.slurm.scontrol import ScontrolRequeue
from executors.store import models as m
from tests.live.conftest import cancel_quietly
from tests.live.muxflow_helpers import REPO, make_store, register, sbatch, write_script

PY = shlex.quote(sys.executable)
_SUBMITTED: list[int] = []


@pytest.fixture(autouse=True)
def _cancel_at_teardown(dev_cluster):
    _SUBMITTED.clear()
    yield
    cancel_quietly(dev_cluster, _SUBMITTED)


@pytest.fixture
def root_backend(dev_cluster, monkeypatch):
    """The Slurm profiler acting as root over JWT; profiling settings for a quick CPU run."""
    settings = dev_cluster.cluster.rest_settings(dev_cluster.layout, "jwt", user="root")
    conf = str(dev_cluster.layout.slurm_conf)
    prof_dir = dev_cluster.job_dir("profiling")
    for k, v in {"MUXFLOW_PROFILING_PROFILE_DIR": str(prof_dir), "MUXFLOW_PROFILING_BOUND_S": "40",
                 "MUXFLOW_PROFILING_PROFILE_SECONDS": "15", "MUXFLOW_PROFILING_ITERATIONS": "8",
                 "MUXFLOW_PROFILING_POLL_S": "0.5", "MUXFLOW_PROFILING_NODE_PYTHON": sys.executable,
                 "MUXFLOW_SAMPLING_PROFILE_DIR": str(prof_dir), "MUXFLOW_SAMPLING_SIZE": "tiny",
                 "MUXFLOW_SAMPLING_WINDOW_S": "2", "MUXFLOW_SAMPLING_SETUP_S": "2",
                 "MUXFLOW_SAMPLING_SM_PCTS": "50", "MUXFLOW_SAMPLING_BUDGET_GPU_S": "12",
                 "MUXFLOW_SAMPLING_POLL_S": "0.5", "MUXFLOW_SAMPLING_NODE_PYTHON": sys.executable}.items():
        monkeypatch.setenv(k, v)
    return SlurmProfiler(lambda: SlurmRestClient(settings, requeue_fallback=ScontrolRequeue(conf)), 30,
                         ProfilingSettings.from_env(os.environ), SamplingSettings.from_env(os.environ))


def _submit(dev_cluster, d, name: str, body: str, job_type: str = "Transformer (batch size 16)") -> int:
    sid = sbatch(dev_cluster, write_script(d, body, f"{name}.sh"), "-p", "offline", "--gres=mps:10", "-J", name,
                 f"--output={d}/%j.out",
                 f"--comment=muxflow: type='{job_type}' mem=1GiB gpu-types=t4 ckpt=/ckpt/{name} steps=1000")
    _SUBMITTED.append(sid)
    return sid


def _import(dev_cluster, store, mine: list[int]) -> dict[int, int]:
    """Slurm job id → store job id of this test's jobs (only these: the cluster is shared)."""
    with dev_cluster.client() as c:
        rep = import_submissions(store, c, None, only=mine)
    assert not rep.rejected, rep.rejected
    with store.session() as s:
        return {j.slurm_job_id: j.id for j in s.scalars(select(m.OfflineJob)) if j.slurm_job_id in mine}


def test_a_submitted_job_is_profiled_on_the_profile_partition(dev_cluster, root_backend, private_tmp) -> None:
    store, url = make_store(private_tmp)
    register(store, dev_cluster)
    d = dev_cluster.job_dir("prof-good")
    sid = _submit(dev_cluster, d, f"mx-prof{os.getpid()}",
                  f"cd {REPO}\nexec {PY} -m executors.workloads.train --family transformer --size tiny "
                  f"--ckpt {d}/ckpt --steps 100000\n")
    job = _import(dev_cluster, store, [sid])[sid]
    assert root_backend.profile_new_jobs(store, seed=0) == 1
    with store.session() as s:
        j = s.get(m.OfflineJob, job)
        assert (j.state, j.state_reason) == ("PENDING", "profiled on t4")
        p = s.scalars(select(m.JobProfile).where(m.JobProfile.job_id == job)).one()
        run = s.scalars(select(m.ProfilingRun).where(m.ProfilingRun.job_id == job)).one()
        prof = (p.gpu_type, p.source, p.method, p.iterations, p.slurm_job_id)
        measured, model_iter, device = p.measured_iter_time_s, p.iter_time_s, p.device
        run_sid, run_state, run_node, run_dir = run.slurm_job_id, run.state, run.node, run.run_dir
    assert prof == ("t4", "simulated", "simulated-metrics", 8, run_sid)  # no GPU: metrics SIMULATED
    assert 0 < measured < 5 and model_iter > 0 and "no GPU" in device
    assert run_state == "done" and run_node == "mx-t4-1"
    with dev_cluster.client() as c:
        copy = c.get_job(run_sid)
        original = c.get_job(sid)
    assert copy.partition == "profile" and copy.state == "COMPLETED" and copy.nodes == ("mx-t4-1",)
    assert original.held and original.partition == "offline"  # the job itself waits for placement
    assert copy.comment.strip() == f"muxflow-profile-run={run_dir.split('/')[-1]}"


def test_a_crashing_job_and_a_silent_job_fail_with_their_reasons(dev_cluster, root_backend,
                                                               private_tmp) -> None:
    store, url = make_store(private_tmp)
    register(store, dev_cluster)
    d = dev_cluster.job_dir("prof-bad")
    crash = _submit(dev_cluster, d, f"mx-crash{os.getpid()}",
                    f"{PY} -c \"import sys; sys.stderr.write('RuntimeError: NCCL init failed\\\\n'); sys.exit(4)\"\n")
    silent = _submit(dev_cluster, d, f"mx-silent{os.getpid()}", "sleep 600\n")
    ids = _import(dev_cluster, store, [crash, silent])
    assert root_backend.profile_new_jobs(store, seed=0) == 0
    with store.session() as s:
        got = {sid: (s.get(m.OfflineJob, ids[sid]).state, s.get(m.OfflineJob, ids[sid]).state_reason)
               for sid in (crash, silent)}
    assert got[crash] == ("FAILED", "profiling failed on t4: crashed (exit code 4) after 0 iteration(s): "
                                    "RuntimeError: NCCL init failed")
    assert got[silent][0] == "FAILED" and "reported no iterations within" in got[silent][1]
    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "--db", url, "jobs", "list", "--state", "FAILED"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "crashed (exit code 4)" in out.stdout and "reported no iterations" in out.stdout


def test_a_job_its_owner_cancels_is_not_profiled_and_one_cancelled_while_profiled_stops(
        dev_cluster, root_backend, private_tmp) -> None:
    """``scancel`` by a real user: before the profiler starts (no run is submitted) and while its profiling run
    is on the profile partition (the run is cancelled in Slurm); both jobs FAILED with Slurm's word."""
    store, _ = make_store(private_tmp)
    register(store, dev_cluster)
    d = dev_cluster.job_dir("prof-cancel")
    user = "mxuser1"
    sids = [sbatch(dev_cluster, write_script(d, "sleep 600\n", f"{n}.sh"), "-p", "offline", "--gres=mps:10",
                   "-J", f"mx-{n}{os.getpid()}", f"--output={d}/%j.out",
                   f"--comment=muxflow: type='cancelled' mem=1GiB gpu-types=t4 ckpt=/ckpt/{n} steps=10", user=user)
            for n in ("before", "during")]
    _SUBMITTED.extend(sids)
    before, during = sids
    ids = _import(dev_cluster, store, sids)

    def scancel(sid: int) -> None:
        env = {**os.environ, **dev_cluster.cluster.slurm_env(dev_cluster.layout)}
        out = subprocess.run(dev_cluster.cluster.command(dev_cluster.layout, ["runuser", "-u", user, "--",
                                                                              "scancel", str(sid)]),
                             env=env, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr

    scancel(before)
    mono = [0.0]
    profiler = SoloProfiler(store, slurm_executor(root_backend, "profile"), root_backend.profiling,
                            monotonic=lambda: mono[0])
    summary = ProfilingSummary()
    profiler.start_new(summary)
    with store.session() as s:
        runs = {j: [(r.slurm_job_id, r.state) for r in s.scalars(select(m.ProfilingRun)
                                                                   .where(m.ProfilingRun.job_id == j))]
                for j in ids.values()}
        got = {sid: (s.get(m.OfflineJob, ids[sid]).state, s.get(m.OfflineJob, ids[sid]).state_reason)
               for sid in sids}
    cancelled = "cancelled in the cluster before it was placed (CANCELLED"  # then Slurm's reason, if any
    assert got[before][0] == "FAILED" and got[before][1].startswith(cancelled)
    assert runs[ids[before]] == [] and got[during][0] == "PROFILING"
    ((run_sid, _),) = runs[ids[during]]

    scancel(during)
    mono[0] += profiler.USER_JOB_CHECK_S
    assert profiler.poll_once(summary) == 0
    with store.session() as s:
        j = s.get(m.OfflineJob, ids[during])
        assert j.state == "FAILED" and j.state_reason.startswith(cancelled)
    with dev_cluster.client() as c:
        dev_cluster.wait_for(f"profiling run {run_sid} cancelled in Slurm",
                             lambda: c.get_job(run_sid).state == "CANCELLED",
                             explain=lambda: dev_cluster.explain_job(run_sid))


def test_collect_samples_measures_a_point_on_the_profile_partition(dev_cluster, root_backend, private_tmp) -> None:
    root_backend.sampling = dataclasses.replace(root_backend.sampling, bootstrap_simulated=False)
    store, url = make_store(private_tmp)
    register(store, dev_cluster)
    with store.session() as s:
        s.add(m.OnlineService(name="img", model_family="cnn", qps_min=10, qps_max=30, latency_slo_ms=100,
                              mem_bytes=10**9))
    added = root_backend.collect_samples(store, per_type=10, seed=0)
    assert added == {"a10": 0, "t4": 0}  # CPU samples are not training data
    with store.session() as s:
        run = s.scalars(select(m.SamplingRun)).one()
        rows = list(s.scalars(select(m.ColocationSample)))
        state, reason, run_sid, method = run.state, run.reason, run.slurm_job_id, run.method
    assert (state, method, len(rows)) == ("done", "cpu", 1), reason
    assert rows[0].sampling_run_id == run.id and rows[0].sm_pct == 50 and rows[0].method == "cpu"
    with dev_cluster.client() as c:
        assert c.get_job(run_sid).partition == "profile"
