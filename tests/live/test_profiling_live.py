"""Real profiling on the live dev Slurm cluster, with the simulated GPU-metrics model (no GPU).

Users' jobs are profiled **in their own Slurm jobs**: a plain ``sbatch -p offline`` by the real non-root user
``mxuser1``, whose files only ``mxuser1`` can read, is picked up and ``SlurmProfiler.profile_new_jobs`` opens its
profiling window on the ``profile`` partition; Slurm runs it as ``mxuser1``; the node agents' window measurement
(:class:`executors.node.profile_windows.ProfileWindows`, run here in the test process on both nodes) writes the
report; the window closes by a requeue-hold and the job, checkpointed, waits held in the offline partition.
MuxFlow submits nothing for the user and never reads the user's files.

- a crashing job and a job that never reports an iteration fail with their reasons (``muxflow jobs list``);
- a job its owner cancels before or during its window fails with Slurm's word;
- ``SlurmProfiler.collect_samples`` measures one co-location point on the profile partition, submitted as the
  unprivileged reference account ``mxref``, never as MuxFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from executors.node.profile_windows import ProfileWindows, ProfileWindowsThread, slurm_windows
from executors.scheduler.profiling.backend import SlurmProfiler
from executors.scheduler.profiling.settings import ProfilingSettings, SamplingSettings
from executors.scheduler.profiling.solo import ProfilingSummary
from executors.scheduler.profiling.windows import SlurmProfileWindows, WindowProfiler
from executors.scheduler.slurm.pickup import import_submissions
from executors.slurm.client import SlurmRestClient
from executors.slurm.scontrol import ScontrolRequeue
from executors.store import models as m
from tests.live.conftest import cancel_quietly
from tests.live.muxflow_helpers import REPO, make_store, register, sbatch

PY = shlex.quote(sys.executable)
USER = "mxuser1"
_SUBMITTED: list[int] = []


@pytest.fixture(autouse=True)
def _cancel_at_teardown(dev_cluster):
    _SUBMITTED.clear()
    yield
    cancel_quietly(dev_cluster, _SUBMITTED)


@pytest.fixture
def root_backend(dev_cluster, monkeypatch):
    """The Slurm profiler as the scheduler host runs it (here as root over the local socket), with the cluster's plan
    key and the reference account's client; profiling settings for a quick CPU run."""
    lay = dev_cluster.layout
    settings = dev_cluster.cluster.rest_settings(lay, "local")
    prof_dir = dev_cluster.job_dir("profiling")
    os.chmod(prof_dir, 0o755)  # MuxFlow's alone (the scheduler here is root: each run's directory goes to mxref)
    for k, v in {"MUXFLOW_PROFILING_BOUND_S": "60", "MUXFLOW_PROFILING_PROFILE_SECONDS": "15",
                 "MUXFLOW_PROFILING_ITERATIONS": "8", "MUXFLOW_PROFILING_POLL_S": "0.5",
                 "MUXFLOW_SAMPLING_PROFILE_DIR": str(prof_dir), "MUXFLOW_SAMPLING_SIZE": "tiny",
                 "MUXFLOW_SAMPLING_WINDOW_S": "2", "MUXFLOW_SAMPLING_SETUP_S": "2",
                 "MUXFLOW_SAMPLING_SM_PCTS": "50", "MUXFLOW_SAMPLING_BUDGET_GPU_S": "20",
                 "MUXFLOW_SAMPLING_POLL_S": "0.5", "MUXFLOW_SAMPLING_NODE_PYTHON": sys.executable}.items():
        monkeypatch.setenv(k, v)
    reference = dev_cluster.cluster.rest_settings(lay, "jwt", user="mxref")
    return SlurmProfiler(lambda: SlurmRestClient(settings, requeue_fallback=ScontrolRequeue(str(lay.slurm_conf))), 30,
                         ProfilingSettings.from_env(os.environ), SamplingSettings.from_env(os.environ),
                         plan_key=dev_cluster.plan_key, reference_client_factory=lambda: SlurmRestClient(reference))


