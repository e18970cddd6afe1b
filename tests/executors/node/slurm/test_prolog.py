"""The Prolog and Epilog as slurmd runs them (root), against a stand-in ``squeue`` and the dev cluster's stand-in MPS
control (it records every command in the GPU's pipe directory): the hard caps they set."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
from pathlib import Path

import pytest

from executors.dev.slurm.cluster import install_node_scripts
from executors.dev.slurm.layout import DevClusterLayout
from executors.slurm import plan as plans

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the node scripts run as root and check root's ownership")
JOB = 4711
NODE = "n1"
MIB = 1024**2


@pytest.fixture()
def layout(tmp_path: Path) -> DevClusterLayout:
    layout = DevClusterLayout(state_dir=tmp_path, controller_host="h")
    layout.etc_dir.mkdir()
    install_node_scripts(layout, os.getuid())
    plans.write_key(layout.node_plan_key_file, KEY)
    (tmp_path / "log").mkdir(mode=0o755)
    return layout


KEY = bytes(range(32))


def _signed(fields: dict[str, str]) -> str:
    """A comment signed with the nodes' key whatever its values (as an older MuxFlow could have written it)."""
    sig = hmac.new(KEY, plans._canonical(fields), hashlib.sha256).hexdigest()
    return " ".join([plans.PREFIX, *(f"{k}={v}" for k, v in fields.items()), f"sig={sig}"])


def _env(layout: DevClusterLayout, comment: str, tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    squeue = bin_dir / "squeue"
    squeue.write_text("#!/bin/sh\ncat <<'EOF'\n" + json.dumps(
        {"jobs": [{"job_id": JOB, "partition": "offline", "comment": comment}]}) + "\nEOF\n")
    squeue.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": str(JOB), "SLURMD_NODENAME": NODE,
            "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "MUXFLOW_NODE_LOG_DIR": str(tmp_path / "log")}


def _run(layout: DevClusterLayout, script: str, env: dict[str, str]) -> list[str]:
    subprocess.run([str(layout.node_script_dir / script)], env=env, check=True, capture_output=True, timeout=60)
    log = layout.mps_pipe_root / NODE / "gpu2" / "commands.log"
    return [line.split(" ", 2)[2] for line in log.read_text().splitlines()] if log.exists() else []


def test_a_quota_is_rounded_up_to_whole_mib(layout: DevClusterLayout, tmp_path: Path) -> None:
    comment = plans.encode(plans.Plan(JOB, 12, "place", 2, sm_pct=30, mem_bytes=64 * MIB + 1), KEY)
    cmds = _run(layout, "prolog.sh", _env(layout, comment, tmp_path))
    # rounded down, 64M would let the job pin a little more than its plan's quota... and 1 byte would be 0M
    assert "set_default_device_pinned_mem_limit 2 65M" in cmds, cmds
    assert "set_default_active_thread_percentage 30" in cmds


def test_a_one_byte_quota_never_becomes_no_limit(layout: DevClusterLayout, tmp_path: Path) -> None:
    """mem=1 once made the Prolog write 0M, which MPS reads as no limit at all."""
    comment = _signed({"slurm": str(JOB), "job": "12", "kind": "place", "gpu": "2", "pct": "30", "mem": "1"})
    cmds = _run(layout, "prolog.sh", _env(layout, comment, tmp_path))
    limits = [c for c in cmds if "pinned_mem_limit" in c]
    assert all(not c.endswith((" 0", " 0M")) for c in limits), limits
    # the plan tool refuses a quota below the floor: no plan, nothing configured, and the log says why
    assert not (layout.plan_dir / f"{JOB}.plan").exists()
    assert f"mem must be at least {plans.MIN_MEM_BYTES}" in (tmp_path / "log" / "muxflow-node.log").read_text()


def test_the_epilog_rounds_the_remaining_quota_up(layout: DevClusterLayout, tmp_path: Path) -> None:
    env = _env(layout, plans.encode(plans.Plan(JOB, 12, "place", 2, sm_pct=30, mem_bytes=64 * MIB), KEY), tmp_path)
    _run(layout, "prolog.sh", env)
    # another job still placed on the GPU, its plan file root's (as the Prolog wrote it) with an odd quota
    other = layout.plan_dir / "4800.plan"
    other.write_text(plans.Plan(4800, 13, "place", 2, sm_pct=20, mem_bytes=100 * MIB + 7).file_text(NODE))
    other.chmod(0o644)
    cmds = _run(layout, "epilog.sh", env)
    assert cmds[-2:] == ["set_default_active_thread_percentage 20", "set_default_device_pinned_mem_limit 2 101M"]
