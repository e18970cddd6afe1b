"""The real loop, end to end, on a dev Slurm cluster of its own: from plain ``sbatch --gres=mps:N`` to DONE.

Identities as a site deploys them (docs/SECURITY.md): the jobs are the real non-root user ``mxuser1``'s, submitted
from a directory only ``mxuser1`` can read; MuxFlow's scheduler (the Dagster daemon and webserver) runs as the
``muxflow`` account, a Slurm Operator (not SlurmUser, not root), with its own token, plan key and store; the node
agents run as root on the nodes, as deployed. MuxFlow never runs the users' code: each job is profiled in its own
Slurm job, as ``mxuser1``.

What runs (as an operator deploys it, docs/DEPLOY.md), all real processes:

- a two-node Slurm cluster (slurmctld, two slurmd in network namespaces, slurmrestd; per-GPU gres
  Types with ``Flags=all_sharing``, job_submit.lua, Prolog/TaskProlog/Epilog);
- the feature store on PostgreSQL;
- two online reference services (``executors.job.workloads.serve``, CPU), one replica per GPU, each with
  its Prometheus endpoint registered;
- one node agent per node (``muxflow node-agent --simulated``): its GPUs are simulated, and follow
  what really runs — the Slurm jobs on each GPU at their shares, and each replica's real request rate;
- ``dagster-daemon`` (the round sensor every ``PERIOD_S`` seconds, the pick-up, profiling, job-state
  and eviction sensors) and ``dagster-webserver``;
- five reference training jobs submitted with plain ``sbatch -p offline --gres=mps:N`` as ``mxuser1``, and three
  scripts that know nothing of MuxFlow: a plain PyTorch loop and a shell program (no Python, no iterations),
  submitted with no comment at all, and a PyTorch loop that checkpoints on SIGUSR1/SIGTERM (its batch shell traps
  them), whose comment only asks for T4s.

It checks: every job is profiled in its own window, as its user; every job is placed by a round and runs on its
planned node, GPU and share with the xCUDA environment; a request burst on one replica drives its GPU to Overlimit
and the agent evicts the job there (the checkpointing plain loop) on that sample; the job is requeued, placed
again by a later round and resumes from its checkpoint (every job that checkpoints ends with the same step and
loss as an uninterrupted run); the plain scripts are profiled through the
iteration hook (the PyTorch loops) or their GPU activity (the shell program), the checkpointing one is seen to
checkpoint and the others not, and those two are never moved once placed; every job ends DONE; the SQL
reports on PostgreSQL cover the run; the Dagster UI (headless Chromium) shows a round with placements.
A summary (durations, one job's life from the audit trail, placements per round) is written to
``test-artifacts/real_loop.json``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import select

from executors.job.workloads.models import reference_job_types
from executors.store import models as m
from executors.store.db import Store
from executors.store.reports import list_reports, run_report
from tests.live.conftest import make_private_cluster
from tests.processes import Processes, processes
from tests.prometheus_helpers import free_port, query, start_prometheus, targets_up
from tests.ui.browser import number, partition_metadata, require_browser, start_webserver

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
PY = sys.executable
PERIOD_S = 20      # the round period of this deployment
SENSOR_S = 3       # sensors' minimum interval
SERVE_QPS = 8.0    # each replica's steady offered load
BURST_QPS = 400.0  # the scripted burst: far above what the simulated GPU's replica can take next to a job
# (family, steps, MPS share asked for): five reference training jobs, tiny sizes for the CPU; the first asks for
# T4s only and runs longest (about a minute on the CPU).
JOBS = [("cnn", 3000, 30), ("transformer", 1600, 25), ("recommender", 2400, 40),
        ("cnn", 700, 20), ("recommender", 2400, 30)]
PLAIN_STEPS = 3000  # the plain PyTorch loops' steps (~10 ms each)
PLAIN_TRAIN = """\
# A user's own training script: nothing of MuxFlow in it.
import json, os, signal, sys, time
import torch

steps, out = int(sys.argv[1]), sys.argv[2]
ckpt = sys.argv[3] if len(sys.argv) > 3 else None
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
start, stop = 0, []
if ckpt:
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.append(1))
for step in range(start, steps):
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(step))
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.01)
    if stop:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
        sys.exit(0)
with open(out, "w") as f:
    json.dump({"steps": steps, "loss": loss.item(), "resumed_from": start}, f)
