"""Users cannot change MuxFlow's plan, and the hard caps come from root (docs/SLURM.md "Users cannot change
the plan", "Hard caps"). On a private dev cluster of each release under test, as the real non-root users
``dev-up`` creates: every attempt to move, resize, re-plan, release or hold an offline job is refused or has
no effect, before and after placement, and the job runs on its planned GPU at its planned share and quota,
with the MPS limits set by the root Prolog through the GPU's control daemon (the stand-in that records
what it receives). The attempts and their outcomes are written to test-artifacts/site_user_attempts_<release>.json.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess

from executors.scheduler.round_runner import stored_result
from executors.scheduler.slurm.backend import XcudaGains
from executors.scheduler.slurm.pickup import import_submissions
from executors.slurm import plan as plans
from executors.store import models as m
from tests.live.muxflow_helpers import (
    GOOD_COMMENT,
    backend,
    make_pending,
    make_round,
    make_store,
    read_env,
    register,
    sbatch,
)
from tests.live.site_helpers import release_of, run_as, site_cluster, write_artifact  # noqa: F401

USER, OTHER = "mxuser1", "mxuser2"
PLAN_GPU, PLAN_PCT = 2, 35


def _attempt(live, sid: int, table: list, what: str, user: str, *argv: str) -> subprocess.CompletedProcess:
    out = run_as(live, user, *[a.format(sid=sid) for a in argv])
    table.append({"attempt": what, "as": user, "command": " ".join(argv).format(sid=sid),
                  "exit": out.returncode, "message": (out.stderr or out.stdout).strip()[-200:]})
    return out


def test_users_cannot_change_the_plan_and_caps_come_from_root(site_cluster, private_tmp) -> None:
    live = site_cluster
    release = release_of(live)
    store, _url = make_store(private_tmp)
    gpus = register(store, live)
    d = live.job_dir("users")
    script = d / "job.sh"
    # The job's own attempts: drop xCUDA and ask MPS for the whole GPU, then report what it sees.
    script.write_text("#!/bin/sh\n"
                      f"env > {d}/env.$SLURM_JOB_ID.tmp && mv {d}/env.$SLURM_JOB_ID.tmp {d}/env.$SLURM_JOB_ID\n"
                      "unset LD_PRELOAD; export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100\n"
                      f"env > {d}/after.$SLURM_JOB_ID\nsleep 300\n")
    script.chmod(0o755)
    sid = sbatch(live, script, "-p", "offline", "--gres=mps:30", "-J", f"mx-users-{os.getpid()}",
                 f"--output={d}/%j.out", f"--comment={GOOD_COMMENT.format(name='users')}", user=USER)
    online = sbatch(live, script, "-p", "online", "--hold", "--gres=mps:10", f"--output={d}/%j.out", user=USER)
    table: list[dict] = []
    refused_before = [
        ("release the held job", USER, "scontrol", "release", "{sid}"),
        ("move it to the online partition", USER, "scontrol", "update", "JobId={sid}", "Partition=online"),
        ("ask for the whole GPU", USER, "scontrol", "update", "JobId={sid}", "TresPerNode=gres/mps:100"),
        ("pick its node", USER, "scontrol", "update", "JobId={sid}", "ReqNodeList=mx-a10-1"),
        ("exclude nodes", USER, "scontrol", "update", "JobId={sid}", "ExcNodeList=mx-t4-1"),
        ("write a plan into its comment", USER, "scontrol", "update", "JobId={sid}",
         "Comment=muxflow-plan=1 slurm={sid} job=1 kind=place gpu=0 pct=100 sig=" + "0" * 64),
        ("write a plan into its admin comment", USER, "scontrol", "update", "JobId={sid}",
         "AdminComment=muxflow-job=1 muxflow-gpu=0 muxflow-pct=100"),
        ("raise its priority", USER, "scontrol", "update", "JobId={sid}", "Nice=-100"),
        ("release it as another user", OTHER, "scontrol", "release", "{sid}"),
    ]
    for what, user, *argv in refused_before:
        out = _attempt(live, sid, table, what, user, *argv)
        assert out.returncode != 0, (release, what, out.stdout, out.stderr)
    # An online job of the user cannot be moved into the offline partition (it would run unmanaged), nor carry
    # a MuxFlow plan.
    for what, argv in (("move an online job into the offline partition", ("Partition=offline",)),
                       ("give an online job a plan", ("AdminComment=muxflow-job=1 muxflow-gpu=0 muxflow-pct=90",)),
                       ("give an online job a plan in its comment",
                        ("Comment=muxflow-plan=1 slurm={sid} job=1 kind=place gpu=0 pct=90 sig=" + "0" * 64,))):
        out = _attempt(live, online, table, what, USER, "scontrol", "update", "JobId={sid}", *argv)
        assert out.returncode != 0, (release, what, out.stderr)
    with live.client() as c:
        j = c.get_job(sid)
        assert j.held and j.partition == "offline" and j.mps_pct == 30 and j.admin_comment.startswith("muxflow")
        assert j.required_nodes == () and not plans.is_plan_text(j.comment)
        assert c.get_job(online).partition == "online" and not c.get_job(online).admin_comment
        c.cancel(online)

    # MuxFlow places it; an MPS server of the same user already runs on the planned GPU (an online replica of
    # that identity): the root Prolog caps the daemon's next server and that server's new clients.
    with live.client() as c:
        import_submissions(store, c, None, only=[sid])
    with store.session() as s:
        job_id = s.query(m.OfflineJob.id).filter(m.OfflineJob.slurm_job_id == sid).scalar()
    make_pending(store, [job_id])
    pipe = live.layout.mps_pipe_root / "mx-a10-1" / f"gpu{PLAN_GPU}"
    pipe.mkdir(parents=True, exist_ok=True)
    (pipe / "daemon").write_text("0\n")
    server = subprocess.Popen(["sleep", "300"], user=USER)
    stranger = subprocess.Popen(["sleep", "300"], user=OTHER)
    try:
        (pipe / "servers").write_text(f"{server.pid}\n{stranger.pid}\n")
        round_id = make_round(store, [{"action": "start", "job_id": job_id, "gpu_id": gpus[("mx-a10-1", PLAN_GPU)],
                                       "from_gpu_id": None, "sm_pct": PLAN_PCT}])
        with store.session() as s:
            result = stored_result(s, s.get(m.SchedulingRound, round_id))
        be = backend(live, gains=XcudaGains(kp=0.5, ki=12.5, kd=0.02))
        assert be.dispatch(store, round_id, result, dt.datetime.now(dt.UTC)) == (1, 0)
        live.wait_for("the job to print its environment", lambda: (d / f"after.{sid}").exists(), timeout_s=60)

        refused_running = [
            ("change the running job's comment", USER, "scontrol", "update", "JobId={sid}", "Comment=x"),
            ("change the running job's admin comment", USER, "scontrol", "update", "JobId={sid}",
             "AdminComment=muxflow-job=1 muxflow-gpu=0 muxflow-pct=100"),
            ("extend the running job's time limit", USER, "scontrol", "update", "JobId={sid}", "TimeLimit=10"),
            ("hold the running job", USER, "scontrol", "hold", "{sid}"),
        ]
        for what, user, *argv in refused_running:
            out = _attempt(live, sid, table, what, user, *argv)
            assert out.returncode != 0, (release, what, out.stdout, out.stderr)

        with live.client() as c:
            j = c.get_job(sid)
        plan = plans.decode(j.comment, live.plan_key, sid)
        assert j.state == "RUNNING" and j.nodes == ("mx-a10-1",) and j.mps_pct == PLAN_PCT
        assert (plan.gpu_index, plan.sm_pct) == (PLAN_GPU, PLAN_PCT)
        env = read_env(d / f"env.{sid}")
        assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) == (str(PLAN_GPU), str(PLAN_PCT))
        assert env["XCUDA_MEM_QUOTA_BYTES"] == str(2 * 1024**3) and env["LD_PRELOAD"].endswith("libxcuda.so")
        assert (env["XCUDA_KP"], env["XCUDA_KI"], env["XCUDA_KD"]) == ("0.5", "12.5", "0.02")
        after = dict(line.split("=", 1) for line in (d / f"after.{sid}").read_text().splitlines() if "=" in line)
        assert "LD_PRELOAD" not in after and after["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
        # What the job did to its environment changes nothing of the fence: root set it on the daemon.
        sent = [line.split(" ", 2)[2] for line in (pipe / "commands.log").read_text().splitlines()]
        by_root = [line for line in (pipe / "commands.log").read_text().splitlines() if " uid=0 " in line]
        assert len(by_root) == len(sent)
        assert "set_default_active_thread_percentage 35" in sent
        assert "set_default_device_pinned_mem_limit 2 2048M" in sent
        assert f"set_active_thread_percentage {server.pid} 35" in sent
        assert f"set_device_pinned_mem_limit {server.pid} 2 2048M" in sent
        assert not any(str(stranger.pid) in line for line in sent if line.startswith("set_"))
        plan_file = live.layout.plan_dir / f"{sid}.plan"
        assert plan_file.stat().st_uid == 0 and oct(plan_file.stat().st_mode & 0o777) == "0o644"
        table.append({"attempt": "the job script unsets LD_PRELOAD and sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100",
                      "as": USER, "command": "(in the job)", "exit": 0,
                      "message": "its environment changes; the daemon's caps (35 %, 2048M, set by root) stay"})
    finally:
        for p in (server, stranger):
            p.kill()
            p.wait()
        with live.client() as c:
            c.cancel(sid)
    # The Epilog gives the GPU its defaults back.
    live.wait_for("the Epilog to reset the GPU's default share",
                  lambda: "set_default_active_thread_percentage 100" in (pipe / "commands.log").read_text(),
                  timeout_s=60)
    write_artifact(f"site_user_attempts_{release}.json", table)
