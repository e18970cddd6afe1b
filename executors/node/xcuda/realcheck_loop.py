"""What xCUDA's real-driver check (:mod:`executors.node.xcuda.realcheck`) runs and records.

- :class:`Child`: a workload in a fresh process (its own process group, so a time-out kills all of it), its JSON-line
  events on stdout, its xCUDA controller trace on stderr (``XCUDA_LOG_LEVEL=debug``: one ``pace`` line per control
  period, :mod:`executors.node.xcuda.trace`), each line stamped when it arrives;
- :class:`AgentLoop`: the node agent's own per-GPU loop (:class:`executors.node.agent.GpuLoop`) ticking every
  ``AgentConfig.interval_s`` on a thread, as ``NodeAgent.run`` does: it samples the GPU (NVML, or a simulated
  sampler) and publishes the xCUDA record the job paces by;
- :class:`Recorder`: at each tick, the record as the job reads it and the job's own xCUDA counters
  (``XCUDA_STATS_DIR``, :mod:`executors.node.xcuda.stats`); :func:`series` turns that into columns;
- :func:`steady_state` and :func:`downsample`: the statistics and the stored form of a series;
- :class:`ToyGpu`: the simulated GPU of ``--simulate``, whose SM activity is the launches the job's own counters
  show times a fixed kernel time (a closed loop through the fake driver, without a GPU).
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executors.node.sampler import RawSample
from executors.node.xcuda import shm
from executors.node.xcuda import trace as pace_trace
from executors.node.xcuda.stats import StatsRefused, XcudaStats
from executors.node.xcuda.stats import decode as decode_stats
from scheduler_core.guard.xcuda_control import clock_factor, gpu_load

log = logging.getLogger(__name__)

# xCUDA's defaults (README "Configuration"): the check never sets XCUDA_A_L, XCUDA_A_H or the gains.
A_L, A_H = pace_trace.Gains().a_l, pace_trace.Gains().a_h
PERIOD_FIELDS = tuple(pace_trace.Period.__dataclass_fields__)


# -- the workload process -------------------------------------------------------------------------

_live: set[Child] = set()
_live_lock = threading.Lock()


def kill_all_children() -> None:
    """Kills every workload still running (the part is being stopped)."""
    with _live_lock:
        children = list(_live)
    for c in children:
        c.kill()


class Child:
    """One workload process. stdout: JSON lines (``{"ev": ...}``; others kept as text); stderr: xCUDA's trace
    (parsed), the rest kept as a tail for error messages. Both are drained continuously (a full pipe would
    block the job, and xCUDA's controller thread with it)."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], cwd: Path | str,
                 on_event: Callable[[dict], None] | None = None):
        self.argv = list(argv)
        self.on_event = on_event
        self.events: list[dict] = []
        self.text: list[str] = []
        self.step_times: list[float] = []
        self.trace: list[tuple[float, str]] = []   # (arrival monotonic s, line): xCUDA's pace lines and restarts
        self.stderr_head: list[str] = []           # the first lines (xCUDA's one-time warnings come early)
        self.stderr_tail: deque[str] = deque(maxlen=30)
        self.spawned = time.monotonic()
        self.killed = False
        self.proc = subprocess.Popen(self.argv, env=env, cwd=str(cwd), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        with _live_lock:
            _live.add(self)
        self._threads = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self._threads:
            t.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            ev = None
            if line.startswith("{"):
                try:
                    ev = json.loads(line)
                except ValueError:
                    ev = None
            if not isinstance(ev, dict):
                self.text.append(line)
                continue
            if ev.get("ev") == "step":
                self.step_times.append(float(ev["t"]))
            else:
                self.events.append(ev)
            if self.on_event is not None:
                self.on_event(ev)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            now = time.monotonic()
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if "debug: pace " in line:
                self.trace.append((now, line))
                continue
            if pace_trace.START_MARKER in line:
                self.trace.append((now, line))
            if len(self.stderr_head) < 30:
                self.stderr_head.append(line)
            self.stderr_tail.append(line)

    def event(self, name: str) -> dict | None:
        """The last event called ``name``."""
        for ev in reversed(self.events):
            if ev.get("ev") == name:
                return ev
        return None

    def wait(self, timeout_s: float) -> int | None:
        """The exit status, or None when it ran past ``timeout_s`` and was killed."""
        try:
            rc = self.proc.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
            rc = None
        for t in self._threads:
            t.join(timeout=5.0)
        with _live_lock:
            _live.discard(self)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.killed = True
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own process group: the workload and what it started
            except ProcessLookupError:
                pass

    def failure(self, rc: int | None) -> str | None:
        """Why the workload failed (None: it did not)."""
        err = self.event("error")
        if err is not None:
            return str(err.get("error"))
        if rc is None:
            return f"timed out after {time.monotonic() - self.spawned:.1f} s (killed)"
        if rc != 0:
            tail = " | ".join(list(self.stderr_tail)[-6:])
            return f"exit status {rc}: {tail[-800:]}"
        return None


# -- the node agent's loop ------------------------------------------------------------------------

class _RecordingEvictor:
    """SysMonitor may judge the GPU Overlimit under the job's load; the check evicts nothing, it notes it."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def evict(self, gpu_id: int, reason: str) -> list:
        self.reasons.append(reason)
        return []


class AgentLoop:
    """The agent's :class:`~executors.node.agent.GpuLoop` for GPU 0 publishing ``record_path``, ticked every
    ``AgentConfig().interval_s`` on its own thread with ``NodeAgent.run``'s timing (missed ticks skipped, never
    bursts). ``on_tick(mono_ns, sample)`` runs after each tick, on the same thread."""

    def __init__(self, sampler: Any, record_path: Path, *, target_util: float, clock_threshold_mhz: float,
                 on_tick: Callable[[int, RawSample | None], None] | None = None):
        from executors.node.agent import AgentConfig, GpuBinding, GpuLoop, MemorySink

        self.cfg = AgentConfig()
        self.sampler = sampler
        self.evictor = _RecordingEvictor()
        binding = GpuBinding(gpu_id=0, gpu_index=0, shm_path=Path(record_path),
                             clock_threshold_mhz=clock_threshold_mhz, target_util=target_util)
        self.loop = GpuLoop(binding, self.cfg, self.evictor, MemorySink(), None, sampler.source)
        self.on_tick = on_tick
        self.ticks = 0
        self.overruns = 0
        self.sample_errors = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._ticked = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="xcuda-check-agent", daemon=True)

    @property
    def interval_s(self) -> float:
        return self.cfg.interval_s

    def start(self, first_ticks: int = 2, timeout_s: float = 10.0) -> None:
        """Starts ticking; returns once ``first_ticks`` ticks published the record (the job finds it at once)."""
        self._thread.start()
        with self._ticked:
            if not self._ticked.wait_for(lambda: self.ticks >= first_ticks or self.error is not None, timeout_s):
                raise RuntimeError(f"the agent loop did not tick within {timeout_s} s")
        if self.error is not None:
            raise RuntimeError(f"agent loop: {self.error}")

    def _tick(self) -> None:
        now = time.time()
        mono_ns = time.monotonic_ns()
        try:
            s = self.sampler.sample(0, now)
        except Exception as exc:  # as NodeAgent.tick: a failed read is a gap
            log.debug("sample failed: %s", exc)
            self.sample_errors += 1
            s = None
        self.loop.tick(now, mono_ns, s, [])
        if self.on_tick is not None:
            self.on_tick(mono_ns, s)

    def _run(self) -> None:
        interval = self.cfg.interval_s
        next_t = time.monotonic()
        try:
            while not self._stop.is_set():
                self._tick()
                with self._ticked:
                    self.ticks += 1
                    self._ticked.notify_all()
                next_t += interval
                now = time.monotonic()
                if next_t < now:
                    missed = int((now - next_t) / interval) + 1
                    self.overruns += missed
                    next_t += missed * interval
                self._stop.wait(max(0.0, next_t - time.monotonic()))
        except Exception as exc:
            log.exception("agent loop failed")
            with self._ticked:
                self.error = f"{type(exc).__name__}: {exc}"
                self._ticked.notify_all()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        self.loop.close()

    def summary(self) -> dict[str, Any]:
        return {"ticks": self.ticks, "overruns": self.overruns, "sample_errors": self.sample_errors,
                "sysmonitor_state": self.loop.monitor.state.value, "evictions_asked": len(self.evictor.reasons),
                "first_eviction_reason": self.evictor.reasons[0] if self.evictor.reasons else None,
                "error": self.error}


# -- what each tick saw ---------------------------------------------------------------------------

def read_stats(path: Path, attempts: int = 4) -> XcudaStats | None:
    """A process's xCUDA counters (None: not published yet, or mid-update every time)."""
    for _ in range(attempts):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return decode_stats(data)
        except StatsRefused:
            continue
    return None


