"""Several offline jobs on ONE GPU through the real Slurm path, from plain ``sbatch`` to finished jobs, live.

On a private dev cluster, on its ``mx-t4-1``, which has one gres Type per GPU (``mps:t4g<i>:100`` each,
``Flags=all_sharing``; docs/SLURM.md "One gres Type per GPU"):

- four plain ``sbatch --gres=mps:10`` submissions, imported and PENDING, are placed by a stored round whose
  placements put three of them on GPU 2 (slots 0, 1 and 2: 30 %, 30 % and 35 %, each with its own memory quota,
  as a round with ``max_jobs_per_gpu`` 3 splits a GPU) and the fourth on GPU 0 (30 %). ``muxflow slurm
  dispatch --name-gpus`` releases them and all four run at the same time; Slurm accounts the three co-placed jobs
  on GPU index 2, each with its own share (``scontrol show job -d``: ``GRES=mps:t4g2:30(IDX:2)`` twice and
  ``GRES=mps:t4g2:35(IDX:2)``); the root Prolog
  wrote a root-owned plan file per job (``gpu=2`` with the job's own ``pct=`` and ``mem=``) and sent each
  job's share to GPU 2's MPS control (the dev cluster's stand-in records it); each job sees its own share in
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and its own quota in ``XCUDA_MEM_QUOTA_BYTES``; ``running()`` maps
  both onto GPU 2 with their own shares. The same dispatch run again sends nothing (every action is ``done``
  in the dispatch log; Slurm's jobs are untouched) and the actions sent again straight to Slurm (a dispatcher
  restarted before it logged its results) all find their job placed as planned. Let go, all four are
  COMPLETED, the Epilog removes their plan files and the job-state sync books them DONE.
- Shares adding up to more than the GPU's MPS count (60 % + 60 % on GPU 2, which has 100): both are
  dispatched, Slurm runs one and keeps the other PENDING with reason ``Resources`` until the first has ended,
  then runs it on GPU 2 at its 60 %: Slurm never oversubscribes a named GPU. (The planner never plans more
  than 100 % on a GPU, scheduler_core.round.slots; this is what Slurm would do if it did.)
- One of two co-placed jobs ends: its Epilog leaves GPU 2's MPS defaults at the other's share and quota (the
  largest of the plans still on the GPU), not the whole GPU. The Prologs of co-placed jobs set the largest of
  their plans likewise, whichever runs last.

The jobs print their environment, then wait for a file the test writes (``go``, or ``go.<Slurm id>``), so
"running at the same time" and "the other still waits" are states the test reads, not races it times.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess

import pytest

from executors.scheduler.round_runner import stored_result
from executors.scheduler.slurm.backend import dispatch_status
from executors.slurm import plan as plans
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
    scontrol_gres,
)

NODE = "mx-t4-1"
GIB = 1024**3
# (GPU index, slot, MPS %, memory quota) per job: three on GPU 2, together 95 % of it, and one on GPU 0
CO_PLACED = [(2, 0, 30, 2 * GIB), (2, 1, 30, 3 * GIB), (2, 2, 35, 4 * GIB), (0, 0, 30, 2 * GIB)]
OVER = [(2, 0, 60, 2 * GIB), (2, 1, 60, 2 * GIB)]  # 120 % of GPU 2's MPS count (100)
WAIT_S = 120  # a job waits at most this long for its go file, then fails: nothing outlives a broken test


@pytest.fixture(scope="module")
def typed_cluster(dev_cluster):
    """The default nodes (``mx-t4-1`` and ``mx-a10-1``, both with one gres Type per GPU): the submissions allow
    both GPU types. Private: nothing but this module's jobs takes MPS share on GPU 2."""
    with make_private_cluster() as live:
        assert next(n for n in live.layout.nodes if n.name == NODE).per_gpu_types
        yield live


def _job_body(d) -> str:
    """Print the environment the TaskProlog gave, then wait for ``go`` or ``go.<own Slurm id>``."""
    env = f"{d}/env.$SLURM_JOB_ID"
    return (f"env > {env}.tmp && mv {env}.tmp {env}\n"
            f"i=0\nwhile [ ! -e {d}/go ] && [ ! -e {d}/go.$SLURM_JOB_ID ]; do\n"
            f"  i=$((i + 1)); [ $i -gt {WAIT_S * 10} ] && exit 3\n  sleep 0.1\ndone\n")


