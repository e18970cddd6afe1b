"""The Slurm dispatcher on the live dev cluster.

- A 50-placement plan is dispatched by ``muxflow slurm dispatch`` in a child process that is
  SIGKILLed at ≥ 20 seeded random points (after a random number of actions was sent) and
  restarted each time; afterwards every planned job exists exactly once in Slurm, on the
  planned node with the planned MPS share, and all 50 run (on a private cluster).
- slurmctld stopped during dispatch and started again: the plan stays pending, then completes
  (on a private cluster of its own: stopping the shared one would break concurrent test runs).
- Jobs that print their environment prove the TaskProlog contract for offline and online jobs,
  xCUDA's controller gains from the dispatcher included.
- Migrate and evict: requeue-hold, then place on the new node with the new share.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func, select

from executors.scheduler.slurm.backend import XcudaGains, placement_plan
from executors.slurm import plan as plans
from executors.store import models as m
from tests.live.conftest import cancel_quietly
from tests.live.muxflow_helpers import (
    REPO,
    backend,
    dispatch_actions,
    dispatch_cmd,
    held_jobs,
    make_round,
    make_store,
    read_env,
    register,
    sbatch,
    write_script,
)

N_JOBS = 50
N_KILLS = 20
SEED = 20260105


_SUBMITTED: list[tuple[object, int]] = []  # (the cluster it went to, Slurm job id)


@pytest.fixture(autouse=True)
def _cancel_at_teardown(dev_cluster):
    """Every Slurm job a test submitted is cancelled afterwards, whatever happened (MPS capacity is shared)."""
    _SUBMITTED.clear()
    yield
    for live in {id(c): c for c, _ in _SUBMITTED}.values():
        if live.cluster.load_layout() is not None:  # a private cluster is gone already
            _cancel(live, [sid for c, sid in _SUBMITTED if c is live])
    _SUBMITTED.clear()


def _held_jobs(dev_cluster, store, d, n: int, prefix: str, body: str = "sleep 300\n") -> dict[int, int]:
    """:func:`held_jobs`, each Slurm job cancelled at the test's end."""
    sids: list[int] = []
    try:
        return held_jobs(dev_cluster, store, d, n, prefix, body, submitted=sids)
    finally:
        _SUBMITTED.extend((dev_cluster, sid) for sid in sids)


_cancel = cancel_quietly


def _status_counts(store, round_id: int) -> dict[str, int]:
    with store.session() as s:
        return dict(s.execute(select(m.DispatchLog.status, func.count()).where(
            m.DispatchLog.round_id == round_id).group_by(m.DispatchLog.status)).all())


def _check_placed(dev_cluster, jobs: dict[int, int], plan: dict[int, tuple[str, int, int]], prefix: str) -> None:
    with dev_cluster.client() as c:
        slurm_jobs = [j for j in c.list_jobs() if j.name.startswith(prefix + "-")]
    # exactly once: one Slurm job per planned job, no extra submissions
    assert sorted(j.job_id for j in slurm_jobs) == sorted(jobs.values())
    by_sid = {j.job_id: j for j in slurm_jobs}
    for job_id, sid in jobs.items():
        j = by_sid[sid]
        node, index, pct = plan[job_id]
        where = j.nodes if j.state == "RUNNING" else j.required_nodes
        assert not j.held and not j.finished, (sid, j.state, j.state_reason)
        assert where == (node,) and j.mps_pct == pct, (sid, where, j.mps_pct, node, pct)
        p = plans.decode(j.comment, dev_cluster.plan_key, sid)  # signed, for this very job
        assert (p.kind, p.job_id, p.gpu_index, p.sm_pct) == ("place", job_id, index, pct)