@dataclass
class Recorder:
    """One row per agent tick: the record as the job reads it, and the job's counters (when it publishes them)."""

    record_path: Path
    stats_path: Path | None = None
    rows: list[tuple] = field(default_factory=list)
    record_errors: int = 0

    def tick(self, mono_ns: int, sample: RawSample | None) -> None:
        try:
            rec = shm.decode(self.record_path.read_bytes())
        except (OSError, ValueError):
            self.record_errors += 1
            return
        s = rec.sample
        gpu_util = float("nan") if sample is None else sample.gpu_util_pct / 100.0
        st = read_stats(self.stats_path) if self.stats_path is not None else None
        stats = None if st is None else (st.timestamp_ns, st.launches, st.waits, st.waited_ns, st.rate,
                                         st.fallback, st.gate_open)
        integral = s.u_sm_integral_s if s.flags & shm.FLAG_INTEGRAL else float("nan")
        self.rows.append((mono_ns, rec.timestamp_ns, s.u_sm, integral, s.sm_clock_mhz, s.clock_threshold_mhz,
                          s.clock_max_mhz, s.target_util, gpu_util, stats))


def _r(x: float, nd: int = 4) -> float | None:
    return round(float(x), nd) if x is not None and math.isfinite(x) else None


def series(rows: Sequence[tuple], t0: float, step_times: Sequence[float] = (), rate_window_s: float = 0.5,
           steps_from_launches: bool = False) -> dict[str, list]:
    """Columns of one run at the agent's sampling interval, ``t_s`` relative to ``t0`` (monotonic s):

    - ``u_sm``, ``u_sm_integral_s`` (the record's running integral of U_SM, seconds; null without it),
      ``sm_clock_mhz``, ``target``: the record as the job read it; ``u_gpu``: Eq. 1-2 of its latest sample
      (xCUDA's default a_L, a_H; the controller itself uses the mean since its previous period, in its trace);
      ``gpu_util``: NVML utilisation (informational);
    - ``launches_per_s`` (the job's launches through the gate, between its counter updates), ``paced_rate``
      (the gate's rate, null while open), ``gate_open``, ``fallback`` (0/1), ``wait_frac`` (time launches spent
      waiting at the gate per second): the job's xCUDA counters, null without them;
    - ``steps``: training steps done (the launches when ``steps_from_launches``), ``steps_per_s`` over the last
      ``rate_window_s``.
    """
    cols: dict[str, list] = {k: [] for k in ("t_s", "u_sm", "u_sm_integral_s", "sm_clock_mhz", "target", "u_gpu",
                                             "gpu_util",
                                             "launches_per_s", "paced_rate", "gate_open", "fallback", "wait_frac",
                                             "steps", "steps_per_s")}
    steps = sorted(step_times)
    prev_stats = None
    launch_rate = wait_frac = None
    hist: deque[tuple[float, float]] = deque()
    k = 0
    for mono_ns, _rec_ts, u_sm, integral, c_sm, t_sm, c_h, target, gpu_util, stats in rows:
        t = mono_ns / 1e9
        cols["t_s"].append(round(t - t0, 4))
        cols["u_sm"].append(_r(u_sm))
        cols["u_sm_integral_s"].append(_r(integral, 6))
        cols["sm_clock_mhz"].append(_r(c_sm, 1))
        cols["target"].append(_r(target))
        cols["u_gpu"].append(_r(gpu_load(u_sm, clock_factor(c_sm, t_sm, c_h, A_L, A_H))))
        cols["gpu_util"].append(_r(gpu_util))
        if stats is not None and prev_stats is not None and stats[0] > prev_stats[0]:
            dt = (stats[0] - prev_stats[0]) / 1e9
            launch_rate = (stats[1] - prev_stats[1]) / dt
            wait_frac = (stats[3] - prev_stats[3]) / 1e9 / dt
        if stats is not None and (prev_stats is None or stats[0] > prev_stats[0]):
            prev_stats = stats
        cols["launches_per_s"].append(_r(launch_rate, 1))
        cols["wait_frac"].append(_r(wait_frac))
        if stats is None:
            cols["paced_rate"].append(None)
            cols["gate_open"].append(None)
            cols["fallback"].append(None)
        else:
            cols["paced_rate"].append(None if stats[6] else _r(stats[4], 1))
            cols["gate_open"].append(1 if stats[6] else 0)
            cols["fallback"].append(1 if stats[5] else 0)
        if steps_from_launches:
            done = float(stats[1]) if stats is not None else 0.0
        else:
            while k < len(steps) and steps[k] <= t:
                k += 1
            done = float(k)
        hist.append((t, done))
        while hist and hist[0][0] < t - rate_window_s:
            hist.popleft()
        span = t - hist[0][0]
        cols["steps"].append(int(done))
        cols["steps_per_s"].append(_r((done - hist[0][1]) / span, 2) if span >= rate_window_s / 2 else None)
    return cols


