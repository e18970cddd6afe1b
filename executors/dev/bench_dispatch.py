"""What the Slurm dispatcher costs per placement, on the dev cluster (``muxflow bench dispatch``).

One run, end to end against the real dev cluster (``muxflow slurm dev-up``):

1. its own feature store (a temporary SQLite file, or ``--db``), migrated, with the
   dev cluster's nodes and GPUs registered from Slurm;
2. a *gate* job, held in the ``profile`` partition (never picked up, never released);
3. N cheap offline jobs (``sleep``) submitted held through slurmrestd with the MuxFlow
   spec in their comment and ``--dependency=afterok:<gate>``, picked up (these ids only)
   and made PENDING;
4. a real plan: a :class:`RoundResult` with N START actions round-robin over the
   cluster's GPUs, stored as a round like any other;
5. **timed**: ``SlurmBackend.dispatch`` — ``round_runner.dispatch_round`` through
   ``SlurmCluster``: every intent written, each job read and placed + released in one
   update, marked sent, every result written; then the same dispatch again (idempotent:
   nothing is sent);
6. verified: every job exactly once in Slurm, released, on its planned node with its
   planned share and plan comment, and one ``done`` row per action;
7. cleanup, always: every job cancelled, the store's jobs marked FAILED.

What is measured is the dispatcher **placing and releasing held jobs**: REST requests
(counted in the client), store writes (counted on the engine) and wall time. What is
not: jobs *starting* — the dev cluster has 8 GPUs on 2 nodes, so 1,000 jobs cannot run
at once (and a real plan has at most one offline job per GPU); the dependency on the
held gate keeps every released job pending (``Reason=Dependency``) instead of starting
1,000 ``sleep``s — nor migrations and evictions (requeue through ``scontrol``), nor planning.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

from sqlalchemy import event  # the write counter listens on the store's engine

from executors.dev.slurm import DevCluster
from executors.machine import describe
from executors.scheduler.round_runner import latest_round_window
from executors.scheduler.slurm.backend import (
    SlurmBackend,
    XcudaGains,
    dispatch_status,
    placement_plan,
    register_slurm_nodes,
)
from executors.scheduler.slurm.pickup import import_submissions, submission_comment
from executors.scheduler.submission import JobSpec
from executors.slurm import plan as plans
from executors.slurm.client import SlurmRestClient
from executors.slurm.errors import SlurmError
from executors.slurm.scontrol import ScontrolRequeue
from executors.slurm.spec import BatchJob
from executors.store import dispatch as dispatch_log
from executors.store import inventory, repo
from executors.store import jobs as jobstore
from executors.store.db import Store
from executors.store.jobs import transition
from executors.store.migrate import upgrade
from scheduler_core.domain import (
    TERMINAL_JOB_STATES,
    Action,
    JobState,
    PlanAction,
    RoundResult,
)

PREFIX = "mx-bench"
JOB_TYPE = "ResNet-50 (batch size 64)"
MEM_BYTES = 2 * 1024**3
SCRIPT = "#!/bin/sh\nsleep 600\n"
_WRITE = re.compile(r"^\s*(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+\"?(\w+)", re.IGNORECASE)


class BenchError(RuntimeError):
    """The benchmark could not run (no dev cluster, a submission refused, …)."""


@dataclass
class StoreWrites:
    """Rows written (by verb and table) and commits on a store's engine while attached.

    Rows, not statements: SQLAlchemy may send many rows in one statement (a multi-row
    INSERT), so each statement counts the rows the driver reports it wrote.
    """

    statements: Counter = field(default_factory=Counter)
    commits: int = 0

    def attach(self, engine) -> None:
        event.listen(engine, "after_cursor_execute", self._on_execute)
        event.listen(engine, "commit", self._on_commit)

    def detach(self, engine) -> None:
        event.remove(engine, "after_cursor_execute", self._on_execute)
        event.remove(engine, "commit", self._on_commit)

    def _on_execute(self, conn, cursor, statement, parameters, context, executemany) -> None:
        m = _WRITE.match(statement)
        if m:
            rows = cursor.rowcount
            if rows is None or rows <= 0:  # the driver does not say (SQLite with RETURNING): one row per set
                many = executemany and parameters and isinstance(parameters[0], tuple | list | dict)
                rows = len(parameters) if many else 1
            self.statements[f"{m.group(1).split()[0].upper()} {m.group(2)}"] += rows

    def _on_commit(self, conn) -> None:
        self.commits += 1


def _plan(jobs: list[int], gpus: list[tuple[str, int, int]]):
    """N START actions round-robin over the GPUs, shares 20..80 %: job id -> (node, index, gpu id, pct).

    More than one job per GPU, which a real plan never has (the store keeps one placement
    per GPU and round), so the round is stored with its actions and no placement rows:
    the dispatcher reads only the actions.
    """

    where = {job: (*gpus[k % len(gpus)], 20 + 10 * (k % 7)) for k, job in enumerate(jobs)}
    result = RoundResult(
        placements=[], actions=[PlanAction(Action.START, j, g, None, pct) for j, (_, _, g, pct) in where.items()],
        objective=0.0, gpus_considered=len(gpus), jobs_considered=len(jobs), feasible_pairs=len(jobs) * len(gpus))
    return where, result


def _window(store) -> dt.datetime:
    """A round window after every stored one (a --db store may hold rounds already)."""

    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    now -= dt.timedelta(minutes=now.minute % 15)
    with store.session() as s:
        latest = latest_round_window(s)
    return max(now, latest + dt.timedelta(minutes=15)) if latest else now


def run_dispatch_bench(placements: int, *, db_url: str | None = None, state_dir: str | None = None,
                       say=lambda _m: None) -> dict:
    """Run the benchmark (module docstring); the figures as a dict. Cleans up whatever happens."""

    cluster = DevCluster(state_dir, echo=lambda _m: None)
    status = cluster.status()
    if not status.ok:
        raise BenchError("the dev Slurm cluster is not up (" + "; ".join(status.problems[:3]) +
                         "): run `sudo muxflow slurm dev-up`")
    layout = status.layout
    client = SlurmRestClient(cluster.rest_settings(layout, "local", timeout_s=60.0),
                             requeue_fallback=ScontrolRequeue(str(layout.slurm_conf)))
    tmp = tempfile.TemporaryDirectory(prefix="muxflow-bench-dispatch-")
    url = db_url or f"sqlite:///{tmp.name}/store.db"
    prefix = f"{PREFIX}-{os.getpid()}-{time.strftime('%H%M%S')}"
    submitted: list[int] = []
    store = None
    out: dict = {"benchmark": "dispatch", "machine": describe(), "placements": placements,
                 "cluster": {"nodes": len(layout.nodes), "slurm_api": layout.api_version,
                             "transport": "unix socket (rest_auth/local)"},
                 "store": "temporary SQLite" if db_url is None else "given (--db)"}
    try:
        upgrade(url)
        store = Store(url)
        register_slurm_nodes(store, client)
        with store.session() as s:
            every = inventory.gpus(s)
            gpus = sorted((g.node.name, g.gpu_index, g.id) for g in every
                          if g.node.name in {n.name for n in layout.nodes})
            gpu_types = sorted({g.gpu_type for g in every})
        out["cluster"]["gpus"] = len(gpus)
        if not gpus:
            raise BenchError("the dev cluster has no GPU nodes registered")

        t = time.perf_counter()
        gate = client.submit(BatchJob(name=f"{prefix}-gate", script="#!/bin/sh\ntrue\n", partition="profile",
                                          hold=True, stdout_path="/dev/null", working_dir="/tmp")).job_id
        submitted.append(gate)
        say(f"submitting {placements} held jobs (gate job {gate}) …")
        for i in range(placements):
            spec = JobSpec(name=f"{prefix}-{i}", command="sleep 600", job_type=JOB_TYPE, mem_bytes=MEM_BYTES,
                           allowed_gpu_types=tuple(gpu_types), checkpoint_dir=f"/tmp/{prefix}/ckpt-{i}",
                           total_steps=1000)
            submitted.append(client.submit(BatchJob(
                name=spec.name, script=SCRIPT, partition="offline", hold=True, gres_per_node="mps:10",
                comment=submission_comment(spec), dependency=f"afterok:{gate}", stdout_path="/dev/null",
                working_dir="/tmp", time_limit_min=10)).job_id)
        setup = {"submit_s": round(time.perf_counter() - t, 3)}
        t = time.perf_counter()
        rep = import_submissions(store, client, {JOB_TYPE}, only=submitted[1:])
        if rep.rejected or len(rep.imported) != placements:
            raise BenchError(f"pick-up imported {len(rep.imported)} of {placements} jobs; rejected: {rep.rejected[:3]}")
        with store.session() as s:
            for job_id in rep.imported:
                transition(s, job_id, JobState.PROFILING, "benchmark job: not profiled")
                transition(s, job_id, JobState.PENDING, "benchmark job: not profiled")
        setup["pickup_s"] = round(time.perf_counter() - t, 3)
        where, result = _plan(sorted(rep.imported), gpus)
        with store.session() as s:
            snapshot = {"benchmark": "dispatch", "start_actions": placements}
            round_id = repo.record_round(s, _window(store), result, snapshot, False, placements, {}).id
        out["setup"] = setup

        # -- the measurement ---------------------------------------------------------
        # The benchmark's jobs never start (no Prolog verifies their plans): a key of its own signs them.
        backend = SlurmBackend(lambda: client, retry_deadline_s=60.0, gains=XcudaGains(), plan_key=plans.new_key())
        writes = StoreWrites()
        client.requests.clear()
        writes.attach(store.engine)
        say(f"dispatching round {round_id}: {placements} START actions over {len(gpus)} GPUs …")
        t = time.perf_counter()
        try:
            ok, failed = backend.dispatch(store, round_id, result, dt.datetime.now(dt.UTC))
        finally:
            wall = time.perf_counter() - t
            writes.detach(store.engine)
        requests = dict(client.requests)
        n_req = sum(requests.values())
        out["dispatch"] = {
            "wall_s": round(wall, 3), "placements_per_s": round(placements / wall, 1),
            "ms_per_placement": round(1000 * wall / placements, 2), "done": ok, "failed": failed,
            "rest_requests": n_req, "rest_requests_by_method": requests,
            "rest_requests_per_placement": round(n_req / placements, 3),
            "intent_writes": writes.statements.get("INSERT dispatch_log", 0),
            "result_writes": writes.statements.get("UPDATE dispatch_log", 0),
            "store_write_statements": dict(sorted(writes.statements.items())),
            "store_transactions": writes.commits,
        }
        client.requests.clear()
        t = time.perf_counter()
        again = backend.dispatch(store, round_id, result, dt.datetime.now(dt.UTC))
        out["redispatch"] = {"wall_s": round(time.perf_counter() - t, 3), "actions_sent": sum(again),
                             "rest_requests": sum(client.requests.values())}
        out["verified"] = _verify(client, store, round_id, where, prefix, backend.gains, backend.plan_key,
                                  dispatch_status)
    except SlurmError as exc:
        raise BenchError(f"Slurm: {exc}") from exc
    finally:
        out["cleanup_s"] = _cleanup(client, store, submitted, say)
        client.close()
        if store is not None:
            store.dispose()
        tmp.cleanup()
    out["measured"] = ("the dispatcher placing + releasing held jobs: round_runner.dispatch_round through "
                       "SlurmCluster (intent rows, one read and one place+release update per job, sent/result "
                       "rows); REST over slurmrestd's unix socket, store on " + out["store"])
    out["not_measured"] = ("jobs starting: a dependency on a held gate job keeps the released jobs pending (8 GPUs "
                           "cannot run 1,000 jobs; a real plan has at most one offline job per GPU); migrations and "
                           "evictions (requeue through scontrol); planning the round; submission and pick-up "
                           "(reported under setup)")
    return out


def _verify(client, store, round_id: int, where: dict, prefix: str, gains, key: bytes, dispatch_status) -> dict:
    """Every planned job exactly once in Slurm, released on its planned node/share/signed plan; one done row each."""

    with store.session() as s:
        sid_of = {j: sid for j, (sid, _mem) in jobstore.slurm_ids_and_memory(s, list(where)).items()}
        keys = [row.job_id for row in dispatch_log.round_log(s, round_id)]
    mine = [j for j in client.list_jobs() if j.name.startswith(prefix + "-") and not j.name.endswith("-gate")]
    by_sid = Counter(j.job_id for j in mine)
    jobs = {j.job_id: j for j in mine}
    wrong = []
    for job_id, (node, index, _gpu, pct) in where.items():
        j = jobs.get(sid_of.get(job_id))
        if (j is None or j.held or j.finished or j.required_nodes != (node,) or j.mps_pct != pct
                or plans.placed_plan(j, key) != placement_plan(job_id, j.job_id, index, pct, MEM_BYTES, gains)):
            wrong.append(f"job {job_id}: " + ("missing in Slurm" if j is None else
                                              f"{j.state} held={j.held} on {j.required_nodes} mps={j.mps_pct}"))
    return {"placed_as_planned": len(where) - len(wrong), "wrong": wrong[:5], "wrong_count": len(wrong),
            "slurm_jobs": len(mine), "slurm_job_ids_repeated": sum(1 for c in by_sid.values() if c > 1),
            "dispatch_log": dispatch_status(store, round_id),
            "actions_logged_twice": len(keys) - len(set(keys)),
            "pending_reasons": dict(Counter(j.state_reason for j in mine if j.state == "PENDING"))}


def _cleanup(client, store, sids: list[int], say) -> float:
    """Cancel every submitted job; mark the store's jobs FAILED. Seconds taken."""

    t = time.perf_counter()
    if sids:
        say(f"cancelling {len(sids)} jobs …")
    left = []
    for sid in sids:
        try:
            client.cancel(sid)
        except SlurmError as exc:
            left.append((sid, str(exc)))
    if left:
        print(f"warning: {len(left)} benchmark job(s) could not be cancelled, e.g. {left[0]}; "
              f"cancel them with scancel", file=sys.stderr)
    if store is not None and sids:
        with store.session() as s:
            for job in jobstore.jobs_of_slurm_ids(s, sids):
                if JobState(job.state) not in TERMINAL_JOB_STATES:
                    transition(s, job.id, JobState.FAILED, "benchmark job: cancelled in Slurm after the measurement")
    return round(time.perf_counter() - t, 3)
