"""Node faults, live, on a private dev cluster of each release under test (docs/SLURM.md "Node faults").

- slurmd killed between the placement and the start: the job is PLACED on a node whose slurmd is gone; once
  Slurm stops hearing from the node, the sync holds the job (PENDING) and the node's GPUs are Unhealthy; slurmd
  back, the GPUs are Healthy again.
- A node set DOWN, then another DRAIN, each while a placed job runs there: the job is handed back (Slurm's own
  requeue on DOWN, MuxFlow's checkpoint + requeue-hold on DRAIN), PENDING in the store and held in Slurm, the
  node's GPUs leave the rounds (Unhealthy), and the job is placed elsewhere and runs there.
- A job Slurm requeues itself (``scontrol requeue``, not held): held by the sync, PENDING.
Outcomes go to test-artifacts/site_faults_<release>.json.
"""

from __future__ import annotations

import datetime as dt
import os
import signal

import pytest
from sqlalchemy import select

from executors.scheduler.slurm.pickup import import_submissions
from executors.store import models as m
from tests.live.muxflow_helpers import (
    GOOD_COMMENT,
    backend,
    dispatch_actions,
    make_pending,
    make_store,
    register,
    sbatch,
)
from tests.live.site_helpers import release_of, run_as, site_cluster, write_artifact  # noqa: F401


def _state(store, job_id: int) -> str:
    with store.session() as s:
        return s.get(m.OfflineJob, job_id).state


def _health(store, gpus, node: str) -> set[str]:
    with store.session() as s:
        return {s.get(m.Gpu, g).health for (n, _i), g in gpus.items() if n == node}