def _finite(x: float) -> float | int | None:
    return x if isinstance(x, int) or math.isfinite(x) else None


def controller_trace(lines: Sequence[tuple[float, str]], t0: float) -> tuple[list[list[pace_trace.Period]],
                                                                              dict[str, list]]:
    """xCUDA's controller, one row per control period as the library logged it (:mod:`executors.node.xcuda.trace`,
    every number at full precision): the stretches of closed-loop control (a new one each time control restarts)
    and columns named as :class:`~executors.node.xcuda.trace.Period`'s fields, plus ``t_s`` (when the line reached
    the check, relative to ``t0``) and ``run`` (the stretch's index), so that a stored trace replays through
    :func:`executors.node.xcuda.trace.replay`."""
    runs: list[list[pace_trace.Period]] = []
    current: list[pace_trace.Period] | None = None
    cols: dict[str, list] = {"t_s": [], "run": [], **{f: [] for f in PERIOD_FIELDS}}
    for arrived, line in lines:
        if pace_trace.START_MARKER in line:
            current = []
            runs.append(current)
            continue
        parsed = pace_trace.parse(line)
        if not parsed:
            continue
        p = parsed[0][0]
        if current is None:
            current = []
            runs.append(current)
        current.append(p)
        cols["t_s"].append(round(arrived - t0, 4))
        cols["run"].append(len(runs) - 1)
        for f in PERIOD_FIELDS:
            cols[f].append(_finite(getattr(p, f)))
    return [r for r in runs if r], cols


