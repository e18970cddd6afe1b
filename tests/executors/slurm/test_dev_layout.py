"""The dev cluster's pure parts: configuration rendering (golden), layout, PID bookkeeping."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from executors.slurm.dev.layout import DevClusterLayout, DevNode
from executors.slurm.dev.procs import ProcTable, descendants, is_running, start_ticks, terminate

GOLDEN = Path(__file__).resolve().parent / "golden" / "dev"
LAYOUT = DevClusterLayout(state_dir=Path("/tmp/muxflow-slurm"), controller_host="devhost")


@pytest.mark.parametrize("name, render", [("slurm.conf", LAYOUT.render_slurm_conf),
                                          ("gres.conf", LAYOUT.render_gres_conf)])
def test_config_matches_golden(name, render) -> None:
    path = GOLDEN / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render())
        pytest.fail(f"recorded missing golden file {path.name}; review it and run again")
    assert render() == path.read_text(), f"{path.name} differs; delete it to re-record"


def test_config_has_what_the_issue_asks() -> None:
    conf = LAYOUT.render_slurm_conf()
    for line in ("GresTypes=gpu,mps", "SelectType=select/cons_tres", "AuthAltTypes=auth/jwt",
                 "SlurmctldHost=devhost(10.213.7.1)", "SlurmUser=muxflow-slurm"):
        assert line in conf.splitlines()
    assert "Gres=gpu:t4:4,mps:400" in conf and "Gres=gpu:a10:4,mps:400" in conf
    assert "NodeAddr=10.213.7.11" in conf and "NodeAddr=10.213.7.12" in conf
    for part in ("online", "offline", "profile"):
        assert f"PartitionName={part} Nodes=mx-t4-1,mx-a10-1" in conf
    gres = LAYOUT.render_gres_conf()
    assert "NodeName=mx-a10-1 Name=mps Count=400 File=/tmp/muxflow-slurm/gpu/mx-a10-1-gpu[0-3]" in gres


def test_network_names_fit_linux_limits() -> None:
    for node in LAYOUT.nodes:
        assert len(LAYOUT.veth(node)) <= 15
    assert LAYOUT.netns(LAYOUT.nodes[0]) == "mxslurm0-mx-t4-1"
    assert LAYOUT.node_address(LAYOUT.nodes[1]) == "10.213.7.12"


def test_layout_json_roundtrip() -> None:
    layout = DevClusterLayout(state_dir=Path("/x"), controller_host="h", subnet="172.29.213.0/24",
                              nodes=(DevNode("a", "t4", gpus=2), DevNode("b", "a10")))
    assert DevClusterLayout.from_json(layout.to_json()) == layout


@pytest.mark.parametrize("kwargs", [
    {"nodes": (DevNode("a", "t4"), DevNode("a", "a10"))},
    {"nodes": ()},
    {"subnet": "10.0.0.0/29"},
    {"default_partition": "batch"},
    {"bridge": "a-very-long-bridge"},
])
def test_layout_validation(kwargs) -> None:
    with pytest.raises(ValueError):
        DevClusterLayout(state_dir=Path("/x"), controller_host="h", **kwargs)


def test_proc_table_records_and_liveness(tmp_path: Path) -> None:
    table = ProcTable(tmp_path / "pids")
    rec = table.start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                      log=tmp_path / "log" / "sleeper.out", env=dict(os.environ), cwd=tmp_path)
    try:
        assert table.get("sleeper") == rec and rec.running()
        assert rec.start_ticks == start_ticks(rec.pid)
        assert not is_running(rec.pid, (rec.start_ticks or 0) + 1), "a different start time is another process"
        assert terminate([rec.pid], 5.0) == []
        assert not rec.running()  # a zombie child counts as gone (and is reaped)
    finally:
        terminate([rec.pid], 1.0)
    table.drop("sleeper")
    assert table.all() == []


def test_descendants() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess,sys,time; "
                             "p=subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); "
                             "print(p.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        child = int(proc.stdout.readline())
        assert child in descendants(proc.pid)
    finally:
        terminate([child, proc.pid], 2.0)
        proc.wait(5)
