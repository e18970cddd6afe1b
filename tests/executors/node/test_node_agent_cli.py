"""``muxflow node-agent --simulated`` as a subprocess: minutes reach the store, SIGTERM flushes and exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from executors.node.wiring import node_gpus
from executors.node.xcuda import shm
from executors.store import models as m

REPO = Path(__file__).resolve().parents[3]


def _rows_per_gpu(store, gpu_ids):
    with store.session() as s:
        got = dict(s.execute(
            select(m.GpuMetricMinute.gpu_id, func.count()).where(m.GpuMetricMinute.gpu_id.in_(gpu_ids))
            .group_by(m.GpuMetricMinute.gpu_id)
        ).all())
    return {g: got.get(g, 0) for g in gpu_ids}


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_node_agent_subprocess_flushes_on_sigterm(cluster_store, tmp_path):
    store = cluster_store
    gpu_ids = [g.id for g, _ in node_gpus(store, "sim-t4-000")]
    shm_dir = tmp_path / "shm"
    env = {**os.environ, "MUXFLOW_DATABASE_URL": store.url, "PYTHONUNBUFFERED": "1"}
    # --time-scale 120: an agent minute passes every half second of real time
    cmd = [sys.executable, "-m", "pipelines.cli", "-v", "node-agent", "--node", "sim-t4-000", "--simulated",
           "--interval-ms", "10", "--shm-dir", str(shm_dir), "--time-scale", "120"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60.0
        seen = _rows_per_gpu(store, gpu_ids)
        while min(seen.values()) < 2:  # two completed minutes per GPU
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, f"no minute rows in time: {seen}"
            time.sleep(0.2)  # polling the store, not waiting out a race
            seen = _rows_per_gpu(store, gpu_ids)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert "node-agent: stopped after" in err
    after = _rows_per_gpu(store, gpu_ids)
    # the minute in progress at SIGTERM was flushed: every GPU has a row more than we last saw
    assert all(after[g] >= seen[g] + 1 for g in gpu_ids), (seen, after)
    with store.session() as s:
        rows = s.scalars(select(m.GpuMetricMinute).where(m.GpuMetricMinute.gpu_id.in_(gpu_ids))).all()
        assert {r.source for r in rows} == {"simulated"}
        assert all(0.0 <= r.sm_activity_pct <= 100.0 and r.sm_clock_mhz > 0 for r in rows)
        healths = {g.health for g in s.scalars(select(m.Gpu).where(m.Gpu.id.in_(gpu_ids)))}
        assert healths <= {"Healthy", "Unhealthy", "Overlimit"}
    for idx in range(len(gpu_ids)):
        rec = shm.decode((shm_dir / f"muxflow-gpu-{idx}").read_bytes())
        assert rec.gpu_index == idx and rec.seq >= 2 and 0.0 <= rec.sample.u_sm <= 1.0
        assert rec.sample.clock_max_mhz > 0 and rec.sample.clock_threshold_mhz > 0
        assert oct((shm_dir / f"muxflow-gpu-{idx}").stat().st_mode & 0o777) == "0o644"


def test_node_agent_unknown_node_is_a_clear_error(tmp_path):
    from click.testing import CliRunner

    from executors.store.migrate import upgrade
    from pipelines.cli import main

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)
    r = CliRunner().invoke(main, ["--db", url, "node-agent", "--node", "nope", "--simulated", "--no-shm",
                                  "--duration", "0"])
    assert r.exit_code == 1 and "node 'nope' is not in the store" in r.output


def test_node_agent_duration_runs_and_exits(cluster_store, tmp_path):
    from click.testing import CliRunner

    from pipelines.cli import main

    r = CliRunner().invoke(main, ["--db", cluster_store.url, "node-agent", "--node", "sim-a10-000", "--simulated",
                                  "--shm-dir", str(tmp_path), "--duration", "0.3", "--interval-ms", "5"])
    assert r.exit_code == 0, r.output
    assert "8 simulated GPU(s)" in r.output
    with cluster_store.session() as s:
        assert s.scalar(select(func.count()).select_from(m.GpuMetricMinute)) >= 8
