"""The pick-up keeps who submitted each job: the user it runs as decides which GPUs it may share (MPS serves
one user per GPU; scheduler_core.run_as)."""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import select

from executors.slurm.pickup import import_submissions
from executors.store import models as m
from executors.store.db import Store
from tests.executors.slurm.fake_slurm import FakeSlurm, make_job, store_with_fake_nodes

GOOD = "muxflow: mem=2GiB gpu-types=t4 ckpt=/ckpt/{} steps=5"


def test_each_imported_or_rejected_job_keeps_its_submitting_user(tmp_path) -> None:
    store: Store = store_with_fake_nodes(tmp_path)
    fake = FakeSlurm([replace(make_job(31, comment=GOOD.format("a")), user_name="alice"),
                      replace(make_job(32, comment=GOOD.format("b")), user_name="bob"),
                      replace(make_job(33, comment="muxflow: mem=2GiB"), user_name="carol"),  # rejected
                      replace(make_job(34, comment=GOOD.format("d")), user_name="")])         # Slurm said nothing
    rep = import_submissions(store, fake, only=[31, 32, 33, 34])
    assert len(rep.imported) == 3 and [sid for sid, _ in rep.rejected] == [33]
    with store.session() as s:
        users = {j.slurm_job_id: (j.run_as_user, j.state) for j in s.scalars(select(m.OfflineJob))}
    assert users == {31: ("alice", "SUBMITTED"), 32: ("bob", "SUBMITTED"), 33: ("carol", "FAILED"),
                     34: (None, "SUBMITTED")}