@contextlib.contextmanager
def measuring(dev_cluster, store) -> Iterator[None]:
    """What each node's agent does for profiling windows (its ProfileWindows thread), on both dev nodes."""
    lay = dev_cluster.layout
    threads = []
    for node in lay.nodes:
        read = slurm_windows(lambda: SlurmRestClient(dev_cluster.cluster.rest_settings(lay, "local")), node.name,
                             dev_cluster.plan_key)
        w = ProfileWindows(store, node.name, read, lay.job_state_dir, dict.fromkeys(range(node.gpus), node.gpu_type),
                           simulated=True, report_s=0.5)
        threads.append(ProfileWindowsThread(w, 0.5).start())
    try:
        yield
    finally:
        for t in threads:
            t.close()


def user_script(d: Path, name: str, body: str, user: str = USER) -> Path:
    """A job script in the user's private directory, the user's own (mode 0700)."""
    p = d / name
    p.write_text("#!/bin/sh\n" + body)
    pw = pwd.getpwnam(user)
    os.chown(p, pw.pw_uid, pw.pw_gid)
    p.chmod(0o700)
    return p


def _submit(dev_cluster, d: Path, name: str, body: str, types: str = "t4") -> int:
    """``sbatch -p offline --gres=mps:10`` as the user, from the user's private directory."""
    sid = sbatch(dev_cluster, user_script(d, f"{name}.sh", body), "-p", "offline", "--gres=mps:10", "-J", name,
                 f"--output={d}/%j.out", f"--comment=muxflow: mem=1GiB gpu-types={types} ckpt={d}/ckpt steps=1000",
                 user=USER)
    _SUBMITTED.append(sid)
    return sid


def _import(dev_cluster, store, mine: list[int]) -> dict[int, int]:
    """Slurm job id → store job id of this test's jobs (only these: the cluster is shared)."""
    with dev_cluster.client() as c:
        rep = import_submissions(store, c, None, only=mine)
    assert not rep.rejected, rep.rejected
    with store.session() as s:
        return {j.slurm_job_id: j.id for j in s.scalars(select(m.OfflineJob)) if j.slurm_job_id in mine}


def test_a_users_job_is_profiled_in_its_own_slurm_job_as_its_user(dev_cluster, root_backend, private_tmp) -> None:
    store, _url = make_store(private_tmp)
    register(store, dev_cluster)
    d = dev_cluster.user_dir("prof-good", USER)
    with dev_cluster.client() as c:
        before = {j.job_id for j in c.list_jobs()}
    sid = _submit(dev_cluster, d, f"mx-prof{os.getpid()}",
                  f"id -u > {d}/uid.$SLURM_JOB_ID.${{SLURM_RESTART_COUNT:-0}}\ncd {REPO}\n"
                  f"exec {PY} -m executors.job.workloads.train --family transformer --size tiny --ckpt {d}/ckpt "
                  "--steps 100000 --every 5\n")
    job = _import(dev_cluster, store, [sid])[sid]
    with measuring(dev_cluster, store):
        assert root_backend.profile_new_jobs(store, seed=0) == 1
    with store.session() as s:
        j = s.get(m.OfflineJob, job)
        assert (j.state, j.state_reason) == ("PENDING", "profiled on t4 (GPU metrics SIMULATED as a generic offline "
                                             "job (no label: no simulated model; the catalog's median traits, the "
                                             "job's 1 GiB))")
        p = s.scalars(select(m.JobProfile).where(m.JobProfile.job_id == job)).one()
        run = s.scalars(select(m.ProfilingRun).where(m.ProfilingRun.job_id == job)).one()
        prof = (p.gpu_type, p.source, p.method, p.slurm_job_id)
        iterations, measured, device = p.iterations, p.measured_iter_time_s, p.device
        run_sid, run_state, run_node, report = run.slurm_job_id, run.state, run.node, run.report
    assert prof == ("t4", "simulated", "simulated-metrics", sid)  # no GPU: metrics SIMULATED
    assert iterations >= 8 and 0 < measured < 5 and "no GPU" in device
    assert run_sid == sid and run_state == "done" and run_node == "mx-t4-1"  # the run is the job itself
    assert report["iteration_report"]["observed"] is True and report["host"] == "mx-t4-1"
    with dev_cluster.client() as c:
        own = c.get_job(sid)
        new = {j.job_id for j in c.list_jobs()} - before
    assert new == {sid}  # nothing was submitted for the user: no copy, no wrapper
    assert own.held and own.partition == "offline" and own.comment == "" and own.restart_count >= 1
    # it ran as its user, and its checkpoint on the window's requeue keeps what it trained
    assert (d / f"uid.{sid}.0").read_text().strip() == str(pwd.getpwnam(USER).pw_uid)
    assert any((d / "ckpt").glob("ckpt-*.mxck"))


