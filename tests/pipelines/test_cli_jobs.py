"""``muxflow jobs list`` says where each job is and, for one that does not run, why (executors.scheduler.job_status)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from executors.scheduler.job_status import held_for_pickup, whereabouts
from executors.scheduler.submission import JobSpec, submit
from executors.store import models as m
from executors.store import repo
from executors.store.db import Store
from executors.store.jobs import transition
from pipelines.cli import main
from scheduler_core.domain import GpuCandidate, GpuHealth, JobCandidate, JobState
from scheduler_core.round.plan import plan_round, snapshot
from tests.executors.scheduler.slurm.fake_slurm import FakeSlurm, make_job, store_with_fake_nodes
from tests.scheduler_core.round.test_plan import ONLINE, PROFILE, StubPredictor

GIB = 1024**3


def _job(s, name: str, mem_gib: float = 2, *states: JobState, reason: str = "test") -> int:
    job = submit(s, JobSpec(name=name, command="train.sh", job_type="" if name != "labelled" else "my model",
                            mem_bytes=int(mem_gib * GIB), allowed_gpu_types=("t4",), checkpoint_dir=f"/ckpt/{name}",
                            total_steps=100), None)
    for st in states:
        transition(s, job.id, st, reason)
    return job.id


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    return store_with_fake_nodes(tmp_path)


@pytest.fixture()
def jobs(store: Store) -> dict[str, int]:
    """One job in each place a user may find theirs, and a real round (plan_round) recorded in between."""
    P, Q, F = JobState.PROFILING, JobState.PENDING, JobState.FAILED
    with store.session() as s:
        gpu_rows = sorted(s.scalars(select(m.Gpu).where(m.Gpu.gpu_type == "t4")), key=lambda g: g.gpu_index)[:2]
        ids = {
            "new": _job(s, "new"),
            "profiling": _job(s, "profiling", 2, P),
            "failed": _job(s, "failed", 2, P, F, reason="profiling failed on t4: crashed (exit code 4) after 0 "
                                                         "iteration(s): RuntimeError: NCCL init failed"),
            "ok": _job(s, "ok", 2, P, Q),
            "big": _job(s, "big", 9, P, Q),
            "placed": _job(s, "labelled", 2, P, Q),
        }
        s.add(m.ProfilingRun(job_id=ids["profiling"], gpu_type="t4", state="running", run_dir="/r", bound_s=600,
                             submitted_utc=dt.datetime(2026, 3, 1, 9, 59, tzinfo=dt.UTC),
                             started_utc=dt.datetime(2026, 3, 1, 10, 0, tzinfo=dt.UTC), node="mx-t4-1",
                             slurm_job_id=77))
        gpu_ids = [g.id for g in gpu_rows]
    gpus = [GpuCandidate(gpu_id=g, gpu_type="t4", memory_bytes=15 * GIB, max_sm_clock_mhz=1590,
                         health=GpuHealth.HEALTHY, service_name="svc", online=ONLINE, forecast_sm_pct=20.0,
                         forecast_mem_bytes=2 * GIB, slowdown_allowance=0.5) for g in gpu_ids]
    cands = [JobCandidate(job_id=ids[k], mem_bytes=int(mem * GIB), allowed_gpu_types=frozenset({"t4"}),
                          profiles={"t4": PROFILE}) for k, mem in (("ok", 2), ("big", 9), ("placed", 2))]
    result = plan_round(gpus, cands, {"t4": StubPredictor()})
    with store.session() as s:
        rnd = repo.record_round(s, dt.datetime(2026, 3, 1, 10, 0, tzinfo=dt.UTC), result, snapshot(gpus, cands),
                                False, 3, {p.job_id: "start" for p in result.placements})
        ids["round"] = rnd.id
        ids["placed_gpu"] = next(p.gpu_id for p in result.placements if p.job_id == ids["placed"])
        transition(s, ids["placed"], JobState.PLACED, "placed")
    with store.session() as s:  # after the round was planned
        ids["late"] = _job(s, "late", 2, P, Q)
    return ids


def test_whereabouts_of_every_kind_of_job(store: Store, jobs: dict[str, int]) -> None:
    with store.session() as s:
        rows = list(s.scalars(select(m.OfflineJob).order_by(m.OfflineJob.id)))
        why = whereabouts(s, rows)
        where = {g.id: f"{g.node.name} GPU {g.gpu_index}" for g in s.scalars(select(m.Gpu))}
    r = jobs["round"]
    assert why[jobs["new"]].startswith("waiting for profiling (submitted ")
    assert why[jobs["profiling"]] == ("profiling: on t4 since 2026-03-01 10:00:00 UTC on mx-t4-1 "
                                      "(Slurm job 77)")
    assert why[jobs["failed"]].startswith("profiling failed on t4: crashed (exit code 4)")
    assert why[jobs["big"]] == (f"round {r}: no feasible GPU: memory above every candidate GPU's free memory quota "
                                "(needs 9 GiB; the largest offline memory quota on a Healthy GPU of t4 is 6 GiB)")
    assert why[jobs["ok"]].startswith(f"planned by round {r} on mx-t4-1 GPU ") and why[jobs["ok"]].endswith(
        "; dispatch not sent yet")
    assert why[jobs["placed"]] == (f"placed by round {r} on {where[jobs['placed_gpu']]} at 70 %: waiting for the "
                                   "cluster to start it")
    # a real cluster (the round is not simulated): a fill starts it when a GPU frees up
    assert why[jobs["late"]].startswith("waiting for a GPU to free up or the next round (pending since ")
    assert f"after round {r} was planned at " in why[jobs["late"]]


def test_a_fill_after_the_round_is_the_plan_a_job_is_explained_by(store: Store, jobs: dict[str, int]) -> None:
    r = jobs["round"]
    with store.session() as s:
        gpu = s.get(m.Gpu, jobs["placed_gpu"])
        free = next(g.id for g in s.scalars(select(m.Gpu)) if g.gpu_type == "t4" and g.id != gpu.id)
    gpus = [GpuCandidate(gpu_id=free, gpu_type="t4", memory_bytes=15 * GIB, max_sm_clock_mhz=1590,
                         health=GpuHealth.HEALTHY, service_name="svc", online=ONLINE, forecast_sm_pct=20.0,
                         forecast_mem_bytes=2 * GIB, slowdown_allowance=0.5)]
    cands = [JobCandidate(job_id=j, mem_bytes=int(mem * GIB), allowed_gpu_types=frozenset({"t4"}),
                          profiles={"t4": PROFILE}) for j, mem in ((jobs["late"], 2), (jobs["big"], 9))]
    result = plan_round(gpus, cands, {"t4": StubPredictor()})
    snap = {**snapshot(gpus, cands), "fill_of_round": r}
    with store.session() as s:
        repo.record_round(s, dt.datetime(2026, 3, 1, 10, 0, tzinfo=dt.UTC), result, snap, False, 2,
                          {p.job_id: "start" for p in result.placements}, seq=1)
        rows = [s.get(m.OfflineJob, jobs[k]) for k in ("late", "big")]
        why = whereabouts(s, rows)
    assert why[jobs["late"]].startswith(f"planned by round {r}'s fill 1 on ")
    assert why[jobs["big"]].startswith(f"round {r}'s fill 1: no feasible GPU: memory above every candidate GPU's")
    with store.session() as s:
        transition(s, jobs["late"], JobState.PLACED, "placed")
        why = whereabouts(s, [s.get(m.OfflineJob, jobs["late"])])
    assert why[jobs["late"]].startswith(f"placed by round {r}'s fill 1 on ")


def test_a_job_the_matching_left_out_and_one_before_any_round(store: Store) -> None:
    with store.session() as s:
        first = _job(s, "first", 2, JobState.PROFILING, JobState.PENDING)
        assert whereabouts(s, [s.get(m.OfflineJob, first)])[first].startswith("waiting for the first round (since ")
        gpu_id = next(g.id for g in s.scalars(select(m.Gpu)) if g.gpu_type == "t4")
        second = _job(s, "second", 2, JobState.PROFILING, JobState.PENDING)
    gpus = [GpuCandidate(gpu_id=gpu_id, gpu_type="t4", memory_bytes=15 * GIB, max_sm_clock_mhz=1590,
                         health=GpuHealth.HEALTHY, service_name="svc", online=ONLINE, forecast_sm_pct=20.0,
                         forecast_mem_bytes=2 * GIB, slowdown_allowance=0.5)]
    cands = [JobCandidate(job_id=j, mem_bytes=2 * GIB, allowed_gpu_types=frozenset({"t4"}), profiles={"t4": PROFILE})
             for j in (first, second)]
    result = plan_round(gpus, cands, {"t4": StubPredictor()})
    with store.session() as s:
        rnd = repo.record_round(s, dt.datetime(2026, 3, 1, 10, 0, tzinfo=dt.UTC), result, snapshot(gpus, cands),
                                False, 2, {p.job_id: "start" for p in result.placements})
        [left] = {first, second} - {p.job_id for p in result.placements}
        why = whereabouts(s, [s.get(m.OfflineJob, left)])[left]
    assert why == (f"round {rnd.id}: lost in the matching to other jobs (feasible on 1 GPU(s); the matching (the "
                   "most predicted throughput in all) gave them to other jobs)")


def test_held_for_pickup_lists_slurms_held_jobs_the_store_does_not_have() -> None:
    fake = FakeSlurm([make_job(5), make_job(6), make_job(7, held=False, state="RUNNING"),
                      make_job(8, partition="online")])
    [(sid, name, why)] = held_for_pickup(fake, known_slurm_ids={6})
    assert (sid, name) == (5, "job5") and why.startswith("held for pick-up: Slurm job 5, submitted ")


def test_jobs_list_shows_the_why_column(store: Store, jobs: dict[str, int], tmp_path: Path) -> None:
    url = str(store.engine.url)
    env = {"MUXFLOW_SETTINGS": None, "DAGSTER_HOME": None, "MUXFLOW_CLUSTER": "simulated"}
    out = CliRunner().invoke(main, ["--db", url, "jobs", "list"], env=env, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["id", "name", "type", "state", "progress", "checkpoints", "why"]
    (big,) = [ln for ln in lines if " big " in ln]
    assert "PENDING" in big and "no feasible GPU: memory above every candidate GPU's free memory quota (needs 9 GiB" \
        in big
    (labelled,) = [ln for ln in lines if " labelled " in ln]
    assert "my model" in labelled and "PLACED" in labelled
    assert "crashed (exit code 4) after 0 iteration(s): RuntimeError: NCCL init failed" in out.stdout
    assert "-" in [ln for ln in lines if " late " in ln][0].split()  # no label
    # only the PENDING ones
    pending = CliRunner().invoke(main, ["--db", url, "jobs", "list", "--state", "pending"], env=env).stdout
    assert {ln.split()[1] for ln in pending.splitlines()[1:]} == {"ok", "big", "late"}


def test_jobs_list_on_slurm_says_when_slurm_cannot_be_asked(store: Store, jobs: dict[str, int],
                                                            tmp_path: Path) -> None:
    env = {"MUXFLOW_SETTINGS": None, "DAGSTER_HOME": None, "MUXFLOW_CLUSTER": "slurm",
           "MUXFLOW_SLURM_URL": f"unix:{tmp_path / 'none.sock'}"}
    out = CliRunner().invoke(main, ["--db", str(store.engine.url), "jobs", "list"], env=env, catch_exceptions=False)
    assert out.exit_code == 0 and " big " in out.stdout  # the store's jobs are listed all the same
    assert out.stderr.startswith("note: cannot list Slurm's held submissions: ") and "none.sock" in out.stderr


def test_jobs_list_shows_progress_and_checkpointing_of_plain_jobs(store: Store) -> None:
    with store.session() as s:
        for name, ckpt, steps, done in [("declared", "declared", 100, 25), ("detected", "detected", None, 340),
                                        ("kept", "undetected", None, 0), ("said-no", "none", None, 0),
                                        ("unknown", None, None, 0)]:
            job = submit(s, JobSpec(name=name, command="sbatch", job_type="", mem_bytes=None, allowed_gpu_types=("t4",),
                                    checkpoint_dir="", total_steps=steps), None)
            job.steps_done, job.checkpointing = done, ckpt  # what profiling learnt
    out = CliRunner().invoke(main, ["--db", str(store.engine.url), "jobs", "list"],
                             env={"MUXFLOW_SETTINGS": None, "DAGSTER_HOME": None, "MUXFLOW_CLUSTER": "simulated"},
                             catch_exceptions=False)
    assert out.exit_code == 0, out.output
    row = {ln.split()[1]: ln for ln in out.stdout.splitlines()[1:]}
    assert "25.0%" in row["declared"] and "on signal (declared)" in row["declared"]
    assert "340 steps" in row["detected"] and "on signal (detected)" in row["detected"]  # of an unknown total
    assert "no: never moved (none seen)" in row["kept"] and "no: never moved (declared)" in row["said-no"]
    assert row["unknown"].split()[4:6] == ["?", "?"]  # nothing known yet: not profiled
