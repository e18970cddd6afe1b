"""The node's GPU identity and ``--gpu-type auto``, on a fake NVML; the probe's CLI resolves it."""

from __future__ import annotations

import json
import sys

import pytest

from executors.node.gpu_type import GpuTypeError, cuda_version_text, gpu_identity, resolve_gpu_type
from executors.node.profiling import probe
from tests.executors.node.fake_nvml import FakeGpu, FakeNvml, NVMLError

MIB = 1024**2
H200 = FakeGpu(name="NVIDIA H200", total_bytes=143_771 * MIB, used_bytes=0)


class NoDriver(FakeNvml):
    def nvmlInit(self) -> None:  # noqa: N802
        raise NVMLError("Driver Not Loaded")


def test_identity_of_a_gpu() -> None:
    nv = FakeNvml([FakeGpu(), H200], driver="580.159.04", cuda_driver=13000)
    assert gpu_identity(1, nvml=nv) == {"name": "NVIDIA H200", "driver": "580.159.04", "cuda": "13.0",
                                        "memory_bytes": 143_771 * MIB, "index": 1}
    assert gpu_identity(nvml=nv)["name"] == "Tesla T4"
    assert gpu_identity(2, nvml=nv) is None and gpu_identity(-1, nvml=nv) is None


def test_identity_without_nvml_or_gpu_or_cuda_version() -> None:
    assert gpu_identity(nvml=NoDriver([H200])) is None
    assert gpu_identity(nvml=FakeNvml([])) is None
    assert gpu_identity(nvml=FakeNvml([H200], cuda_driver=None))["cuda"] is None


@pytest.mark.parametrize(("version", "text"), [(13000, "13.0"), (12040, "12.4"), (11080, "11.8"), (12010, "12.1")])
def test_cuda_version_text(version, text) -> None:
    assert cuda_version_text(version) == text


def test_auto_is_the_type_of_the_gpus_name() -> None:
    nv = FakeNvml([FakeGpu(), H200])
    assert resolve_gpu_type("auto", nvml=nv) == "t4"
    assert resolve_gpu_type(" AUTO ", 1, nvml=nv) == "h200"


def test_known_names_pass_through_validated() -> None:
    assert resolve_gpu_type("a100", nvml=NoDriver([])) == "a100"
    assert resolve_gpu_type("H100") == "h100"
    with pytest.raises(GpuTypeError) as err:
        resolve_gpu_type("v100")
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value)
    assert str(err.value).startswith("gpu-type: unknown GPU type 'v100' (known: a10, a100, h100, h200,")


@pytest.mark.parametrize(("nv", "says"), [
    (NoDriver([H200]), "no GPU to read the type of (nvmlInit failed: Driver Not Loaded)"),
    (FakeNvml([]), "no GPU to read the type of (no GPU 0: NVML sees 0 GPUs)"),
    (FakeNvml([FakeGpu(name="NVIDIA GeForce RTX 4090")]), "GPU device 'NVIDIA GeForce RTX 4090' is none of"),
    (FakeNvml([FakeGpu(name="NVIDIA A100-SXM4-40GB", total_bytes=40_960 * MIB)]), "no known GPU type fits it"),
    (FakeNvml([FakeGpu(name="NVIDIA A100-SXM4-80GB", total_bytes=40_960 * MIB)]), "NVML reports 40 GiB"),
])
def test_auto_fails_in_one_line(nv, says) -> None:
    with pytest.raises(GpuTypeError) as err:
        resolve_gpu_type("auto", nvml=nv)
    msg = str(err.value)
    assert msg.startswith("gpu-type auto: ") and says in msg and "\n" not in msg


def _probe(tmp_path, gpu_type: str) -> list[str]:
    return ["--run-dir", str(tmp_path / "run"), "--job-type", "ResNet-18 (batch size 16)", "--gpu-type", gpu_type,
            "--metrics", "simulated", "--iters", "1", "--seconds", "5", "--deadline", "60", "--",
            sys.executable, "-c", "pass"]


def test_the_probe_resolves_auto_through_nvml(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([H200]))
    assert probe.main(_probe(tmp_path, "auto")) == 0
    rep = json.loads((tmp_path / "run" / probe.PROBE_FILE).read_text())
    assert rep["gpu_type"] == "h200" and rep["exit_code"] == 0


@pytest.mark.parametrize(("gpu_type", "says"), [("auto", "error: gpu-type auto: no GPU to read the type of"),
                                                ("v100", "error: gpu-type: unknown GPU type 'v100'")])
def test_the_probe_refuses_a_type_it_cannot_resolve_in_one_line(tmp_path, monkeypatch, capsys, gpu_type,
                                                                  says) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", NoDriver([H200]))
    assert probe.main(_probe(tmp_path, gpu_type)) == 2
    err = capsys.readouterr().err
    assert err.startswith(says) and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_the_module_imports_no_store_or_orchestration() -> None:
    """gpu_type runs on GPU nodes without sqlalchemy or dagster."""
    import subprocess

    code = ("import sys\nclass Block:\n    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('sqlalchemy', 'dagster', 'alembic', 'ortools'):\n"
            "            raise ImportError('blocked: ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import executors.node.gpu_type, executors.node.profiling.probe, executors.job.workloads.sizes\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