def _why_not_running(dev_cluster, prefix: str) -> str:
    """Which of the test's jobs do not run, why (Slurm's reason), and who holds each node's MPS and CPUs."""
    with dev_cluster.client() as c:
        jobs = c.list_jobs()
        nodes = {n.name: n for n in c.list_nodes()}
    mine = [j for j in jobs if j.name.startswith(prefix + "-")]
    waiting = Counter((j.state, j.state_reason) for j in mine if j.state != "RUNNING")
    lines = [f"{sum(waiting.values())} of {len(mine)} jobs not running: "
             + ", ".join(f"{n}x {st} ({why})" for (st, why), n in waiting.most_common())]
    for name, node in sorted(nodes.items()):
        here = [j for j in jobs if j.state == "RUNNING" and name in j.nodes]
        others = [j for j in here if not j.name.startswith(prefix + "-")]
        lines.append(f"{name}: {node.state}, CPUs {node.alloc_cpus}/{node.cpus}, {len(here)} running "
                     f"({len(others)} not this test's, MPS {sum(j.mps_pct for j in here)}/100 in use: "
                     f"{sorted({j.name.rsplit('-', 1)[0] for j in others})})")
    return "\n".join(lines)


def test_dispatch_survives_20_sigkills_during_a_50_placement_plan(private_cluster, private_tmp) -> None:
    """On a cluster of its own: its 50 jobs must all start, which other test runs' jobs on the shared
    cluster (whole-GPU profiling jobs ahead in the queue, say) would otherwise prevent, and the other way round."""
    dev_cluster = private_cluster
    rng = random.Random(SEED)
    store, url = make_store(private_tmp)
    db_file = private_tmp / "store.db"
    gpus = register(store, dev_cluster)
    d = dev_cluster.job_dir("crash")
    prefix = f"mx-crash{os.getpid()}"
    jobs = _held_jobs(dev_cluster, store, d, N_JOBS, prefix)
    try:
        keys = sorted(gpus)
        plan = {}
        actions = []
        for k, job_id in enumerate(sorted(jobs)):
            node, index = keys[k % len(keys)]
            # Small shares: 25 jobs per node at 1-2 % take 37 % of the node's MPS, whichever GPUs
            # Slurm accounts them on (untyped shares, docs/SLURM.md).
            pct = (1, 2)[k % 2]
            plan[job_id] = (node, index, pct)
            actions.append({"action": "start", "job_id": job_id, "gpu_id": gpus[(node, index)],
                            "from_gpu_id": None, "sm_pct": pct})
        round_id = make_round(store, actions)

        # Kill after a seeded random number of actions was sent (0 = after the intents only),
        # plus a random few milliseconds: a random point inside the action stream each time.
        thresholds = sorted(rng.sample(range(0, N_JOBS - 1), N_KILLS))
        kill_points: list[int] = []  # actions sent or done when each SIGKILL landed
        finished_early = 0
        for t in thresholds:
            assert db_file.exists(), f"the store {db_file} vanished during the test (someone removed it)"
            proc = subprocess.Popen(dispatch_cmd(url, round_id, state_dir=dev_cluster.cluster.state_dir), cwd=REPO,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            extra = rng.uniform(0, 0.05)
            end = time.monotonic() + 120
            while proc.poll() is None and time.monotonic() < end:
                c = _status_counts(store, round_id)
                if sum(c.values()) >= N_JOBS and c.get("sent", 0) + c.get("done", 0) >= t:
                    time.sleep(extra)  # jitter, not a race: the process is killed wherever it is
                    break
                time.sleep(0.005)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                c = _status_counts(store, round_id)
                kill_points.append(c.get("sent", 0) + c.get("done", 0))
            out, err = proc.communicate(timeout=30)
            if proc.returncode not in (0, -signal.SIGKILL):
                pytest.fail(f"a restarted dispatcher failed (exit {proc.returncode}) instead of being killed "
                            f"or finishing; its stderr ends:\n{err[-3000:]}")
            finished_early += proc.returncode == 0
            if _status_counts(store, round_id).get("done") == N_JOBS:
                break
        final = subprocess.run(dispatch_cmd(url, round_id, state_dir=dev_cluster.cluster.state_dir), cwd=REPO,
                               capture_output=True, text=True, timeout=300)
        assert final.returncode == 0, f"final dispatch exit {final.returncode}:\n{final.stderr[-3000:]}"
        print(f"crash test: {len(kill_points)} SIGKILLs at thresholds {thresholds}, landing after "
              f"{kill_points} actions sent; {finished_early} runs finished before their kill point; "
              f"final: {final.stdout.strip()}")
        assert len(kill_points) >= N_KILLS, (kill_points, finished_early)
        assert _status_counts(store, round_id) == {"done": N_JOBS}
        with store.session() as s:
            states = {j.state for j in s.scalars(select(m.OfflineJob).where(m.OfflineJob.id.in_(list(jobs))))}
        assert states == {"PLACED"}  # released on their GPUs; Slurm starts them
        _check_placed(dev_cluster, jobs, plan, prefix)
        with dev_cluster.client() as c:
            def all_running() -> bool:
                mine = [j for j in c.list_jobs() if j.name.startswith(prefix + "-")]
                return len(mine) == N_JOBS and all(j.state == "RUNNING" for j in mine)

            try:
                dev_cluster.wait_for("all 50 jobs running", all_running, timeout_s=90)
            except pytest.fail.Exception:
                pytest.fail("placed as planned, but not all 50 jobs started within 90 s:\n"
                            + _why_not_running(dev_cluster, prefix))
        _check_placed(dev_cluster, jobs, plan, prefix)
        # The store follows: every job RUNNING, once, whatever the kills left behind.
        sync = backend(dev_cluster).sync_jobs(store, dt.datetime.now(dt.UTC))
        assert sync.transitions == {"RUNNING": N_JOBS} and not sync.errors, sync
        with store.session() as s:
            states = {j.state for j in s.scalars(select(m.OfflineJob).where(m.OfflineJob.id.in_(list(jobs))))}
        assert states == {"RUNNING"}
    finally:
        _cancel(dev_cluster, jobs.values())


def test_taskprolog_contract_offline_and_online(dev_cluster, private_tmp) -> None:
    store, url = make_store(private_tmp)
    gpus = register(store, dev_cluster)
    d = dev_cluster.job_dir("taskprolog")
    body = f"env > {d}/env.$SLURM_JOB_ID.tmp && mv {d}/env.$SLURM_JOB_ID.tmp {d}/env.$SLURM_JOB_ID\n"
    jobs = _held_jobs(dev_cluster, store, d, 1, f"mx-tp{os.getpid()}", body)
    (job_id, sid), = jobs.items()
    round_id = make_round(store, [{"action": "start", "job_id": job_id, "gpu_id": gpus[("mx-a10-1", 2)],
                                   "from_gpu_id": None, "sm_pct": 35}])
    # an online job carrying the same plan comment must get nothing
    online = sbatch(dev_cluster, write_script(d, body, "online.sh"), "-p", "online", "--gres=mps:20",
                    f"--output={d}/%j.out", "--comment=muxflow-job=1 muxflow-gpu=1 muxflow-pct=20")
    _SUBMITTED.append((dev_cluster, online))
    with store.session() as s:
        from executors.scheduler.round_runner import stored_result
        result = stored_result(s, s.get(m.SchedulingRound, round_id))

    gains = XcudaGains(kp=0.5, ki=12.5, kd=0.02)  # not xCUDA's defaults: they must come from the dispatcher
    ok, failed = backend(dev_cluster, gains=gains).dispatch(store, round_id, result, dt.datetime.now(dt.UTC))
    assert (ok, failed) == (1, 0)
    dev_cluster.wait_for("both jobs to print their environment",
                         lambda: (d / f"env.{sid}").exists() and (d / f"env.{online}").exists(), timeout_s=60)
    env = read_env(d / f"env.{sid}")
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "35"
    assert env["CUDA_MPS_PIPE_DIRECTORY"].endswith("/gpu2") and env["SLURMD_NODENAME"] == "mx-a10-1"
    # The cluster's link to the tree's build, beside its xcuda.conf (executors/dev/slurm/cluster.py install_xcuda).
    assert Path(env["LD_PRELOAD"]).resolve().as_posix().endswith("executors/node/xcuda/build/libxcuda.so"), env
    assert env["XCUDA_MEM_QUOTA_BYTES"] == str(2 * 1024**3) and env["XCUDA_GPU_INDEX"] == "2"
    assert (env["XCUDA_KP"], env["XCUDA_KI"], env["XCUDA_KD"]) == ("0.5", "12.5", "0.02")
    oenv = read_env(d / f"env.{online}")
    assert "LD_PRELOAD" not in oenv and not any(k.startswith("XCUDA_") for k in oenv)
    assert oenv.get("CUDA_VISIBLE_DEVICES", "") == ""


def test_migrate_and_evict(dev_cluster, private_tmp) -> None:
    store, url = make_store(private_tmp)
    gpus = register(store, dev_cluster)
    d = dev_cluster.job_dir("migrate")
    prefix = f"mx-mig{os.getpid()}"
    jobs = _held_jobs(dev_cluster, store, d, 2, prefix)
    (a, sa), (b, sb) = sorted(jobs.items())


    be = backend(dev_cluster)

    def run_round(actions, minute):
        window = dt.datetime(2030, 1, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=minute)
        return dispatch_actions(store, be, actions, window)

    try:
        assert run_round([{"action": "start", "job_id": a, "gpu_id": gpus[("mx-t4-1", 0)], "from_gpu_id": None,
                           "sm_pct": 30},
                          {"action": "start", "job_id": b, "gpu_id": gpus[("mx-t4-1", 1)], "from_gpu_id": None,
                           "sm_pct": 20}], 15 * (os.getpid() % 1000)) == (2, 0)
        with dev_cluster.client() as c:
            for sid in (sa, sb):
                dev_cluster.wait_job(c, sid, lambda j: j.state == "RUNNING", "start", timeout_s=60)
        assert run_round([{"action": "migrate", "job_id": a, "gpu_id": gpus[("mx-a10-1", 3)],
                           "from_gpu_id": gpus[("mx-t4-1", 0)], "sm_pct": 50},
                          {"action": "evict", "job_id": b, "gpu_id": None, "from_gpu_id": gpus[("mx-t4-1", 1)],
                           "sm_pct": None}], 15 * (os.getpid() % 1000) + 15) == (2, 0)
        with dev_cluster.client() as c:
            j = dev_cluster.wait_job(c, sa, lambda j: j.state == "RUNNING", "restart on the new node", timeout_s=60)
            assert j.nodes == ("mx-a10-1",) and j.mps_pct == 50 and j.restart_count >= 1
            assert plans.decode(j.comment, dev_cluster.plan_key, sa).gpu_index == 3
            # an eviction requeues and holds: the job passes through COMPLETING (held, not yet pending) first
            e = dev_cluster.wait_job(c, sb, lambda j: j.state != "COMPLETING", "eviction to finish", timeout_s=60)
            assert e.held and e.state == "PENDING"
        cl = be.cluster(store)
        running = cl.running()
        assert running[a].gpu_id == gpus[("mx-a10-1", 3)] and running[a].sm_pct == 50 and b not in running
    finally:
        _cancel(dev_cluster, jobs.values())


def test_slurmctld_down_during_dispatch_plan_completes_after_restart(private_cluster, private_tmp) -> None:
    """On a cluster of its own: stopping the shared slurmctld would break every concurrent test run."""


    live = private_cluster
    store, url = make_store(private_tmp)
    gpus = register(store, live)
    d = live.job_dir("ctld")
    prefix = f"mx-ctld{os.getpid()}"
    jobs = _held_jobs(live, store, d, 4, prefix)
    keys = sorted(gpus)
    plan = {job_id: (*keys[k], 15) for k, job_id in enumerate(sorted(jobs))}
    round_id = make_round(store, [{"action": "start", "job_id": j, "gpu_id": gpus[(n, i)], "from_gpu_id": None,
                                   "sm_pct": p} for j, (n, i, p) in plan.items()],
                          dt.datetime(2031, 1, 1, tzinfo=dt.UTC))
    cluster = live.cluster
    rec = cluster.procs.get("slurmctld")
    assert rec is not None and rec.running()
    proc = None
    try:
        os.kill(rec.pid, signal.SIGTERM)
        live.wait_for("slurmctld to stop", lambda: not rec.running(), timeout_s=30)
        # a dispatcher that gives up quickly leaves the plan pending with a clear status
        quick = subprocess.run(dispatch_cmd(url, round_id, retry_deadline_s=2, state_dir=cluster.state_dir),
                               cwd=REPO, capture_output=True, text=True, timeout=120)
        assert quick.returncode == 75 and "PENDING" in quick.stderr, quick.stderr[-2000:]
        with store.session() as s:
            rows = s.scalars(select(m.DispatchLog).where(m.DispatchLog.round_id == round_id)).all()
            assert rows and all(r.status in ("intent", "sent") and "pending" in (r.error or "") for r in rows)
            assert s.get(m.SchedulingRound, round_id).status == "planned"
        # a patient one, started while slurmctld is down, finishes once it is back
        proc = subprocess.Popen(dispatch_cmd(url, round_id, retry_deadline_s=180, state_dir=cluster.state_dir),
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        st = cluster.up(install=False)  # restarts only what died: slurmctld
        assert st.ok, st.problems
    out, err = proc.communicate(timeout=200)
    assert proc.returncode == 0, err[-3000:]
    assert _status_counts(store, round_id) == {"done": len(jobs)}
    _check_placed(live, jobs, plan, prefix)


def test_pytorch_job_migrated_three_times_ends_like_an_unmigrated_run(dev_cluster, private_tmp) -> None:
    """A small CPU PyTorch job (executors.job.runtime.example_train) moved t4 → a10 → t4 → a10 by MIGRATE actions."""

    import json
    import sys

    from executors.job.runtime import CheckpointStore

    steps = "240"
    ref_out = private_tmp / "ref.json"
    ref = subprocess.run([sys.executable, "-m", "executors.job.runtime.example_train", "--ckpt", str(private_tmp / "ref"),
                          "--out", str(ref_out), "--steps", steps, "--every", "20"], cwd=REPO, timeout=120)
    assert ref.returncode == 0
    want = json.loads(ref_out.read_text())

    store, url = make_store(private_tmp)
    gpus = register(store, dev_cluster)
    d = dev_cluster.job_dir("migrate-torch")
    ckpt, out = d / "ckpt", d / "result.json"
    body = (f"cd {REPO}\nexec {sys.executable} -m executors.job.runtime.example_train --ckpt {ckpt} --out {out} "
            f"--steps {steps} --every 20 --iter-ms 60\n")
    jobs = _held_jobs(dev_cluster, store, d, 1, f"mx-torch{os.getpid()}", body)
    (job_id, sid), = jobs.items()
    be = backend(dev_cluster)
    base = dt.datetime(2032, 1, 1, tzinfo=dt.UTC) + dt.timedelta(hours=os.getpid() % 1000)
    route = [("mx-t4-1", 0, 40), ("mx-a10-1", 1, 30), ("mx-t4-1", 2, 50), ("mx-a10-1", 3, 20)]

    def run_round(k: int, action: str, prev):
        node, index, pct = route[k]
        assert dispatch_actions(store, be, [{"action": action, "job_id": job_id, "gpu_id": gpus[(node, index)],
                                             "from_gpu_id": gpus[prev] if prev else None, "sm_pct": pct}],
                                base + dt.timedelta(minutes=15 * k)) == (1, 0)

    try:
        with dev_cluster.client() as c:
            run_round(0, "start", None)
            resumed_at = 0
            for k in range(1, 4):
                node, index, pct = route[k - 1]
                dev_cluster.wait_job(c, sid, lambda j, n=node: j.state == "RUNNING" and j.nodes == (n,),
                                     f"running on {node}", timeout_s=60)
                # let it make progress past its last checkpoint before moving it
                dev_cluster.wait_for("training progress", lambda r=resumed_at: (ckpt / "progress").exists() and int(
                    (ckpt / "progress").read_text() or 0) > r + 25, timeout_s=60)
                run_round(k, "migrate", (node, index))
                latest = CheckpointStore(ckpt).latest()
                assert latest is not None and latest[0] > resumed_at
                resumed_at = latest[0]
            node, index, pct = route[3]
            j = dev_cluster.wait_job(c, sid, lambda j: j.finished, "the migrated job to finish", timeout_s=120)
            assert j.state == "COMPLETED" and j.nodes == (node,) and j.restart_count == 3, (j.state, j.nodes,
                                                                                           j.restart_count)
        got = json.loads(out.read_text())
        assert got == want
    finally:
        _cancel(dev_cluster, jobs.values())


def _job_printing_each_run(dev_cluster, store, name: str, prefix: str) -> tuple[int, int, Path]:
    """One held offline job whose every run prints its environment to ``env.<Slurm id>.<restart count>``:
    (store id, Slurm id, its directory)."""
    d = dev_cluster.job_dir(name)
    run_env = f"{d}/env.$SLURM_JOB_ID.${{SLURM_RESTART_COUNT:-0}}"
    jobs = _held_jobs(dev_cluster, store, d, 1, f"{prefix}{os.getpid()}",
                      f"env > {run_env}.tmp && mv {run_env}.tmp {run_env}\nsleep 300\n")
    (job_id, sid), = jobs.items()
    return job_id, sid, d


def _run_env(dev_cluster, d: Path, sid: int, restart: int, timeout_s: float) -> dict[str, str]:
    """The environment run ``restart`` of Slurm job ``sid`` printed (:func:`_job_printing_each_run`)."""
    f = d / f"env.{sid}.{restart}"
    dev_cluster.wait_for(f"run {restart} of job {sid} to print its environment", f.exists, timeout_s=timeout_s,
                         explain=lambda: dev_cluster.explain_job(sid))
    return read_env(f)


def _a10_prolog_watch(dev_cluster):
    """The node agent's prolog watch of mx-a10-1, started (executors.node.prolog_watch)."""
    from executors.node.prolog_watch import PrologWatch, PrologWatchThread

    layout = dev_cluster.layout
    return PrologWatchThread(PrologWatch(layout.node_script_dir / "prolog.sh", layout.plan_dir, "mx-a10-1",
                                         env={**os.environ, **dev_cluster.cluster.slurm_env(layout)}),
                             interval_s=0.2).start()


def test_a_job_placed_again_on_its_node_runs_with_its_plan_though_slurmd_skips_the_prolog(dev_cluster,
                                                                                           private_tmp) -> None:
    """slurmd skips the Prolog of a requeued job released again on the node it ran on (reproduced by hand:
    one Prolog for two runs). The TaskProlog waits for its plan file and the node agent's prolog watch runs
    the Prolog for it, so the second run has its plan too (docs/SLURM.md "Node scripts")."""
    store, _url = make_store(private_tmp)
    gpus = register(store, dev_cluster)
    job_id, sid, d = _job_printing_each_run(dev_cluster, store, "reprolog", "mx-rp")
    be = backend(dev_cluster)
    gpu = gpus[("mx-a10-1", 1)]
    base = dt.datetime(2032, 1, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=15 * (os.getpid() % 1000))
    watch = _a10_prolog_watch(dev_cluster)
    start = {"action": "start", "job_id": job_id, "gpu_id": gpu, "from_gpu_id": None, "sm_pct": 30}
    try:
        assert dispatch_actions(store, be, [start], base) == (1, 0)
        first = _run_env(dev_cluster, d, sid, 0, timeout_s=90)
        assert dispatch_actions(store, be, [{"action": "evict", "job_id": job_id, "gpu_id": None,
                                             "from_gpu_id": gpu, "sm_pct": None}],
                                base + dt.timedelta(minutes=1)) == (1, 0)
        with dev_cluster.client() as c:
            dev_cluster.wait_job(c, sid, lambda j: j.state == "PENDING" and j.held, "requeue-hold", timeout_s=60)
        with store.session() as s:
            assert s.get(m.OfflineJob, job_id).state == "PENDING"  # evicted, requeued held: to be placed again
        assert dispatch_actions(store, be, [start], base + dt.timedelta(minutes=2)) == (1, 0)
        second = _run_env(dev_cluster, d, sid, 1, timeout_s=90)
    finally:
        watch.close()
    for env in (first, second):
        assert env["SLURMD_NODENAME"] == "mx-a10-1" and env["CUDA_VISIBLE_DEVICES"] == "1", env
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30" and env["LD_PRELOAD"].endswith("libxcuda.so"), env


def test_a_job_migrated_on_its_node_within_the_second_of_its_requeue_runs_again(dev_cluster, private_tmp) -> None:
    """A migration to another GPU of the same node, dispatched at the start of a wall-clock second: the requeue,
    the release and Slurm's allocation could all fall in that second, and slurmd refuses a launch credential no
    newer than the kill of the previous run ("Job N already killed, do not launch batch job"): the job would end
    FAILED. The dispatcher releases a requeued job no earlier than the second after its requeue
    (SlurmCluster._past_requeue_second), so every run starts, on its planned GPU."""
    store, _url = make_store(private_tmp)
    gpus = register(store, dev_cluster)
    job_id, sid, d = _job_printing_each_run(dev_cluster, store, "samesecond", "mx-ss")
    be = backend(dev_cluster)
    base = dt.datetime(2033, 1, 1, tzinfo=dt.UTC) + dt.timedelta(hours=os.getpid() % 1000)
    watch = _a10_prolog_watch(dev_cluster)
    try:
        for run in range(4):
            if run:  # at the start of a second, as a round's dispatch may be
                time.sleep(1.0 - time.time() % 1.0)
            assert dispatch_actions(store, be, [{"action": "migrate" if run else "start", "job_id": job_id,
                                                 "gpu_id": gpus[("mx-a10-1", run)],
                                                 "from_gpu_id": gpus[("mx-a10-1", run - 1)] if run else None,
                                                 "sm_pct": 30}], base + dt.timedelta(minutes=15 * run)) == (1, 0)
            env = _run_env(dev_cluster, d, sid, run, timeout_s=60)
            assert env["SLURMD_NODENAME"] == "mx-a10-1" and env["CUDA_VISIBLE_DEVICES"] == str(run), env
    finally:
        watch.close()
        _cancel(dev_cluster, [sid])


def test_a_task_prolog_waiting_for_its_plan_gets_it_from_the_prolog_the_node_agent_runs(dev_cluster,
                                                                                         private_tmp) -> None:
    """The skipped-Prolog case made deterministic: a held offline job released by root with an incomplete plan
    in its admin comment (no GPU, no share: its slurmd Prolog writes nothing, "not a MuxFlow placement"), so its
    TaskProlog, seeing a MuxFlow admin comment but no plan file, waits; the whole plan is then put in the admin
    comment, and the prolog watch (started only now) sees the waiting TaskProlog, runs the Prolog for it, and
    the task starts with the plan's GPU, share and xCUDA. A job released by hand with no MuxFlow admin comment
    does not wait (test_rest_live)."""
    from executors.node.prolog_watch import PrologWatch, PrologWatchThread

    store, _url = make_store(private_tmp)
    register(store, dev_cluster)
    d = dev_cluster.job_dir("waitplan")
    body = f"env > {d}/env.$SLURM_JOB_ID.tmp && mv {d}/env.$SLURM_JOB_ID.tmp {d}/env.$SLURM_JOB_ID\n"
    jobs = _held_jobs(dev_cluster, store, d, 1, f"mx-wp{os.getpid()}", body)
    (_job_id, sid), = jobs.items()
    layout = dev_cluster.layout
    slurm_env = {**os.environ, **dev_cluster.cluster.slurm_env(layout)}

    def scontrol(*args: str) -> None:
        out = subprocess.run(dev_cluster.cluster.command(layout, ["scontrol", *args]), env=slurm_env,
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr

    # a plan the Prolog cannot verify yet (it starts without one), then the real one
    scontrol("update", f"jobid={sid}", "NodeList=mx-a10-1", "TresPerNode=gres/mps:30",
             "Comment=muxflow-plan=1 (to come)")
    scontrol("release", str(sid))
    with dev_cluster.client() as c:
        dev_cluster.wait_job(c, sid, lambda j: j.state == "RUNNING", "start without a plan", timeout_s=60)
    waiting = PrologWatch(layout.node_script_dir / "prolog.sh", layout.plan_dir, "mx-a10-1", env=slurm_env)
    dev_cluster.wait_for("the TaskProlog to wait for its plan", lambda: any(k[0] == sid for k in waiting.waiting()),
                         timeout_s=20)
    assert not (d / f"env.{sid}").exists()
    scontrol("update", f"jobid={sid}", "Comment=" + plans.encode(placement_plan(_job_id, sid, 3, 30, 2 * 1024**3),
                                                                 dev_cluster.plan_key))
    watch = PrologWatchThread(waiting, interval_s=0.2).start()
    try:
        dev_cluster.wait_for("the task to start", (d / f"env.{sid}").exists, timeout_s=30)
    finally:
        watch.close()
    env = read_env(d / f"env.{sid}")
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30", env
    assert env["LD_PRELOAD"].endswith("libxcuda.so") and env["XCUDA_MEM_QUOTA_BYTES"] == str(2 * 1024**3), env
    log = Path("/var/log/muxflow/muxflow-node.log")
    if log.exists():  # the Prolog's own log says who ran it
        assert f"prolog job={sid} node=mx-a10-1 (run by the node-agent" in log.read_text()
