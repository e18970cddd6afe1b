"""The online replica's share of a real GPU from NVML per-process accounting (a fake pynvml, NVIDIA's semantics)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from executors.node.attribution import ProcessAttribution, proc_slurm_job
from executors.node.sampler import NvmlSampler
from tests.executors.node.fake_nvml import FakeGpu, FakeNvml, proc, util_sample

GIB = 1 << 30
ONLINE_PID, OFFLINE_PID, HELPER_PID, MPS_PID = 100, 200, 201, 300
OFFLINE_SLURM_JOB = 555


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    """/proc of a node: the replica (no Slurm job), the offline job and its helper (Slurm job 555), an MPS server."""
    for pid, env, comm in ((ONLINE_PID, b"PATH=/bin\0HOME=/srv", "python"),
                           (OFFLINE_PID, b"PATH=/bin\0SLURM_JOB_ID=555\0SLURM_JOB_NAME=train", "python"),
                           (HELPER_PID, b"SLURM_JOB_ID=555", "python"),
                           (MPS_PID, b"", "nvidia-cuda-mps-server")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "environ").write_bytes(env + b"\0")
        (tmp_path / str(pid) / "comm").write_text(comm + "\n")
    return tmp_path


def shared_gpu() -> FakeGpu:
    return FakeGpu(util_pct=80.0, mem_util_pct=40.0, used_bytes=10 * GIB,
                   processes=[proc(ONLINE_PID, 3 * GIB), proc(OFFLINE_PID, 5 * GIB), proc(HELPER_PID, 1 * GIB)],
                   samples=[util_sample(ONLINE_PID, 1_000, 20, 5), util_sample(OFFLINE_PID, 1_000, 40, 25),
                            util_sample(ONLINE_PID, 2_000, 10, 5), util_sample(HELPER_PID, 2_000, 10, 5)])


def attribution(nv: FakeNvml, proc_root: Path, offline=frozenset({OFFLINE_SLURM_JOB})) -> ProcessAttribution:
    return ProcessAttribution(nv, lambda gpu_index: set(offline), refresh_s=1.0, proc_root=proc_root)


def test_processes_of_the_offline_slurm_job_are_offline_everything_else_is_online(proc_root) -> None:
    assert proc_slurm_job(OFFLINE_PID, proc_root) == 555 and proc_slurm_job(ONLINE_PID, proc_root) is None
    assert proc_slurm_job(999, proc_root) is None  # gone
    gpu = shared_gpu()
    at = attribution(FakeNvml([gpu]), proc_root)
    util, sm, mem, bw = at.online(0, gpu, 0.0, 80.0, 80.0, 10 * GIB, 40.0)
    # SM samples: online 30 of 80; memory-controller samples: online 10 of 40
    assert (util, sm, bw) == pytest.approx((30.0, 30.0, 10.0))
    assert mem == 4 * GIB  # device used − the offline job's processes (its helper included)
    assert at.gap(0) is None


def test_only_new_samples_count_and_no_sample_is_a_measured_idle(proc_root) -> None:
    gpu = shared_gpu()
    nv = FakeNvml([gpu])
    at = attribution(nv, proc_root)
    at.online(0, gpu, 0.0, 80.0, 80.0, 10 * GIB, 40.0)
    at.online(0, gpu, 0.5, 80.0, 80.0, 10 * GIB, 40.0)   # within refresh_s: NVML is not asked again
    assert nv.calls["utilization"] == 1
    # nothing newer than the last timestamp: NVML says NOT_FOUND — no process ran kernels since
    util, sm, mem, bw = at.online(0, gpu, 1.0, 2.0, 2.0, 10 * GIB, 1.0)
    assert nv.calls["utilization"] == 2 and (util, bw) == (2.0, 1.0) and at.gap(0) is None
    gpu.samples.append(util_sample(OFFLINE_PID, 3_000, 90, 60))  # only the offline job since
    util, *_ = at.online(0, gpu, 2.0, 90.0, 90.0, 10 * GIB, 60.0)
    assert util == 0.0


def test_without_per_process_utilization_the_split_is_a_labelled_gap(proc_root) -> None:
    gpu = shared_gpu()
    gpu.per_process_supported = False
    at = attribution(FakeNvml([gpu]), proc_root)
    util, sm, mem, bw = at.online(0, gpu, 0.0, 80.0, 80.0, 10 * GIB, 40.0)
    assert math.isnan(util) and math.isnan(sm) and math.isnan(bw)
    assert mem == 4 * GIB  # memory still splits
    assert "no per-process utilization" in at.gap(0) and "NotSupported" in at.gap(0)
    # with no offline job on the GPU nothing needs splitting: the whole GPU is the online side
    alone = attribution(FakeNvml([gpu]), proc_root, offline=frozenset())
    assert alone.online(0, gpu, 0.0, 80.0, 80.0, 10 * GIB, 40.0) == (80.0, 80.0, 10 * GIB, 40.0)


def test_unknown_process_memory_and_mps_are_gaps_not_zeros(proc_root) -> None:
    gpu = shared_gpu()
    gpu.processes[1] = proc(OFFLINE_PID, None)  # the driver cannot tell (NVML_VALUE_NOT_AVAILABLE)
    at = attribution(FakeNvml([gpu]), proc_root)
    util, _, mem, _ = at.online(0, gpu, 0.0, 80.0, 80.0, 10 * GIB, 40.0)
    assert util == pytest.approx(30.0) and math.isnan(mem) and "per-process memory" in at.gap(0)
    mps = shared_gpu()
    mps.samples = [util_sample(MPS_PID, 1_000, 70, 30)]  # under MPS every client's kernels are the server's
    at = attribution(FakeNvml([mps]), proc_root)
    util, sm, mem, bw = at.online(0, mps, 0.0, 70.0, 70.0, 10 * GIB, 30.0)
    assert math.isnan(util) and math.isnan(bw) and mem == 4 * GIB and "MPS" in at.gap(0)


def test_the_nvml_sampler_carries_the_online_split(proc_root) -> None:
    gpu = shared_gpu()
    nv = FakeNvml([gpu])
    smp = NvmlSampler([0], nvml=nv, attribution=attribution(nv, proc_root))
    try:
        s = smp.sample(0, 0.0)
        assert (s.gpu_util_pct, s.sm_activity_pct, s.mem_used_bytes) == (80.0, 80.0, 10 * GIB)
        assert (s.online_gpu_util_pct, s.online_sm_activity_pct, s.online_mem_used_bytes,
                s.online_mem_bw_util_pct) == pytest.approx((30.0, 30.0, 4 * GIB, 10.0))
        assert math.isnan(s.online_qps)  # the request rate is the endpoint's business
        assert smp.online_gap(0) is None
    finally:
        smp.close()
    plain = NvmlSampler([0], nvml=FakeNvml([shared_gpu()]))
    try:
        assert math.isnan(plain.sample(0, 0.0).online_gpu_util_pct) and "off" in plain.online_gap(0)
    finally:
        plain.close()
