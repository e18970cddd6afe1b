"""The node agent: GPU monitor + SysMonitor + error detector for the GPUs of one node.

One sampling thread ticks every ``interval_s``: for each GPU it reads a sample, appends
it to the GPU's ring, publishes the xCUDA shared-memory record, steps SysMonitor (evicting
on entry to Overlimit) and runs the error detector. Store writes (health changes,
evictions, device errors, per-minute metrics) go to a sink; the store's
(``executors.node.store_sink``) queues them to a writer thread, so a slow database never
delays sampling. So do the replicas' endpoint scrapes and the placement polls
(``executors.node.scrape``, ``executors.node.placements``), on threads of their own.
``stop()`` ends sampling, flushes the current minute, drains the queue and closes the
sampler (NVML). This module imports no database code: the agent's core runs where no
database library is installed (a GPU check), with a :class:`MemorySink`.

Time: ``Clock`` gives monotonic seconds for pacing and epoch seconds for minutes and
SysMonitor; ``ScaledClock`` runs agent time faster than real time, so tests see a
"minute" pass in a second.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from executors.node.aggregate import aggregate_minute, minute_floor
from executors.node.detector import ErrorDetector, Fault
from executors.node.evictor import Evictor
from executors.node.online import OnlineAccounting
from executors.node.placements import Placements, StaticPlacements
from executors.node.ring import SampleRing
from executors.node.sampler import GpuSampler, RawSample
from executors.node.xcuda import shm
from scheduler_core.domain import GpuHealth
from scheduler_core.guard.burst import BURST_TARGET_UTIL, BurstGuard, BurstParams
from scheduler_core.guard.sysmonitor import GpuSample, SysMonitor, SysMonitorConfig

log = logging.getLogger(__name__)


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def epoch(self) -> float: ...


class RealClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def epoch(self) -> float:
        return time.time()


class ScaledClock:
    """Agent time runs ``scale`` times faster than real time (pacing stays in real time)."""

    def __init__(self, scale: float, start_epoch: float | None = None):
        self.scale = scale
        self._m0 = time.monotonic()
        self._e0 = time.time() if start_epoch is None else start_epoch

    def monotonic(self) -> float:
        return time.monotonic()

    def epoch(self) -> float:
        return self._e0 + (time.monotonic() - self._m0) * self.scale


@dataclass(frozen=True)
class GpuBinding:
    """One GPU of this node: its store id, its index on the node and its xCUDA record path."""

    gpu_id: int
    gpu_index: int
    shm_path: Path | None = None
    clock_threshold_mhz: float = 0.0   # T_SM for xCUDA (0: no clock information)
    target_util: float = 0.0


@dataclass(frozen=True)
class AgentConfig:
    interval_s: float = 0.01           # sampling period (≤ 10 ms)
    ring_window_s: float = 300.0       # raw samples kept (paper: "several minutes")
    time_scale: float = 1.0            # agent seconds per real second (tests)
    sysmonitor: SysMonitorConfig = field(default_factory=SysMonitorConfig)
    idle_util_pct: float = 5.0         # below this, a low clock is idling, not throttling
    partial_every_s: float | None = None  # also write the minute in progress this often (agent seconds)
    # The burst guard (scheduler_core.guard.burst): a replica's request rate over its recent level paces its GPU's
    # offline work to xCUDA's floor until the burst is over; None: off. Checked every burst_check_s (agent s).
    burst: BurstParams | None = field(default_factory=BurstParams)
    burst_check_s: float = 1.0


# -- events to the store ------------------------------------------------------------------------

@dataclass(frozen=True)
class HealthChange:
    gpu_id: int
    health: str
    at_utc: dt.datetime
    overlimit_entries_utc: tuple[dt.datetime, ...]


@dataclass(frozen=True)
class EvictionEvent:
    gpu_id: int
    job_id: int | None
    at_utc: dt.datetime
    reason: str
    health: str
    ok: bool
    slurm_job_id: int | None = None   # set when a Slurm job was requeued: the store moves the job to EVICTED


@dataclass(frozen=True)
class DeviceErrorEvent:
    gpu_id: int
    at_utc: dt.datetime
    kind: str
    xid: int | None
    detail: str


class Sink(Protocol):
    def health(self, ev: HealthChange) -> None: ...
    def eviction(self, ev: EvictionEvent) -> None: ...
    def device_error(self, ev: DeviceErrorEvent) -> None: ...
    def metrics(self, rows: list, source: str) -> None: ...
    def close(self) -> None: ...


class MemorySink:
    """Keeps everything in lists (tests, dry runs)."""

    def __init__(self) -> None:
        self.healths: list[HealthChange] = []
        self.evictions: list[EvictionEvent] = []
        self.errors: list[DeviceErrorEvent] = []
        self.rows: list = []
        self.sources: set[str] = set()

    def health(self, ev: HealthChange) -> None:
        self.healths.append(ev)

    def eviction(self, ev: EvictionEvent) -> None:
        self.evictions.append(ev)

    def device_error(self, ev: DeviceErrorEvent) -> None:
        self.errors.append(ev)

    def metrics(self, rows: list, source: str) -> None:
        keys = {(r.gpu_id, r.minute_utc) for r in rows}
        # the minute in progress written again replaces its earlier version, as in the store
        self.rows = [r for r in self.rows if (r.gpu_id, r.minute_utc) not in keys] + list(rows)
        self.sources.add(source)

    def close(self) -> None:
        pass


# -- per-GPU loop -------------------------------------------------------------------------------

def _utc(epoch_s: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch_s, tz=dt.timezone.utc)


def to_sysmonitor_sample(s: RawSample, idle_util_pct: float) -> GpuSample | None:
    """The four SysMonitor metrics; None if the sample cannot judge health (core readings missing).

    A low SM clock on an idle GPU is power management, not throttling: the clock fraction is
    then taken as 1 (NVML's GpuIdle clock reason, or utilization under ``idle_util_pct``).
    """
    if any(math.isnan(v) for v in (s.gpu_util_pct, s.sm_activity_pct, s.mem_used_bytes, s.mem_total_bytes)):
        return None
    if s.mem_total_bytes <= 0:
        return None
    idle = s.clock_idle or s.gpu_util_pct < idle_util_pct
    if idle or math.isnan(s.sm_clock_mhz) or math.isnan(s.sm_clock_max_mhz) or s.sm_clock_max_mhz <= 0:
        clock_frac = 1.0
    else:
        clock_frac = s.sm_clock_mhz / s.sm_clock_max_mhz
    return GpuSample(s.gpu_util_pct, s.sm_activity_pct, clock_frac, s.mem_used_bytes / s.mem_total_bytes)


@dataclass(frozen=True)
class GpuSnapshot:
    """What a GPU's loop holds now, for the metrics endpoint (executors.node.metrics)."""

    sample: RawSample | None          # the latest reading (None: none yet)
    sample_epoch_s: float | None
    health: str
    xids: int
    evictions: int
    samples: int
    gaps: int
    row: object | None                # the last whole minute recorded (AgentMetricRow)
    burst: bool | None = None         # the replica is in a burst, its GPU's offline work paced (None: no guard)


class GpuLoop:
    """Everything the agent does for one GPU, one ``tick`` per sample (single-threaded)."""

    def __init__(self, binding: GpuBinding, cfg: AgentConfig, evictor: Evictor, sink: Sink,
                 detector: ErrorDetector | None, source: str, monitor: SysMonitor | None = None,
                 placements: Placements | None = None, accounting: OnlineAccounting | None = None,
                 split_gap: Callable[[], str | None] = lambda: None,
                 rate: Callable[[float], tuple[float | None, float | None]] | None = None,
                 slo_ms: float | None = None):
        self.b = binding
        # The burst guard: its replica's request rate and p99 now (its endpoint's latest scrape interval; without
        # one, the simulated replica's modelled rate in the sample, no p99) against its service's p99 SLO,
        # checked every cfg.burst_check_s.
        self.rate = rate
        self.slo_ms = slo_ms
        self.burst = BurstGuard(1, cfg.burst) if cfg.burst is not None else None
        self.bursting = False
        self.bursts = 0  # bursts begun
        self.burst_listeners: list[Callable[[bool], None]] = []  # called with each change of ``bursting``
        self._burst_checked_s: float | None = None
        self.placements = placements or StaticPlacements()
        self.accounting = accounting
        self.split_gap = split_gap
        self.minute_job: int | None = None   # the offline job seen on the GPU in the minute (the latest sample's)
        self._partial_at_s: float | None = None
        self.cfg = cfg
        self.evictor = evictor
        self.sink = sink
        self.detector = detector
        self.source = source
        self.monitor = monitor or SysMonitor(cfg.sysmonitor)
        self.ring = SampleRing.for_window(cfg.ring_window_s, cfg.interval_s)
        self.writer = shm.ShmWriter(binding.shm_path, binding.gpu_index) if binding.shm_path else None
        self.minute: dt.datetime | None = None
        self.minute_start_count = 0
        self.minute_first_s: float | None = None
        self.gaps = 0
        self.samples = 0
        self.evictions = 0
        self.xids = 0
        self.evicted_jobs: dict[tuple[int | None, int | None], int] = {}  # (job id, Slurm id) → times evicted
        self.last_sample: tuple[float, RawSample] | None = None
        self.last_row = None
        self.minute_listeners: list[Callable[[object], None]] = []  # called with each whole minute's row
        self.last_health = self.monitor.state.value
        self.coverage_log: list[tuple[dt.datetime, float]] = []

    # expected samples in ``span_s`` of agent time
    def _expected(self, span_s: float = 60.0) -> int:
        return max(1, int(round(span_s / (self.cfg.interval_s * self.cfg.time_scale))))

    def tick(self, now_epoch: float, mono_ns: int, sample: RawSample | None, xids: list) -> None:
        minute = minute_floor(now_epoch)
        if self.minute is None:
            self.minute = minute
        elif minute != self.minute:
            self.flush_minute()
            self.minute, self.minute_job, self._partial_at_s = minute, None, None
        jobs = self.placements.on_gpu(self.b.gpu_index)
        if jobs:  # of several, the one with the largest share (as the simulated cluster labels its minutes)
            self.minute_job = max(jobs, key=lambda j: (j.sm_pct, -j.job_id)).job_id
        every = self.cfg.partial_every_s
        if every and (self._partial_at_s is None or now_epoch - self._partial_at_s >= every):
            if self._partial_at_s is not None:
                self.flush_minute(end_s=now_epoch, partial=True)
            self._partial_at_s = now_epoch
        self.xids += len(xids)
        if sample is None:
            self.gaps += 1
        else:
            self.ring.append(now_epoch, sample)
            self.last_sample = (now_epoch, sample)  # one assignment: a scrape reads a whole pair
            self.samples += 1
        self._check_burst(now_epoch)
        if sample is not None:
            if self.writer is not None:
                self._publish(sample, mono_ns)
        self._health(now_epoch, sample, xids)

    def _current_load(self, now_epoch: float) -> tuple[float | None, float | None]:
        q, p99 = self.rate(now_epoch) if self.rate is not None else (None, None)
        if q is None and self.last_sample is not None and math.isfinite(self.last_sample[1].online_qps):
            q = self.last_sample[1].online_qps
        return q, p99

    def _check_burst(self, now_epoch: float) -> None:
        if self.burst is None or (self._burst_checked_s is not None
                                  and 0.0 <= now_epoch - self._burst_checked_s < self.cfg.burst_check_s):
            return
        self._burst_checked_s = now_epoch
        q, p99 = self._current_load(now_epoch)
        over = None if p99 is None or self.slo_ms is None else p99 > self.slo_ms
        on = bool(self.burst.update(q, over)[0])
        if on == self.bursting:
            return
        self.bursting = on
        ref = float(self.burst.reference[0])
        if on:
            self.bursts += 1
            why = "" if over is None else f", p99 {p99:.1f} ms over the SLO {self.slo_ms:g} ms"
            log.info("GPU %d: online burst: %.1f req/s against %.1f recently (+%.0f %%)%s: its offline work is paced "
                     "to xCUDA's floor until the rate falls back", self.b.gpu_id, q, ref, 100.0 * (q / ref - 1.0), why)
        else:
            log.info("GPU %d: burst over (%s req/s against %.1f): xCUDA's target is back to %s", self.b.gpu_id,
                     "no rate" if q is None else f"{q:.1f}", ref, self.b.target_util or "its default")
        for listen in self.burst_listeners:
            try:
                listen(on)
            except Exception:
                log.exception("burst listener failed")

    def _publish(self, s: RawSample, mono_ns: int) -> None:
        def fin(v: float, default: float = 0.0) -> float:
            return default if math.isnan(v) else v

        self.writer.write(shm.GpuSample(
            u_sm=min(1.0, max(0.0, fin(s.sm_activity_pct) / 100.0)), sm_clock_mhz=fin(s.sm_clock_mhz),
            clock_threshold_mhz=self.b.clock_threshold_mhz if not math.isnan(s.sm_clock_mhz) else 0.0,
            clock_max_mhz=fin(s.sm_clock_max_mhz),
            target_util=BURST_TARGET_UTIL if self.bursting else self.b.target_util,
            sm_occupancy=min(1.0, max(0.0, fin(s.sm_occupancy_pct) / 100.0)),
            gpu_util=min(1.0, max(0.0, fin(s.gpu_util_pct) / 100.0)),
            mem_used_bytes=int(fin(s.mem_used_bytes)),
        ), timestamp_ns=mono_ns)

    def _health(self, now_epoch: float, sample: RawSample | None, xids: list) -> None:
        det = self.detector
        faults: list[Fault] = det.check(now_epoch, xids) if det is not None else []
        if faults:
            self._on_faults(now_epoch, faults)
        elif det is not None and det.recovering:
            if det.recovered(now_epoch):
                log.info("GPU %d recovered: Init, then back to SysMonitor", self.b.gpu_id)
                self.monitor.state = GpuHealth.INIT
            else:
                self._note_health(now_epoch)
                return
        if self.monitor.state == GpuHealth.DISABLED:
            self._note_health(now_epoch)
            return
        gs = to_sysmonitor_sample(sample, self.cfg.idle_util_pct) if sample is not None else None
        if gs is not None and not (det is not None and det.recovering):
            prev = self.monitor.state
            if self.monitor.step(now_epoch, gs):
                self._evict(now_epoch, self._overlimit_reason(gs, prev))
        self._note_health(now_epoch)

    def _overlimit_reason(self, s: GpuSample, prev: GpuHealth) -> str:
        return f"Overlimit ({prev.value} -> Overlimit): " + "; ".join(self.cfg.sysmonitor.overlimit.reasons(s))

    def _on_faults(self, now_epoch: float, faults: list[Fault]) -> None:
        at = _utc(now_epoch)
        for f in faults:
            log.error("GPU %d device error: %s %s %s", self.b.gpu_id, f.kind, f.xid or "", f.detail)
            self.sink.device_error(DeviceErrorEvent(self.b.gpu_id, at, f.kind, f.xid, f.detail))
        reason = "device error: " + ", ".join(f"{f.kind}{'' if f.xid is None else ' ' + str(f.xid)}" for f in faults)
        disable = any(f.disable for f in faults)
        if self.monitor.state != GpuHealth.DISABLED:
            self._evict(now_epoch, reason, GpuHealth.DISABLED if disable else GpuHealth.INIT)
        if disable:
            self.monitor.disable()
            return
        if self.monitor.state == GpuHealth.DISABLED:
            return
        det = self.detector
        assert det is not None
        ok = det.mps.reset(det.probe_timeout_s)
        if not ok:
            log.error("GPU %d: MPS reset failed; staying in Init until a probe answers", self.b.gpu_id)
        det.recovering = True
        det._last_probe_s = now_epoch  # the next probe comes one interval after the reset
        self.monitor.state = GpuHealth.INIT
        self.monitor.calm_since_s = None

    def _evict(self, now_epoch: float, reason: str, health_after: GpuHealth | None = None) -> None:
        """Evict offline work; the eviction is recorded with the state the GPU is going to."""
        at = _utc(now_epoch)
        health = (health_after or self.monitor.state).value
        try:
            done = self.evictor.evict(self.b.gpu_id, reason)
        except Exception as exc:
            log.exception("eviction on GPU %d failed", self.b.gpu_id)
            self.sink.eviction(EvictionEvent(self.b.gpu_id, None, at, f"{reason} (failed: {exc})", health, False))
            return
        self.evictions += 1
        log.warning("GPU %d: evicted %s — %s", self.b.gpu_id, [e.job_id for e in done], reason)
        for e in done:
            if e.ok and (e.job_id is not None or e.slurm_job_id is not None):
                key = (e.job_id, e.slurm_job_id)
                self.evicted_jobs[key] = self.evicted_jobs.get(key, 0) + 1
            self.sink.eviction(EvictionEvent(self.b.gpu_id, e.job_id, at, reason if e.ok else f"{reason} (failed: {e.detail})",
                                             health, e.ok, e.slurm_job_id))

    def _note_health(self, now_epoch: float) -> None:
        state = self.monitor.state.value
        if state != self.last_health:
            log.info("GPU %d: %s -> %s", self.b.gpu_id, self.last_health, state)
            self.last_health = state
            entries = tuple(_utc(t) for t in self.monitor.overlimit_entries_s)
            self.sink.health(HealthChange(self.b.gpu_id, state, _utc(now_epoch), entries))

    def flush_minute(self, end_s: float | None = None, partial: bool = False) -> None:
        """Aggregate the samples of the current minute and hand the row to the sink.

        ``partial``: the minute so far (up to ``end_s``), written again later; its samples stay
        the minute's. ``end_s`` defaults to the minute's end."""
        if self.minute is None:
            return
        _, data = self.ring.since(self.minute_start_count)
        if not partial:
            self.minute_start_count = self.ring.count
        start = self.minute.timestamp()
        end = start + 60.0 if end_s is None else min(end_s, start + 60.0)
        agg = aggregate_minute(self.b.gpu_id, self.minute, data, self._expected(end - start), self.last_health)
        if not partial:
            self.coverage_log.append((self.minute, agg.coverage))
        if agg.row is None:
            if not partial:
                if self.burst is not None:
                    self.burst.record_minute(math.nan)
                log.warning("GPU %d minute %s skipped: %s", self.b.gpu_id, self.minute.isoformat(),
                            agg.skipped_reason)
            return
        lvl = logging.DEBUG if partial else logging.INFO if agg.coverage >= 0.9 else logging.WARNING
        log.log(lvl, "GPU %d minute %s%s: %d samples, coverage %.2f", self.b.gpu_id, self.minute.isoformat(),
                " (so far)" if partial else "", agg.samples, agg.coverage)
        row = agg.row
        if self.accounting is not None:
            row = self.accounting.complete(self.b.gpu_index, row, start, end, self.minute_job, self.split_gap())
        else:
            row = replace(row, offline_job_id=self.minute_job)
        self.sink.metrics([row], self.source)
        if not partial:
            if self.burst is not None:
                q = row.online_qps
                self.burst.record_minute(math.nan if q is None else q)
            self.last_row = row
            for listen in self.minute_listeners:
                try:
                    listen(row)
                except Exception:
                    log.exception("minute listener failed")

    def snapshot(self) -> GpuSnapshot:
        last = self.last_sample
        return GpuSnapshot(None if last is None else last[1], None if last is None else last[0],
                           self.monitor.state.value, self.xids, self.evictions, self.samples, self.gaps,
                           self.last_row, self.bursting if self.burst is not None else None)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


# -- the node ----------------------------------------------------------------------------------

class NodeAgent:
    def __init__(self, sampler: GpuSampler, bindings: list[GpuBinding], evictor: Evictor, sink: Sink,
                 cfg: AgentConfig = AgentConfig(), clock: Clock | None = None,
                 detectors: dict[int, ErrorDetector] | None = None,
                 monitors: dict[int, SysMonitor] | None = None, placements: Placements | None = None,
                 accounting: OnlineAccounting | None = None, closers: list[Callable[[], None]] | None = None,
                 rates: dict[int, Callable[[float], tuple[float | None, float | None]]] | None = None,
                 slos: dict[int, float | None] | None = None):
        self.sampler = sampler
        self.cfg = cfg
        self.clock = clock or (ScaledClock(cfg.time_scale) if cfg.time_scale != 1.0 else RealClock())
        self.sink = sink
        self.placements = placements or StaticPlacements()
        self.closers = list(closers or [])  # the scrapers and placement pollers, stopped at shutdown
        self.stoppers: list[Callable[[], None]] = []  # threads that write to the sink: stopped before it closes
        detectors = detectors or {}
        monitors = monitors or {}
        self.loops = {b.gpu_index: GpuLoop(b, cfg, evictor, sink, detectors.get(b.gpu_index), sampler.source,
                                           monitors.get(b.gpu_index), self.placements, accounting,
                                           lambda i=b.gpu_index: _split_gap(sampler, i), (rates or {}).get(b.gpu_index),
                                           (slos or {}).get(b.gpu_index))
                      for b in bindings}
        self._stop = threading.Event()
        self.ticks = 0
        self.overruns = 0
        self.on_tick: Callable[[NodeAgent], None] | None = None

    def tick(self) -> None:
        now = self.clock.epoch()
        mono_ns = time.monotonic_ns()
        xids = self.sampler.poll_xids(now)
        by_gpu: dict[int, list] = {}
        for e in xids:
            by_gpu.setdefault(e.gpu_index, []).append(e)
        for idx, loop in self.loops.items():
            try:
                s = self.sampler.sample(idx, now)
            except Exception as exc:
                log.debug("sample of GPU %d failed: %s", idx, exc)
                s = None
            loop.tick(now, mono_ns, s, by_gpu.get(idx, []))
        self.ticks += 1
        if self.on_tick is not None:
            self.on_tick(self)

    def run(self, duration_s: float | None = None) -> None:
        """Sample until ``stop()`` (or ``duration_s`` of real time), then flush and close."""
        start = time.monotonic()
        next_t = start
        try:
            while not self._stop.is_set():
                if duration_s is not None and time.monotonic() - start >= duration_s:
                    break
                self.tick()
                next_t += self.cfg.interval_s
                now = time.monotonic()
                if next_t < now:  # behind: skip the missed ticks rather than burst
                    missed = int((now - next_t) / self.cfg.interval_s) + 1
                    self.overruns += missed
                    next_t += missed * self.cfg.interval_s
                self._stop.wait(max(0.0, next_t - time.monotonic()))
        finally:
            self.shutdown()

    def stop(self) -> None:
        self._stop.set()

    def job_evictions(self) -> dict[tuple[int | None, int | None], int]:
        """(store job id, Slurm job id) → times this agent evicted the job (any GPU of the node)."""
        out: dict[tuple[int | None, int | None], int] = {}
        for loop in self.loops.values():
            for key, n in list(loop.evicted_jobs.items()):
                out[key] = out.get(key, 0) + n
        return out

    def shutdown(self) -> None:
        for stop in self.stoppers:
            try:
                stop()
            except Exception:
                log.exception("stopping %s failed", stop)
        now = self.clock.epoch()
        for loop in self.loops.values():
            try:
                loop.flush_minute(end_s=now)
            finally:
                loop.close()
        try:
            self.sink.close()
        finally:
            try:
                self.sampler.close()
            finally:
                for close in self.closers:
                    try:
                        close()
                    except Exception:
                        log.exception("closing %s failed", close)


def _split_gap(sampler: GpuSampler, gpu_index: int) -> str | None:
    gap = getattr(sampler, "online_gap", None)  # samplers written before per-process accounting have none
    return gap(gpu_index) if gap is not None else None
