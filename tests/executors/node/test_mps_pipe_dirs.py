"""The node agent's MPS directories: each GPU's own, where the Prolog starts its control daemon, under a root that
only root can write (never /tmp)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from executors.node.agent import AgentConfig
from executors.node.sampler import RawSample, SimulatedSampler
from executors.node.wiring import build_agent, node_gpus

NODE = "sim-a10-000"
CALM = RawSample(40.0, 30.0, 15.0, 6e9, 24e9, 10.0, 1600.0, 1700.0, 120.0, 55.0)


def _agent(store, root: str):
    sampler = SimulatedSampler(replay={g.gpu_index: [CALM] for g, _ in node_gpus(store, NODE)})
    return build_agent(store, NODE, simulated=False, cfg=AgentConfig(interval_s=1.0), shm_dir=None,
                       evict_callback=lambda gpu_id, reason: [], sampler=sampler, mps_pipe_root=root)


@pytest.mark.parametrize("root", ["/tmp/nvidia-mps", "/tmp/muxflow/mps"])
def test_the_agent_does_not_start_with_its_mps_pipes_under_tmp(cluster_store, root) -> None:
    with pytest.raises(ValueError, match=f"MPS pipe root {root}: its parent /tmp is writable by group or others"):
        _agent(cluster_store, root)


@pytest.mark.skipif(os.geteuid() != 0, reason="a root-owned chain of directories")
def test_each_gpu_is_probed_through_its_own_pipe_directory_as_the_prolog_makes_it(cluster_store) -> None:
    root = tempfile.mkdtemp(prefix="muxflow-test-mps-", dir="/run")
    try:
        os.chmod(root, 0o755)
        agent = _agent(cluster_store, root)
        try:
            for i, loop in agent.loops.items():
                mps = loop.detector.mps
                assert mps.env["CUDA_MPS_PIPE_DIRECTORY"] == f"{root}/gpu{i}"
                assert mps.env["CUDA_MPS_LOG_DIRECTORY"] == f"{root}/gpu{i}.log"
                assert mps.server_alive() is None and loop.detector.mps_state == "no pipe dir"  # none made yet
        finally:
            agent.shutdown()
    finally:
        shutil.rmtree(root, ignore_errors=True)
