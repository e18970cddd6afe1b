"""Every reference workload runs on CPU for a few iterations/requests; the job types exist in the catalog."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from executors.data.calibration import default_catalog
from executors.job.runtime import Runtime
from executors.job.workloads.models import FAMILIES, SIZES, batch_pool, build_model, reference_job_types, workload_size
from executors.job.workloads.serve import STDOUT_MARKER, serve
from executors.job.workloads.train import train

REPO = Path(__file__).resolve().parents[4]


def test_every_size_names_a_catalog_job_type() -> None:
    known = set(default_catalog().offline)
    assert set(reference_job_types()) == {(f, s) for f in FAMILIES for s in SIZES}
    assert set(reference_job_types().values()) <= known
    with pytest.raises(ValueError, match="unknown workload"):
        workload_size("cnn", "huge")


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_models_forward_and_backward(family) -> None:
    w = workload_size(family, "tiny")
    model = build_model(w)
    (inputs, y), = batch_pool(w, 4, 1, 0, torch.device("cpu"))
    out = model(*inputs)
    assert out.shape[0] == 4 and torch.isfinite(out).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_serve_on_cpu_records_every_request(family) -> None:
    rep = serve(family, "tiny", qps=40, duration_s=0.5, device="cpu", arrivals="uniform")
    assert rep["requests"] == rep["scheduled_requests"] == 20 and not rep["stopped_early"]
    assert 0 < rep["p50_ms"] <= rep["p99_ms"] <= rep["max_ms"]
    assert rep["device_type"] == "cpu" and rep["window_end_unix"] > rep["window_start_unix"]


@pytest.mark.parametrize("family", FAMILIES)
def test_train_on_cpu_resumes_to_the_same_loss(family, tmp_path) -> None:
    def rt(d):
        return Runtime(d, every_steps=3, signals=(), profiling=None)

    whole = train(family, "tiny", str(tmp_path / "a"), 6, device="cpu", runtime=rt(tmp_path / "a"))
    part = train(family, "tiny", str(tmp_path / "b"), 3, device="cpu", runtime=rt(tmp_path / "b"))
    assert part["step"] == 3
    resumed = train(family, "tiny", str(tmp_path / "b"), 6, device="cpu", runtime=rt(tmp_path / "b"))
    assert resumed == whole and whole["step"] == 6


def test_modules_run_as_scripts_with_profiling_from_the_environment(tmp_path) -> None:
    """What a Slurm job script runs: ``python -m executors.job.workloads.serve|train``."""
    out = subprocess.run([sys.executable, "-m", "executors.job.workloads.serve", "--family", "recommender", "--qps", "30",
                          "--duration", "0.5", "--report", str(tmp_path / "lat.json")], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads((tmp_path / "lat.json").read_text())
    assert rep["requests"] > 0 and STDOUT_MARKER in out.stdout
    env = {**os.environ, "MUXFLOW_PROFILE_ITERS": "4", "MUXFLOW_PROFILE_WARMUP": "1",
           "MUXFLOW_PROFILE_REPORT": str(tmp_path / "iter.json")}
    out = subprocess.run([sys.executable, "-m", "executors.job.workloads.train", "--family", "cnn", "--ckpt",
                          str(tmp_path / "ckpt"), "--steps", "1000"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    it = json.loads((tmp_path / "iter.json").read_text())
    assert it["iterations"] == 4 and it["stopped_by"] == "iterations" and it["mean_s"] > 0
    bad = subprocess.run([sys.executable, "-m", "executors.job.workloads.serve", "--family", "cnn", "--qps", "-1",
                          "--duration", "1"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "error: qps" in bad.stderr
