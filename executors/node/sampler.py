"""GPU samplers: the one interface the node agent reads GPUs through.

``NvmlSampler`` reads real GPUs through nvidia-ml-py (``pynvml``), with the online
replica's share from NVML's per-process accounting (``executors.node.attribution``);
``SimulatedSampler`` has the same interface and drives values from a model
(``executors.node.simgpu``: the one simulated GPU, following what really runs) or a
replayed sequence, for machines without GPUs. Values are floats; a metric a GPU
cannot report is NaN.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from executors.node.attribution import ProcessAttribution

log = logging.getLogger(__name__)

NAN = float("nan")


@dataclass(frozen=True)
class RawSample:
    """One reading of one GPU. Percentages 0–100, bytes, MHz, W, °C; NaN = not available."""

    gpu_util_pct: float = NAN
    sm_activity_pct: float = NAN      # GPM SM activity on Hopper+, else NVML utilization
    sm_occupancy_pct: float = NAN     # GPM only
    mem_used_bytes: float = NAN
    mem_total_bytes: float = NAN
    mem_bw_util_pct: float = NAN      # NVML memory-controller utilization
    sm_clock_mhz: float = NAN
    sm_clock_max_mhz: float = NAN
    power_w: float = NAN
    temperature_c: float = NAN
    clock_idle: bool = False          # clocks are low because the GPU is idle, not throttled
    # The online replica's own share of the GPU (per-process accounting, or the simulated split)
    online_gpu_util_pct: float = NAN
    online_sm_activity_pct: float = NAN
    online_mem_used_bytes: float = NAN
    online_mem_bw_util_pct: float = NAN
    # A simulated replica without a metrics endpoint: its modelled load (else the endpoint's)
    online_qps: float = NAN
    online_latency_ms: float = NAN
    online_solo_latency_ms: float = NAN


FIELDS: tuple[str, ...] = (
    "gpu_util_pct", "sm_activity_pct", "sm_occupancy_pct", "mem_used_bytes", "mem_total_bytes",
    "mem_bw_util_pct", "sm_clock_mhz", "sm_clock_max_mhz", "power_w", "temperature_c",
    "online_gpu_util_pct", "online_sm_activity_pct", "online_mem_used_bytes", "online_mem_bw_util_pct",
    "online_qps", "online_latency_ms", "online_solo_latency_ms",
)
ONLINE_SPLIT = ("online_gpu_util_pct", "online_sm_activity_pct", "online_mem_used_bytes", "online_mem_bw_util_pct")


@dataclass(frozen=True)
class XidEvent:
    gpu_index: int
    xid: int
    at_s: float
    detail: str = ""


class GpuSampler(Protocol):
    source: str  # 'measured' | 'simulated' — the label of the rows it produces

    def gpu_indices(self) -> list[int]:
        ...

    def sample(self, gpu_index: int, now_s: float) -> RawSample | None:
        """Read one GPU; None when the whole read failed (a gap)."""
        ...

    def poll_xids(self, now_s: float) -> list[XidEvent]:
        """XID events since the last call (never blocks)."""
        ...

    def online_gap(self, gpu_index: int) -> str | None:
        """Why the online split of that GPU's samples is NaN now (None: it is not)."""
        ...

    def close(self) -> None:
        ...


# -- NVML ---------------------------------------------------------------------------------------

def nvml_available(nvml=None) -> tuple[bool, str]:
    """(True, driver version) when NVML initialises here, else (False, why)."""
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - it is a dependency
        return False, f"nvidia-ml-py not installed: {exc}"
    pynvml = nvml or pynvml
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return False, f"nvmlInit failed: {exc}"
    try:
        ver = pynvml.nvmlSystemGetDriverVersion()
        return True, ver.decode() if isinstance(ver, bytes) else str(ver)
    finally:
        pynvml.nvmlShutdown()


