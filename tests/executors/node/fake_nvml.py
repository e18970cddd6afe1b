"""A fake ``pynvml`` module following NVIDIA's documented behaviour, for machines without a GPU.

What it follows (NVML API reference, nvidia-ml-py):

- ``nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)`` returns one sample per process
  that used the GPU in a driver sampling period, only samples newer than ``lastSeenTimeStamp``
  (CPU timestamps in µs); with none, it raises ``NVMLError_NotFound``; on a device without
  per-process accounting, ``NVMLError_NotSupported``.
- ``nvmlDeviceGetComputeRunningProcesses`` lists the processes with a compute context;
  ``usedGpuMemory`` is None where the driver cannot tell (NVML_VALUE_NOT_AVAILABLE).
- Everything else the sampler reads: utilization rates, memory info, clocks, power, temperature;
  GPM and event sets are not supported (their calls raise), as on pre-Hopper GPUs.
- The identity ``executors.node.gpu_type`` reads: the device name, the driver version and the CUDA
  version the driver supports (``nvmlSystemGetCudaDriverVersion``: 1000 × major + 10 × minor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_NotFound(NVMLError):  # noqa: N801 (pynvml's names)
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801
    pass


@dataclass
class FakeGpu:
    util_pct: float = 50.0
    mem_util_pct: float = 20.0
    used_bytes: int = 8 << 30
    total_bytes: int = 16 << 30
    clock_mhz: int = 1500
    max_clock_mhz: int = 1590
    processes: list = field(default_factory=list)        # SimpleNamespace(pid, usedGpuMemory)
    samples: list = field(default_factory=list)          # SimpleNamespace(pid, timeStamp, smUtil, memUtil, …)
    per_process_supported: bool = True
    name: str = "Tesla T4"


class FakeNvml:
    """Pass as ``nvml=`` to ``NvmlSampler`` / ``ProcessAttribution``."""

    NVMLError = NVMLError
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    nvmlClocksEventReasonGpuIdle = 1
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, gpus: list[FakeGpu], driver: str = "fake", cuda_driver: int | None = 13000):
        self.gpus = gpus
        self.driver, self.cuda_driver = driver, cuda_driver
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def nvmlInit(self) -> None:  # noqa: N802
        pass

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        if self.cuda_driver is None:
            raise NVMLError_NotSupported()
        return self.cuda_driver

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:  # noqa: N802
        return h.name

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:  # noqa: N802
        return self.gpus[i]

    def nvmlDeviceGetMaxClockInfo(self, h: FakeGpu, kind: int) -> int:  # noqa: N802
        return h.max_clock_mhz

    def nvmlGpmQueryDeviceSupport(self, h):  # noqa: N802
        raise NVMLError_NotSupported()

    def nvmlEventSetCreate(self):  # noqa: N802
        raise NVMLError_NotSupported()

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu):  # noqa: N802
        return SimpleNamespace(gpu=h.util_pct, memory=h.mem_util_pct)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu):  # noqa: N802
        return SimpleNamespace(used=h.used_bytes, total=h.total_bytes, free=h.total_bytes - h.used_bytes)

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, kind: int) -> int:  # noqa: N802
        return h.clock_mhz

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:  # noqa: N802
        return 70_000

    def nvmlDeviceGetTemperature(self, h: FakeGpu, kind: int) -> int:  # noqa: N802
        return 50

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:  # noqa: N802
        return 0

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list:  # noqa: N802
        self._count("processes")
        return list(h.processes)

    def nvmlDeviceGetProcessUtilization(self, h: FakeGpu, last_seen_ts: int) -> list:  # noqa: N802
        self._count("utilization")
        if not h.per_process_supported:
            raise NVMLError_NotSupported()
        out = [s for s in h.samples if s.timeStamp > last_seen_ts]
        if not out:
            raise NVMLError_NotFound()
        return out


def proc(pid: int, mem: int | None) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, usedGpuMemory=mem, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)


def util_sample(pid: int, ts_us: int, sm: int, mem: int) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, timeStamp=ts_us, smUtil=sm, memUtil=mem, encUtil=0, decUtil=0)