def _place(live, store, d, prefix: str, plan: list[tuple[int, int, int, int]]) -> tuple[dict[int, tuple], dict, int]:
    """Submit ``len(plan)`` held jobs and store a round placing the k-th by Slurm id on ``plan[k]``.

    Returns Slurm id -> (store job id, GPU index, slot, %, quota), the store's GPU ids and the round's id."""
    gpus = register(store, live)
    held = held_jobs(live, store, d, len(plan), prefix, _job_body(d))
    placed = {sid: (job_id, *p) for (job_id, sid), p in zip(sorted(held.items(), key=lambda kv: kv[1]), plan)}
    actions = [{"action": "start", "job_id": job_id, "gpu_id": gpus[(NODE, i)], "from_gpu_id": None, "sm_pct": pct}
               for job_id, i, _slot, pct, _mem in placed.values()]
    rows = [{"job_id": job_id, "gpu_id": gpus[(NODE, i)], "slot": slot, "sm_pct": pct, "mem_quota_bytes": mem}
            for job_id, i, slot, pct, mem in placed.values()]
    return placed, gpus, make_round(store, actions, placements=rows)


def _dispatch(live, url: str, round_id: int) -> str:
    out = subprocess.run([*dispatch_cmd(url, round_id, state_dir=live.cluster.state_dir), "--name-gpus"],
                         cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _plan_file(live, sid: int) -> dict[str, str]:
    """The plan the root Prolog wrote for the job (what its TaskProlog reads), checked root-owned and 0644."""
    f = live.layout.plan_dir / f"{sid}.plan"
    st = f.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o644), (f, st.st_uid, oct(st.st_mode))
    return read_env(f)


def _mps_commands(live, index: int) -> list[str]:
    """What the node scripts sent to the MPS control of GPU ``index`` (the dev cluster's stand-in logs it)."""
    log = live.layout.mps_pipe_root / NODE / f"gpu{index}" / "commands.log"
    return [line.split(" ", 2)[2] for line in log.read_text().splitlines()] if log.exists() else []