def mirror_check(runs: Sequence[Sequence[pace_trace.Period]], settle_s: float) -> dict[str, Any]:
    """The live library against the Python mirror (:func:`executors.node.xcuda.trace.mismatches`, xCUDA's default
    gains: the check sets none), and the loop's own view of its tracking (the longest stretch, after ``settle_s``
    of control)."""
    periods = sum(len(r) for r in runs)
    bad = [m for r in runs for m in pace_trace.mismatches(list(r))]
    out: dict[str, Any] = {"periods": periods, "stretches": len(runs), "mirror_mismatches": len(bad),
                           "mirror_agrees": bool(periods) and not bad, "first_mismatches": bad[:3]}
    if runs:
        st = pace_trace.steady_state(list(max(runs, key=len)), settle_s)
        out["steady"] = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in st.items()}
    return out


def downsample(cols: dict[str, list], max_points: int) -> tuple[dict[str, list], int]:
    """At most ``max_points`` rows: consecutive rows averaged in groups (nulls left out; a group of nulls is
    null); returns the columns and the group size (1: unchanged)."""
    n = len(cols.get("t_s", []))
    if n <= max_points or max_points <= 0:
        return cols, 1
    group = math.ceil(n / max_points)
    out: dict[str, list] = {}
    for name, values in cols.items():
        merged = []
        for i in range(0, n, group):
            chunk = [v for v in values[i:i + group] if v is not None]
            merged.append(round(sum(chunk) / len(chunk), 6) if chunk else None)
        out[name] = merged
    return out, group


# -- statistics -----------------------------------------------------------------------------------

