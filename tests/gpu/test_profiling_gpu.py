"""Reference workloads, solo profiling and the co-location harness on a real NVIDIA GPU.

Skipped where NVML or CUDA-enabled torch is missing; ``MUXFLOW_REQUIRE_GPU=1`` (``make test-gpu``)
turns that into a failure. With a GPU every test asserts real, measured values.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from executors.node.gpu_type import resolve_gpu_type
from executors.node.sampler import nvml_available

REPO = Path(__file__).resolve().parents[2]
_NVML, _WHY = nvml_available()
_REQUIRED = os.environ.get("MUXFLOW_REQUIRE_GPU") == "1"


def _cuda() -> tuple[bool, str]:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - a dependency
        return False, str(exc)
    return (True, "") if torch.cuda.is_available() else (False, f"torch {torch.__version__} sees no CUDA GPU")


_CUDA, _CUDA_WHY = _cuda() if _NVML else (False, _WHY)
pytestmark = pytest.mark.skipif(not (_NVML and _CUDA) and not _REQUIRED,
                                reason=f"no usable NVIDIA GPU for torch: {_WHY if not _NVML else _CUDA_WHY}")


@pytest.fixture(autouse=True)
def _gpu_present():
    if not (_NVML and _CUDA):
        pytest.fail(f"MUXFLOW_REQUIRE_GPU=1 but no GPU is usable: {_WHY if not _NVML else _CUDA_WHY}")


@pytest.mark.parametrize("family", ["cnn", "transformer", "recommender"])
def test_reference_workloads_run_on_the_gpu(family, tmp_path) -> None:
    from executors.job.runtime import Runtime
    from executors.job.workloads.serve import serve
    from executors.job.workloads.train import train

    rep = serve(family, "small", qps=50, duration_s=2.0, device="cuda", arrivals="uniform")
    assert rep["device_type"] == "cuda" and "CUDA" in rep["device"]
    assert rep["requests"] == 100 and 0 < rep["p50_ms"] <= rep["p99_ms"]
    res = train(family, "small", str(tmp_path), 5, device="cuda",
                runtime=Runtime(tmp_path, every_steps=5, signals=(), profiling=None))
    assert res["step"] == 5 and res["loss"] == res["loss"]  # finite


def test_solo_profile_on_the_gpu_is_measured_with_nvml(tmp_path) -> None:
    from executors.node.profiling.probe import run_probe
    from executors.scheduler.profiling.outcome import classify

    job = tmp_path / "job.sh"
    job.write_text(f"#!/bin/sh\ncd {REPO}\nexec {shlex.quote(sys.executable)} -m executors.job.workloads.train "
                   f"--family cnn --size gpu --device cuda --ckpt {tmp_path}/ckpt --steps 100000\n")
    job.chmod(0o755)
    rep = run_probe(tmp_path / "run", [str(job)], job_type="ResNet-18 (batch size 64)",
                    gpu_type=resolve_gpu_type("auto"), metrics="nvml", iterations=20, seconds=60, warmup=3,
                    deadline_s=300, interval_s=0.02)
    out = classify(rep, bound_s=600)
    assert out.ok, out.reason
    assert (out.source, out.method) == ("measured", "nvml")
    f = out.features
    assert f.gpu_util_pct > 20 and f.sm_activity_pct > 5 and f.mem_used_bytes > 256 * 1024**2
    assert f.sm_clock_mhz > 100 and f.iter_time_s == out.measured["measured_iter_time_s"] > 0
    assert rep["metrics"]["samples"] >= 10 and "driver" in out.measured["device"]
    print("solo profile on the GPU:", json.dumps({"features": f.__dict__, **out.measured}))


def test_colocation_harness_on_the_gpu(tmp_path) -> None:
    """The SM sweep on one GPU: under MPS a larger share gives the job more throughput."""
    from executors.node.profiling.colocate import Harness

    h = Harness(tmp_path, gpu_type=resolve_gpu_type("auto"), service_family="cnn", qps=200, job_family="cnn",
                size="gpu", window_s=6, baseline_window_s=4, metrics="nvml")
    rep = h.run([20, 80])
    assert rep["method"] in ("mps", "no-mps") and "error" not in rep, rep.get("error")
    assert rep["solo_service"]["metrics"]["source"] == "measured"
    pts = {p["sm_pct"]: p for p in rep["points"]}
    assert all(not p.get("error") for p in pts.values()), pts
    for p in pts.values():
        assert 0 < p["norm_tput"] < 1.5 and p["slowdown_avg"] > 0.5 and p["latency"]["requests"] > 100
    if rep["method"] == "mps":
        assert pts[20]["norm_tput"] < 0.9 * pts[80]["norm_tput"], pts
    print("co-location on the GPU:", json.dumps({k: {"norm_tput": p["norm_tput"], "slowdown_avg": p["slowdown_avg"],
                                                    "slowdown_p99": p["slowdown_p99"]} for k, p in pts.items()}))
