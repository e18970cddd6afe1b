"""GPU metrics of a profiling window, through the node agent's sampler interface (paper §6, docs/DESIGN.md §5).

A :class:`WindowRecorder` samples one GPU on a thread while a workload runs,
into the node agent's :class:`~executors.node.ring.SampleRing`; the window of
the measured iterations (or requests) is then averaged with the node agent's
own per-minute aggregation (:func:`~executors.node.aggregate.aggregate_minute`).

Where the samples come from (:func:`open_sampler`):

- ``nvml`` — :class:`~executors.node.sampler.NvmlSampler` on the GPU the job
  sees (``CUDA_VISIBLE_DEVICES``): real metrics, labelled ``measured``;
- ``simulated`` — :class:`~executors.node.sampler.SimulatedSampler` driven by the
  simulated GPU model of the workload (``executors.simulated.profiling``, with
  its measurement noise per sample): what runs on nodes without a GPU, labelled
  ``simulated``;
- ``auto`` — NVML when it initialises and a GPU is visible, else simulated.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import platform
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from executors.data.calibration import default_catalog
from executors.node.aggregate import aggregate_minute
from executors.node.ring import SampleRing
from executors.node.sampler import GpuSampler, RawSample, SimulatedSampler, nvml_available
from executors.simulated.profiling import offline_profile, online_features
from scheduler_core.gpu_specs import get_spec
from scheduler_core.interference.pairs import WorkloadTraits
from scheduler_core.workloads import OfflineWorkload

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WindowMetrics:
    """Averages of a GPU's samples over a window; measured memory is the peak (what the job needs)."""

    source: str               # 'measured' (NVML) | 'simulated'
    samples: int
    gpu_util_pct: float
    sm_activity_pct: float
    sm_occupancy_pct: float   # 0 where the GPU has no GPM (pre-Hopper): noted in `notes`
    mem_used_bytes: float
    mem_total_bytes: float
    mem_bw_util_pct: float
    sm_clock_mhz: float
    sm_clock_max_mhz: float
    notes: str = ""
    sm_clock_min_mhz: float = math.nan   # the lowest SM clock read in the window (a clock that sagged or throttled)

    def as_dict(self) -> dict:
        return asdict(self)


def _node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


class MetricsUnavailable(RuntimeError):
    """No usable GPU samples for the window."""


def visible_gpu_index(env: dict[str, str] | None = None) -> int | str:
    """The first GPU the job sees: an NVML index, or a ``GPU-…`` UUID to look up.

    Slurm sets ``CUDA_VISIBLE_DEVICES`` (and ``SLURM_JOB_GPUS``) for a ``--gres=gpu`` job; the
    index is taken as NVML's (clusters set ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, NVML's order).
    """
    env = dict(os.environ) if env is None else env
    for var in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):
        first = env.get(var, "").split(",")[0].strip()
        if first:
            return int(first) if first.isdigit() else first
    return 0


def _nvml_index(uuid_or_index: int | str) -> int:
    if isinstance(uuid_or_index, int):
        return uuid_or_index
    import pynvml

    pynvml.nvmlInit()
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            if (u.decode() if isinstance(u, bytes) else str(u)) == uuid_or_index:
                return i
    finally:
        pynvml.nvmlShutdown()
    raise MetricsUnavailable(f"no GPU with UUID {uuid_or_index} on this node")


@dataclass(frozen=True)
class OpenedSampler:
    sampler: GpuSampler
    gpu_index: int
    note: str     # where the metrics come from, for the report
    device: str   # the GPU model and driver, or the CPU of a node without a GPU


def _gpu_name(index: int) -> str:
    import pynvml

    pynvml.nvmlInit()
    try:
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
        return name.decode() if isinstance(name, bytes) else str(name)
    finally:
        pynvml.nvmlShutdown()


