"""The Dagster submission sensor on a Slurm cluster picks up sbatch jobs before asking for profiling (fake Slurm)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from dagster import DagsterInstance, build_sensor_context
from sqlalchemy import select

from assets.resources import ClusterResource
from executors.scheduler.slurm.backend import SlurmBackend
from executors.store import models as m
from executors.store.db import Store
from pipelines.definitions import build_definitions
from pipelines.settings import MuxflowSettings
from tests.executors.scheduler.slurm.fake_slurm import PLAN_KEY, FakeSlurm, make_job, store_with_fake_nodes

GOOD = "muxflow: type='ResNet-50 (batch size 64)' mem=2GiB gpu-types=t4,a10 ckpt=/ckpt/{n} steps=100"


# Dagster rebuilds resources from their config for each evaluation, so the fake is found by name.
_FAKES: dict[str, FakeSlurm] = {}


class FakeSlurmCluster(ClusterResource):
    """ClusterResource(kind='slurm') whose backend talks to the :class:`FakeSlurm` registered as ``fake``."""

    kind: str = "slurm"
    slurm_url: str | None = "unix:/nonexistent/slurmrestd.sock"
    fake: str = ""

    def backend(self) -> SlurmBackend:
        return SlurmBackend(lambda: _FAKES[self.fake], plan_key=PLAN_KEY)


@pytest.fixture(autouse=True)
def _forget_fakes():
    yield
    _FAKES.clear()


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    return store_with_fake_nodes(tmp_path)


def _defs(store: Store, tmp_path: Path):
    return build_definitions(MuxflowSettings(db_url=store.url, cluster="slurm", slurm_url="unix:/nonexistent.sock",
                                             rounds_start=dt.datetime(2026, 1, 5, tzinfo=dt.UTC),
                                             report_dir=str(tmp_path / "report")))


def _tick(defs, fake: FakeSlurm, cursor: str | None):
    _FAKES[str(id(fake))] = fake
    cluster = FakeSlurmCluster(fake=str(id(fake)))
    with DagsterInstance.ephemeral() as inst, build_sensor_context(
            instance=inst, cursor=cursor, resources={**defs.resources, "cluster": cluster}, definitions=defs) as ctx:
        return defs.resolve_sensor_def("new_submission_sensor").evaluate_tick(ctx)


def test_sbatch_jobs_are_picked_up_and_profiling_requested_once(store: Store, tmp_path: Path) -> None:
    defs = _defs(store, tmp_path)
    fake = FakeSlurm([make_job(201, comment=GOOD.format(n="a")), make_job(202, comment=GOOD.format(n="b")),
                      make_job(203, comment="no spec here: a plain job, every field optional"),
                      make_job(205, comment="muxflow: mem=lots"),  # a malformed spec is still refused
                      make_job(204, comment=GOOD.format(n="online"), partition="online", held=False)])
    first = _tick(defs, fake, None)
    assert len(first.run_requests) == 1
    with store.session() as s:
        rows = {j.slurm_job_id: j for j in s.scalars(select(m.OfflineJob))}
    assert set(rows) == {201, 202, 203, 205}
    assert rows[201].state == rows[202].state == rows[203].state == "SUBMITTED"
    plain = rows[203]
    assert (plain.mem_bytes, plain.total_steps, plain.checkpoint_dir, plain.checkpointing) == (None, None, "", None)
    assert sorted(plain.allowed_gpu_types) == ["a10", "t4"]  # any GPU type of the cluster
    assert rows[205].state == "FAILED" and rows[205].state_reason.startswith("rejected: mem"), rows[205].state_reason
    assert first.run_requests[0].run_key == f"profile-upto-{max(rows[201].id, rows[202].id, rows[203].id)}"
    assert fake.jobs[205].state == "CANCELLED" and fake.closed
    # nothing new: no second run, nothing imported twice
    again = _tick(defs, fake, first.cursor)
    assert not again.run_requests and "already have a profiling run" in again.skip_message
    assert "0 imported, 0 rejected" in again.skip_message
    with store.session() as s:
        assert len(s.scalars(select(m.OfflineJob)).all()) == 4
    # a later submission: one more run
    fake.jobs[206] = make_job(206, comment=GOOD.format(n="c"))
    third = _tick(defs, fake, first.cursor)
    assert len(third.run_requests) == 1 and third.run_requests[0].run_key != first.run_requests[0].run_key


def test_slurm_down_does_not_fail_the_tick_and_says_why(store: Store, tmp_path: Path) -> None:
    defs = _defs(store, tmp_path)
    fake = FakeSlurm([make_job(301, comment=GOOD.format(n="a"))])
    fake.down = True
    tick = _tick(defs, fake, None)
    assert not tick.run_requests
    assert "no submitted job" in tick.skip_message and "Slurm pick-up failed" in tick.skip_message
    assert "connection refused" in tick.skip_message
    fake.down = False  # back: the next tick imports it and asks for profiling
    tick = _tick(defs, fake, None)
    assert len(tick.run_requests) == 1


def test_simulated_cluster_never_contacts_slurm(store: Store, tmp_path: Path) -> None:
    defs = build_definitions(MuxflowSettings(db_url=store.url, report_dir=str(tmp_path / "report")))
    with DagsterInstance.ephemeral() as inst, build_sensor_context(instance=inst, resources=defs.resources,
                                                                   definitions=defs) as ctx:
        tick = defs.resolve_sensor_def("new_submission_sensor").evaluate_tick(ctx)
    assert "Slurm" not in (tick.skip_message or "")
