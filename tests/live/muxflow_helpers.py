"""Helpers for the pick-up and dispatcher tests on the live dev cluster: real ``sbatch``, a SQLite store."""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path

from sqlalchemy import select

from executors.scheduler.slurm.backend import SlurmBackend, XcudaGains, register_slurm_nodes
from executors.scheduler.slurm.pickup import import_submissions
from executors.slurm.client import SlurmRestClient
from executors.store import models as m
from executors.store.db import Store
from executors.store.jobs import transition
from executors.store.migrate import upgrade
from scheduler_core.domain import JobState

REPO = Path(__file__).resolve().parents[2]
GOOD_COMMENT = "muxflow: type='ResNet-50 (batch size 64)' mem=2GiB gpu-types=t4,a10 ckpt=/ckpt/{name} steps=1000"


def make_store(tmp_path: Path) -> tuple[Store, str]:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    return Store(url), url


def sbatch_run(dev_cluster, script: Path, *args: str, user: str | None = None) -> subprocess.CompletedProcess:
    """``sbatch --parsable`` of the cluster's Slurm release, as root or as ``user`` (a real non-root user)."""
    env = {**os.environ, **dev_cluster.cluster.slurm_env(dev_cluster.layout)}
    argv = ["sbatch", "--parsable", *args, str(script)]
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    return subprocess.run(dev_cluster.cluster.command(dev_cluster.layout, argv), env=env, capture_output=True,
                          text=True, timeout=30, cwd="/tmp")


def sbatch(dev_cluster, script: Path, *args: str, user: str | None = None) -> int:
    """:func:`sbatch_run`, which must succeed: the job id."""
    out = sbatch_run(dev_cluster, script, *args, user=user)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0])


def scontrol_gres(live, sid: int) -> list[str]:
    """The ``GRES=`` of each node of a job in ``scontrol show job -d``: what Slurm accounts it on
    (``mps:t4g2:40(IDX:2)``: 40 of the MPS count of GPU index 2)."""
    out = subprocess.run(["scontrol", "show", "job", "-d", str(sid)], env={**os.environ,
                         **live.cluster.slurm_env(live.layout)}, capture_output=True, text=True, timeout=30,
                         check=False)
    assert out.returncode == 0, out.stderr
    return re.findall(r"\bGRES=(\S+)", out.stdout)


