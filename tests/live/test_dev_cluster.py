"""The dev cluster itself: idempotent dev-up, nodes and partitions as the issue asks, status, restart cycle."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from executors.dev.slurm import DevCluster
from executors.dev.slurm import network as net
from executors.dev.slurm.procs import is_running, terminate


def _pids(cluster: DevCluster) -> dict[str, tuple[int, int | None]]:
    return {r.name: (r.pid, r.start_ticks) for r in cluster.procs.all()}


def test_second_dev_up_is_a_no_op(dev_cluster) -> None:
    before = _pids(dev_cluster.cluster)
    assert set(before) == set(dev_cluster.cluster.component_names(dev_cluster.layout))
    out = dev_cluster.cli("dev-up")
    assert out.returncode == 0, out.stderr
    assert "already up" in out.stdout and "started" not in out.stdout.replace("nothing started", "")
    assert _pids(dev_cluster.cluster) == before
    assert all(is_running(pid, ticks) for pid, ticks in before.values())


def test_dev_up_restarts_only_what_died(dev_cluster) -> None:
    cluster = dev_cluster.cluster
    before = _pids(cluster)
    victim = cluster.procs.get("slurmd-mx-a10-1")
    assert terminate([victim.pid], 5.0) == []
    assert "slurmd-mx-a10-1 is not running" in cluster.status().problems
    out = dev_cluster.cli("dev-up")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "started slurmd-mx-a10-1" in out.stdout and out.stdout.count("started ") == 1
    after = _pids(cluster)
    assert after["slurmd-mx-a10-1"] != before["slurmd-mx-a10-1"]
    assert {k: v for k, v in after.items() if k != "slurmd-mx-a10-1"} == \
        {k: v for k, v in before.items() if k != "slurmd-mx-a10-1"}
    assert cluster.status().ok


def test_dev_status_reports_processes_nodes_and_rest(dev_cluster) -> None:
    out = dev_cluster.cli("dev-status")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for rec in dev_cluster.cluster.procs.all():
        [line] = [ln for ln in lines if ln.split()[:1] == [rec.name]]
        assert str(rec.pid) in line and line.endswith("running")
    for text in ("mx-t4-1", "mx-a10-1", f"unix:{dev_cluster.layout.rest_socket}", dev_cluster.layout.rest_url,
                 "SLURM_CONF="):
        assert text in out.stdout


def test_two_nodes_with_gpu_and_mps_gres(dev_cluster) -> None:
    with dev_cluster.client() as c:
        nodes = {n.name: n for n in c.list_nodes()}
        busy = {n for j in c.list_jobs() if j.state in ("RUNNING", "COMPLETING") for n in j.nodes}
    assert set(nodes) == {"mx-t4-1", "mx-a10-1"}
    assert {n.gpu_type for n in nodes.values()} == {"t4", "a10"}
    for n in nodes.values():
        assert n.usable, (n.name, n.state, n.state_flags)
        assert n.state == "IDLE" or n.name in busy
        assert n.gres_total("gpu") == 4 and n.gres_total("mps") == 400
        assert set(n.partitions) == {"online", "offline", "profile"}


def test_partitions(dev_cluster) -> None:
    with dev_cluster.client() as c:
        parts = {p.name: p for p in c.list_partitions()}
    assert set(parts) == {"online", "offline", "profile"}
    assert all(p.state == "UP" and set(p.nodes) == {"mx-t4-1", "mx-a10-1"} for p in parts.values())


def test_each_slurmd_has_its_own_network_namespace(dev_cluster) -> None:
    layout = dev_cluster.layout
    mine = os.readlink("/proc/self/ns/net")
    seen = set()
    for node in layout.nodes:
        rec = dev_cluster.cluster.procs.get(f"slurmd-{node.name}")
        assert rec is not None and rec.running()
        ns = os.readlink(f"/proc/{rec.pid}/ns/net")
        assert ns != mine and ns not in seen
        seen.add(ns)
        assert rec.pid in net.pids_in_netns(layout.netns_path(node))
    for name in ("slurmctld", "slurmrestd-local", "slurmrestd-jwt", "munged"):
        assert os.readlink(f"/proc/{dev_cluster.cluster.procs.get(name).pid}/ns/net") == mine


@pytest.mark.slow
def test_down_up_down_on_a_second_cluster(dev_cluster) -> None:
    """dev-up → dev-down → dev-up → dev-down on an independent cluster beside the main one."""
    state = Path(tempfile.mkdtemp(prefix="muxflow-slurm-cycle-"))
    os.chmod(state, 0o755)  # the service user must reach its state below
    other = DevCluster(state, bridge="mxslurm9", port_base=7117, echo=lambda _m: None)
    try:
        pids = []
        for _ in range(2):
            st = other.up(timeout_s=90, install=False)
            assert st.ok, st.problems
            assert st.layout.subnet != dev_cluster.layout.subnet
            recs = other.procs.all()
            assert len(recs) == len(other.component_names(st.layout))
            pids.append({(r.pid, r.start_ticks) for r in recs})
            assert other.down(grace_s=5) == []
            assert not any(is_running(p, t) for p, t in pids[-1]), "a recorded process survived dev-down"
            assert other.procs.all() == []
            assert not net.link_exists("mxslurm9")
            assert not any(st.layout.netns_path(n).exists() for n in st.layout.nodes)
            assert not other.status().ok
        assert pids[0].isdisjoint(pids[1])
        assert dev_cluster.cluster.status().ok, "the main cluster must be untouched"
    finally:
        other.down(grace_s=2, quiet=True)
        shutil.rmtree(state, ignore_errors=True)