def _quantile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def steady_state(t_s: Sequence[float], u_gpu: Sequence[float | None], target: float | None, settle_s: float,
                 progress: Sequence[tuple[float, float]] = (), tolerance: float = 0.05,
                 gate_open: Sequence[int | None] = (), launches_per_s: Sequence[float | None] = ()) -> dict[str, Any]:
    """The load after ``settle_s`` (the samples with ``t_s >= settle_s``): mean, spread, error against ``target``,
    the share of samples within ``tolerance`` of it, and the speed: ``progress`` is (t_s, cumulative count)
    points (steps done, or launches), and ``steps_per_s`` is their slope over the same window. ``gate_open`` and
    ``launches_per_s`` (aligned with ``t_s``) give the share of time the gate was open and the mean launch rate.
    """
    idx = [i for i, t in enumerate(t_s) if t >= settle_s and u_gpu[i] is not None and math.isfinite(u_gpu[i])]
    vals = [float(u_gpu[i]) for i in idx]
    out: dict[str, Any] = {"settle_s": settle_s, "samples": len(vals), "window_s": None, "mean_u_gpu": None,
                           "std_u_gpu": None, "p05_u_gpu": None, "p95_u_gpu": None, "target": target,
                           "error": None, "relative_error": None, "within_tolerance": None, "tolerance": tolerance,
                           "gate_open_frac": None, "mean_launches_per_s": None, "steps_per_s": None}
    if vals:
        mean = sum(vals) / len(vals)
        sv = sorted(vals)
        out.update(window_s=round(t_s[idx[-1]] - t_s[idx[0]], 3), mean_u_gpu=round(mean, 4),
                   std_u_gpu=round(math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals)), 4),
                   p05_u_gpu=round(_quantile(sv, 0.05), 4), p95_u_gpu=round(_quantile(sv, 0.95), 4))
        if target is not None:
            out["error"] = round(mean - target, 4)
            out["relative_error"] = round((mean - target) / target, 4) if target > 0 else None
            out["within_tolerance"] = round(sum(abs(v - target) <= tolerance for v in vals) / len(vals), 4)
    window = [i for i, t in enumerate(t_s) if t >= settle_s]
    opens = [gate_open[i] for i in window if i < len(gate_open) and gate_open[i] is not None]
    if opens:
        out["gate_open_frac"] = round(sum(opens) / len(opens), 4)
    rates = [launches_per_s[i] for i in window if i < len(launches_per_s) and launches_per_s[i] is not None]
    if rates:
        out["mean_launches_per_s"] = round(sum(rates) / len(rates), 1)
    pts = [(t, c) for t, c in progress if t >= settle_s]
    if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
        out["steps_per_s"] = round((pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]), 3)
    return out


# -- the simulated GPU ----------------------------------------------------------------------------

class ToyGpu:
    """``--simulate``'s GPU: each kernel launch keeps the SMs busy ``kernel_s``; the SM activity is what the
    watched process's xCUDA counters show it launched over the last ``gpm_interval_s`` (recomputed at that
    interval, as the agent's GPM reading is). A :class:`~executors.node.sampler.SimulatedSampler` model."""

    def __init__(self, kernel_s: float = 200e-6, gpm_interval_s: float = 0.1, clock_mhz: float = 1980.0,
                 constant_u_sm: float | None = None):
        self.kernel_s = kernel_s
        self.gpm_interval_s = gpm_interval_s
        self.clock_mhz = clock_mhz
        self.constant_u_sm = constant_u_sm
        self.stats_path: Path | None = None
        self._last: tuple[int, int] | None = None   # (timestamp_ns, launches) at the last update
        self._u = 0.0
        self._lock = threading.Lock()

    def watch(self, stats_path: Path | None) -> None:
        with self._lock:
            self.stats_path, self._last, self._u = stats_path, None, 0.0

    def _update(self) -> float:
        if self.constant_u_sm is not None:
            return self.constant_u_sm
        with self._lock:
            st = read_stats(self.stats_path) if self.stats_path is not None else None
            if st is None:
                return self._u
            if self._last is None:
                self._last = (st.timestamp_ns, st.launches)
            elif st.timestamp_ns - self._last[0] >= self.gpm_interval_s * 1e9:
                dt = (st.timestamp_ns - self._last[0]) / 1e9
                self._u = min(1.0, (st.launches - self._last[1]) * self.kernel_s / dt)
                self._last = (st.timestamp_ns, st.launches)
            return self._u

    def __call__(self, now_s: float) -> RawSample:
        u = self._update()
        return RawSample(gpu_util_pct=100.0 * min(1.0, u * 1.2), sm_activity_pct=100.0 * u,
                         sm_occupancy_pct=50.0 * u, mem_used_bytes=2.0 * 2**30, mem_total_bytes=16.0 * 2**30,
                         mem_bw_util_pct=30.0 * u, sm_clock_mhz=self.clock_mhz, sm_clock_max_mhz=self.clock_mhz,
                         power_w=100.0 + 300.0 * u, temperature_c=40.0)
