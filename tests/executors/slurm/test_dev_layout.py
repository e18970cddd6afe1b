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
    # one gres Type per GPU, so a placement can name its GPU (docs/SLURM.md)
    assert ("Gres=gpu:t4g0:1,gpu:t4g1:1,gpu:t4g2:1,gpu:t4g3:1,mps:t4g0:100,mps:t4g1:100,mps:t4g2:100,mps:t4g3:100"
            in conf)
    assert "NodeAddr=10.213.7.11" in conf and "NodeAddr=10.213.7.12" in conf
    for part in ("online", "offline", "profile"):
        assert f"PartitionName={part} Nodes=mx-t4-1,mx-a10-1" in conf
    gres = LAYOUT.render_gres_conf().splitlines()
    assert "NodeName=mx-a10-1 Name=gpu Type=a10g2 File=/tmp/muxflow-slurm/gpu/mx-a10-1-gpu2" in gres
    assert ("NodeName=mx-a10-1 Name=mps Type=a10g2 Count=100 File=/tmp/muxflow-slurm/gpu/mx-a10-1-gpu2 "
            "Flags=all_sharing") in gres
    # without all_sharing Slurm 22.05 runs MPS jobs on one GPU of a node at a time (DESIGN §4)
    assert all(line.endswith("Flags=all_sharing") for line in gres if "Name=mps" in line)


def test_a_node_without_per_gpu_types_has_the_classic_gres_with_all_sharing() -> None:
    layout = DevClusterLayout(state_dir=Path("/s"), controller_host="h",
                              nodes=(DevNode("a", "t4"), DevNode("b", "a10", gpus=2, mps_count=200,
                                                                 per_gpu_types=False)))
    conf = layout.render_slurm_conf()
    assert "Gres=gpu:a10:2,mps:200 " in conf and "Gres=gpu:t4g0:1," in conf
    gres = layout.render_gres_conf().splitlines()
    assert "NodeName=b Name=gpu Type=a10 File=/s/gpu/b-gpu[0-1]" in gres
    assert "NodeName=b Name=mps Count=200 File=/s/gpu/b-gpu[0-1] Flags=all_sharing" in gres
    assert sum("NodeName=a Name=mps Type=t4g" in line for line in gres) == 4


def test_mps_must_split_evenly_over_the_gpus() -> None:
    with pytest.raises(ValueError, match="split evenly"):
        DevNode("a", "t4", gpus=3, mps_count=400)


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