class NvmlSampler:
    """Real GPUs through NVML. GPM (SM activity, occupancy) where the device supports it.

    GPM metrics are differences between two GPM samples; they are recomputed every
    ``gpm_interval_s`` and the last value is reported in between (NVML's GPM needs
    samples some distance apart to be meaningful). XIDs come from an NVML event set
    polled without waiting.
    """

    source = "measured"

    def __init__(self, indices: Sequence[int] | None = None, gpm_interval_s: float = 0.1, *,
                 attribution: ProcessAttribution | None = None, nvml=None):
        if nvml is None:
            import pynvml as nvml
        pynvml = nvml
        self._nv = pynvml
        self.attribution = attribution
        pynvml.nvmlInit()
        self._closed = False
        try:
            count = pynvml.nvmlDeviceGetCount()
            self._indices = list(range(count)) if indices is None else list(indices)
            self._handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in self._indices}
            self._max_clock = {i: self._try(lambda h=h: float(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)))
                               for i, h in self._handles.items()}
            self.gpm_interval_s = gpm_interval_s
            self._gpm: dict[int, dict] = {}
            for i, h in self._handles.items():
                if self._gpm_supported(h):
                    self._gpm[i] = {"prev": pynvml.nvmlGpmSampleAlloc(), "cur": pynvml.nvmlGpmSampleAlloc(),
                                    "t": None, "sm": NAN, "occ": NAN}
            self._events = None
            self._setup_events()
        except Exception:
            self.close()
            raise
        log.info("NVML sampler on GPUs %s (GPM on %s)", self._indices, sorted(self._gpm))

    @staticmethod
    def _try(fn: Callable[[], float]) -> float:
        try:
            return fn()
        except Exception:
            return NAN

    def _gpm_supported(self, handle) -> bool:
        nv = self._nv
        try:
            return bool(nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except Exception:
            return False

    def _setup_events(self) -> None:
        nv = self._nv
        try:
            self._events = nv.nvmlEventSetCreate()
            for h in self._handles.values():
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._events)
            self._index_of = {}
            for i, h in self._handles.items():
                self._index_of[self._uuid(h)] = i
        except Exception as exc:
            log.warning("XID events unavailable: %s", exc)
            self._events = None

    def _uuid(self, handle) -> str:
        u = self._nv.nvmlDeviceGetUUID(handle)
        return u.decode() if isinstance(u, bytes) else str(u)

    def gpu_indices(self) -> list[int]:
        return list(self._indices)

    def _gpm_update(self, i: int, h, now_s: float) -> tuple[float, float]:
        nv = self._nv
        st = self._gpm[i]
        if st["t"] is not None and now_s - st["t"] < self.gpm_interval_s:
            return st["sm"], st["occ"]
        try:
            nv.nvmlGpmSampleGet(h, st["cur"])
            if st["t"] is not None:
                mg = nv.c_nvmlGpmMetricsGet_t()
                mg.version = nv.NVML_GPM_METRICS_GET_VERSION
                mg.numMetrics = 2
                mg.sample1, mg.sample2 = st["prev"], st["cur"]
                mg.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
                mg.metrics[1].metricId = nv.NVML_GPM_METRIC_SM_OCCUPANCY
                nv.nvmlGpmMetricsGet(mg)
                st["sm"] = float(mg.metrics[0].value) if mg.metrics[0].nvmlReturn == 0 else NAN
                st["occ"] = float(mg.metrics[1].value) if mg.metrics[1].nvmlReturn == 0 else NAN
            st["prev"], st["cur"], st["t"] = st["cur"], st["prev"], now_s
        except Exception as exc:
            log.debug("GPM read failed on GPU %d: %s", i, exc)
            return NAN, NAN
        return st["sm"], st["occ"]

    def sample(self, gpu_index: int, now_s: float) -> RawSample | None:
        nv = self._nv
        h = self._handles[gpu_index]
        try:
            util = nv.nvmlDeviceGetUtilizationRates(h)
            gpu_util, bw = float(util.gpu), float(util.memory)
        except Exception:
            gpu_util = bw = NAN
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            used, total = float(mem.used), float(mem.total)
        except Exception:
            used = total = NAN
        clock = self._try(lambda: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))
        power = self._try(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
        temp = self._try(lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))
        try:
            idle = bool(nv.nvmlDeviceGetCurrentClocksEventReasons(h) & nv.nvmlClocksEventReasonGpuIdle)
        except Exception:
            idle = False
        if gpu_index in self._gpm:
            sm, occ = self._gpm_update(gpu_index, h, now_s)
        else:
            sm, occ = gpu_util, NAN  # without GPM, NVML utilization is the SM-activity proxy
        if all(math.isnan(v) for v in (gpu_util, used, clock)):
            return None
        on = (NAN, NAN, NAN, NAN)
        if self.attribution is not None:
            on = self.attribution.online(gpu_index, h, now_s, gpu_util, sm, used, bw)
        return RawSample(gpu_util, sm, occ, used, total, bw, clock, self._max_clock[gpu_index], power, temp, idle, *on)

    def online_gap(self, gpu_index: int) -> str | None:
        if self.attribution is None:
            return "GPU split: per-process accounting is off"
        return self.attribution.gap(gpu_index)

    def compute_pids(self) -> dict[int, set[int]]:
        """GPU index → the PIDs with a CUDA context on it: NVML's compute processes (under MPS the MPS server, and
        on Volta and later its clients too) and the MPS server's clients
        (``nvmlDeviceGetMPSComputeRunningProcesses``). NVML is thread-safe: the xCUDA check calls this from its own
        thread."""
        out: dict[int, set[int]] = {}
        for i, h in self._handles.items():
            pids = out.setdefault(i, set())
            for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
                fn = getattr(self._nv, name, None)
                if fn is None:
                    continue
                try:
                    pids.update(int(p.pid) for p in fn(h))
                except Exception as exc:  # not supported here, or the GPU is briefly unreadable
                    log.debug("GPU %d: %s failed: %s", i, name, exc)
        return out

    def poll_xids(self, now_s: float) -> list[XidEvent]:
        if self._events is None:
            return []
        nv = self._nv
        out = []
        for _ in range(64):
            try:
                ev = nv.nvmlEventSetWait(self._events, 0)
            except nv.NVMLError_Timeout:
                break
            except Exception as exc:
                log.warning("XID event read failed: %s", exc)
                break
            try:
                idx = self._index_of.get(self._uuid(ev.device), -1)
            except Exception:
                idx = -1
            out.append(XidEvent(idx, int(ev.eventData), now_s, "nvml event"))
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        nv = self._nv
        for st in getattr(self, "_gpm", {}).values():
            for k in ("prev", "cur"):
                try:
                    nv.nvmlGpmSampleFree(st[k])
                except Exception:
                    pass
        if getattr(self, "_events", None) is not None:
            try:
                nv.nvmlEventSetFree(self._events)
            except Exception:
                pass
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


