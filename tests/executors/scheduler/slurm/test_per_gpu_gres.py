"""One gres Type per GPU (docs/SLURM.md): the naming rule, per-node detection, register-nodes, and the
dispatcher naming the planned GPU in the share (``mps:<type>:<pct>``) — untyped nodes keep ``mps:<pct>``."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select

from executors.scheduler.slurm.backend import SlurmBackend, placement_plan
from executors.scheduler.slurm.pickup import import_submissions
from executors.slurm import plan as plans
from executors.slurm.api import api_version
from executors.slurm.hostlist import parse_gres, per_gpu_type, split_per_gpu_type
from executors.slurm.models import Node, NodeGpu
from executors.store import models as m
from executors.store import repo
from executors.store.db import Store
from executors.store.jobs import transition
from scheduler_core.domain import Action, JobState, PlanAction, PlannedPlacement, RoundResult
from tests.executors.scheduler.slurm.fake_slurm import PLAN_KEY, FakeSlurm, make_job, store_with_fake_nodes
from tests.executors.slurm.test_parsers import body

V38 = api_version("v0.0.38")
GOOD = "muxflow: type='ResNet-50 (batch size 64)' mem=2GiB gpu-types=t4,a10 ckpt=/ckpt/{n} steps=100"


def _node(gres: str) -> Node:
    return Node("n", "", "n", "IDLE", (), ("offline",), parse_gres(gres), (), 8, 0, "")


@pytest.mark.parametrize(("model", "index", "name"), [("t4", 0, "t4g0"), ("a10", 3, "a10g3"), ("a10g", 1, "a10gg1"),
                                                      ("h100-80gb", 12, "h100-80gbg12")])
def test_per_gpu_type_round_trips(model, index, name) -> None:
    assert per_gpu_type(model, index) == name
    assert split_per_gpu_type(name) == (model, index)


@pytest.mark.parametrize("text", ["t4", "a10g", "", None, "g1"])
def test_a_type_that_names_no_single_gpu_does_not_split(text) -> None:
    assert split_per_gpu_type(text) is None


@pytest.mark.parametrize(("gres", "gpus"), [
    ("gpu:t4g0:1,gpu:t4g1:1,mps:t4g0:100,mps:t4g1:100", [(0, "t4", "t4g0"), (1, "t4", "t4g1")]),
    # the order Slurm lists them in does not matter; the index is the Type's
    ("gpu:a10g1:1,gpu:a10g0:1,mps:a10g1:100,mps:a10g0:100", [(0, "a10", "a10g0"), (1, "a10", "a10g1")]),
    # per-GPU gpu Types but one untyped mps pool: the GPUs are known, a share cannot name one
    ("gpu:t4g0:1,gpu:t4g1:1,mps:200", [(0, "t4", None), (1, "t4", None)]),
    ("gpu:t4:4,mps:400", [(i, "t4", None) for i in range(4)]),
    ("gpu:t4:2,mps:t4:200", [(0, "t4", None), (1, "t4", None)]),  # slurmrestd's form of an untyped mps line
    ("gpu:a10g:2,mps:200", [(0, "a10g", None), (1, "a10g", None)]),  # a model name ending in g
])
def test_node_gpus_are_detected_per_node(gres, gpus) -> None:
    node = _node(gres)
    assert [(g.index, g.model, g.share_type) for g in node.gpus] == gpus
    assert node.gpu_type == gpus[0][1]


@pytest.mark.parametrize("gres", ["gpu:4,mps:400", "gpu:t4:2,gpu:a10:2", "gpu:t4g0:1,gpu:a10g1:1", "mps:100", "",
                                  "gpu:t4g0:2,gpu:t4g1:2"])
def test_nodes_without_one_gpu_model_have_no_gpus(gres) -> None:
    assert _node(gres).gpus == () and _node(gres).gpu_type is None


def test_captured_node_and_job_of_a_per_gpu_cluster() -> None:
    """Responses of slurmrestd 22.05 for a node with per-GPU Types and a job with a typed share, running."""
    [node] = V38.parse_nodes(body("node_per_gpu_types"))
    assert node.gpus == tuple(NodeGpu(i, "t4", f"t4g{i}") for i in range(4))
    assert node.gres_total("mps") == 400
    [job] = V38.parse_jobs(body("job_running_typed_share"))
    assert job.state == "RUNNING" and job.mps_pct == 40 and job.mps_share_type == "t4g2"


def test_an_untyped_share_has_no_share_type() -> None:
    assert make_job(1, gres="gres:mps:30").mps_share_type is None
    assert make_job(1, gres="gres:mps:t4g1:30").mps_share_type == "t4g1"


def test_register_nodes_stores_the_model_and_slurms_index(tmp_path: Path) -> None:
    fake = FakeSlurm(nodes={"mx-t4-1": ("t4", 4), "mx-a10-1": ("a10", 2), "cpu-1": ("t4", 0)}, untyped={"mx-a10-1"})
    store = store_with_fake_nodes(tmp_path, fake)
    with store.session() as s:
        rows = sorted((g.node.name, g.gpu_index, g.gpu_type) for g in s.scalars(select(m.Gpu)))
        assert repo.gpu_type_names(s) == {"t4", "a10"}
    assert rows == sorted([("mx-t4-1", i, "t4") for i in range(4)] + [("mx-a10-1", i, "a10") for i in range(2)])


# -- the dispatcher ---------------------------------------------------------------------------------------
@pytest.fixture()
def fake() -> FakeSlurm:
    return FakeSlurm([make_job(sid, comment=GOOD.format(n=sid)) for sid in (11, 12, 13)], untyped={"mx-a10-1"})


@pytest.fixture()
def store(tmp_path: Path, fake: FakeSlurm) -> Store:
    return store_with_fake_nodes(tmp_path, fake)


def _ids(store: Store, fake: FakeSlurm) -> dict[int, int]:
    rep = import_submissions(store, fake, None, only=[11, 12, 13])
    with store.session() as s:
        for j in rep.imported:
            transition(s, j, JobState.PROFILING, "test")
            transition(s, j, JobState.PENDING, "test")
        return {j.slurm_job_id: j.id for j in s.scalars(select(m.OfflineJob))}


def _gpu(store: Store, node: str, index: int) -> int:
    with store.session() as s:
        return next(g.id for g in s.scalars(select(m.Gpu)) if (g.node.name, g.gpu_index) == (node, index))


def _round(store: Store, starts: list[tuple[int, int, int]]) -> tuple[int, RoundResult]:
    result = RoundResult([PlannedPlacement(j, g, p, 2 * 1024**3, 0.5, 0.1) for j, g, p in starts],
                         [PlanAction(Action.START, j, g, None, p) for j, g, p in starts], 0.5, 8, len(starts), 8)
    with store.session() as s:
        rnd = repo.record_round(s, dt.datetime(2026, 1, 5, tzinfo=dt.UTC), result, {}, False, len(starts),
                                {j: "start" for j, _, _ in starts})
        return rnd.id, result


def _backend(fake: FakeSlurm, name_gpus: bool = True) -> SlurmBackend:
    return SlurmBackend(lambda: fake, plan_key=PLAN_KEY, name_gpus=name_gpus)


def test_a_placement_names_the_planned_gpu_where_the_node_has_per_gpu_types(store: Store, fake: FakeSlurm) -> None:
    ids = _ids(store, fake)
    rid, result = _round(store, [(ids[11], _gpu(store, "mx-t4-1", 2), 35), (ids[12], _gpu(store, "mx-t4-1", 3), 35),
                                 (ids[13], _gpu(store, "mx-a10-1", 1), 20)])
    fake.calls.clear()
    assert _backend(fake).dispatch(store, rid, result, dt.datetime.now(dt.UTC)) == (3, 0)
    assert len(fake.sent("list_nodes")) == 1  # Slurm's nodes are read once per dispatch
    shares = {u[1]: u[2].gres_per_node for u in fake.sent("update_job")}
    # the untyped node keeps the plain share: Slurm picks the GPU it accounts it on
    assert shares == {11: "mps:t4g2:35", 12: "mps:t4g3:35", 13: "mps:20"}
    assert (fake.jobs[11].mps_share_type, fake.jobs[11].mps_pct) == ("t4g2", 35)
    # Slurm turns a plain sbatch's untyped share into a typed one only from an empty request
    assert [c[1] for c in fake.sent("clear_gres")] == [11, 12]


def test_without_naming_every_share_is_untyped_and_nothing_is_cleared(store: Store, fake: FakeSlurm) -> None:
    ids = _ids(store, fake)
    rid, result = _round(store, [(ids[11], _gpu(store, "mx-t4-1", 2), 35)])
    fake.calls.clear()
    assert _backend(fake, name_gpus=False).dispatch(store, rid, result, dt.datetime.now(dt.UTC)) == (1, 0)
    assert [u[2].gres_per_node for u in fake.sent("update_job")] == ["mps:35"]
    assert fake.sent("clear_gres") == [] and fake.sent("list_nodes") == []


@pytest.mark.parametrize("name_gpus", [True, False])
def test_a_job_holding_another_gpus_type_is_not_touched(store: Store, fake: FakeSlurm, name_gpus: bool) -> None:
    """Slurm 22.05 cannot re-type a pending job: the action fails with the reason before anything is sent."""
    ids = _ids(store, fake)
    rid, result = _round(store, [(ids[11], _gpu(store, "mx-t4-1", 2), 35)])
    _backend(fake).cluster(store, rid).dispatch(list(result.actions), dt.datetime.now(dt.UTC))
    fake.jobs[11] = replace(fake.jobs[11], state="RUNNING", priority=100, nodes=("mx-t4-1",))
    with store.session() as s:
        rnd = repo.record_round(s, dt.datetime(2026, 1, 5, 0, 15, tzinfo=dt.UTC), result, {}, False, 1,
                                {ids[11]: "migrate"})
        rid2 = rnd.id
    move = PlanAction(Action.MIGRATE, ids[11], _gpu(store, "mx-t4-1", 0), _gpu(store, "mx-t4-1", 2), 35)
    fake.calls.clear()
    [res] = _backend(fake, name_gpus).cluster(store, rid2).dispatch([move], dt.datetime.now(dt.UTC))
    assert not res.ok and "holds the MPS share Type t4g2" in res.detail, res
    assert fake.jobs[11].state == "RUNNING" and fake.sent("requeue") == fake.sent("update_job") == []


def test_a_restarted_dispatch_reconciles_a_typed_share(store: Store, fake: FakeSlurm) -> None:
    ids = _ids(store, fake)
    rid, result = _round(store, [(ids[11], _gpu(store, "mx-t4-1", 2), 35)])
    be = _backend(fake)
    be.cluster(store, rid).dispatch(list(result.actions), dt.datetime.now(dt.UTC))
    fake.calls.clear()
    assert be.dispatch(store, rid, result, dt.datetime.now(dt.UTC)) == (1, 0)
    # read back as gres:mps:t4g2:35 it equals the planned mps:t4g2:35: nothing cleared or sent again
    assert fake.sent("update_job") == fake.sent("clear_gres") == []


def test_running_maps_typed_shares_by_the_gpu_slurm_accounts(store: Store, fake: FakeSlurm) -> None:
    ids = _ids(store, fake)
    def c(job_id: int, sid: int, gpu: int, pct: int) -> str:
        return plans.encode(placement_plan(job_id, sid, gpu, pct, None), PLAN_KEY)

    fake.jobs[11] = replace(fake.jobs[11], state="RUNNING", priority=100, nodes=("mx-t4-1",),
                            gres_per_node="gres:mps:t4g3:40", comment=c(ids[11], 11, 3, 40))
    # a comment that disagrees with the typed share: Slurm's accounting wins
    fake.jobs[12] = replace(fake.jobs[12], state="RUNNING", priority=100, nodes=("mx-t4-1",),
                            gres_per_node="gres:mps:t4g0:25", comment=c(ids[12], 12, 1, 25))
    # an untyped share on the untyped node: only the comment knows the GPU
    fake.jobs[13] = replace(fake.jobs[13], state="RUNNING", priority=100, nodes=("mx-a10-1",),
                            gres_per_node="gres:mps:20", comment=c(ids[13], 13, 1, 20))
    running = _backend(fake).cluster(store).running()
    assert {j: (r.gpu_id, r.sm_pct) for j, r in running.items()} == {
        ids[11]: (_gpu(store, "mx-t4-1", 3), 40), ids[12]: (_gpu(store, "mx-t4-1", 0), 25),
        ids[13]: (_gpu(store, "mx-a10-1", 1), 20)}


def test_the_client_clears_a_jobs_gres_through_scontrol(tmp_path: Path) -> None:
    import httpx

    from executors.slurm.client import SlurmRestClient
    from executors.slurm.errors import SlurmUnsupported
    from executors.slurm.scontrol import ScontrolError, ScontrolRequeue
    from executors.slurm.settings import SlurmRestSettings

    log = tmp_path / "argv"
    tool = tmp_path / "scontrol"
    tool.write_text(f'#!/bin/sh\necho "$@" >> {log}\n[ "$2" != "JobId=13" ] || {{ echo "denied" >&2; exit 1; }}\n')
    tool.chmod(0o755)
    transport = httpx.MockTransport(lambda r: httpx.Response(500))
    settings = SlurmRestSettings(unix_socket="/x", api_version="v0.0.38")
    with pytest.raises(SlurmUnsupported, match="cannot clear"):
        SlurmRestClient(settings, transport=transport).clear_gres(5)
    c = SlurmRestClient(settings, transport=transport, requeue_fallback=ScontrolRequeue("/etc/s.conf", scontrol=str(tool)))
    c.clear_gres(12)
    assert log.read_text() == "update JobId=12 TresPerNode=\n"
    with pytest.raises(ScontrolError, match="denied"):
        c.clear_gres(13)


def test_pickup_refuses_a_typed_share() -> None:
    from executors.scheduler.slurm.pickup import spec_from_job
    from executors.scheduler.submission import SubmissionError

    with pytest.raises(SubmissionError, match="untyped share --gres=mps:30") as exc:
        spec_from_job(make_job(5, comment=GOOD.format(n=5), gres="gres:mps:t4g1:30"))
    assert exc.value.field == "gres"
