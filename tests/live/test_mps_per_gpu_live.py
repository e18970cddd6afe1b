"""MPS on every GPU of a node, on the planned GPU (docs/SLURM.md "One gres Type per GPU"), live.

On a private cluster whose ``mx-t4-1`` has one gres Type per GPU and whose ``mx-a10-1`` still has
the classic untyped GRES (both with ``Flags=all_sharing``):

- ``register-nodes`` reads both kinds: store GPU type = the model, index = Slurm's;
- four offline jobs, placed by ``muxflow slurm dispatch --name-gpus`` on the four GPUs of ``mx-t4-1`` with
  shares that add up to far more than one GPU (30+45+60+80 %), run at the same time, each
  accounted by Slurm on its planned GPU with its planned share (``scontrol show job -d``:
  ``GRES=mps:t4g<i>:<pct>(IDX:<i>)``) and seeing that share in ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``;
- on the untyped node the dispatcher sends plain ``mps:<pct>``: two 60 % jobs still run at once
  (all_sharing), but Slurm picks the GPU it accounts each on; ``running()`` maps them by the comment;
- why a typed job cannot move (the dispatcher refuses to): Slurm 22.05 adds a pending job's new Type
  next to its old one, so the job then holds a share on both GPUs.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import time

import pytest
from sqlalchemy import select

from executors.dev.slurm.layout import DevNode
from executors.scheduler.slurm.backend import requeue_second_wait_s
from executors.scheduler.round_runner import stored_result
from executors.slurm.spec import JobUpdate
from executors.store import models as m
from tests.live.conftest import cancel_quietly, make_private_cluster
from tests.live.muxflow_helpers import (
    REPO,
    backend,
    dispatch_cmd,
    held_jobs,
    make_round,
    make_store,
    read_env,
    register,
    sbatch,
    scontrol_gres,
    write_script,
)

TYPED_SHARES = {0: 30, 1: 45, 2: 60, 3: 80}  # GPU index of mx-t4-1 -> MPS %: 215 % in all, one GPU has 100
UNTYPED_SHARES = {1: 60, 2: 60}              # GPU index of mx-a10-1 -> MPS %: 120 %, more than one GPU


@pytest.fixture(scope="module")
def mixed_cluster(dev_cluster):
    nodes = (DevNode("mx-t4-1", "t4"), DevNode("mx-a10-1", "a10", per_gpu_types=False))
    with make_private_cluster(nodes) as live:
        yield live


def test_register_nodes_reads_per_gpu_and_untyped_nodes(mixed_cluster, private_tmp) -> None:
    store, _ = make_store(private_tmp)
    gpus = register(store, mixed_cluster)
    assert sorted(gpus) == sorted([("mx-t4-1", i) for i in range(4)] + [("mx-a10-1", i) for i in range(4)])
    with store.session() as s:
        assert {(g.node.name, g.gpu_type) for g in s.scalars(select(m.Gpu))} == {("mx-t4-1", "t4"),
                                                                                ("mx-a10-1", "a10")}
    with mixed_cluster.client() as c:
        nodes = {n.name: n for n in c.list_nodes()}
    assert nodes["mx-t4-1"].per_gpu_types and [g.share_type for g in nodes["mx-t4-1"].gpus] == [
        "t4g0", "t4g1", "t4g2", "t4g3"]
    assert not nodes["mx-a10-1"].per_gpu_types and {g.share_type for g in nodes["mx-a10-1"].gpus} == {None}


def test_four_jobs_run_at_once_each_on_its_planned_gpu_and_share(mixed_cluster, private_tmp) -> None:
    live = mixed_cluster
    store, url = make_store(private_tmp)
    gpus = register(store, live)
    d = live.job_dir("mps-per-gpu")
    plan = [("mx-t4-1", i, pct) for i, pct in TYPED_SHARES.items()] + \
           [("mx-a10-1", i, pct) for i, pct in UNTYPED_SHARES.items()]
    # plain sbatch --gres=mps:10 submissions, imported and PENDING: store id -> Slurm id
    held = held_jobs(live, store, d, len(plan), f"mx-pergpu{os.getpid()}",
                     f"env > {d}/env.$SLURM_JOB_ID.tmp && mv {d}/env.$SLURM_JOB_ID.tmp {d}/env.$SLURM_JOB_ID\n"
                     "sleep 300\n")
    job_of = {sid: job_id for job_id, sid in held.items()}
    sids = sorted(job_of)
    try:
        placed = {sid: p for sid, p in zip(sids, plan)}
        round_id = make_round(store, [{"action": "start", "job_id": job_of[sid], "gpu_id": gpus[(node, i)],
                                       "from_gpu_id": None, "sm_pct": pct} for sid, (node, i, pct) in placed.items()])
        out = subprocess.run([*dispatch_cmd(url, round_id, state_dir=live.cluster.state_dir), "--name-gpus"],
                             cwd=REPO, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr

        with live.client() as c:
            def all_running() -> bool:
                return all(c.get_job(sid).state == "RUNNING" for sid in sids)
            try:
                live.wait_for("all six jobs running at the same time", all_running, timeout_s=90)
            except pytest.fail.Exception:
                pytest.fail("not all six jobs run: " + "; ".join(
                    f"{sid} {j.state} ({j.state_reason}) {j.gres_per_node}" for sid in sids
                    for j in [c.get_job(sid)]))
            jobs = {sid: c.get_job(sid) for sid in sids}
        live.wait_for("every job to print its environment", lambda: all((d / f"env.{sid}").exists() for sid in sids),
                      timeout_s=60)
        for sid, (node, i, pct) in placed.items():
            j = jobs[sid]
            assert j.nodes == (node,) and j.mps_pct == pct, (sid, j.nodes, j.gres_per_node)
            env = read_env(d / f"env.{sid}")
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(pct) and env["SLURMD_NODENAME"] == node
            gres = scontrol_gres(live, sid)
            if node == "mx-t4-1":
                # Slurm accounts the share on the planned GPU: the typed share named it
                assert j.gres_per_node == f"gres:mps:t4g{i}:{pct}"
                assert gres == [f"mps:t4g{i}:{pct}(IDX:{i})"], (sid, gres)
            else:
                # an untyped node: Slurm picks the GPU itself (whatever the plan said)
                assert j.gres_per_node == f"gres:mps:{pct}" and j.mps_share_type is None, j.gres_per_node
                assert re.fullmatch(rf"mps:(a10:)?{pct}\(IDX:\d\)", gres[0].split(",")[0]), gres
        # the two untyped 60 % shares ran at once, so Slurm put them on two GPUs (all_sharing)
        idx = {re.search(r"\(IDX:(\d)\)", scontrol_gres(live, sid)[0]).group(1)
               for sid, (node, _i, _pct) in placed.items() if node == "mx-a10-1"}
        assert len(idx) == 2, idx
        print(f"untyped shares planned on mx-a10-1 GPUs {sorted(UNTYPED_SHARES)}, "
              f"Slurm accounted them on {sorted(idx)}")
        running = backend(live).cluster(store).running()  # mapping needs no naming
        assert {j: r.gpu_id for j, r in running.items()} == {
            job_of[sid]: gpus[(node, i)] for sid, (node, i, _pct) in placed.items()}
        with store.session() as s:
            result = stored_result(s, s.get(m.SchedulingRound, round_id))
        # sent again (a restarted dispatcher), every action finds its job placed as planned: typed shares
        # read back from Slurm compare equal to the ones sent
        be = backend(live)
        be.name_gpus = True
        again = be.cluster(store).dispatch(list(result.actions), dt.datetime.now(dt.UTC))
        assert [r.ok for r in again] == [True] * len(plan) and all("(reconciled)" in r.detail for r in again), again
    finally:
        cancel_quietly(live, sids)


def test_slurm_2205_adds_a_pending_jobs_new_type_next_to_its_old_one(mixed_cluster) -> None:
    """The Slurm behaviour behind the dispatcher's refusal to move a typed share (docs/SLURM.md): placed on GPU 2,
    requeued and updated to GPU 0's Type, the job then holds a share on both GPUs. If this test fails, Slurm
    replaces the Type now and typed shares could follow migrations."""
    live = mixed_cluster
    d = live.job_dir("retype")
    sid = sbatch(live, write_script(d, "sleep 300\n"), "-p", "online", "--gres=mps:t4g2:40", "-w", "mx-t4-1",
                 f"--output={d}/%j.out")
    env = {**os.environ, **live.cluster.slurm_env(live.layout)}
    try:
        with live.client() as c:
            live.wait_job(c, sid, lambda j: j.state == "RUNNING", "start", timeout_s=60)
            subprocess.run(["scontrol", "requeuehold", str(sid)], env=env, check=True, timeout=30)
            pending = live.wait_job(c, sid, lambda j: j.state == "PENDING", "requeued", timeout_s=60)
            # Slurm kills a job started within its requeue's second ("Job credential revoked"): released past
            # it, as the dispatcher does (SlurmCluster._past_requeue_second)
            time.sleep(requeue_second_wait_s(pending, time.time()))
            c.update_job(sid, JobUpdate(gres_per_node="mps:t4g0:30", hold=False, eligible_now=True))
            j = live.wait_job(c, sid, lambda j: j.state == "RUNNING", "restart", timeout_s=60)
        assert j.gres_per_node == "gres:mps:t4g0:30"  # what the job record says it asks for ...
        # ... and what Slurm gave it: the per-node detail line of `scontrol show job -d`, there only while the job holds
        # its allocation. Wait for it, and if it never comes, say what Slurm knew of the job then.
        gres = live.wait_for(f"job {sid}: the per-node GRES of its restart", lambda: scontrol_gres(live, sid),
                             timeout_s=30, explain=lambda: live.explain_job(sid))
        assert gres == ["mps:t4g2:40(IDX:2),mps:t4g0:30(IDX:0)"], live.explain_job(sid)
    finally:
        cancel_quietly(live, [sid])