def open_sampler(kind: str, simulated_model: Callable[[], Callable[[float], RawSample]],
                 env: dict[str, str] | None = None) -> OpenedSampler:
    """The sampler of the GPU the job sees. ``simulated_model`` is only called where the model is used."""
    if kind not in ("auto", "nvml", "simulated"):
        raise ValueError(f"metrics: expected auto, nvml or simulated, got {kind!r}")
    if kind in ("auto", "nvml"):
        ok, why = nvml_available()
        if ok:
            from executors.node.sampler import NvmlSampler

            index = _nvml_index(visible_gpu_index(env))
            device = f"{_gpu_name(index)} (driver {why})"
            return OpenedSampler(NvmlSampler([index]), index, f"NVML on GPU {index}: {device}", device)
        if kind == "nvml":
            raise MetricsUnavailable(f"metrics=nvml but NVML is unusable here: {why}")
        note = f"simulated GPU metrics (no GPU on this node: {why})"
    else:
        note = "simulated GPU metrics (asked for)"
    device = f"cpu ({platform.machine()}, {os.cpu_count()} cores, {_node_name()}; no GPU)"
    return OpenedSampler(SimulatedSampler(models={0: simulated_model()}), 0, note, device)


class WindowRecorder:
    """Samples one GPU every ``interval_s`` on a thread until :meth:`stop`; wall-clock timestamps."""

    def __init__(self, sampler: GpuSampler, gpu_index: int, interval_s: float = 0.05, max_s: float = 3600.0,
                 wall: Callable[[], float] = time.time):
        self.sampler = sampler
        self.gpu_index = gpu_index
        self.interval_s = interval_s
        self.wall = wall
        self.ring = SampleRing.for_window(max_s, interval_s)
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="muxflow-window-metrics", daemon=True)

    def start(self) -> WindowRecorder:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            now = self.wall()
            try:
                s = self.sampler.sample(self.gpu_index, now)
            except Exception as exc:  # a failed read is a gap, as in the node agent
                self.errors += 1
                if self.errors <= 3:
                    log.warning("GPU sample failed: %s", exc)
                s = None
            if s is not None:
                self.ring.append(now, s)
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self.sampler.close()

    def window(self, start_unix: float | None, end_unix: float | None, note: str = "",
               strict: bool = False) -> WindowMetrics:
        """Averages over [start, end] (all samples if the window is unknown or holds none, unless ``strict``:
        then :class:`MetricsUnavailable`)."""
        t, data = self.ring.since(0)
        if start_unix is not None and end_unix is not None:
            inside = (t >= start_unix) & (t <= end_unix)
            if inside.any():
                t, data = t[inside], data[inside]
            elif strict:
                raise MetricsUnavailable(f"no GPU sample inside the window ({end_unix - start_unix:.2f} s)")
            else:
                note = (note + "; " if note else "") + "no sample inside the iteration window: whole run used"
        if len(t) == 0:
            raise MetricsUnavailable(f"no GPU samples were taken ({self.errors} failed reads)")
        agg = aggregate_minute(-1, dt.datetime.fromtimestamp(float(t[0]), dt.timezone.utc), data, len(t), "Healthy")
        if agg.row is None:
            raise MetricsUnavailable(f"GPU samples unusable: {agg.skipped_reason}")
        r = agg.row
        col = self.ring.column
        # A job needs its peak memory; a model's readings carry noise, whose peak would be biased up.
        mem = (float(np.nanmax(data[:, col("mem_used_bytes")])) if self.sampler.source == "measured"
               else r.mem_used_bytes)
        max_clock = data[:, col("sm_clock_max_mhz")]
        clock = data[:, col("sm_clock_mhz")]
        occ_missing = bool(np.isnan(data[:, col("sm_occupancy_pct")]).all())
        if occ_missing:
            note = (note + "; " if note else "") + "no SM occupancy (no GPM on this GPU): stored as 0"
        return WindowMetrics(
            source=self.sampler.source, samples=int(len(t)), gpu_util_pct=r.gpu_util_pct,
            sm_activity_pct=r.sm_activity_pct, sm_occupancy_pct=r.sm_occupancy_pct, mem_used_bytes=mem,
            mem_total_bytes=r.mem_total_bytes, mem_bw_util_pct=r.mem_bw_util_pct or 0.0,
            sm_clock_mhz=r.sm_clock_mhz,
            sm_clock_max_mhz=float(np.nanmax(max_clock)) if not np.isnan(max_clock).all() else math.nan,
            notes=note,
            sm_clock_min_mhz=float(np.nanmin(clock)) if not np.isnan(clock).all() else math.nan,
        )


# -- the simulated GPU model of a workload, sample by sample ---------------------------------------