def test_node_faults_hand_jobs_back_and_take_gpus_out(site_cluster, private_tmp) -> None:
    live = site_cluster
    release = release_of(live)
    store, _url = make_store(private_tmp)
    gpus = register(store, live)
    with store.session() as s:  # the node agents would have said so; here nothing samples the GPUs
        for g in s.scalars(select(m.Gpu)):
            g.health = "Healthy"
    d = live.job_dir("faults")
    script = d / "job.sh"
    script.write_text("#!/bin/sh\nsleep 600\n")
    script.chmod(0o755)
    sids = [sbatch(live, script, "-p", "offline", "--gres=mps:20", "-J", f"mx-fault-{i}", "-o", "/dev/null",
                   f"--comment={GOOD_COMMENT.format(name=f'fault{i}')}", user="mxuser1") for i in range(4)]
    with live.client() as c:
        import_submissions(store, c, None, only=sids)
    with store.session() as s:
        ids = {j.slurm_job_id: j.id for j in s.scalars(select(m.OfflineJob))}
    jobs = [ids[sid] for sid in sids]
    make_pending(store, jobs)
    be = backend(live, retry_deadline_s=20)
    minute = [0]

    def start(job_id: int, node: str, index: int) -> None:
        minute[0] += 15
        assert dispatch_actions(store, be, [{"action": "start", "job_id": job_id, "gpu_id": gpus[(node, index)],
                                             "from_gpu_id": None, "sm_pct": 20}],
                                dt.datetime(2031, 1, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=minute[0])) == (1, 0)

    seen: dict[str, set[str]] = {"mx-t4-1": set(), "mx-a10-1": set()}

    def sync() -> None:
        be.sync_jobs(store, dt.datetime.now(dt.UTC))
        for node, health in seen.items():  # what each round starting now would have seen
            health |= _health(store, gpus, node)

    def settles(job_id: int, state: str, timeout_s: float = 120) -> None:
        try:
            live.wait_for(f"job {job_id} {state}", lambda: (sync(), _state(store, job_id))[1] == state, timeout_s)
        except pytest.fail.Exception as exc:  # say what Slurm and the store saw
            sid = next(s for s, j in ids.items() if j == job_id)
            with live.client() as cl:
                j = cl.get_job(sid)
                nodes = {n.name: (n.state, n.state_flags) for n in cl.list_nodes()}
            pytest.fail(f"{exc}; store: {_state(store, job_id)}; Slurm job {sid}: {j.state} ({j.state_reason}, "
                        f"held {j.held}, nodes {j.nodes}); nodes: {nodes}", pytrace=False)

    outcomes = []
    a, b, c_, r = jobs
    sa, sb, sc, sr = sids
    # 1. slurmd of mx-t4-1 dies, then a job is placed there: released, but it cannot start.
    rec = live.cluster.procs.get("slurmd-mx-t4-1")
    os.kill(rec.pid, signal.SIGKILL)
    start(a, "mx-t4-1", 0)
    assert _state(store, a) == "PLACED"
    settles(a, "PENDING", timeout_s=120)  # SlurmdTimeout=30 s, then Slurm marks the node down
    with live.client() as cl:
        assert cl.get_job(sa).held
    assert _health(store, gpus, "mx-t4-1") == {"Unhealthy"}
    outcomes.append({"fault": "slurmd killed between placement and start", "job": "PLACED -> PENDING (held)",
                     "gpus": "mx-t4-1 Unhealthy"})
    live.cluster.up(timeout_s=120, install=False)  # slurmd back; the node returns (ReturnToService=2)
    run_as(live, None, "scontrol", "update", "NodeName=mx-t4-1", "State=RESUME")
    live.wait_for("mx-t4-1's GPUs back in the rounds",
                  lambda: (sync(), _health(store, gpus, "mx-t4-1"))[1] == {"Healthy"}, timeout_s=90)
    outcomes[-1]["after"] = "slurmd restarted: GPUs Healthy"

    # 2. DOWN with a running job: Slurm requeues it, MuxFlow holds it; placed elsewhere, it runs.
    start(b, "mx-a10-1", 1)
    settles(b, "RUNNING")
    out = run_as(live, None, "scontrol", "update", "NodeName=mx-a10-1", "State=DOWN", "Reason=muxflow-test")
    assert out.returncode == 0, out.stderr
    settles(b, "PENDING")
    # (with ReturnToService=2 the node is back as soon as its slurmd registers again: its GPUs may never have
    # been seen out; the DRAIN case below checks that)
    start(b, "mx-t4-1", 1)
    settles(b, "RUNNING")
    with live.client() as cl:
        assert cl.get_job(sb).nodes == ("mx-t4-1",)
    outcomes.append({"fault": "node set DOWN with a running job", "job": "RUNNING -> PENDING -> placed on mx-t4-1, RUNNING",
                     "gpus": f"mx-a10-1 seen {sorted(seen['mx-a10-1'])} (back at its slurmd's next registration)"})
    run_as(live, None, "scontrol", "update", "NodeName=mx-a10-1", "State=RESUME")
    live.wait_for("mx-a10-1 back", lambda: (sync(), _health(store, gpus, "mx-a10-1"))[1] == {"Healthy"},
                  timeout_s=90)

    # 3. DRAIN with a running job: Slurm lets it run; MuxFlow checkpoints and requeues it held.
    start(c_, "mx-a10-1", 2)
    settles(c_, "RUNNING")
    out = run_as(live, None, "scontrol", "update", "NodeName=mx-a10-1", "State=DRAIN", "Reason=muxflow-test")
    assert out.returncode == 0, out.stderr
    settles(c_, "PENDING")
    with live.client() as cl:
        assert cl.get_job(sc).held
    assert _health(store, gpus, "mx-a10-1") == {"Unhealthy"}  # a drained node stays out until resumed
    start(c_, "mx-t4-1", 2)
    settles(c_, "RUNNING")
    outcomes.append({"fault": "node set DRAIN with a running job",
                     "job": "RUNNING -> PENDING (checkpoint + requeue-hold) -> placed on mx-t4-1, RUNNING",
                     "gpus": "mx-a10-1 Unhealthy"})

    # 4. Slurm requeues a job itself (released, not held): the sync holds it.
    start(r, "mx-t4-1", 3)
    settles(r, "RUNNING")
    out = run_as(live, None, "scontrol", "requeue", str(sr))
    assert out.returncode == 0, out.stderr
    settles(r, "PENDING")
    with live.client() as cl:
        assert cl.get_job(sr).held
    outcomes.append({"fault": "Slurm requeues a running job itself", "job": "RUNNING -> PENDING (held)"})
    with live.client() as cl:
        for sid in sids:
            cl.cancel(sid)
    write_artifact(f"site_faults_{release}.json", outcomes)