"""
EVERY = 50         # checkpoint interval (steps)
DEADLINE_S = 480   # the whole loop, submission to every job DONE
USER = "mxuser1"   # the jobs' owner, a real non-root user
SERVICE = "muxflow"  # the account MuxFlow's scheduler runs as: a Slurm Operator


def _env(extra: dict) -> dict:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}


def _cli(env: dict, *args: str, timeout_s: float = 180) -> str:
    out = subprocess.run([PY, "-m", "pipelines.cli", *args], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=timeout_s)
    assert out.returncode == 0, f"muxflow {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _poll(what: str, check, timeout_s: float, procs: Processes, interval_s: float = 0.5, describe=None):
    end = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < end:
        dead = procs.dead()
        if dead:
            pytest.fail(f"while waiting for {what}, a process died:\n" + "\n".join(dead), pytrace=False)
        last = check()
        if last:
            return last
        time.sleep(interval_s)
    logs = "\n".join(f"--- {p.name}\n{p.log_tail(2500)}" for p in procs.procs
                     if p.name.startswith(("dagster-daemon", "node-agent")))
    state = f"\n--- state\n{describe()}" if describe else ""
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r}){state}\n{logs}", pytrace=False)


def _no_job_failed(store: Store, rows: dict, procs: Processes) -> None:
    """Fail, with each failed job's reason, its profiling runs and the daemon's log, if any job is FAILED."""
    failed = {sid: j for sid, j in rows.items() if j.state == "FAILED"}
    if not failed:
        return
    with store.session() as s:
        runs = {sid: [(r.gpu_type, r.state, r.slurm_job_id, r.reason) for r in s.scalars(
            select(m.ProfilingRun).where(m.ProfilingRun.job_id == j.id).order_by(m.ProfilingRun.id))]
            for sid, j in failed.items()}
    lines = [f"Slurm job {sid}: {j.state_reason!r}; profiling runs (type, state, Slurm id, reason): {runs[sid]}"
             for sid, j in failed.items()]
    logs = "\n".join(f"--- {p.name}\n{p.log_tail(2500)}" for p in procs.procs if p.name.startswith("dagster-daemon"))
    pytest.fail("jobs FAILED before they were placed:\n" + "\n".join(lines) + "\n" + logs, pytrace=False)


ENV_RECORDED = "|".join(("CUDA_[A-Z_]*", "LD_PRELOAD", "XCUDA_[A-Z_]*", "MUXFLOW_PLANNED_GPU", "MUXFLOW_PROFILING_RUN",
                         "MUXFLOW_ITERATION_REPORT", "SLURMD_NODENAME", "SLURM_JOB_ID", "SLURM_RESTART_COUNT",
                         "PYTHONPATH"))


def _record_env(d: Path) -> str:
    """The script's first lines: where (and as whom) this start of the job runs, into a file of the user's."""
    return f"""{{ env | grep -E '^({ENV_RECORDED})=' || true; echo UID=$(id -u); }} \\
  > {d}/.env-$SLURM_JOB_ID && mv {d}/.env-$SLURM_JOB_ID {d}/env-$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}
"""


def _users_file(path: Path, text: str, mode: int = 0o700) -> Path:
    path.write_text(text)
    pw = pwd.getpwnam(USER)
    os.chown(path, pw.pw_uid, pw.pw_gid)
    path.chmod(mode)
    return path


def _job_script(d: Path, k: int, family: str, steps: int) -> Path:
    """What a user writes: print where (and as whom) it runs, then train (checkpointing on SIGTERM/SIGUSR1,
    resuming). The script and everything it writes are the user's alone."""
    return _users_file(d / f"train-{k}.sh", f"""#!/bin/bash
set -e
{_record_env(d)}cd {REPO}
exec {PY} -m executors.job.workloads.train --family {family} --size tiny --steps {steps} --every {EVERY} \\
  --ckpt {d}/ckpt-{k} --out {d}/result-$SLURM_JOB_ID.json --threads 1
""")


def _plain_scripts(d: Path) -> dict[str, Path]:
    """Scripts that know nothing of MuxFlow: a PyTorch loop run by bash as a child (no checkpoint), the same loop
    checkpointing on SIGUSR1/SIGTERM (its shell ignores them, so that it outlives the program's checkpoint), and
    a shell program (no Python: no iterations to count; it works for 30 s, which on a simulated GPU is what stands
    for GPU work, and restarts from the beginning when moved)."""
    _users_file(d / "plain_train.py", PLAIN_TRAIN, 0o600)
    return {
        "torch-loop": _users_file(d / "plain-loop.sh", f"""#!/bin/bash
{_record_env(d)}{PY} {d}/plain_train.py {PLAIN_STEPS} {d}/result-$SLURM_JOB_ID.json
"""),
        "torch-ckpt": _users_file(d / "plain-ckpt.sh", f"""#!/bin/bash
#SBATCH --comment="muxflow: gpu-types=t4"
trap '' USR1 TERM
{_record_env(d)}{PY} {d}/plain_train.py {PLAIN_STEPS} {d}/result-$SLURM_JOB_ID.json {d}/plain.ckpt
"""),
        "shell": _users_file(d / "plain-shell.sh", f"""#!/bin/bash
{_record_env(d)}end=$((SECONDS + 30)); while [ "$SECONDS" -lt "$end" ]; do :; done  # 30 s of work, no iterations
echo '{{"done": true}}' > {d}/result-$SLURM_JOB_ID.json
"""),
    }


def _plain_reference(d: Path) -> subprocess.Popen:
    """The plain PyTorch loop run through, uninterrupted and without MuxFlow: what both plain loops must end with."""
    (d / "plain_train.py").write_text(PLAIN_TRAIN)
    return subprocess.Popen([PY, str(d / "plain_train.py"), str(PLAIN_STEPS), str(d / "plain-ref.json")], cwd=d)


def _starts(work: Path, sid: int) -> list[dict[str, str]]:
    """Every start of a job, in order: the environment (and uid) each start of its script recorded."""
    files = sorted(work.glob(f"env-{sid}-*"), key=lambda f: int(f.name.rsplit("-", 1)[1]))
    return [dict(line.split("=", 1) for line in f.read_text().splitlines() if "=" in line) for f in files]


def _placed_starts(work: Path, sid: int) -> list[dict[str, str]]:
    """The starts on a placement (a profiling window's start carries MUXFLOW_PROFILING_RUN)."""
    return [e for e in _starts(work, sid) if "MUXFLOW_PROFILING_RUN" not in e]


def _service_home() -> Path:
    """A directory of MuxFlow's account alone (its Dagster home, settings and reports): mode 0700, its own."""
    pw = pwd.getpwnam(SERVICE)
    home = Path(tempfile.mkdtemp(prefix="muxflow-e2e-", dir="/tmp"))
    os.chown(home, pw.pw_uid, pw.pw_gid)
    home.chmod(0o700)
    return home