def test_a_crashing_job_and_a_silent_job_fail_with_their_reasons(dev_cluster, root_backend,
                                                               private_tmp) -> None:
    store, url = make_store(private_tmp)
    register(store, dev_cluster)
    d = dev_cluster.user_dir("prof-bad", USER)
    crash = _submit(dev_cluster, d, f"mx-crash{os.getpid()}", "echo 'RuntimeError: NCCL init failed' >&2\nexit 4\n")
    silent = _submit(dev_cluster, d, f"mx-silent{os.getpid()}", "sleep 600\n")
    ids = _import(dev_cluster, store, [crash, silent])
    with measuring(dev_cluster, store):
        assert root_backend.profile_new_jobs(store, seed=0) == 0
    with store.session() as s:
        got = {sid: (s.get(m.OfflineJob, ids[sid]).state, s.get(m.OfflineJob, ids[sid]).state_reason)
               for sid in (crash, silent)}
    assert got[crash][0] == "FAILED" and got[crash][1].startswith(
        "failed in the cluster during its profiling window (FAILED") and "exit code 4" in got[crash][1], got[crash]
    assert got[silent][0] == "FAILED" and "reported no iterations in its" in got[silent][1], got[silent]
    with dev_cluster.client() as c:
        quiet = c.get_job(silent)
    assert quiet.held and quiet.partition == "offline"  # back and held: a user's job is never cancelled for this
    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "--db", url, "jobs", "list", "--state", "FAILED"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "exit code 4" in out.stdout and "reported no iterations" in out.stdout


def test_a_job_its_owner_cancels_is_not_profiled_and_one_cancelled_in_its_window_stops(
        dev_cluster, root_backend, private_tmp) -> None:
    """``scancel`` by the job's user: before the profiler starts (no window opens) and while its window runs (the
    job is the window: it ends); both jobs FAILED with Slurm's word."""
    store, _ = make_store(private_tmp)
    register(store, dev_cluster)
    d = dev_cluster.user_dir("prof-cancel", USER)
    before, during = (_submit(dev_cluster, d, f"mx-{n}{os.getpid()}", "sleep 600\n") for n in ("before", "during"))
    ids = _import(dev_cluster, store, [before, during])

    def scancel(sid: int) -> None:
        env = {**os.environ, **dev_cluster.cluster.slurm_env(dev_cluster.layout)}
        out = subprocess.run(dev_cluster.cluster.command(dev_cluster.layout, ["runuser", "-u", USER, "--",
                                                                              "scancel", str(sid)]),
                             env=env, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr

    scancel(before)
    windows = SlurmProfileWindows(root_backend.client_factory(), dev_cluster.plan_key)
    profiler = WindowProfiler(store, windows, root_backend.profiling)
    summary = ProfilingSummary()
    profiler.start_new(summary)
    with store.session() as s:
        runs = {j: [(r.slurm_job_id, r.state) for r in s.scalars(select(m.ProfilingRun)
                                                                   .where(m.ProfilingRun.job_id == j))]
                for j in ids.values()}
        got = {sid: (s.get(m.OfflineJob, ids[sid]).state, s.get(m.OfflineJob, ids[sid]).state_reason)
               for sid in (before, during)}
    cancelled = "cancelled in the cluster before it was placed (CANCELLED"  # then Slurm's reason, if any
    assert got[before][0] == "FAILED" and got[before][1].startswith(cancelled)
    assert runs[ids[before]] == [] and got[during][0] == "PROFILING" and runs[ids[during]][0][0] == during
    with dev_cluster.client() as c:
        dev_cluster.wait_job(c, during, lambda j: j.state == "RUNNING" and j.partition == "profile",
                             "the profiling window to start")
    scancel(during)
    with dev_cluster.client() as c:
        dev_cluster.wait_job(c, during, lambda j: j.finished, "the cancelled job to end")
    assert profiler.poll_once(summary) == 0
    with store.session() as s:
        j = s.get(m.OfflineJob, ids[during])
        assert j.state == "FAILED" and j.state_reason.startswith(cancelled), j.state_reason


def test_collect_samples_measures_a_point_as_the_reference_account(dev_cluster, root_backend, private_tmp) -> None:
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
        j = c.get_job(run_sid)
    assert j.partition == "profile" and j.user_name == "mxref"  # MuxFlow's code, never MuxFlow's identity
