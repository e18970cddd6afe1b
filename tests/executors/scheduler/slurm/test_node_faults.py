"""GPU health from Slurm's node states (executors.scheduler.slurm.node_faults.mark_gpus) beside the node agents' own:
a node Slurm calls unusable takes its GPUs out of the rounds, and its return gives back only what it took —
never a SysMonitor state. No Slurm needed."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select

from executors.scheduler.slurm import node_faults
from executors.store import models as m
from executors.store import repo
from scheduler_core.domain import GpuHealth
from tests.executors.scheduler.slurm.fake_slurm import FakeSlurm, store_with_fake_nodes

T0 = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)


@pytest.fixture()
def cluster(tmp_path: Path):
    fake = FakeSlurm()
    store = store_with_fake_nodes(tmp_path, fake)
    with store.session() as s:
        gpus = {(g.node.name, g.gpu_index): g.id for g in s.scalars(select(m.Gpu))}
        repo.set_gpu_health(s, {gid: GpuHealth.HEALTHY.value for gid in gpus.values()}, T0)
    return store, fake, gpus


def _health(store, gpu_ids) -> dict[int, tuple[str, str]]:
    with store.session() as s:
        return {g.id: (g.health, g.health_source) for g in s.scalars(select(m.Gpu).where(m.Gpu.id.in_(gpu_ids)))}


def _nodes(fake: FakeSlurm, **states: str):
    return [replace(n, state=states.get(n.name, n.state)) for n in fake.list_nodes()]


def test_a_sysmonitor_unhealthy_survives_every_sync_while_the_node_is_usable(cluster) -> None:
    store, fake, gpus = cluster
    calm = gpus[("mx-t4-1", 0)]
    with store.session() as s:  # the node agent: Overlimit passed, the GPU stays Unhealthy for its hold period
        repo.set_gpu_health(s, {calm: GpuHealth.UNHEALTHY.value}, T0)
    for minute in range(3):
        assert node_faults.mark_gpus(store, _nodes(fake), T0 + dt.timedelta(minutes=minute)) == {}
    assert _health(store, [calm])[calm] == ("Unhealthy", "node")


def test_a_down_node_takes_its_gpus_out_and_its_return_gives_back_only_those_it_took(cluster) -> None:
    store, fake, gpus = cluster
    t4 = [gid for (node, _), gid in gpus.items() if node == "mx-t4-1"]
    own = t4[1]
    with store.session() as s:  # the agent's SysMonitor had this one Unhealthy before the node went down
        repo.set_gpu_health(s, {own: GpuHealth.UNHEALTHY.value}, T0)
    taken = node_faults.mark_gpus(store, _nodes(fake, **{"mx-t4-1": "DOWN"}), T0)
    assert taken == {g: "Unhealthy" for g in t4 if g != own}
    assert {h for h in _health(store, t4).values()} == {("Unhealthy", "slurm"), ("Unhealthy", "node")}
    back = node_faults.mark_gpus(store, _nodes(fake), T0 + dt.timedelta(minutes=5))
    assert back == {g: "Healthy" for g in t4 if g != own}
    assert _health(store, [own])[own] == ("Unhealthy", "node")
    assert node_faults.mark_gpus(store, _nodes(fake), T0 + dt.timedelta(minutes=6)) == {}  # settled


def test_an_agent_write_between_the_read_and_the_write_wins(cluster, monkeypatch) -> None:
    """The sync reads the GPUs' health, a node agent writes its state, then the sync writes: the agent's stays."""
    store, fake, gpus = cluster
    gid = gpus[("mx-a10-1", 2)]
    read = node_faults.inventory.gpu_health_by_node

    def read_then_agent_writes(s):
        rows = read(s)
        with store.session() as other:
            repo.set_gpu_health(other, {gid: GpuHealth.OVERLIMIT.value}, T0)
        return rows

    monkeypatch.setattr(node_faults.inventory, "gpu_health_by_node", read_then_agent_writes)
    changes = node_faults.mark_gpus(store, _nodes(fake, **{"mx-a10-1": "DOWN"}), T0)
    assert gid not in changes and len(changes) == 3
    assert _health(store, [gid])[gid] == ("Overlimit", "node")