def _give(path: Path, user: str) -> None:
    """``path`` and everything under it to ``user`` (what root prepared for a service account)."""
    pw = pwd.getpwnam(user)
    for p in [path, *path.rglob("*")]:
        os.lchown(p, pw.pw_uid, pw.pw_gid)


def _reference_results(jobs: list[tuple[str, int, int]], d: Path) -> dict[tuple[str, int], dict]:
    """Each job's result when nothing interrupts it (same code, same seed, in this process)."""
    from executors.job.workloads.train import train

    out = {}
    for family, steps, _ in jobs:
        if (family, steps) not in out:
            out[(family, steps)] = train(family, "tiny", str(d / f"ref-{family}-{steps}"), steps, every=EVERY)
    return out


def test_real_loop_end_to_end_from_sbatch_to_done(dev_cluster, make_postgres_database, tmp_path: Path) -> None:
    require_browser()
    t0 = time.monotonic()
    timeline: dict[str, float] = {}
    db = make_postgres_database()
    with make_private_cluster() as live, processes(tmp_path) as procs:
        lay = live.layout
        work = live.user_dir("real-loop", USER)  # the user's scripts, output, checkpoints: theirs alone (0700)
        slurm_env = {"SLURM_CONF": str(lay.slurm_conf)}
        env = _env({**slurm_env, "MUXFLOW_DATABASE_URL": db, "MUXFLOW_SLURM_URL": f"unix:{lay.rest_socket}"})
        store = Store(db)

        # -- the operator: store, nodes, predictors ------------------------------------------------
        _cli(env, "db", "upgrade")
        _cli(env, "slurm", "register-nodes", "--state-dir", str(lay.state_dir))
        with store.session() as s:
            gpus = {(g.node.name, g.gpu_index): (g.id, g.gpu_type) for g in s.scalars(select(m.Gpu))}
        assert len(gpus) == 8, gpus
        gpus_by_id = {gid: key for key, (gid, _) in gpus.items()}

        # -- two online services, one replica (and endpoint) per GPU -----------------------------------
        services = {"svc-vision": ("cnn", "mx-t4-1"), "svc-recsys": ("recommender", "mx-a10-1")}
        ready: dict[int, Path] = {}
        for svc, (family, node) in services.items():
            for index in range(4):
                gid = gpus[(node, index)][0]
                ready[gid] = tmp_path / f"ready-{gid}.json"
                procs.start(f"serve-{gid}", [PY, "-m", "executors.job.workloads.serve", "--family", family, "--size",
                                             "tiny", "--qps", str(SERVE_QPS), "--metrics-port", "0", "--threads", "1",
                                             "--ready", str(ready[gid]), "--seed", str(gid)], env=env, cwd=REPO)
        replicas: dict[int, str] = {}  # GPU id → endpoint base URL
        for gid, path in ready.items():
            info = _poll(f"replica on GPU {gid} ready", lambda r=path: r.exists() and json.loads(r.read_text()), 90,
                         procs)
            replicas[gid] = info["metrics_url"].rsplit("/metrics", 1)[0]
        for svc, (family, node) in services.items():
            ids = [gpus[(node, index)][0] for index in range(4)]
            # The vision service keeps a slowdown budget over its requests (each minute within a 0.3 cap); the
            # recommender the paper's flat rule, +20 % on every minute.
            budget = (["--allowance", "0.3", "--slowdown-budget", "0.25"] if svc == "svc-vision"
                      else ["--allowance", "0.2", "--slowdown-budget", "none"])
            _cli(env, "online", "register", "--name", svc, "--family", family, "--qps-min", "5", "--qps-max", "40",
                 "--mem", "2GiB", "--gpu-ids", ",".join(map(str, ids)), *budget,
                 *[a for gid in ids for a in ("--endpoint", f"{gid}={replicas[gid]}/metrics")])
        _cli(env, "sample", "--per-type", "400")
        _cli(env, "train", "--epochs", "40")
        timeline["setup_s"] = time.monotonic() - t0

        # -- the node agents: simulated GPUs that follow Slurm's jobs and the replicas' real load -------
        # This site's SysMonitor thresholds on SM activity (the operator's choice, docs/NODE_AGENT.md): a job
        # alone stays below Healthy's 70 % (the model's busiest reference job at its largest share, next to
        # a replica at SERVE_QPS, is ~66 %); a replica at full load next to any job passes Overlimit's 80 %.
        thresholds = tmp_path / "sysmonitor.toml"
        thresholds.write_text("[healthy]\nsm_activity_pct = 70\n[unhealthy]\nsm_activity_pct = 75\n"
                              "[overlimit]\nsm_activity_pct = 80\n")
        # root on the nodes, as deployed, with the nodes' copy of the plan key
        agent_env = {**env, "MUXFLOW_SLURM_PLAN_KEY_FILE": str(lay.node_plan_key_file)}
        metrics_ports = {node: free_port() for node in ("mx-t4-1", "mx-a10-1", "scheduler")}
        for node in ("mx-t4-1", "mx-a10-1"):
            procs.start(f"node-agent-{node}", [
                PY, "-m", "pipelines.cli", "--db", db, "node-agent", "--node", node, "--simulated",
                "--evict", "scontrol", "--placements", "slurm", "--interval-ms", "100", "--no-shm",
                "--scrape-interval", "1", "--placement-poll", "1", "--partial-every", "3",
                "--sysmonitor-config", str(thresholds),
                # a requeued job placed again on its node may start without its Prolog: the agent runs it
                "--prolog", str(lay.node_script_dir / "prolog.sh"), "--plan-dir", str(lay.plan_dir),
                # the profiling windows of this node: measured into their runs' rows
                "--job-dir", str(lay.job_state_dir),
                # what Prometheus scrapes (below)
                "--metrics-port", str(metrics_ports[node]), "--metrics-host", "127.0.0.1"], env=agent_env, cwd=REPO)
        # -- Prometheus: the node agents and the scheduler's endpoint, scraped every second; MuxFlow's alert rules
        procs.start("metrics-serve", [PY, "-m", "pipelines.cli", "--db", db, "metrics", "serve", "--port",
                                      str(metrics_ports["scheduler"]), "--host", "127.0.0.1"], env=env, cwd=REPO)
        prom = start_prometheus(procs, tmp_path / "prometheus", {
            "muxflow-node-agent": [f"127.0.0.1:{metrics_ports[n]}" for n in ("mx-t4-1", "mx-a10-1")],
            "muxflow-scheduler": [f"127.0.0.1:{metrics_ports['scheduler']}"]})

        # -- Dagster: daemon (rounds every PERIOD_S, sensors) and webserver, as MuxFlow's own account ---------
        # Its Slurm identity is an Operator (its token, its plan key, the reference account's token for its own
        # workloads: dev-up's files under <state>/muxflow, its alone); it can neither read a user's files nor act
        # as SlurmUser or root.
        service_home = _service_home()
        home = service_home / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())  # SQLite storage in the home
        today = dt.datetime.now(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
        (home / "muxflow.json").write_text(json.dumps({
            "db_url": db, "cluster": "slurm", "slurm_url": lay.rest_url, "slurm_jwt_file": str(lay.muxflow_jwt_file),
            "slurm_plan_key_file": str(lay.plan_key_file), "slurm_reference_jwt_file": str(lay.reference_jwt_file),
            "slurm_conf": str(lay.slurm_conf), "round_period_s": PERIOD_S, "sensor_interval_s": SENSOR_S,
            "sensors_running": True, "rounds_start": today.isoformat(), "gpu_types": ["a10", "t4"],
            "report_dir": str(service_home / "report"),
            # a window closes after its iterations, or after 20 s for a job that reports none (the shell program)
            "profiling": {"poll_s": 0.5, "profile_seconds": 20},
        }))
        (home / "muxflow.json").chmod(0o600)
        dagster_env = _env({**slurm_env, "DAGSTER_HOME": str(home), "MUXFLOW_SETTINGS": str(home / "muxflow.json"),
                            "HOME": str(service_home)})
        for k in ("MUXFLOW_SLURM_URL", "MUXFLOW_DATABASE_URL", "SLURM_JWT"):
            dagster_env.pop(k, None)  # the settings file is the service's whole configuration
        from dagster import DagsterInstance

        with DagsterInstance.from_config(str(home)):
            pass  # create the instance's storage once: the daemon and the webserver would race to
        _give(service_home, SERVICE)
        procs.start("dagster-daemon", [str(Path(PY).parent / "dagster-daemon"), "run", "-w",
                                       str(REPO / "workspace.yaml")], env=dagster_env, cwd=REPO, user=SERVICE)
        _server, ui_url = start_webserver(procs, dagster_env, user=SERVICE)

        # -- the users: plain sbatch --------------------------------------------------------------------
        t_submit = time.monotonic()
        sids: dict[int, tuple[str, int, int]] = {}
        ckpt_of: dict[int, Path] = {}
        for k, (family, steps, share) in enumerate(JOBS):
            script = _job_script(work, k, family, steps)
            # Four jobs name the reference job type they stand for; two are unlabelled training scripts.
            label = f"type='{reference_job_types()[(family, 'tiny')]}' " if k < 4 else ""
            types = "t4" if k == 0 else "t4,a10"
            comment = f"muxflow: {label}mem=1GiB gpu-types={types} ckpt={work}/ckpt-{k} steps={steps}"
            out = subprocess.run(["runuser", "-u", USER, "--", "sbatch", "-p", "offline", f"--gres=mps:{share}", "-J",
                                  f"train-{k}", "-o", str(work / f"out-%j-{k}.txt"), f"--comment={comment}",
                                  str(script)], env=_env(slurm_env), capture_output=True, text=True, timeout=30,
                                 cwd="/tmp")
            assert out.returncode == 0, out.stderr
            sid = int(out.stdout.split()[-1])
            sids[sid] = (family, steps, share)
            ckpt_of[sid] = work / f"ckpt-{k}"
        # ... and three scripts that know nothing of MuxFlow, with no comment: everything is learnt by profiling
        plain: dict[str, int] = {}
        for name, script in _plain_scripts(work).items():
            out = subprocess.run(["runuser", "-u", USER, "--", "sbatch", "-p", "offline", "--gres=mps:30", "-J",
                                  f"plain-{name}", "-o", str(work / f"out-%j-{name}.txt"), str(script)],
                                 env=_env(slurm_env), capture_output=True, text=True, timeout=30, cwd="/tmp")
            assert out.returncode == 0, out.stderr
            plain[name] = int(out.stdout.split()[-1])
        all_sids = [*sids, *plain.values()]

        def job_rows() -> dict[int, m.OfflineJob]:
            with store.session() as s:
                return {j.slurm_job_id: j for j in s.scalars(select(m.OfflineJob)
                                                             .where(m.OfflineJob.slurm_job_id.in_(all_sids)))}

        # -- a burst on one replica: Overlimit, eviction on that sample, requeue ------------------------
        # The victim is the checkpointing plain loop (T4s only: the vision service's GPUs), once it runs placed
        # with a checkpoint (the one its profiling window's requeue left).
        # On a cnn replica's GPU (T4): the simulated T4 reaches the cnn service's full load at ~195 QPS, which
        # the replica serves on the CPU; the recommender service's A10 capacity (~490 QPS) it could not.
        vision = {gid for gid in replicas if gpus_by_id[gid][0] == "mx-t4-1"}

        ckpt_of[plain["torch-ckpt"]] = work / "plain.ckpt"

        def checkpoints(sid: int) -> int | None:
            ckpt = ckpt_of.get(sid)
            return None if ckpt is None else int(ckpt.is_file()) if ckpt.suffix else len(list(ckpt.glob("*.mxck")))

        def victim() -> tuple[int, int] | None:
            for sid in [plain["torch-ckpt"]]:
                if checkpoints(sid) and not (work / f"result-{sid}.json").exists():
                    with store.session() as s:
                        job = s.scalars(select(m.OfflineJob).where(m.OfflineJob.slurm_job_id == sid)).one()
                        if job.state != "RUNNING":
                            continue
                        p = s.scalars(select(m.Placement).where(m.Placement.job_id == job.id)
                                      .order_by(m.Placement.round_id.desc())).first()
                        # where its latest start really runs (a later round may be moving it meanwhile)
                        if p.gpu_id in vision and running_on(sid) == p.gpu_id:
                            return sid, p.gpu_id
            return None

        def running_on(sid: int) -> int | None:
            """The GPU the job's latest start ran on, from the environment its script recorded."""
            starts = _starts(work, sid)
            if not starts or "MUXFLOW_PROFILING_RUN" in starts[-1]:
                return None
            seen = starts[-1]
            return gpus.get((seen.get("SLURMD_NODENAME"), int(seen.get("CUDA_VISIBLE_DEVICES", "-1"))), (None,))[0]

        def where_jobs_run() -> str:
            with store.session() as s:
                out = []
                for j in s.scalars(select(m.OfflineJob).where(m.OfflineJob.slurm_job_id.in_(all_sids))):
                    p = s.scalars(select(m.Placement).where(m.Placement.job_id == j.id)
                                  .order_by(m.Placement.round_id.desc())).first()
                    out.append((j.slurm_job_id, j.state, p and p.gpu_id, checkpoints(j.slurm_job_id)))
            return f"jobs (slurm id, state, GPU, checkpoints): {out}; T4 replicas' GPUs: {sorted(vision)}"

        vsid, vgpu = _poll("a running job with a checkpoint", victim, 240, procs, describe=where_jobs_run)
        vjob = job_rows()[vsid].id
        with store.session() as s:
            vplace = s.scalars(select(m.Placement).where(m.Placement.job_id == vjob)
                               .order_by(m.Placement.round_id.desc())).first()
            vquota = vplace.mem_quota_bytes
            vnode, vindex = s.get(m.Gpu, vgpu).node.name, s.get(m.Gpu, vgpu).gpu_index
        t_burst = time.monotonic()
        _post_load(replicas[vgpu], BURST_QPS)

        def evicted():
            with store.session() as s:
                ev = s.scalars(select(m.Eviction).where(m.Eviction.job_id == vjob)).first()
                return (ev.at_utc, ev.reason, s.get(m.Gpu, vgpu).health, s.get(m.Gpu, vgpu).health_since_utc) \
                    if ev else None

        ev_at, ev_reason, health, health_since = _poll(f"job {vjob} evicted from GPU {vgpu}", evicted, 90, procs)
        timeline["eviction_after_burst_s"] = time.monotonic() - t_burst
        _post_load(replicas[vgpu], SERVE_QPS)
        # what every job must end with: the same code run through here, uninterrupted (after the burst: the victim
        # is a job of half a minute, which this machine's two cores would otherwise let finish first)
        plain_ref = _plain_reference(tmp_path)
        refs = _reference_results(JOBS, tmp_path)
        assert "Overlimit" in ev_reason, ev_reason
        # On the sample that entered Overlimit: the GPU's health changed at the eviction's instant.
        assert health == "Overlimit" and health_since == ev_at, (health, health_since, ev_at)
        _poll(f"Slurm job {vsid} requeued held", lambda: (j := _slurm_job(live, vsid)).state == "PENDING"
              or j.restart_count > 0, 60, procs)
        with store.session() as s:  # a round may have re-shared the victim since: any share its rounds gave it
            vshares = set(s.scalars(select(m.Placement.sm_pct).where(m.Placement.job_id == vjob)))
        prom_answers = _prometheus_saw_it(prom, procs, vsid, vjob, vshares, vquota, vnode, vindex)

        # -- every job profiled in its own Slurm job (meanwhile: the first ones were placed while others profiled)
        _poll("every job picked up and profiled", lambda: len(rows := job_rows()) == len(all_sids) and all(
            j.state not in ("SUBMITTED", "PROFILING") for j in rows.values()) and rows, 240, procs)
        rows = job_rows()
        _no_job_failed(store, rows, procs)
        timeline["profiled_s"] = time.monotonic() - t_submit
        # each job was profiled in its own Slurm job, in a window per GPU type it may use, as its user
        uid = str(pwd.getpwnam(USER).pw_uid)
        with store.session() as s:
            for sid, j in rows.items():
                runs = list(s.scalars(select(m.ProfilingRun).where(m.ProfilingRun.job_id == j.id)))
                assert {r.slurm_job_id for r in runs} == {sid} and all(r.state == "done" for r in runs), runs
                assert {r.gpu_type for r in runs} == set(j.allowed_gpu_types), (sid, runs)
                windows = [e for e in _starts(work, sid) if "MUXFLOW_PROFILING_RUN" in e]
                assert {int(e["MUXFLOW_PROFILING_RUN"]) for e in windows} == {r.id for r in runs}, (sid, windows)
                assert all(e["UID"] == uid for e in windows), windows

        # -- every job placed by a round, its first start where the round put it -----------------------
        def started() -> dict[int, dict[str, str]] | None:
            found = {sid: next(iter(_placed_starts(work, sid)), None) for sid in all_sids}
            return found if all(found.values()) else None

        def why_not() -> str:
            with store.session() as s:
                jobs = [(j.slurm_job_id, j.state, j.state_reason) for j in s.scalars(
                    select(m.OfflineJob).where(m.OfflineJob.slurm_job_id.in_(all_sids)))]
                rounds = [(r.window_start_utc.isoformat(), r.status, r.gpus_considered, r.jobs_pending,
                           r.feasible_pairs, r.placements) for r in s.scalars(
                    select(m.SchedulingRound).order_by(m.SchedulingRound.id.desc()).limit(3))]
            return f"jobs (slurm id, state, reason): {jobs}\nlast rounds (window, status, gpus, jobs, pairs, placed): {rounds}"

        envs = _poll("every job started on its planned GPU", started, 240, procs, describe=why_not)
        timeline["all_started_s"] = time.monotonic() - t_submit
        with store.session() as s:
            for sid, seen in envs.items():
                job = rows[sid]
                assert seen["UID"] == uid, (sid, seen)  # the placed job runs as its user too
                first = s.scalars(select(m.JobTransition).where(m.JobTransition.job_id == job.id,
                                                                m.JobTransition.to_state == "PLACED")
                                  .order_by(m.JobTransition.id)).first()
                assert first is not None and first.reason.startswith("placed on GPU"), (sid, first)
                placement = s.scalars(select(m.Placement).where(m.Placement.job_id == job.id)
                                      .order_by(m.Placement.round_id)).first()
                gpu = s.get(m.Gpu, placement.gpu_id)
                ctx = f"Slurm job {sid}: {seen} vs placement GPU {gpu.node.name}:{gpu.gpu_index} at {placement.sm_pct}%"
                assert seen["SLURMD_NODENAME"] == gpu.node.name, ctx
                assert seen["CUDA_VISIBLE_DEVICES"] == seen["XCUDA_GPU_INDEX"] == str(gpu.gpu_index), ctx
                assert seen["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(placement.sm_pct), ctx
                assert seen["LD_PRELOAD"].endswith("libxcuda.so") and Path(seen["LD_PRELOAD"]).is_file(), ctx
                assert int(seen["XCUDA_MEM_QUOTA_BYTES"]) == placement.mem_quota_bytes, ctx
                assert {"XCUDA_KP", "XCUDA_KI", "XCUDA_KD"} <= set(seen), ctx

        # -- every job DONE; the victim placed again by a later round and resumed ------------------------
        _poll("every job DONE", lambda: all(j.state == "DONE" for j in job_rows().values()),
              DEADLINE_S - (time.monotonic() - t_submit), procs, interval_s=1.0)
        timeline["all_done_s"] = time.monotonic() - t_submit
        for sid, (family, steps, _) in sids.items():
            result = json.loads((work / f"result-{sid}.json").read_text())
            assert result == refs[(family, steps)], (sid, result, refs[(family, steps)])
        plain_summary = _plain_jobs_learnt_and_kept(store, work, plain, plain_ref, tmp_path)
        with store.session() as s:
            life = [(t.from_state, t.to_state, t.at_utc.isoformat(), t.reason) for t in s.scalars(
                select(m.JobTransition).where(m.JobTransition.job_id == vjob).order_by(m.JobTransition.id))]
            placements = s.scalars(select(m.Placement).where(m.Placement.job_id == vjob)
                                   .order_by(m.Placement.round_id)).all()
            rounds = s.scalars(select(m.SchedulingRound).order_by(m.SchedulingRound.id)).all()
            per_round = [(r.id, r.window_start_utc.isoformat(), r.placements, dict(r.action_counts), r.seq)
                         for r in rounds]
            allowances = [(g["service_name"], g["slowdown_allowance"]) for r in rounds for g in r.snapshot["gpus"]]
            paced = [((r.snapshot.get("budget_pacing") or {}).get("svc-vision"),
                      [g["slowdown_allowance"] for g in r.snapshot["gpus"] if g["service_name"] == "svc-vision"])
                     for r in rounds if r.seq == 0]
        states = [(a, b) for a, b, _, _ in life]
        times = [t for _, _, t, _ in life]
        assert times == sorted(times), f"the audit trail is in time order: {life}"
        assert ("RUNNING", "EVICTED") in states and ("EVICTED", "PENDING") in states, life
        again = states.index(("EVICTED", "PENDING"))
        assert ("PENDING", "PLACED") in states[again:] and states[-1] == ("RUNNING", "DONE"), life
        assert len({p.round_id for p in placements}) >= 2, "the victim was placed again by a later round"
        assert len(_placed_starts(work, vsid)) >= 2, "the victim ran again"
        # The budgeted service's replicas were planned within their cap, each round at its budget as paced (up to
        # the cap while the cluster has headroom) and below the cap where the paced budget is under it and their
        # load weighs (its water level, from the replicas' own load; a quiet minute may take the whole cap); the
        # other service's at its flat allowance.
        shaped = [a for name, a in allowances if name == "svc-vision"]
        assert shaped and all(0.0 <= a <= 0.3 for a in shaped), allowances
        assert paced and all(p is not None for p, _ in paced), paced
        for pace, got in paced:
            # (k and the budget are both recorded to 6 decimals)
            assert 0.25 <= pace["k"] <= 1.2, paced
            assert pace["budget"] == pytest.approx(min(0.3, 0.25 * pace["k"]), abs=2e-6), paced
            if pace["budget"] < 0.3 - 1e-9 and got:
                assert any(a < 0.3 for a in got), paced
        assert all(a == 0.2 for name, a in allowances if name == "svc-recsys"), allowances

        # -- the SQL reports on PostgreSQL cover the run --------------------------------------------------
        reports = {r.name: run_report(store.engine, r.name) for r in list_reports()}
        util = reports["utilization_per_hour"]
        assert len(util) and util["shared_minutes"].sum() > 0, util
        over = reports["oversold_per_round"]
        assert (over["placements"] > 0).any(), over
        evictions = reports["evictions_per_day"]
        assert evictions["evictions"].sum() >= 1, evictions
        latency = reports["online_latency_per_day"]  # what the budgeted service's requests saw, beside its budget
        vision = latency[latency["service"] == "svc-vision"]
        assert len(vision) and vision["requests"].sum() > 0, latency
        assert (vision["slowdown_budget"] == 0.25).all() and (vision["slowdown_allowance"] == 0.3).all(), latency

        # -- the Dagster UI shows a round with placements ----------------------------------------------
        # A window's round (seq 0), not one of its fills: the UI's partitions are the rounds' (a fill is a run of
        # fill_job), and the first placements of a window are often a fill's.
        first_round = next(r for r in per_round if r[2] > 0 and r[4] == 0)
        from scheduler_core.round.clock import RoundClock

        key = RoundClock(PERIOD_S).key(dt.datetime.fromisoformat(first_round[1]).replace(tzinfo=dt.timezone.utc))
        text, shown = partition_metadata(ui_url, "placement_plan", key, ("round_id", "placements"),
                                         ARTIFACTS / "real_loop_placement_plan.png", 60)
        assert int(number(shown["round_id"])) == first_round[0] and int(number(shown["placements"])) > 0, shown

        timeline["total_s"] = time.monotonic() - t0
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "real_loop.json").write_text(json.dumps({
            "timeline_s": {k: round(v, 1) for k, v in timeline.items()},
            "victim": {"slurm_job_id": vsid, "store_job_id": vjob, "life": life},
            "rounds": per_round, "reports": sorted(reports), "plain_jobs": plain_summary,
            "prometheus": {**prom_answers, "at_the_end": _prometheus_at_the_end(prom, all_sids)},
        }, indent=2, default=str))
        with live.client() as c:
            for sid in all_sids:
                j = c.get_job(sid)
                assert j.state == "COMPLETED" and j.user_name == USER
            # MuxFlow submitted nothing of its own for the users' jobs (no profiling copy, no wrapper job)
            assert not [j for j in c.list_jobs() if j.user_name == SERVICE]
        shutil.rmtree(service_home, ignore_errors=True)


def _prometheus_saw_it(prom: str, procs: Processes, vsid: int, vjob: int, shares: set[int], quota: int, node: str,
                       index: int) -> dict:
    """What a real Prometheus scraped from the node agents while the victim ran, was evicted and requeued: the
    victim's series with its Slurm job id, owner, share and quota, its eviction, and the Overlimit alert firing on
    its GPU (each PromQL answer returned, for the run's summary)."""
    job = f'hpc_job="{vsid}",job_id="{vjob}",node="{node}",gpu="{index}",user="{USER}"'
    questions = {
        "share": f"last_over_time(muxflow_job_sm_share_ratio{{{job}}}[15m])",  # its share when evicted
        "quota": f"last_over_time(muxflow_job_memory_quota_bytes{{{job}}}[15m])",
        "evictions": f'max_over_time(muxflow_job_evictions_total{{hpc_job="{vsid}",node="{node}"}}[15m])',
        "gpu_evictions": f'max_over_time(muxflow_gpu_evictions_total{{node="{node}",gpu="{index}"}}[15m])',
        "overlimit_alert": f'max_over_time(ALERTS{{alertname="MuxflowGpuOverlimit",alertstate="firing",'
                           f'node="{node}",gpu="{index}"}}[15m])',
        "scheduler_up": "max_over_time(muxflow_scheduler_store_up[15m])",
    }
    answers: dict[str, float] = {}

    def ask() -> bool:
        for name, q in questions.items():
            res = query(prom, q)
            if res:
                answers[name] = float(res[0]["value"][1])
        return set(answers) == set(questions) and answers["evictions"] >= 1 and answers["overlimit_alert"] == 1

    any_share = 'last_over_time(muxflow_job_sm_share_ratio{hpc_job="%d"}[15m])' % vsid
    _poll("Prometheus to have the victim's series, its eviction and the Overlimit alert", ask, 60, procs,
          describe=lambda: f"answers so far: {answers}; targets: {targets_up(prom)}; the victim's series: "
                           f"{query(prom, any_share)}")
    # The share in force when it was evicted: the plan of one of its rounds (the round just before the burst may
    # have re-shared it, and its re-dispatch may not have landed when the agent saw the burst).
    assert any(answers["share"] == pytest.approx(p / 100) for p in shares) and answers["quota"] == quota, \
        (answers, shares, quota)
    assert answers["gpu_evictions"] >= 1 and answers["scheduler_up"] == 1, answers
    assert set(targets_up(prom).values()) == {"up"}, targets_up(prom)
    return {"questions": questions, "answers": answers}


def _prometheus_at_the_end(prom: str, sids: list[int]) -> dict:
    """The scheduler's figures as Prometheus has them once every job is DONE."""
    done = query(prom, 'muxflow_jobs{state="DONE"}')
    assert done and float(done[0]["value"][1]) >= len(sids), done
    rounds = query(prom, "sum(muxflow_rounds_total)")
    assert rounds and float(rounds[0]["value"][1]) >= 2, rounds
    placed = query(prom, "max_over_time(muxflow_round_last_placements[30m])")
    assert any(float(r["value"][1]) > 0 for r in placed), placed
    return {"jobs_done": float(done[0]["value"][1]), "rounds": float(rounds[0]["value"][1]),
            "placements_by_action": {r["metric"]["action"]: float(r["value"][1]) for r in placed}}


def _post_load(base_url: str, qps: float) -> None:
    req = urllib.request.Request(f"{base_url}/load", data=json.dumps({"qps": qps}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


def _slurm_job(live, sid: int):
    with live.client() as c:
        return c.get_job(sid)


def _plain_jobs_learnt_and_kept(store: Store, work: Path, plain: dict[str, int], ref: subprocess.Popen,
                                tmp: Path) -> dict:
    """What profiling learnt of the scripts that declared nothing, and what the rounds did with it (returned: each
    one's profiles and life, for the run's summary)."""
    assert ref.wait(timeout=120) == 0
    expected = json.loads((tmp / "plain-ref.json").read_text())
    summary = {}
    with store.session() as s:
        for name, sid in plain.items():
            job = s.scalars(select(m.OfflineJob).where(m.OfflineJob.slurm_job_id == sid)).one()
            profiles = s.scalars(select(m.JobProfile).where(m.JobProfile.job_id == job.id)).all()
            runs = s.scalars(select(m.ProfilingRun).where(m.ProfilingRun.job_id == job.id)).all()
            out_file = work / f"out-{sid}-{name}.txt"
            ctx = (name, sid, job.state, job.checkpointing, [(p.gpu_type, p.progress_signal) for p in profiles],
                   [(r.gpu_type, r.state, (r.report or {}).get("elapsed_s"), (r.report or {}).get("iteration_report"),
                     (r.report or {}).get("report_error")) for r in runs],
                   [e for e in _starts(work, sid) if "MUXFLOW_PROFILING_RUN" in e],
                   out_file.read_text(errors="replace")[-1500:] if out_file.exists() else "(no output file)")
            assert job.state == "DONE" and job.total_steps is None, ctx
            types = {"t4"} if name == "torch-ckpt" else {"a10", "t4"}  # else every type of the cluster
            assert set(job.allowed_gpu_types) == types, ctx
            assert job.mem_bytes and job.mem_bytes >= max(p.mem_used_bytes for p in profiles), ctx  # from its peak
            signal = "gpu-activity" if name == "shell" else "optimizer-step"
            assert {p.gpu_type for p in profiles} == types, ctx
            assert all(p.progress_signal == signal for p in profiles), ctx
            assert job.checkpointing == ("detected" if name == "torch-ckpt" else "undetected"), ctx
            placed = s.scalars(select(m.Placement).where(m.Placement.job_id == job.id)
                               .order_by(m.Placement.round_id)).all()
            gpus = {p.gpu_id for p in placed}
            if name != "torch-ckpt":
                # It would lose its progress if moved: no round moves it. Only a node agent's eviction (the service
                # comes first; a burst can reach any GPU) restarts it, where the next round puts it.
                evictions = len(s.scalars(select(m.Eviction).where(m.Eviction.job_id == job.id)).all())
                why = (evictions, ctx, [(p.round_id, p.gpu_id, p.action, p.sm_pct) for p in placed],
                       _placed_starts(work, sid),
                       [(tr.from_state, tr.to_state, tr.reason) for tr in s.scalars(
                           select(m.JobTransition).where(m.JobTransition.job_id == job.id)
                           .order_by(m.JobTransition.id))],
                       [(r.id, [(g["gpu_id"], g["health"]) for g in r.snapshot["gpus"]
                                if g["gpu_id"] in gpus]) for r in s.scalars(select(m.SchedulingRound)
                                                                             .order_by(m.SchedulingRound.id))])
                assert not [p for p in placed if p.action == "migrate"], why
                assert len(gpus) <= 1 + evictions and len(_placed_starts(work, sid)) == 1 + evictions, why
            summary[name] = {
                "slurm_job_id": sid, "mem_bytes": job.mem_bytes, "checkpointing": job.checkpointing,
                "profiles": [{"gpu_type": p.gpu_type, "signal": p.progress_signal, "iterations": p.iterations,
                              "iter_time_s": p.iter_time_s, "measured_iter_time_s": p.measured_iter_time_s,
                              "profiling_s": p.profiling_s, "source": p.source} for p in profiles],
                "life": [(tr.from_state, tr.to_state, tr.at_utc.isoformat(), tr.reason) for tr in s.scalars(
                    select(m.JobTransition).where(m.JobTransition.job_id == job.id).order_by(m.JobTransition.id))],
                "gpus": sorted(gpus)}
    for name in ("torch-loop", "torch-ckpt"):
        got = json.loads((work / f"result-{plain[name]}.json").read_text())
        assert (got["steps"], got["loss"]) == (expected["steps"], expected["loss"]), (name, got, expected)
    # the checkpointing loop was requeued at the end of its profiling window and when evicted, and resumed
    assert json.loads((work / f"result-{plain['torch-ckpt']}.json").read_text())["resumed_from"] > 0
    windows = [e for e in _starts(work, plain["torch-loop"]) if "MUXFLOW_PROFILING_RUN" in e]
    assert windows and all(e["PYTHONPATH"].split(":")[0].endswith("python-hook") for e in windows), windows
    return summary