def _raw(gpu_util: float, sm: float, occ: float, mem: float, bw: float, clock: float, gpu_type: str) -> RawSample:
    spec = get_spec(gpu_type)
    clip = lambda v: min(100.0, max(0.0, v))  # noqa: E731
    return RawSample(gpu_util_pct=clip(gpu_util), sm_activity_pct=clip(sm), sm_occupancy_pct=clip(occ),
                     mem_used_bytes=mem, mem_total_bytes=float(spec.memory_bytes), mem_bw_util_pct=clip(bw),
                     sm_clock_mhz=clock, sm_clock_max_mhz=float(spec.max_sm_clock_mhz))


GENERIC_JOB = "(generic offline job)"


@dataclass(frozen=True)
class SimulatedJobModel:
    """Which simulated GPU model stands for a job on a node without a GPU (docs/PROFILING.md).

    A job whose type is a catalog workload is modelled as that workload. Any other label (or
    none: on a real cluster a job type is a free label) gets the *generic offline job*: per
    trait (SM need, memory bandwidth, sensitivity, pressure, solo speed) the median of the
    catalog's workloads, with the job's own memory need — nothing about the job's GPU use is
    known without a GPU, so it is profiled as a typical one, and labelled so (``generic``).
    """

    catalog: object  # WorkloadCatalog holding ``key``
    key: str
    generic: bool
    note: str


def simulated_job_model(job_type: str, mem_bytes: float | None = None) -> SimulatedJobModel:
    from dataclasses import replace


    catalog = default_catalog()
    if job_type in catalog.offline:
        return SimulatedJobModel(catalog, job_type, False, f"the simulated model of {job_type!r}")
    wls = list(catalog.offline.values())

    def med(values) -> float:
        return float(np.median(list(values)))

    traits = WorkloadTraits(sensitivity=med(w.traits.sensitivity for w in wls),
                            pressure=med(w.traits.pressure for w in wls),
                            sm_need=med(w.traits.sm_need for w in wls), mem_bw=med(w.traits.mem_bw for w in wls))
    mem = int(mem_bytes) if mem_bytes else int(med(w.mem_bytes for w in wls))
    generic = OfflineWorkload(GENERIC_JOB, traits, med(w.solo_steps_per_s_p100 for w in wls), mem)
    label = f"label {job_type!r}" if job_type else "no label"
    return SimulatedJobModel(replace(catalog, offline={**catalog.offline, GENERIC_JOB: generic}), GENERIC_JOB, True,
                             f"a generic offline job ({label}: no simulated model; the catalog's median traits, "
                             f"the job's {mem / 1024**3:.3g} GiB)")


def simulated_offline_model(job_type: str, gpu_type: str, seed: int,
                            mem_bytes: float | None = None) -> Callable[[float], RawSample]:
    """Per-sample readings of the simulated GPU running ``job_type`` alone (measurement noise included);
    a label the catalog does not model gets the generic job (:func:`simulated_job_model`)."""
    model = simulated_job_model(job_type, mem_bytes)
    rng = np.random.default_rng(seed)

    def at(_t: float) -> RawSample:
        f = offline_profile(model.catalog, model.key, gpu_type, rng)
        return _raw(f.gpu_util_pct, f.sm_activity_pct, f.sm_occupancy_pct, f.mem_used_bytes, f.mem_bw_util_pct,
                    f.sm_clock_mhz, gpu_type)
    return at


def simulated_offline_iter_time_s(job_type: str, gpu_type: str, mem_bytes: float | None = None) -> float:
    """The simulated model's solo iteration time of ``job_type`` on ``gpu_type`` (no noise)."""
    model = simulated_job_model(job_type, mem_bytes)
    return offline_profile(model.catalog, model.key, gpu_type, None).iter_time_s


def simulated_online_model(family: str, gpu_type: str, load: float, mem_bytes: float,
                           seed: int) -> Callable[[float], RawSample]:
    """Per-sample readings of the simulated GPU serving ``family`` at ``load`` (0..1 of its capacity)."""
    catalog = default_catalog()
    rng = np.random.default_rng(seed)

    def at(_t: float) -> RawSample:
        f = online_features(catalog, family, gpu_type, load, mem_bytes, rng)
        return _raw(f.gpu_util_pct, f.sm_activity_pct, f.sm_occupancy_pct, f.mem_used_bytes, f.mem_bw_util_pct,
                    f.sm_clock_mhz, gpu_type)
    return at
