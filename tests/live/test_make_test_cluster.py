"""``make test`` leaves the machine's dev cluster as it found it (.ci/with_slurm.sh, the Makefile's test runner)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from executors.dev.slurm import DevCluster
from executors.dev.slurm import network as net
from executors.dev.slurm.procs import is_running
from tests.live.conftest import REPO, _free_port_base, _free_subnet

SCRIPT = REPO / ".ci" / "with_slurm.sh"


def _with_slurm(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), "sh", "-c", command], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "MUXFLOW_BIN": str(Path(sys.executable).parent / "muxflow"), **extra}


def test_a_cluster_running_before_is_left_running_and_the_status_is_the_commands(dev_cluster) -> None:
    before = {(r.name, r.pid) for r in dev_cluster.cluster.procs.all()}
    out = _with_slurm("exit 3", _env(MUXFLOW_SLURM_DIR=str(dev_cluster.cluster.state_dir)))
    assert out.returncode == 3, out.stdout + out.stderr
    assert "taking down" not in out.stdout
    assert {(r.name, r.pid) for r in dev_cluster.cluster.procs.all()} == before
    assert dev_cluster.cluster.status().ok


@pytest.mark.slow
def test_a_cluster_it_brought_up_is_taken_down_also_when_the_tests_fail(dev_cluster) -> None:
    """A fresh machine, as far as the script can tell: its own state dir, bridge, ports and subnet."""
    pid = os.getpid()
    bridge = f"mxm{pid % 100000}"
    state = Path(tempfile.mkdtemp(prefix="muxflow-slurm-maketest-"))
    os.chmod(state, 0o755)
    env = _env(MUXFLOW_SLURM_DIR=str(state), MUXFLOW_SLURM_BRIDGE=bridge,
               MUXFLOW_SLURM_PORT_BASE=str(_free_port_base(pid + 97)),
               MUXFLOW_SLURM_SUBNET=_free_subnet(bridge, pid + 97))
    cluster = DevCluster(state, echo=lambda _m: None)
    try:
        # the "tests": prove the cluster is up while they run, then fail
        probe = f"{env['MUXFLOW_BIN']} slurm dev-status > {state}/during.txt && exit 4"
        out = _with_slurm(probe, env)
        assert out.returncode == 4, out.stdout + out.stderr
        during = (state / "during.txt").read_text()
        assert "mx-t4-1" in during and " running" in during
        assert "taking down the dev Slurm cluster this run brought up" in out.stdout
        layout = cluster.load_layout()
        assert layout is not None
        assert cluster.procs.all() == [], "dev-down leaves no PID records"
        pids = [int(line.split()[2]) for line in during.splitlines() if line.endswith(" running")]
        assert pids and not any(is_running(p, None) for p in pids), "a dev-cluster process survived"
        assert not net.link_exists(bridge) and not any(layout.netns_path(n).exists() for n in layout.nodes)
        assert not cluster.status().ok
        assert dev_cluster.cluster.status().ok, "the shared cluster must be untouched"
    finally:
        cluster.down(grace_s=2, quiet=True)
        shutil.rmtree(state, ignore_errors=True)
