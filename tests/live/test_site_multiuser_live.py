"""Several users on one GPU, live (docs/SLURM.md "Several users on one GPU"): MPS serves one user per GPU, so a
round places an offline job only next to an online replica of the job's own user.

On a private dev cluster of each release under test, with the real users ``dev-up`` creates:

1. an online service whose replicas (GPUs 1 and 2 of ``mx-a10-1``) run as ``mxuser1``, each GPU's MPS
   server a process of ``mxuser1`` (the stand-in control daemon lists it); a node agent with simulated GPUs
   writes their online load;
2. ``mxuser1`` and ``mxuser2`` each submit an offline job with plain ``sbatch``; the pick-up stores who
   submitted it; both are profiled and a predictor is trained (simulated samples);
3. a real round (``RoundService`` on Slurm) places ``mxuser1``'s job next to ``mxuser1``'s replica and
   leaves ``mxuser2``'s held in Slurm, PENDING in the store, with its reason in ``muxflow jobs list``; the
   root Prolog sets the caps on the planned GPU's MPS server of ``mxuser1`` (the job's uid);
4. a replica of ``mxuser2`` registered on GPU 3: the next round places ``mxuser2``'s job there, and the
   Prolog caps ``mxuser2``'s server on that GPU, never ``mxuser1``'s.

The placements and the commands the stand-in control daemon received go to
test-artifacts/site_multiuser_<release>.json.
"""

from __future__ import annotations

import datetime as dt
import os
import pwd
import subprocess
import sys

from sqlalchemy import func, select

from executors.scheduler.round_service import RoundService
from executors.scheduler.slurm.pickup import import_submissions
from executors.slurm import plan as plans
from executors.store import models as m
from scheduler_core.round.clock import RoundClock
from tests.live.conftest import cancel_quietly
from tests.live.muxflow_helpers import REPO, backend, make_store, register, sbatch, write_script
from tests.live.site_helpers import release_of, site_cluster, write_artifact  # noqa: F401
from tests.processes import processes, stop

NODE, REPLICA_GPUS, LATER_GPU = "mx-a10-1", (1, 2), 3
USERS = ("mxuser1", "mxuser2")
SPEC = "muxflow: type='ResNet-50 (batch size 64)' mem=2GiB gpu-types=a10 ckpt={d}/ckpt-{u} steps=1000"


def _cli(url: str, *args: str, env: dict | None = None) -> str:
    env = {**os.environ, **(env or {})}
    env.pop("MUXFLOW_SETTINGS", None)
    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "--db", url, *args], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"muxflow {' '.join(args)}: {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _servers(live, gpu: int) -> dict[str, subprocess.Popen]:
    """A process of each user standing in for an MPS server of that user on the GPU (the stand-in control
    daemon's get_server_list prints them): the Prolog must cap only the job user's."""
    pipe = live.layout.mps_pipe_root / NODE / f"gpu{gpu}"
    pipe.mkdir(parents=True, exist_ok=True)
    (pipe / "daemon").write_text("0\n")
    procs = {u: subprocess.Popen(["sleep", "600"], user=u) for u in USERS}
    (pipe / "servers").write_text("".join(f"{p.pid}\n" for p in procs.values()))
    return procs


def _capped(live, gpu: int) -> list[tuple[int, int]]:
    """(server pid, share) of every set_active_thread_percentage root sent on the GPU's control daemon."""
    out = []
    for line in _caps(live, gpu):
        uid, cmd, *args = line.split(" ", 1)[1].split()
        if cmd == "set_active_thread_percentage":
            assert uid == "uid=0", line
            out.append((int(args[0]), int(args[1])))
    return out


def _caps(live, gpu: int) -> list[str]:
    log = live.layout.mps_pipe_root / NODE / f"gpu{gpu}" / "commands.log"
    return log.read_text().splitlines() if log.exists() else []


