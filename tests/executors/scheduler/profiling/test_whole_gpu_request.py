"""A profiling or sampling run asks for one whole GPU of its type; on nodes with one gres Type per GPU
(``gpu:t4g0:1,…``, docs/SLURM.md) ``gpu:<model>:1`` matches nothing, so it asks ``gpu:1`` on a node of that type."""

from __future__ import annotations

from executors.scheduler.profiling.slurm_exec import whole_gpu_request
from executors.slurm.hostlist import parse_gres
from executors.slurm.models import Node


def _node(name: str, gres: str, used: str = "", state: str = "IDLE", partitions=("profile",)) -> Node:
    return Node(name, "", name, state, (), partitions, parse_gres(gres), parse_gres(used), 8, 0, "")


TYPED_T4 = "gpu:t4g0:1,gpu:t4g1:1,mps:t4g0:100,mps:t4g1:100"


def test_classic_nodes_keep_the_model_type() -> None:
    nodes = [_node("a", "gpu:t4:4,mps:400"), _node("b", "gpu:a10g0:1,mps:a10g0:100")]
    assert whole_gpu_request(nodes, "profile", "t4") == ("gpu:t4:1", None)
    # one classic node of the model is enough: Slurm finds it by Type
    assert whole_gpu_request(nodes + [_node("c", TYPED_T4)], "profile", "t4") == ("gpu:t4:1", None)


def test_per_gpu_nodes_get_any_gpu_on_the_node_of_the_model_with_most_free() -> None:
    nodes = [_node("t4-busy", TYPED_T4, used="gpu:t4g0:1(IDX:0),gpu:t4g1:0"), _node("t4-free", TYPED_T4),
             _node("a10", "gpu:a10g0:1,gpu:a10g1:1,mps:a10g0:100,mps:a10g1:100"),
             _node("t4-elsewhere", TYPED_T4, partitions=("offline",))]
    assert whole_gpu_request(nodes, "profile", "t4") == ("gpu:1", "t4-free")
    assert whole_gpu_request(nodes, "profile", "a10") == ("gpu:1", "a10")
    # a node that cannot take work loses to one that can, however many GPUs it has free
    drained = [_node("t4-down", TYPED_T4, state="DOWN"), _node("t4-busy", TYPED_T4, used="gpu:t4g0:1,gpu:t4g1:0")]
    assert whole_gpu_request(drained, "profile", "t4") == ("gpu:1", "t4-busy")


def test_no_node_of_the_model_keeps_the_model_type() -> None:
    """Slurm then refuses the submission with its own message, which the run records."""
    assert whole_gpu_request([_node("a", TYPED_T4)], "profile", "v100") == ("gpu:v100:1", None)