def read_env(path: Path) -> dict[str, str]:
    """A job's ``env`` output (or any ``KEY=value`` lines) as a dict."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def write_script(d: Path, body: str, name: str = "job.sh") -> Path:
    p = d / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return p


def backend(dev_cluster, retry_deadline_s: float = 30.0, gains: XcudaGains | None = None) -> SlurmBackend:
    settings = dev_cluster.cluster.rest_settings(dev_cluster.layout, "local")
    fallback = dev_cluster.cluster.scontrol_fallback(dev_cluster.layout)
    return SlurmBackend(lambda: SlurmRestClient(settings, requeue_fallback=fallback),
                        retry_deadline_s=retry_deadline_s, gains=gains or XcudaGains(), plan_key=dev_cluster.plan_key)


def register(store: Store, dev_cluster) -> dict[tuple[str, int], int]:
    with dev_cluster.client() as c:
        register_slurm_nodes(store, c)
    with store.session() as s:
        return {(g.node.name, g.gpu_index): g.id for g in s.scalars(select(m.Gpu))}


def held_jobs(live, store: Store, d: Path, n: int, prefix: str, body: str = "sleep 300\n",
              submitted: list[int] | None = None) -> dict[int, int]:
    """``n`` plain ``sbatch -p offline --gres=mps:10`` submissions (held by the cluster's job_submit.lua) named
    ``<prefix>-<i>``, imported (these alone: other runs' jobs are theirs) and PENDING; store id -> Slurm id.
    ``submitted`` gets each Slurm id as soon as it exists (for the caller's clean-up)."""
    script = write_script(d, body)
    sids = []
    for i in range(n):
        sids.append(sbatch(live, script, "-p", "offline", "--gres=mps:10", "-J", f"{prefix}-{i}",
                           f"--output={d}/%j.out", f"--comment={GOOD_COMMENT.format(name=f'{prefix}-{i}')}"))
        if submitted is not None:
            submitted.append(sids[-1])
    with live.client() as c:
        import_submissions(store, c, None, only=sids)
    with store.session() as s:
        rows = {j.id: j.slurm_job_id for j in s.scalars(select(m.OfflineJob).where(
            m.OfflineJob.slurm_job_id.in_(sids)))}
    assert sorted(rows.values()) == sorted(sids)
    make_pending(store, list(rows))
    return rows


def make_pending(store: Store, job_ids: list[int]) -> None:
    with store.session() as s:
        for j in job_ids:
            transition(s, j, JobState.PROFILING, "test: no profiling")
            transition(s, j, JobState.PENDING, "test: profiled")


def make_round(store: Store, actions: list[dict], window: dt.datetime | None = None,
               placements: list[dict] | None = None) -> int:
    """A planned round with these plan actions; ``placements``: its ``placements`` rows, each a dict of
    :class:`executors.store.models.Placement` columns (``job_id``, ``gpu_id``, ``sm_pct``, ``mem_quota_bytes``,
    ``slot``…; the predictions default to 0 and the action to ``start``)."""
    window = window or dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=15 * (os.getpid() % 10000))
    with store.session() as s:
        rnd = m.SchedulingRound(window_start_utc=window, status="planned", plan_actions=actions,
                                placements=len(placements if placements is not None else actions))
        s.add(rnd)
        s.flush()
        for p in placements or []:
            s.add(m.Placement(**{"round_id": rnd.id, "action": "start", "predicted_norm_tput": 0.0,
                                 "predicted_online_slowdown": 0.0, **p}))
        return rnd.id


def dispatch_actions(store: Store, be: SlurmBackend, actions: list[dict], window: dt.datetime) -> tuple[int, int]:
    """A planned round of ``actions`` (:func:`make_round`) dispatched by ``be`` now: (done, failed)."""
    from executors.scheduler.round_runner import stored_result

    rid = make_round(store, actions, window)
    with store.session() as s:
        res = stored_result(s, s.get(m.SchedulingRound, rid))
    return be.dispatch(store, rid, res, dt.datetime.now(dt.UTC))


def dispatch_cmd(url: str, round_id: int, retry_deadline_s: float = 60.0, state_dir: Path | None = None) -> list[str]:
    return [sys.executable, "-m", "pipelines.cli", "slurm", "dispatch", "--db", url, "--round", str(round_id),
            "--retry-deadline", str(retry_deadline_s), *(["--state-dir", str(state_dir)] if state_dir else [])]


def place_running(live, store: Store, sids: dict[str, int], gpu_of: dict[str, int], node: str,
                  share_pct: int = 20) -> dict[str, int]:
    """Pick up the held jobs ``sids`` (name → Slurm job id), dispatch each to GPU ``gpu_of[name]`` of ``node`` at
    ``share_pct``, wait until Slurm runs them all and record them RUNNING, as the job-state sync would: name →
    the store's job id."""
    from scheduler_core.domain import Action, PlanAction

    with store.session() as s:
        gpus = {(g.node.name, g.gpu_index): g.id for g in s.scalars(select(m.Gpu))}
    with live.client() as c:
        import_submissions(store, c, None, only=list(sids.values()))
    with store.session() as s:
        ids = {k: s.scalars(select(m.OfflineJob.id).where(m.OfflineJob.slurm_job_id == sid)).one()
               for k, sid in sids.items()}
    make_pending(store, list(ids.values()))
    actions = [PlanAction(Action.START, ids[k], gpus[(node, i)], None, share_pct) for k, i in gpu_of.items()]
    assert all(r.ok for r in backend(live).cluster(store).dispatch(actions, dt.datetime.now(dt.UTC)))
    with live.client() as c:
        for k, sid in sids.items():
            live.wait_job(c, sid, lambda j: j.state == "RUNNING", f"the {k} job to run", timeout_s=60)
    with store.session() as s:  # what the job-state sync does when it sees the release and the start
        for job_id in ids.values():
            transition(s, job_id, JobState.PLACED, "test: released on its planned GPU")
            transition(s, job_id, JobState.RUNNING, "test: Slurm started it")
    return ids


def node_agent_env(live, tmp: Path) -> dict[str, str]:
    """The environment a node agent of the dev cluster runs with: its Slurm, its REST socket (with a token file in
    ``tmp`` where the release's socket takes tokens: 23.11 and later), the nodes' plan key."""
    slurm = live.cluster.slurm_env(live.layout)
    env = {**os.environ, **slurm, "PATH": os.environ["PATH"] + ":" + slurm["PATH"],
           "MUXFLOW_SLURM_URL": f"unix:{live.layout.rest_socket}", "PYTHONUNBUFFERED": "1",
           "MUXFLOW_SLURM_PLAN_KEY_FILE": str(live.layout.node_plan_key_file)}
    if live.layout.root_fs:  # another release's tree: the agent's `scontrol` (requeue-hold) is that release's
        import shlex

        shim = tmp / "bin"
        shim.mkdir(exist_ok=True)
        (shim / "scontrol").write_text(f"#!/bin/sh\nexec {shlex.join(live.cluster.command(live.layout, ['scontrol']))} "
                                       '"$@"\n')
        (shim / "scontrol").chmod(0o755)
        env["PATH"] = f"{shim}:{env['PATH']}"
    rest = live.cluster.rest_settings(live.layout, "local")
    if rest.token:
        token = tmp / "agent.jwt"
        token.write_text(rest.token)
        token.chmod(0o600)
        env["MUXFLOW_SLURM_JWT_FILE"] = str(token)
    return env
