"""Every reference workload runs on CPU for a few iterations/requests; the job types exist in the catalog;
the CNNs are torchvision's ResNet-18 and ResNet-50."""

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
from executors.job.workloads.models import (
    FAMILIES,
    JOB_FAMILIES,
    SERVICE_FAMILIES,
    SIZES,
    batch_pool,
    build_model,
    parameter_count,
    reference_job_types,
    workload_size,
)
from executors.job.workloads.serve import STDOUT_MARKER, serve
from executors.job.workloads.train import train

REPO = Path(__file__).resolve().parents[4]


def test_every_size_names_a_catalog_job_type() -> None:
    known = set(default_catalog().offline)
    assert set(reference_job_types()) == {(f, s) for f in JOB_FAMILIES for s in SIZES}
    assert set(reference_job_types().values()) <= known
    assert workload_size("cnn", "gpu").job_type == "ResNet-18 (batch size 64)"
    assert workload_size("resnet50", "gpu").job_type == "ResNet-50 (batch size 64)"
    with pytest.raises(ValueError, match="unknown workload"):
        workload_size("cnn", "huge")


def test_the_service_families_are_the_online_catalogs() -> None:
    from scheduler_core.workloads import ONLINE_FAMILIES

    assert SERVICE_FAMILIES == FAMILIES and set(FAMILIES) <= set(ONLINE_FAMILIES) and set(FAMILIES) <= set(JOB_FAMILIES)
    assert "resnet50" in JOB_FAMILIES and "resnet50" not in ONLINE_FAMILIES
    with pytest.raises(ValueError, match="not an online service family"):
        serve("resnet50", "tiny", qps=10, duration_s=0.1, device="cpu")


@pytest.mark.parametrize("family", JOB_FAMILIES)
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


@pytest.mark.parametrize("family", JOB_FAMILIES)
def test_train_on_cpu_resumes_to_the_same_loss(family, tmp_path) -> None:
    def rt(d):
        return Runtime(d, every_steps=3, signals=(), profiling=None)

    whole = train(family, "tiny", str(tmp_path / "a"), 6, device="cpu", runtime=rt(tmp_path / "a"))
    part = train(family, "tiny", str(tmp_path / "b"), 3, device="cpu", runtime=rt(tmp_path / "b"))
    assert part["step"] == 3
    resumed = train(family, "tiny", str(tmp_path / "b"), 6, device="cpu", runtime=rt(tmp_path / "b"))
    assert resumed == whole and whole["step"] == 6


def test_a_checkpoint_of_another_model_is_refused_in_one_line(tmp_path) -> None:
    def rt():
        return Runtime(tmp_path, every_steps=1, signals=(), profiling=None)

    train("cnn", "tiny", str(tmp_path), 1, device="cpu", runtime=rt())
    with pytest.raises(ValueError, match=r"checkpoint at step 1 is not a resnet50/tiny training state") as err:
        train("resnet50", "tiny", str(tmp_path), 2, device="cpu", runtime=rt())
    assert "\n" not in str(err.value)


def _meta_model(family: str, size: str = "gpu") -> torch.nn.Module:
    with torch.device("meta"):
        return build_model(workload_size(family, size))


@pytest.mark.parametrize(("family", "published"), [("cnn", 11_689_512), ("resnet50", 25_557_032)])
def test_the_gpu_cnns_have_the_published_parameter_counts(family, published) -> None:
    """torchvision's ResNet-18 / ResNet-50 with 1000 classes (He et al.; torchvision's model table)."""
    assert parameter_count(_meta_model(family)) == published


@pytest.mark.parametrize(("family", "published_gmacs"), [("cnn", 1.81), ("resnet50", 4.09)])
def test_the_gpu_cnns_cost_the_published_flops(family, published_gmacs) -> None:
    """Multiply-adds of one 224×224 forward pass, as torchvision's model table gives them (GFLOPS 1.81 / 4.09):
    the 7×7 stride-2 stem and the max-pool put the first stage at 56×56."""
    from torch.utils.flop_counter import FlopCounterMode

    model = _meta_model(family).eval()
    with FlopCounterMode(display=False) as counter:
        model(torch.empty(1, 3, 224, 224, device="meta"))
    assert counter.get_total_flops() / 2e9 == pytest.approx(published_gmacs, abs=0.01)


def _torchvision_models():
    try:
        import torchvision.models as tvm
    except Exception as exc:  # absent, or built for another torch (importing it fails then)
        pytest.skip(f"torchvision is not importable here ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); "
                    "it is not a requirement of the project: the parity test runs where it is installed")
    return tvm


@pytest.mark.parametrize(("family", "name"), [("cnn", "resnet18"), ("resnet50", "resnet50")])
def test_the_gpu_cnns_are_torchvisions_module_for_module(family, name) -> None:
    """Same state_dict keys and shapes as torchvision's model, the same initial weights from one seed (modules
    built and initialised in the same order), and with its weights loaded the same outputs."""
    tvm = _torchvision_models()
    torch.manual_seed(0)
    theirs = getattr(tvm, name)(weights=None).eval()
    torch.manual_seed(0)
    ours = build_model(workload_size(family, "gpu")).eval()
    mine, ref = ours.state_dict(), theirs.state_dict()
    assert list(mine) == list(ref)
    assert {k: tuple(v.shape) for k, v in mine.items()} == {k: tuple(v.shape) for k, v in ref.items()}
    assert [k for k in mine if not torch.equal(mine[k], ref[k])] == []
    ours.load_state_dict(ref)
    x = torch.randn(2, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(ours(x), theirs(x), rtol=1e-4, atol=1e-5)


def test_modules_run_as_scripts_with_profiling_from_the_environment(tmp_path) -> None:
    """What a Slurm job script runs: ``python -m executors.job.workloads.serve|train``."""
    out = subprocess.run([sys.executable, "-m", "executors.job.workloads.serve", "--family", "recommender",
                          "--qps", "30", "--duration", "0.5", "--report", str(tmp_path / "lat.json")], cwd=REPO,
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
