"""Graph memory-allocation nodes are device memory too: cuGraphAddMemAllocNode, and cuGraphAddNode / _v2 with an
allocation's parameters, are charged against the quota when the node is created, refused over it before the driver
sees them, and keep their charge after the graph is gone (an instantiation of the graph, and an allocation the graph
does not free, outlive it; refunding at cuGraphDestroy would let a program escape the quota)."""

from __future__ import annotations

import pytest

OOM = "2"
MIB = 1 << 20


@pytest.mark.parametrize("how", ["node", "add", "add_v2"])
@pytest.mark.parametrize("path", ["direct", "dlsym", "gpa"])
def test_a_graph_allocation_node_is_charged_and_refused_over_the_quota(harness, how, path) -> None:
    run = harness("init",
                  "graph-alloc", how, str(2 * MIB), path,       # more than the quota: refused
                  "fake-used",
                  "graph-alloc", how, str(MIB * 3 // 4), path,  # fits: charged
                  "meminfo",
                  "alloc", "v2", str(MIB // 2),                  # would exceed what the node left: refused
                  "alloc", "v2", str(MIB // 8),                  # fits in what is left
                  XCUDA_MEM_QUOTA_BYTES="1MiB")
    assert run.returncode == 0, run.stderr
    refused, fits = run.fields("graph-alloc", 0), run.fields("graph-alloc", 1)
    assert (refused["rc"], refused["dptr"]) == (OOM, "none")
    assert run.fields("fake-used", 0) == {"bytes": "0"}  # the driver never saw it
    assert (fits["rc"], fits["dptr"]) == ("0", "set")     # the driver's address is handed back
    assert run.fields("meminfo")["free"] == str(MIB - MIB * 3 // 4)
    assert [run.fields("alloc", i)["rc"] for i in range(2)] == [OOM, "0"]
    assert "cuGraphAdd" in run.stderr and "refused" in run.stderr


def test_a_node_the_driver_refuses_gives_the_budget_back(harness) -> None:
    run = harness("init", "fail-next", "cuGraphAddMemAllocNode", "2", "graph-alloc", "node", "4096", "meminfo",
                  "fail-next", "cuGraphAddNode", "1", "graph-alloc", "add", "4096", "meminfo",
                  XCUDA_MEM_QUOTA_BYTES="1MiB")
    assert [run.fields("graph-alloc", i)["rc"] for i in range(2)] == [OOM, "1"]
    assert [run.fields("meminfo", i)["free"] for i in range(2)] == [str(MIB), str(MIB)]


def test_other_node_types_are_not_charged(harness) -> None:
    # A kernel node whose unused union bytes happen to read as a huge allocation.
    run = harness("init", "graph-kernel", "meminfo", XCUDA_MEM_QUOTA_BYTES="1MiB")
    assert run.fields("graph-kernel") == {"rc": "0"}
    assert run.fields("meminfo")["free"] == str(MIB)


def test_graph_allocations_accumulate(harness) -> None:
    # Nodes of graphs no longer needed keep their charge: four of 300 KiB do not fit in 1 MiB.
    step = str(300 * 1024)
    run = harness("init", *(["graph-alloc", "node", step] * 4), XCUDA_MEM_QUOTA_BYTES="1MiB")
    assert [run.fields("graph-alloc", i)["rc"] for i in range(4)] == ["0", "0", "0", OOM]