def test_jobs_share_a_gpu_only_with_a_replica_of_their_user(site_cluster, private_tmp) -> None:
    live = site_cluster
    release = release_of(live)
    store, url = make_store(private_tmp)
    gpus = register(store, live)
    replica_ids = [gpus[(NODE, i)] for i in REPLICA_GPUS]
    where = {gpu_id: node_index for node_index, gpu_id in gpus.items()}
    _cli(url, "online", "register", "--name", "rec-u1", "--family", "cnn", "--qps-min", "20", "--qps-max", "40",
         "--mem", "2GiB", "--gpu-ids", ",".join(map(str, replica_ids)), "--run-as", USERS[0])
    servers = {i: _servers(live, i) for i in (*REPLICA_GPUS, LATER_GPU)}
    d = live.job_dir("multiuser")
    script = write_script(d, "sleep 600\n")
    sids = {u: sbatch(live, script, "-p", "offline", "--gres=mps:30", "-J", f"mx-mu-{u}", f"--output={d}/%j.out",
                      f"--comment={SPEC.format(d=d, u=u)}", user=u) for u in USERS}
    record: dict = {"release": release}
    try:
        with processes(private_tmp) as procs:
            agent_cmd = [sys.executable, "-m", "pipelines.cli", "--db", url, "node-agent", "--node", NODE,
                         "--simulated", "--evict", "record", "--placements", "none", "--no-shm", "--interval-ms",
                         "200", "--partial-every", "2"]
            agent = procs.start("agent", agent_cmd, cwd=REPO)

            with live.client() as c:
                import_submissions(store, c, None, only=list(sids.values()))
            with store.session() as s:
                jobs = {j.run_as_user: j.id for j in s.scalars(select(m.OfflineJob))}
            assert set(jobs) == set(USERS), jobs  # the pick-up stored each job's submitting user
            _cli(url, "profile")
            _cli(url, "sample", "--per-type", "300")
            _cli(url, "train")

            def online_rows(ids) -> bool:
                with store.session() as s:
                    healthy = s.scalar(select(func.count()).select_from(m.Gpu).where(
                        m.Gpu.id.in_(ids), m.Gpu.health == "Healthy"))
                    rows = s.scalar(select(func.count(func.distinct(m.GpuMetricMinute.gpu_id))).where(
                        m.GpuMetricMinute.gpu_id.in_(ids), m.GpuMetricMinute.online_sm_activity_pct.is_not(None)))
                return healthy == rows == len(ids)

            live.wait_for("online load of the replicas' GPUs", lambda: online_rows(replica_ids), 90)
            service = RoundService(store, backend(live), clock=RoundClock(period_s=60))

            # Round 1: only mxuser1's replicas. mxuser1's job goes next to one; mxuser2's waits, and says why.
            first = service.run_once(service.next_window(dt.datetime.now(dt.UTC)))
            placed = {p.job_id: p for p in first.planned.result.placements}
            assert set(placed) == {jobs[USERS[0]]}, first.planned.result.stats.get("unplaced")
            gpu_u1 = next(i for i in REPLICA_GPUS if gpus[(NODE, i)] == placed[jobs[USERS[0]]].gpu_id)
            pct_u1 = placed[jobs[USERS[0]]].sm_pct
            assert first.planned.result.stats["unplaced"]["counts"] == {"run_as_user": 1}
            listing = _cli(url, "jobs", "list")
            line = next(ln for ln in listing.splitlines() if ln.split()[0] == str(jobs[USERS[1]]))
            assert "PENDING" in line and "every candidate GPU's online replica runs as another user" in line
            assert f"runs as {USERS[1]}; the online replicas of its 2 candidate GPU(s) run as {USERS[0]}" in line
            with live.client() as c:
                u1 = live.wait_job(c, sids[USERS[0]], lambda j: j.state == "RUNNING", "mxuser1's job to run", 60)
                u2 = c.get_job(sids[USERS[1]])
            assert u1.user_name == USERS[0] and u1.nodes == (NODE,)
            assert plans.decode(u1.comment, live.plan_key, u1.job_id).gpu_index == gpu_u1
            assert u2.user_name == USERS[1] and u2.held and u2.state == "PENDING"  # still MuxFlow's, not released
            live.wait_for("the Prolog's caps on mxuser1's MPS server", lambda: _capped(live, gpu_u1), 60)
            assert _capped(live, gpu_u1) == [(servers[gpu_u1][USERS[0]].pid, pct_u1)]  # not mxuser2's server
            record["round1"] = {"placed": {USERS[0]: f"{NODE} GPU {gpu_u1} at {pct_u1} %"},
                                "waiting": {USERS[1]: line.split("  ")[-1].strip()},
                                "mps_commands": {f"gpu{gpu_u1}": _caps(live, gpu_u1)}}

            # Round 2: a replica of mxuser2 on GPU 3.
            later = gpus[(NODE, LATER_GPU)]
            _cli(url, "online", "register", "--name", "rec-u2", "--family", "cnn", "--qps-min", "20", "--qps-max",
                 "40", "--mem", "2GiB", "--gpu-ids", str(later), "--run-as", USERS[1])
            stop(agent)  # the agent reads the replicas when it starts
            procs.procs.remove(agent)
            procs.start("agent2", agent_cmd, cwd=REPO)
            live.wait_for("online load of mxuser2's replica", lambda: online_rows([later]), 90)
            second = service.run_once(service.next_window(dt.datetime.now(dt.UTC)))
            placed2 = {p.job_id: p for p in second.planned.result.placements}
            assert placed2[jobs[USERS[1]]].gpu_id == later
            assert placed2[jobs[USERS[0]]].gpu_id in replica_ids  # kept, or moved to mxuser1's other replica
            pct_u2 = placed2[jobs[USERS[1]]].sm_pct
            with live.client() as c:
                u2 = live.wait_job(c, sids[USERS[1]], lambda j: j.state == "RUNNING", "mxuser2's job to run", 60)
            assert plans.decode(u2.comment, live.plan_key, u2.job_id).gpu_index == LATER_GPU
            live.wait_for("the Prolog's caps on mxuser2's MPS server", lambda: _capped(live, LATER_GPU), 60)
            assert _capped(live, LATER_GPU) == [(servers[LATER_GPU][USERS[1]].pid, pct_u2)]  # not mxuser1's
            for i in REPLICA_GPUS:  # mxuser1's GPUs only ever capped mxuser1's servers
                assert {pid for pid, _ in _capped(live, i)} <= {servers[i][USERS[0]].pid}
            assert pwd.getpwuid(os.stat(f"/proc/{servers[LATER_GPU][USERS[1]].pid}").st_uid).pw_name == USERS[1]
            record["round2"] = {"placed": {USERS[1]: f"{NODE} GPU {LATER_GPU} at {pct_u2} %",
                                           USERS[0]: "{} GPU {}".format(*where[placed2[jobs[USERS[0]]].gpu_id])},
                                "mps_commands": {f"gpu{LATER_GPU}": _caps(live, LATER_GPU)}}
            assert not procs.dead(), procs.dead()
    finally:
        for by_user in servers.values():
            for p in by_user.values():
                p.kill()
                p.wait()
        cancel_quietly(live, sids.values())
    write_artifact(f"site_multiuser_{release}.json", record)