# -- simulated ----------------------------------------------------------------------------------

class SimulatedSampler:
    """Simulated GPUs behind the sampler interface (labelled 'simulated').

    Per GPU either a model (``executors.node.simgpu.SimulatedGpu``, or any ``f(t_s) -> RawSample``) or a replayed
    sequence of samples (``None`` entries are gaps). A replay past its end repeats its last
    sample unless ``loop`` is set. ``xids`` is a list of (at_s, gpu_index, xid) events handed
    out by ``poll_xids`` once their time has come. ``faults`` can be set at run time by tests
    (e.g. ``set_override(i, sample)``) to push a GPU into a state.
    """

    source = "simulated"

    def __init__(
        self,
        models: dict[int, Callable[[float], RawSample]] | None = None,
        replay: dict[int, Sequence[RawSample | None]] | None = None,
        xids: Iterable[tuple[float, int, int]] = (),
        loop: bool = False,
    ):
        self._models = dict(models or {})
        self._replay = {i: list(seq) for i, seq in (replay or {}).items()}
        self._pos = {i: 0 for i in self._replay}
        self._loop = loop
        self._xids = sorted(xids)
        self._overrides: dict[int, RawSample | None] = {}
        self.closed = False
        if set(self._models) & set(self._replay):
            raise ValueError("a GPU is either modelled or replayed, not both")

    def gpu_indices(self) -> list[int]:
        return sorted(set(self._models) | set(self._replay))

    def set_override(self, gpu_index: int, sample: RawSample | None) -> None:
        self._overrides[gpu_index] = sample

    def clear_override(self, gpu_index: int) -> None:
        self._overrides.pop(gpu_index, None)

    def add_xid(self, at_s: float, gpu_index: int, xid: int) -> None:
        self._xids.append((at_s, gpu_index, xid))
        self._xids.sort()

    def sample(self, gpu_index: int, now_s: float) -> RawSample | None:
        if gpu_index in self._overrides:
            return self._overrides[gpu_index]
        if gpu_index in self._replay:
            seq, k = self._replay[gpu_index], self._pos[gpu_index]
            if not seq:
                return None
            if k >= len(seq):
                k = k % len(seq) if self._loop else len(seq) - 1
            self._pos[gpu_index] = k + 1
            return seq[k]
        return self._models[gpu_index](now_s)

    def online_gap(self, gpu_index: int) -> str | None:
        if gpu_index in self._replay or gpu_index in self._overrides:
            return "GPU split: a replayed sample carries none"
        gap = getattr(self._models.get(gpu_index), "online_gap", None)
        return gap() if callable(gap) else None

    def poll_xids(self, now_s: float) -> list[XidEvent]:
        out = []
        while self._xids and self._xids[0][0] <= now_s:
            at, idx, xid = self._xids.pop(0)
            out.append(XidEvent(idx, xid, at, "simulated"))
        return out

    def close(self) -> None:
        self.closed = True


__all__ = ["FIELDS", "ONLINE_SPLIT", "GpuSampler", "NvmlSampler", "RawSample", "SimulatedSampler", "XidEvent",
           "nvml_available"]