def test_three_jobs_share_one_gpu_each_with_its_own_share_from_sbatch_to_completed(typed_cluster,
                                                                                 private_tmp) -> None:
    live = typed_cluster
    store, url = make_store(private_tmp)
    d = live.job_dir("several-per-gpu")
    placed, gpus, round_id = _place(live, store, d, f"mx-several{os.getpid()}", CO_PLACED)
    sids = sorted(placed)
    try:
        first = _dispatch(live, url, round_id)
        assert f"round {round_id}: {len(sids)} action(s) done, 0 failed" in first, first

        with live.client() as c:
            def all_running() -> bool:
                return all(c.get_job(sid).state == "RUNNING" for sid in sids)

            try:
                live.wait_for("every job running at the same time", all_running, timeout_s=90)
            except pytest.fail.Exception:
                pytest.fail("not every job runs: " + "; ".join(
                    f"{sid} {j.state} ({j.state_reason}) {j.gres_per_node}" for sid in sids for j in [c.get_job(sid)]))
            jobs = {sid: c.get_job(sid) for sid in sids}
        live.wait_for("every job to print its environment",
                      lambda: all((d / f"env.{sid}").exists() for sid in sids), timeout_s=60)

        for sid, (job_id, i, _slot, pct, mem) in placed.items():
            j = jobs[sid]
            # Slurm: on the node, the share naming the planned GPU, accounted on that GPU index
            assert j.nodes == (NODE,) and j.gres_per_node == f"gres:mps:t4g{i}:{pct}", (sid, j.nodes,
                                                                                        j.gres_per_node)
            assert scontrol_gres(live, sid) == [f"mps:t4g{i}:{pct}(IDX:{i})"], (sid, scontrol_gres(live, sid))
            comment = plans.decode(j.comment, live.plan_key, sid)
            assert (comment.job_id, comment.gpu_index, comment.sm_pct, comment.mem_bytes) == (job_id, i, pct, mem), \
                j.comment
            # the node: the Prolog's plan file of this job, and what its TaskProlog made of it
            plan = _plan_file(live, sid)
            assert (plan["job"], plan["gpu"], plan["pct"], plan["mem"]) == (str(job_id), str(i), str(pct), str(mem))
            env = read_env(d / f"env.{sid}")
            assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) == (str(i), str(pct)), sid
            assert env["XCUDA_MEM_QUOTA_BYTES"] == str(mem) and env["XCUDA_GPU_INDEX"] == str(i), sid
            assert env["CUDA_MPS_PIPE_DIRECTORY"].endswith(f"/{NODE}/gpu{i}") and env["LD_PRELOAD"].endswith(
                "libxcuda.so"), sid
            # the root Prologs left the GPU's MPS control at the largest share and quota of the jobs placed on it
            # (per-client limits: each job keeps at least its own; its environment and xCUDA hold it to it)
            on_i = [(p, q) for _j, gi, _s, p, q in placed.values() if gi == i]
            sent = _mps_commands(live, i)
            last = {c.rsplit(" ", 1)[0]: c for c in sent if c.startswith("set_default_")}
            assert last["set_default_active_thread_percentage"].endswith(f" {max(p for p, _ in on_i)}"), (i, sent)
            assert last[f"set_default_device_pinned_mem_limit {i}"].endswith(f" {max(q for _, q in on_i) // 2**20}M"), (
                i, sent)
        # three jobs on GPU 2, each with its own share (95 % of it in all), while GPU 0 has the fourth
        on_gpu2 = sorted(g for sid in sids for g in scontrol_gres(live, sid) if g.endswith("(IDX:2)"))
        assert on_gpu2 == ["mps:t4g2:30(IDX:2)", "mps:t4g2:30(IDX:2)", "mps:t4g2:35(IDX:2)"], on_gpu2

        # MuxFlow's view: the three jobs on the same GPU of the store, each with its own share
        running = backend(live).cluster(store).running()
        assert {j: (r.gpu_id, r.sm_pct) for j, r in running.items()} == {
            job_id: (gpus[(NODE, i)], pct) for job_id, i, _slot, pct, _mem in placed.values()}
        sync = backend(live).sync_jobs(store, dt.datetime.now(dt.UTC))
        assert sync.transitions == {"RUNNING": len(sids)} and not sync.errors, sync

        # Idempotent: the same dispatch again sends nothing ...
        again = _dispatch(live, url, round_id)
        assert f"round {round_id}: 0 action(s) done, 0 failed" in again, again
        assert dispatch_status(store, round_id) == {"done": len(sids)}
        # ... and the actions sent again to Slurm itself (a dispatcher that died before logging its results) find
        # every job, the three co-placed ones included, placed as planned: nothing is requeued or changed
        with store.session() as s:
            result = stored_result(s, s.get(m.SchedulingRound, round_id))
        assert sorted((p.gpu_id, p.slot) for p in result.placements) == sorted(
            (gpus[(NODE, i)], slot) for _job_id, i, slot, _pct, _mem in placed.values())
        be = backend(live)
        be.name_gpus = True
        resent = be.cluster(store, round_id).dispatch(list(result.actions), dt.datetime.now(dt.UTC))
        assert all(r.ok and "(reconciled)" in r.detail for r in resent), resent
        with live.client() as c:
            after = {sid: c.get_job(sid) for sid in sids}
        assert all(j.state == "RUNNING" and j.restart_count == 0 and j.gres_per_node == jobs[sid].gres_per_node
                   and j.start_time_utc == jobs[sid].start_time_utc for sid, j in after.items()), after

        # Let go: all four finish, the Epilog removes each plan file, the store follows
        (d / "go").touch()
        with live.client() as c:
            for sid in sids:
                j = live.wait_job(c, sid, lambda j: j.finished, "the job to finish", timeout_s=60)
                assert (j.state, j.exit_code) == ("COMPLETED", 0), (sid, j.state, j.state_reason, j.exit_code)
        live.wait_for("the Epilog to remove the plan files",
                      lambda: not any((live.layout.plan_dir / f"{sid}.plan").exists() for sid in sids), timeout_s=60)
        sync = backend(live).sync_jobs(store, dt.datetime.now(dt.UTC))
        assert sync.transitions == {"DONE": len(sids)} and not sync.errors, sync
    finally:
        cancel_quietly(live, sids)


