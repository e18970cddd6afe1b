"""The pick-up keeps who submitted each job: the user it runs as decides which GPUs it may share (MPS serves
one user per GPU; scheduler_core.jobs.run_as)."""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import select

from executors.scheduler.slurm.pickup import import_submissions
from executors.store import models as m
from executors.store.db import Store
from tests.executors.scheduler.slurm.fake_slurm import FakeSlurm, make_job, store_with_fake_nodes

GOOD = "muxflow: mem=2GiB gpu-types=t4 ckpt=/ckpt/{} steps=5"


def test_each_imported_or_rejected_job_keeps_its_submitting_user(tmp_path) -> None:
    store: Store = store_with_fake_nodes(tmp_path)
    fake = FakeSlurm([replace(make_job(31, comment=GOOD.format("a")), user_name="alice"),
                      replace(make_job(32, comment=GOOD.format("b")), user_name="bob"),
                      replace(make_job(33, comment="muxflow: mem=2GiB steps=x"), user_name="carol"),  # rejected
                      replace(make_job(34, comment=GOOD.format("d")), user_name="")])         # Slurm said nothing
    rep = import_submissions(store, fake, only=[31, 32, 33, 34])
    assert len(rep.imported) == 3 and [sid for sid, _ in rep.rejected] == [33]
    with store.session() as s:
        users = {j.slurm_job_id: (j.run_as_user, j.state) for j in s.scalars(select(m.OfflineJob))}
    assert users == {31: ("alice", "SUBMITTED"), 32: ("bob", "SUBMITTED"), 33: ("carol", "FAILED"),
                     34: (None, "SUBMITTED")}


def test_a_heterogeneous_job_is_cancelled_through_its_leader_and_a_refused_cancel_stops_nothing(tmp_path) -> None:
    store: Store = store_with_fake_nodes(tmp_path)
    fake = FakeSlurm([replace(make_job(40, comment=GOOD.format("h")), het_job_id=40),
                      replace(make_job(41, comment=GOOD.format("h")), het_job_id=40),
                      make_job(42, comment=GOOD.format("ok"))])
    rep = import_submissions(store, fake, only=[40, 41, 42])
    assert [sid for sid, _ in rep.rejected] == [40, 41] and len(rep.imported) == 1
    assert all("heterogeneous" in reason for _, reason in rep.rejected)
    assert [c[1] for c in fake.calls if c[0] == "cancel"] == [40]  # the leader, once: Slurm refuses a component
    assert {fake.jobs[i].state for i in (40, 41)} == {"CANCELLED"} and fake.jobs[42].held

    # Slurm refusing a cancel is logged: the jobs after it are still imported, the next pick-up tries again.
    fake2 = FakeSlurm([replace(make_job(50, comment=GOOD.format("x")), het_job_id=49),  # leader not listed
                       make_job(51, comment=GOOD.format("y"))])
    rep = import_submissions(store, fake2, only=[50, 51])
    assert [sid for sid, _ in rep.rejected] == [50] and len(rep.imported) == 1
    assert fake2.jobs[50].held  # nothing cancelled it yet


def test_two_pickups_of_the_same_jobs_at_once_import_each_once_and_neither_fails(tmp_path, monkeypatch) -> None:
    """``muxflow submit`` and the pick-up sensor both find the new jobs not imported yet, then both insert them: the
    second insert of a job meets the first's row (unique Slurm id) and counts it as imported by the other, not as
    an error that fails the sensor tick or the user's submit."""
    from executors.scheduler.slurm import pickup

    store: Store = store_with_fake_nodes(tmp_path)
    fake = FakeSlurm([make_job(41, comment=GOOD.format("a")), make_job(42, comment="muxflow: mem=2GiB steps=x")])
    read = pickup.inventory.imported_slurm_ids
    other = []

    def read_then_the_other_imports(s, *args):
        seen = read(s, *args)
        if not other:  # the other pick-up runs between this one's read of the store and its inserts
            other.append(None)
            other[0] = import_submissions(store, fake, only=[41, 42])
        return seen

    monkeypatch.setattr(pickup.inventory, "imported_slurm_ids", read_then_the_other_imports)
    rep = import_submissions(store, fake, only=[41, 42])
    assert rep.imported == [] and rep.rejected == []
    assert len(other[0].imported) == 1 and [sid for sid, _ in other[0].rejected] == [42]
    with store.session() as s:
        assert sorted((j.slurm_job_id, j.state) for j in s.scalars(select(m.OfflineJob))) == [
            (41, "SUBMITTED"), (42, "FAILED")]
    assert fake.jobs[42].state == "CANCELLED"