def test_shares_over_one_gpus_mps_count_wait_for_resources(typed_cluster, private_tmp) -> None:
    live = typed_cluster
    store, url = make_store(private_tmp)
    d = live.job_dir("over-one-gpu")
    placed, _gpus, round_id = _place(live, store, d, f"mx-over{os.getpid()}", OVER)
    sids = sorted(placed)
    try:
        # MuxFlow sends both (the dispatcher checks no sums: the plan is the planner's); Slurm decides
        out = _dispatch(live, url, round_id)
        assert f"round {round_id}: 2 action(s) done, 0 failed" in out, out
        with live.client() as c:
            def one_runs_one_waits() -> tuple[int, int] | None:
                jobs = {sid: c.get_job(sid) for sid in sids}
                run = [sid for sid, j in jobs.items() if j.state == "RUNNING"]
                wait = [sid for sid, j in jobs.items() if j.state == "PENDING" and not j.held
                        and j.state_reason not in ("", "None")]
                return (run[0], wait[0]) if len(run) == 1 and len(wait) == 1 else None

            first, second = live.wait_for("one job running and the other waiting", one_runs_one_waits,
                                          timeout_s=90)  # type: ignore[misc]
            waiting = c.get_job(second)
            assert (waiting.state, waiting.state_reason) == ("PENDING", "Resources"), waiting
            assert waiting.gres_per_node == "gres:mps:t4g2:60" and waiting.required_nodes == (NODE,)
            assert scontrol_gres(live, first) == ["mps:t4g2:60(IDX:2)"]
            # the first one ends: the second runs, on GPU 2 at its own 60 %
            (d / f"go.{first}").touch()
            j = live.wait_job(c, first, lambda j: j.finished, "the first job to finish", timeout_s=60)
            assert j.state == "COMPLETED", (j.state, j.state_reason)
            live.wait_job(c, second, lambda j: j.state == "RUNNING", "the waiting job to start", timeout_s=90)
        assert scontrol_gres(live, second) == ["mps:t4g2:60(IDX:2)"]
        live.wait_for("the second job to print its environment", (d / f"env.{second}").exists, timeout_s=60)
        env = read_env(d / f"env.{second}")
        assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) == ("2", "60"), env
        (d / f"go.{second}").touch()
        with live.client() as c:
            j = live.wait_job(c, second, lambda j: j.finished, "the second job to finish", timeout_s=60)
        assert j.state == "COMPLETED", (j.state, j.state_reason)
    finally:
        cancel_quietly(live, sids)


def test_the_epilog_of_one_co_placed_job_leaves_the_other_its_caps(typed_cluster, private_tmp) -> None:
    live = typed_cluster
    store, url = make_store(private_tmp)
    d = live.job_dir("co-placed-epilog")
    placed, _gpus, round_id = _place(live, store, d, f"mx-coepi{os.getpid()}", CO_PLACED[:2])
    (ends, pct_ends, _), (stays, pct_stays, mem_stays) = [(sid, pct, mem) for sid, (*_, pct, mem) in placed.items()]
    sids = [ends, stays]
    try:
        _dispatch(live, url, round_id)
        # both Prologs are done once both TaskProlog'd jobs printed their environment
        live.wait_for("both jobs to print their environment",
                      lambda: all((d / f"env.{sid}").exists() for sid in sids), timeout_s=90)
        (d / f"go.{ends}").touch()
        with live.client() as c:
            live.wait_job(c, ends, lambda j: j.finished, "the first job to finish", timeout_s=60)
            live.wait_for("its Epilog to remove its plan file",
                          lambda: not (live.layout.plan_dir / f"{ends}.plan").exists(), timeout_s=60)
            assert c.get_job(stays).state == "RUNNING"
        # GPU 2's MPS control still caps a new server for the job that runs there at that job's share and quota
        default = (live.layout.mps_pipe_root / NODE / "gpu2" / "default_active_thread_percentage").read_text()
        mem_limits = [c for c in _mps_commands(live, 2) if c.startswith("set_default_device_pinned_mem_limit 2 ")]
        assert (default.strip(), mem_limits[-1]) == (
            str(pct_stays), f"set_default_device_pinned_mem_limit 2 {mem_stays // 2**20}M"), (pct_ends, default,
                                                                                            mem_limits)
    finally:
        (d / "go").touch()
        cancel_quietly(live, sids)
