"""The co-location harness: one online reference service and one offline reference job on one GPU.

    python -m executors.node.profiling.colocate --run-dir DIR --gpu-type auto --service cnn --qps auto \\
        --job transformer --size gpu --sm 20,50,80 --repeat 3 --window 5

Runs on a node with a whole GPU (a job on the profile partition, or by hand). What it measures, per SM %
of the job (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` under MPS; paper §6, §7.1): the job's normalized
throughput (its solo iteration time ÷ its co-located one) and the service's slowdown (co-located ÷ solo
latency, average and p99). How, so that the numbers mean something:

- **Long-lived workload processes** (:mod:`executors.node.profiling.hosts`): one service process for the
  whole sweep, paused (not stopped) while the job is measured alone, so its solo baselines and its
  co-located windows are measured in the same process, context and kernels (two runs of one service
  differed by 3.2 vs 5.6 ms, measured on one H200 on 2026-11-27); one job process per SM % (the share binds at a
  CUDA context) and one alone, each paused between its windows, its first iterations after a pause left
  out. No window pays for a process's start. Where the GPU cannot hold a job process per SM % beside
  the others, the SM %s are measured one after the other (``sm-major``), each process started before its
  repetitions and stopped after them.
- **Solo baselines before and after every co-located window**: the service alone right before and right
  after each point (a point's slowdown divides by the mean of the two), the job alone before and after
  each round of points (its normalized throughput likewise). Both are reported, with their relative
  difference; a repetition whose service (average latency) or job (iteration time) baselines differ by
  more than ``tolerance`` (10 %) is flagged ``unstable``.
- **Repetitions** (``--repeat``, 3 on the command line): rounds over all SM %s, each round rotated by one
  (every SM % at every position once in as many rounds as SM %s), so a drift does not fall on one SM %.
  Per SM %: mean, standard deviation (n−1), min and max of ``norm_tput``, ``slowdown_avg`` and
  ``slowdown_p99``, and every repetition's values.
- **Per window** the SM clock (MHz: mean and min) and the host's CPU load (busy fraction of all CPUs
  from ``/proc/stat``, ``os.getloadavg()``), with the GPU metrics of the window.
- **A GPU-bound service**: dynamic batching (``--max-batch``, as ``serve``) and ``--qps auto``: a short
  solo calibration raises the offered load until the service's solo GPU utilization (NVML; with simulated
  metrics its busy fraction) is within the target (0.3..0.6) while its p99 stays bounded; the steps and
  the reason for the choice are in the report. With a fixed ``--qps`` the solo utilization is recorded
  and a service under 0.3 is reported as not GPU-bound (its latency is then the host's: Python, launches,
  wake-ups; a job beside it cannot be told from noise).
- **A deadline** (``--deadline``): a point is started only when it, its baseline after and the job's
  closing baseline fit; the report says what was left out.

Processes are forked from a server that has imported torch once (:mod:`executors.node.profiling.forked`).
Method: ``mps`` when the node has a GPU and a private MPS control daemon could be started for the run;
``no-mps`` with a GPU but no MPS (time-slicing: the SM % is not enforced, one job process serves every
window); ``cpu`` without a GPU: both run on the CPU, one thread each, with simulated GPU metrics — a test
of the harness, not a measurement of GPU interference (such samples never train a predictor). The report
(``muxflow-colocation-report/2``) goes to ``DIR/colocation.json``, rewritten after every point; scratch
files to ``DIR/.colocate-work/``.

Report /2 (what /1 readers use keeps its meaning): ``points[]`` one per SM % with ``norm_tput``,
``slowdown_avg``, ``slowdown_p99`` (the repetitions' means), ``stats`` (mean, std, min, max, n, values),
``repetitions[]`` (each window's record: ``iterations``, ``latency``, ``metrics``, ``sm_clock_mhz``,
``host``, its ``baseline`` before/after with their spread, ``unstable``) and ``baselines`` (the service's
solo windows around it); ``solo_service`` / ``solo_job``: every solo window pooled (the samples'
features); ``baselines`` / ``job_baselines``: every solo window; ``qps_selection``; ``caveats``;
``complete`` / ``why_incomplete``.
"""

from __future__ import annotations

import argparse
import collections
import logging
import math
import os
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from executors.job.runtime.timing import finite_or_none, percentile, write_json_atomic
from executors.job.workloads.models import workload_size
from executors.node.profiling.child import Child
from executors.node.profiling.forked import ForkedChild, job_target, service_target
from executors.node.profiling.hosts import (
    IterationReader,
    JobConfig,
    ServiceConfig,
    StreamReader,
    read_json_file,
    write_json,
)
from executors.node.profiling.metrics import (
    MetricsUnavailable,
    WindowRecorder,
    open_sampler,
    simulated_offline_iter_time_s,
    simulated_offline_model,
    simulated_online_model,
)
from executors.node.sampler import RawSample, nvml_available

log = logging.getLogger(__name__)
FORMAT = "muxflow-colocation-report/2"
FORMATS = ("muxflow-colocation-report/1", FORMAT)  # what readers of the report accept
REPORT_FILE = "colocation.json"
WORK_DIR = ".colocate-work"
DEFAULT_TOLERANCE = 0.10
DEFAULT_AUTO_TARGET = (0.3, 0.6)
GPU_BOUND_UTIL = 0.3          # a service's solo utilization below it: not GPU-bound
DEFAULT_MAX_BATCH = 32
VALUES = ("norm_tput", "slowdown_avg", "slowdown_p99")

__all__ = ["FORMAT", "FORMATS", "REPORT_FILE", "Child", "Harness", "HostLoad", "Mps", "auto_qps", "build_report",
           "latency_stats", "main", "plan_rounds", "spread_stats"]


def private_work_dir(path: Path) -> Path:
    """The harness's scratch directory (its processes' control and state files, whose numbers become the samples):
    made 0700, or, from an earlier run of this account, kept only when it is a directory (not a link) of this
    account that no one else can write to; anything else (someone made it first) is refused with one line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() \
                or st.st_mode & 0o077:
            raise ValueError(f"work directory {path}: not this account's private directory (owner uid {st.st_uid}, "
                             f"mode {stat.S_IMODE(st.st_mode):04o}{', a link' if stat.S_ISLNK(st.st_mode) else ''}): "
                             "someone else made it; not used") from None
    return path


def latency_stats(latencies_s: Sequence[float]) -> dict[str, Any]:
    xs = sorted(latencies_s)
    ms = lambda q: finite_or_none(1000 * percentile(xs, q)) if xs else None  # noqa: E731
    return {"requests": len(xs), "avg_ms": finite_or_none(1000 * sum(xs) / len(xs)) if xs else None,
            "p50_ms": ms(50), "p99_ms": ms(99), "max_ms": finite_or_none(1000 * xs[-1]) if xs else None}


class Mps:
    """A private MPS control daemon for this run (its own pipe and log directories)."""

    def __init__(self, root: Path):
        self.pipe, self.log = root / "mps-pipe", root / "mps-log"
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe), "CUDA_MPS_LOG_DIRECTORY": str(self.log)}
        self.started = False
        self.answer_timeout_s = 10.0   # how long a started daemon may take to answer its first command

    def start(self, static: bool = False) -> str | None:
        """None when started, else why not. ``static``: with ``-S`` (static SM partitions, CUDA 13.1+)."""
        exe = shutil.which("nvidia-cuda-mps-control")
        if exe is None:
            return "nvidia-cuda-mps-control not found"
        self.pipe.mkdir(parents=True, exist_ok=True)
        self.log.mkdir(parents=True, exist_ok=True)
        args = ["-d", "-S"] if static else ["-d"]
        out = subprocess.run([exe, *args], env={**os.environ, **self.env}, capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            return f"nvidia-cuda-mps-control {' '.join(args)} failed ({out.returncode}): " \
                   f"{(out.stderr or out.stdout).strip()}"
        self.started = True
        why = self._answers(exe, self.answer_timeout_s)
        if why is not None:
            self.started = False
            return f"nvidia-cuda-mps-control {' '.join(args)}: {why}"
        return None

    def _answers(self, exe: str, timeout_s: float = 10.0) -> str | None:
        """None once the daemon answers a control command; else why not, with the end of its own log (a daemon
        that cannot run as asked, ``-S`` on a driver without static partitions, say, exits right after ``-d``)."""
        end = time.monotonic() + timeout_s
        while True:
            r = subprocess.run([exe], input="get_default_active_thread_percentage\n", env={**os.environ, **self.env},
                               capture_output=True, text=True, timeout=timeout_s)
            said = (r.stdout + r.stderr).strip()
            if r.returncode == 0 and "Cannot find" not in said:
                return None
            if time.monotonic() >= end:
                break
            time.sleep(0.1)  # the daemon's pipe may take a moment after -d returns
        try:
            lines = (self.log / "control.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        tail = " | ".join(ln.strip() for ln in lines[-3:])
        return f"the control daemon does not answer ({said[:200] or f'exit status {r.returncode}'})" + \
               (f"; its log ends: {tail[:400]}" if tail else "; it wrote no log")

    def stop(self) -> None:
        if self.started:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env={**os.environ, **self.env},
                           capture_output=True, text=True, timeout=60)
            self.started = False


# -- host CPU load ------------------------------------------------------------------------------------

def read_cpu_times(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs together from the first line of ``/proc/stat``; None where unreadable.
    Idle is ``idle + iowait``; total is user … steal (guest time is inside user)."""
    try:
        with open(path) as f:
            parts = f.readline().split()
    except OSError:
        return None
    if len(parts) < 5 or parts[0] != "cpu":
        return None
    vals = [int(x) for x in parts[1:9]]
    total = sum(vals)
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return total - idle, total


def cpu_busy_fraction(a: tuple[int, int] | None, b: tuple[int, int] | None) -> float | None:
    """The busy fraction of all CPUs between two ``read_cpu_times`` readings, within [0, 1]."""
    if a is None or b is None or b[1] <= a[1]:
        return None
    return min(1.0, max(0.0, (b[0] - a[0]) / (b[1] - a[1])))


class HostLoad:
    """Reads ``/proc/stat`` and the load average every ``interval_s`` on a thread; the load of any window."""

    def __init__(self, interval_s: float = 0.1, reader: Callable[[], tuple[int, int] | None] = read_cpu_times,
                 loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg,
                 wall: Callable[[], float] = time.time, keep: int = 40_000):
        self.interval_s, self.reader, self.loadavg, self.wall = interval_s, reader, loadavg, wall
        self.samples: collections.deque = collections.deque(maxlen=keep)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="muxflow-host-load", daemon=True)

    def _read(self) -> None:
        try:
            la = tuple(self.loadavg())
        except OSError:
            la = None
        r = self.reader()
        s = (self.wall(), r, la)
        with self._lock:
            self.samples.append(s)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._read()
            self._stop.wait(self.interval_s)

    def start(self) -> HostLoad:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def window(self, start: float, end: float) -> dict[str, Any]:
        """CPU busy fraction over [start, end] (from the readings just before and just after it) and the load
        average read at its end. Call it after the window ended (a fresh reading is taken)."""
        self._read()
        with self._lock:
            ss = [s for s in self.samples if s[1] is not None]
        before = [s for s in ss if s[0] <= start]
        after = [s for s in ss if s[0] >= end]
        a = before[-1] if before else (ss[0] if ss else None)
        b = after[0] if after else (ss[-1] if ss else None)
        busy = cpu_busy_fraction(a[1], b[1]) if a and b else None
        la = b[2] if b and b[2] else None
        return {"cpu_busy_frac": busy, "cpus": os.cpu_count(),
                "span_s": (b[0] - a[0]) if a and b else None,
                "loadavg_1m": la[0] if la else None, "loadavg": list(la) if la else None,
                "source": "/proc/stat" if busy is not None else "unavailable"}


# -- the simulated GPU, following what runs ------------------------------------------------------------

class PhaseModel:
    """Simulated GPU readings of what the harness runs now (``phase``): nothing, the service, the job, or both
    (the job at ``sm_pct``). The service's readings are its family's at the current load (``load()``)."""

    def __init__(self, family: str, job_type: str, gpu_type: str, mem_bytes: float, seed: int,
                 load: Callable[[], float]):
        from scheduler_core.gpu_specs import get_spec

        self.family, self.gpu_type, self.mem_bytes, self.seed, self.load = family, gpu_type, mem_bytes, seed, load
        self.phase, self.sm_pct = "idle", 100
        self._offline = simulated_offline_model(job_type, gpu_type, seed)
        self._online: dict[float, Callable[[float], RawSample]] = {}
        spec = get_spec(gpu_type)
        self._idle = RawSample(gpu_util_pct=0.0, sm_activity_pct=0.0, sm_occupancy_pct=0.0, mem_used_bytes=0.0,
                               mem_total_bytes=float(spec.memory_bytes), mem_bw_util_pct=0.0,
                               sm_clock_mhz=float(spec.max_sm_clock_mhz), sm_clock_max_mhz=float(spec.max_sm_clock_mhz))

    def _service(self, t: float) -> RawSample:
        load = round(min(1.0, max(0.05, self.load())), 3)
        if load not in self._online:
            self._online[load] = simulated_online_model(self.family, self.gpu_type, load, self.mem_bytes, self.seed)
        return self._online[load](t)

    def __call__(self, t: float) -> RawSample:
        phase = self.phase
        if phase == "service":
            return self._service(t)
        if phase == "job":
            return self._offline(t)
        if phase != "both":
            return self._idle
        on, off = self._service(t), self._offline(t)
        share = self.sm_pct / 100.0
        return RawSample(
            gpu_util_pct=min(100.0, on.gpu_util_pct + off.gpu_util_pct * (1 - on.gpu_util_pct / 100.0)),
            sm_activity_pct=min(100.0, on.sm_activity_pct + off.sm_activity_pct * share),
            sm_occupancy_pct=min(100.0, on.sm_occupancy_pct + off.sm_occupancy_pct * share),
            mem_used_bytes=on.mem_used_bytes + off.mem_used_bytes, mem_total_bytes=on.mem_total_bytes,
            mem_bw_util_pct=min(100.0, on.mem_bw_util_pct + off.mem_bw_util_pct * share),
            sm_clock_mhz=min(on.sm_clock_mhz, off.sm_clock_mhz), sm_clock_max_mhz=on.sm_clock_max_mhz)


# -- the report, derived from the windows ---------------------------------------------------------------

def _finite(x: Any) -> Any:
    """JSON has no NaN: NaN and infinities become null, recursively."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [float(x) for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def _rel_diff(a: float | None, b: float | None) -> float | None:
    """|b − a| relative to their mean."""
    if a is None or b is None or a + b <= 0:
        return None
    return abs(b - a) / ((a + b) / 2.0)


def spread_stats(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean, sample standard deviation (n − 1; null below two values), min and max of the values that exist;
    ``values`` keeps every repetition's (null where it failed)."""
    xs = [float(v) for v in values if v is not None]
    return {"n": len(xs), "mean": statistics.fmean(xs) if xs else None,
            "std": statistics.stdev(xs) if len(xs) >= 2 else None,
            "min": min(xs) if xs else None, "max": max(xs) if xs else None, "values": list(values)}


def _pool_metrics(ms: list[dict]) -> dict | None:
    """Window metrics averaged field by field (the samples summed, the lowest clock kept)."""
    ms = [m for m in ms if m and "error" not in m]
    if not ms:
        return None
    out: dict[str, Any] = {}
    for k, v in ms[0].items():
        if k == "source":
            out[k] = v
        elif k == "notes":
            out[k] = "; ".join(dict.fromkeys(m.get("notes") for m in ms if m.get("notes")))
        elif k == "samples":
            out[k] = sum(int(m.get(k) or 0) for m in ms)
        elif k == "sm_clock_min_mhz":
            out[k] = min((m[k] for m in ms if m.get(k) is not None), default=None)
        elif isinstance(v, (int, float)) or v is None:
            out[k] = _mean([m.get(k) for m in ms])
    out["windows"] = len(ms)
    return out


def _ok(w: dict) -> bool:
    return not w.get("error") and w.get("start_unix") is not None and w.get("end_unix") is not None


def _bracket(windows: list[dict], kind: str, w: dict) -> tuple[dict | None, dict | None]:
    """The last ``kind`` window that ended before ``w`` started, and the first that started after ``w`` ended."""
    same = [x for x in windows if x.get("kind") == kind and _ok(x)]
    before = [x for x in same if x["end_unix"] <= w["start_unix"]]
    after = [x for x in same if x["start_unix"] >= w["end_unix"]]
    return (max(before, key=lambda x: x["end_unix"]) if before else None,
            min(after, key=lambda x: x["start_unix"]) if after else None)


def _lat(w: dict | None, key: str) -> float | None:
    return None if w is None else (w.get("latency") or {}).get(key)


def _iter(w: dict | None) -> float | None:
    return None if w is None else (w.get("iterations") or {}).get("mean_s")


def repetition(windows: list[dict], w: dict, tolerance: float) -> dict[str, Any]:
    """One co-located window with its baselines (the service's around it, the job's around its round), its
    values and its stability."""
    rep = dict(w)
    if not _ok(w):
        rep.setdefault("error", "no co-located window")
        for k in VALUES:
            rep[k] = None
        return rep
    sb, sa = _bracket(windows, "service_solo", w)
    jb, ja = _bracket(windows, "job_solo", w)
    svc_avg = _mean([_lat(sb, "avg_ms"), _lat(sa, "avg_ms")])
    svc_p99 = _mean([_lat(sb, "p99_ms"), _lat(sa, "p99_ms")])
    job_it = _mean([_iter(jb), _iter(ja)])
    spread = {"service_avg": _rel_diff(_lat(sb, "avg_ms"), _lat(sa, "avg_ms")),
              "service_p99": _rel_diff(_lat(sb, "p99_ms"), _lat(sa, "p99_ms")),
              "job_iter": _rel_diff(_iter(jb), _iter(ja))}
    rep["baseline"] = {
        "service_before": None if sb is None else {"index": sb.get("index"), "avg_ms": _lat(sb, "avg_ms"),
                                                   "p99_ms": _lat(sb, "p99_ms")},
        "service_after": None if sa is None else {"index": sa.get("index"), "avg_ms": _lat(sa, "avg_ms"),
                                                  "p99_ms": _lat(sa, "p99_ms")},
        "service_avg_ms": svc_avg, "service_p99_ms": svc_p99,
        "job_before": None if jb is None else {"index": jb.get("index"), "mean_s": _iter(jb)},
        "job_after": None if ja is None else {"index": ja.get("index"), "mean_s": _iter(ja)},
        "job_mean_s": job_it, "spread": spread, "tolerance": tolerance,
    }
    it, avg, p99 = _iter(w), _lat(w, "avg_ms"), _lat(w, "p99_ms")
    rep["norm_tput"] = job_it / it if job_it and it else None
    rep["slowdown_avg"] = avg / svc_avg if avg and svc_avg else None
    rep["slowdown_p99"] = p99 / svc_p99 if p99 and svc_p99 else None
    reasons = []
    for key, what in (("service_avg", "service's average latency"), ("job_iter", "job's iteration time")):
        if spread[key] is not None and spread[key] > tolerance:
            reasons.append(f"the {what} alone before and after differs by {100 * spread[key]:.1f} % "
                           f"(> {100 * tolerance:g} %)")
    complete = None not in (sb, sa, jb, ja)
    rep["unstable"] = True if reasons else (False if complete else None)
    if reasons:
        rep["unstable_reasons"] = reasons
    if not complete:
        rep["baseline_missing"] = [name for name, b in (("service before", sb), ("service after", sa),
                                                        ("job before", jb), ("job after", ja)) if b is None]
    if rep["norm_tput"] is None or rep["slowdown_avg"] is None:
        rep["error"] = ("no co-located window (no job iterations or no request inside it)"
                        if not (it and avg) else "no solo baseline to divide by")
    return rep


def _point_baselines(reps: list[dict], windows: list[dict]) -> list[dict]:
    """The service's solo windows around a point's repetitions (in time order), shaped as ``solo_service``."""
    used = {b["index"] for r in reps for k in ("service_before", "service_after")
            if (b := (r.get("baseline") or {}).get(k)) is not None}
    out = []
    for w in windows:
        if w.get("kind") == "service_solo" and w.get("index") in used:
            m = w.get("metrics") or {}
            out.append({"index": w["index"], "start_unix": w.get("start_unix"), "end_unix": w.get("end_unix"),
                        "latency": w.get("latency"), "utilization": w.get("utilization"),
                        "metrics": {k: m.get(k) for k in ("source", "gpu_util_pct", "sm_activity_pct",
                                                          "sm_clock_mhz", "error") if k in m}})
    return out


def build_report(meta: dict[str, Any], windows: list[dict], *, sm_pcts: Sequence[int], repeat: int,
                 tolerance: float = DEFAULT_TOLERANCE, gpu_bound_util: float = GPU_BOUND_UTIL) -> dict[str, Any]:
    """The report (``muxflow-colocation-report/2``) from the run's description and its windows in time order.

    ``windows``: dicts with ``kind`` (``service_solo`` | ``job_solo`` | ``colocated``), ``index``,
    ``start_unix``/``end_unix``, the service's ``latency`` (``avg_ms``, ``p99_ms``, …), the job's
    ``iterations`` (``mean_s``, …), ``metrics``, ``host``, ``sm_clock_mhz``; co-located ones with ``sm_pct``
    and ``rep``; a failed one with ``error``. Pure: the harness calls it after every window."""
    report: dict[str, Any] = {**meta, "format": FORMAT, "sm_pcts": list(sm_pcts), "repeat": repeat,
                              "baseline_tolerance": tolerance}
    svc = [w for w in windows if w.get("kind") == "service_solo" and _ok(w)]
    job = [w for w in windows if w.get("kind") == "job_solo" and _ok(w)]
    colo = [w for w in windows if w.get("kind") == "colocated"]
    svc_lat = [w.get("latency") or {} for w in svc]
    util = _mean([w.get("utilization") for w in svc])
    report["solo_service"] = {
        "latency": {**{k: _mean([x.get(k) for x in svc_lat]) for k in
                       ("avg_ms", "p50_ms", "p99_ms", "achieved_qps", "busy_frac", "mean_batch")},
                    "max_ms": max((x["max_ms"] for x in svc_lat if x.get("max_ms") is not None), default=None),
                    "requests": sum(int(x.get("requests") or 0) for x in svc_lat), "windows": len(svc),
                    "job_type": meta.get("service_job_type"), "family": meta.get("service_family"),
                    "qps_target": meta.get("qps")},
        "metrics": _pool_metrics([w.get("metrics") for w in svc]), "device": meta.get("service_device"),
        "utilization": util, "utilization_source": meta.get("utilization_source")}
    its = [w.get("iterations") or {} for w in job]
    report["solo_job"] = {
        "iterations": {"mean_s": _mean([x.get("mean_s") for x in its]),
                       "min_s": min((x["min_s"] for x in its if x.get("min_s") is not None), default=None),
                       "max_s": max((x["max_s"] for x in its if x.get("max_s") is not None), default=None),
                       "iterations": sum(int(x.get("iterations") or 0) for x in its), "windows": len(job)},
        "metrics": _pool_metrics([w.get("metrics") for w in job]), "device": meta.get("device")}
    if meta.get("model_iter_time_s") is not None:
        report["solo_job"]["model_iter_time_s"] = meta["model_iter_time_s"]
    report["baselines"] = [w for w in windows if w.get("kind") == "service_solo"]
    report["job_baselines"] = [w for w in windows if w.get("kind") == "job_solo"]

    points = []
    unstable_total = 0
    for sm in sm_pcts:
        reps = [repetition(windows, w, tolerance) for w in colo if w.get("sm_pct") == sm]
        if not reps:
            continue
        good = [r for r in reps if not r.get("error")]
        stats = {k: spread_stats([r.get(k) for r in reps]) for k in VALUES}
        unstable = sum(1 for r in good if r.get("unstable"))
        unstable_total += unstable
        lat = [r.get("latency") or {} for r in good]
        p: dict[str, Any] = {
            "sm_pct": sm, "repetitions_planned": repeat, "repetitions_measured": len(good),
            "unstable_repetitions": unstable, **{k: stats[k]["mean"] for k in VALUES}, "stats": stats,
            "latency": {k: _mean([x.get(k) for x in lat]) for k in ("requests", "avg_ms", "p99_ms")},
            "iterations": {"mean_s": _mean([_iter(r) for r in good]),
                           "iterations": sum(int((r.get("iterations") or {}).get("iterations") or 0) for r in good)},
            "baselines": _point_baselines(reps, windows), "repetitions": reps}
        if not good:
            p["error"] = next((r["error"] for r in reps if r.get("error")), "not measured")
        points.append(p)
    report["points"] = points
    report["timeline"] = [[w.get("index"), w.get("kind"), w.get("sm_pct"), w.get("rep"),
                           w.get("start_unix"), w.get("end_unix")] for w in windows]

    caveats = list(meta.get("caveats") or [])
    sel = meta.get("qps_selection") or {}
    if sel.get("mode") == "fixed" and util is not None and util < gpu_bound_util:
        caveats.append(f"not GPU-bound: slowdowns measure the host, not interference (the service used "
                       f"{util:.2f} of the GPU alone at {meta.get('qps')} QPS, {meta.get('utilization_source')}; "
                       f"< {gpu_bound_util:g})")
    if unstable_total:
        n = sum(len(p["repetitions"]) for p in points)
        caveats.append(f"{unstable_total} of {n} co-located windows had solo baselines before and after that differ "
                       f"by more than {100 * tolerance:g} % (unstable)")
    report["caveats"] = caveats
    measured = sum(p["repetitions_measured"] for p in points)
    report["repetitions_measured"] = measured
    report["gpu_bound"] = None if util is None else util >= gpu_bound_util
    return _finite(report)


# -- the harness ---------------------------------------------------------------------------------------

class Stopped(Exception):
    """The run was asked to stop (a signal)."""


CONTEXT_BYTES = 600 * 2**20     # a CUDA context beside what PyTorch reserves (the memory check's allowance)
WARMUP_ITERATIONS = 2           # a released job's first iterations, left out of its window
JOB_READY_FIELDS = ("sm_pct", "iteration_s", "first_iteration_s", "memory_reserved_bytes", "device")


def plan_rounds(sm_pcts: Sequence[int], repeat: int, order: str) -> list[list[int]]:
    """The co-located windows in the order measured. ``interleaved``: ``repeat`` rounds over every SM %, each
    rotated by one (every SM % at every position once in len(sm_pcts) rounds); ``sm-major``: every SM %'s
    repetitions in a row."""
    p = len(sm_pcts)
    if order == "interleaved":
        return [list(sm_pcts[r % p:]) + list(sm_pcts[:r % p]) for r in range(repeat)]
    return [[sm] * repeat for sm in sm_pcts]


class HostProcess:
    """One of the harness's workload processes (:mod:`executors.node.profiling.hosts`), from the fork server."""

    def __init__(self, name: str, work: Path, target: Callable[..., None], config: dict[str, Any],
                 env: dict[str, str], python: str | None, qps: float | None = None):
        self.name = name
        self.files = {k: work / f"{name}.{k}" for k in ("stream", "ready", "control", "state", "log")}
        for f in self.files.values():
            f.unlink(missing_ok=True)
        self.qps, self.paused, self.seq = qps, True, 0
        write_json(self.files["control"], self._wish(False))
        config = {**config, **{k: str(self.files[k]) for k in ("stream", "ready", "control", "state")}}
        self.child = ForkedChild(target, (env, str(self.files["log"]), config), self.files["log"], python)
        self.ready: dict[str, Any] | None = None

    def _wish(self, stop: bool) -> dict[str, Any]:
        return {"seq": self.seq, "paused": self.paused, "stop": stop,
                **({"qps": self.qps} if self.qps is not None else {})}

    def failure(self) -> str | None:
        rc = self.child.poll()
        if rc is None:
            return None
        tail = " ".join(self.child.stderr_tail()[-600:].split())
        return f"the {self.name} process exited (status {rc}): {tail}"

    def poll_ready(self) -> bool:
        if self.ready is None and self.files["ready"].exists():
            self.ready = read_json_file(self.files["ready"])
        return self.ready is not None

    def control(self, stop_fn: Callable[[], bool], *, paused: bool | None = None, qps: float | None = None,
                timeout_s: float = 30.0) -> None:
        """Tell the process; wait for its acknowledgement (a pause: until it is idle)."""
        self.seq += 1
        if paused is not None:
            self.paused = paused
        if qps is not None:
            self.qps = qps
        write_json(self.files["control"], self._wish(False))
        end = time.monotonic() + timeout_s
        while True:
            st = read_json_file(self.files["state"]) or {}
            if st.get("seq", -1) >= self.seq and (not self.paused or st.get("idle")):
                return
            if stop_fn():  # first: a stop signal reaches the processes too, which then exit
                raise Stopped()
            why = self.failure()
            if why:
                raise RuntimeError(why)
            if time.monotonic() > end:
                raise RuntimeError(f"the {self.name} process did not acknowledge {self._wish(False)} within "
                                   f"{timeout_s:.0f} s")
            time.sleep(0.002)  # polling the process's state file

    def stop(self, grace_s: float = 10.0) -> None:
        try:
            write_json(self.files["control"], self._wish(True))
        except OSError:
            pass
        self.child.wait(min(grace_s, 3.0))
        self.child.terminate(grace_s)


class Harness:
    def __init__(self, run_dir: Path, *, gpu_type: str, service_family: str, qps: float | str, job_family: str,
                 size: str, window_s: float, python: str = sys.executable, device: str = "auto",
                 metrics: str = "auto", mps: str = "auto", seed: int = 0, startup_s: float = 180.0,
                 service_mem_bytes: float | None = None, stop: Callable[[], bool] = lambda: False,
                 repeat: int = 1, baseline_window_s: float | None = None, max_batch: int = DEFAULT_MAX_BATCH,
                 tolerance: float = DEFAULT_TOLERANCE, auto_target: tuple[float, float] = DEFAULT_AUTO_TARGET,
                 deadline_s: float | None = None, on_progress: Callable[[dict], None] | None = None,
                 auto_step_s: float | None = None, auto_max_steps: int = 8, p99_factor: float = 5.0,
                 write_report: bool = True, order: str = "auto", per_sm_processes: bool | None = None):
        from executors.job.workloads.models import SERVICE_FAMILIES

        self.dir = Path(run_dir)
        self.work = self.dir / WORK_DIR
        if service_family not in SERVICE_FAMILIES:
            raise ValueError(f"service: {service_family!r} is not an online service family "
                             f"({', '.join(SERVICE_FAMILIES)})")
        self.gpu_type, self.service_family, self.job_family, self.size = gpu_type, service_family, job_family, size
        self.job_type = workload_size(job_family, size).job_type
        self.service_job_type = workload_size(service_family, size).job_type
        if isinstance(qps, str):
            if qps != "auto":
                raise ValueError(f"qps: a positive number or auto, got {qps!r}")
            self.qps_mode, self.qps = "auto", None
        else:
            if not (math.isfinite(qps) and qps > 0):
                raise ValueError(f"qps: must be a positive number, got {qps}")
            self.qps_mode, self.qps = "fixed", float(qps)
        if not (window_s > 0) or (baseline_window_s is not None and not baseline_window_s > 0):
            raise ValueError("window: must be a positive number of seconds")
        if repeat < 1:
            raise ValueError(f"repeat: must be >= 1, got {repeat}")
        if max_batch < 1:
            raise ValueError(f"max-batch: must be >= 1, got {max_batch}")
        if not 0 < tolerance < 1:
            raise ValueError(f"tolerance: a fraction within (0, 1), got {tolerance}")
        lo, hi = auto_target
        if not 0 < lo < hi <= 1:
            raise ValueError(f"auto target: 0 < low < high <= 1, got {lo}..{hi}")
        if order not in ("auto", "interleaved", "sm-major"):
            raise ValueError(f"order: auto, interleaved or sm-major, got {order!r}")
        if metrics not in ("auto", "nvml", "simulated"):
            raise ValueError(f"metrics: expected auto, nvml or simulated, got {metrics!r}")
        self.window_s, self.baseline_window_s = float(window_s), float(baseline_window_s or window_s)
        self.repeat, self.max_batch, self.tolerance, self.auto_target = repeat, max_batch, tolerance, (lo, hi)
        self.python, self.device, self.metrics, self.mps_mode, self.seed = python, device, metrics, mps, seed
        self.startup_s, self.stop, self.deadline_s, self.on_progress = startup_s, stop, deadline_s, on_progress
        self.auto_max_steps, self.p99_factor, self.write_report = auto_max_steps, p99_factor, write_report
        self.order_wish = order
        self.per_sm_wish = per_sm_processes
        self.gpu, why = nvml_available()
        self.simulated_metrics = metrics == "simulated" or (metrics == "auto" and not self.gpu)
        self.service_mem_bytes = service_mem_bytes
        if self.simulated_metrics:  # the simulated model needs the GPU type's spec and the family's model
            from executors.data.calibration import default_catalog
            from scheduler_core.gpu_specs import get_spec
            from scheduler_core.workloads import ONLINE_FAMILIES

            try:
                get_spec(gpu_type)
            except KeyError as exc:
                raise ValueError(str(exc.args[0]) if exc.args else f"unknown GPU type {gpu_type!r}") from None
            if service_family not in ONLINE_FAMILIES:
                raise ValueError(f"service: no simulated model of the {service_family!r} family")
            default_catalog()  # fails early without its data
            self.service_mem_bytes = service_mem_bytes or float(ONLINE_FAMILIES[service_family].mem_bytes)
        self.mps_root: Path | None = None   # a short path: MPS's pipe directory holds a Unix socket (108 bytes)
        self.mps = Mps(self.work)
        if not self.gpu:
            self.method, self.method_note = "cpu", f"no GPU ({why}): both workloads on the CPU, one thread each"
        elif device == "cpu":
            self.method, self.method_note = "cpu", "device cpu: both workloads on the CPU, one thread each"
        elif mps == "off":
            self.method, self.method_note = "no-mps", "MPS turned off: the GPU time-slices; SM % not enforced"
        else:
            self.method, self.method_note = "mps", "private MPS control daemon (started with the run)"
        self.windows: list[dict] = []
        self.qps_selection: dict[str, Any] = {}
        self.caveats: list[str] = []
        self.phase: PhaseModel | None = None
        self.recorder: WindowRecorder | None = None
        self.metrics_note = ""
        self.metrics_device: str | None = None
        self.host: HostLoad | None = None
        self.service: HostProcess | None = None
        self.jobs: dict[int | None, HostProcess] = {}   # None: the job alone (100 %); else its SM %
        self.stream: StreamReader | None = None
        self.iters: dict[str, IterationReader] = {}
        self._index = 0
        self._end: float | None = None
        self.incomplete: str | None = None
        self.error: str | None = None
        self.order_used: str | None = None
        self.order: list[list[int]] = []
        self.sm_pcts: list[int] = []
        self.gpu_identity: dict | None = None
        self.model_iter_time_s: float | None = None
        self.utilization_source: str | None = None
        self.started_unix = time.time()
        self.t0 = time.monotonic()
        self.on_gpu = self.method != "cpu"
        self.auto_step_s = auto_step_s or (1.5 if self.on_gpu else 0.4)
        self.job_start_s = 6.0 if self.on_gpu else 1.0  # a job process's start to ready (refined when measured)
        self.per_sm = False
        self.job_processes: dict[str, dict] = {}

    # -- time ----------------------------------------------------------------------------------------
    def left_s(self) -> float:
        return math.inf if self._end is None else self._end - time.monotonic()

    def reserve_s(self) -> float:
        return 3.0 if self.on_gpu else 1.0

    def fits(self, cost_s: float) -> bool:
        return cost_s + self.reserve_s() <= self.left_s()

    def _sleep(self, s: float) -> None:
        end = time.monotonic() + s
        while True:
            if self.stop():
                raise Stopped()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.05))  # a measurement window: wall time to let pass, watching for a stop

    def iteration_s(self) -> float:
        it = [float(h.ready.get("iteration_s") or 0) for h in self.jobs.values() if h.ready]
        return max(it) if it else (0.2 if self.on_gpu else 0.05)

    def job_window_s(self, window_s: float) -> float:
        """A job's window holds at least five whole iterations."""
        return max(window_s, 5 * self.iteration_s())

    def cost(self, kind: str) -> float:
        it = self.iteration_s()
        if kind == "service_solo":
            return self.baseline_window_s + 0.3
        if kind == "job_solo":
            return self.job_window_s(self.baseline_window_s) + (WARMUP_ITERATIONS + 1) * it + 0.4
        if kind == "job_start":
            return self.job_start_s + 1.0
        return self.job_window_s(self.window_s) + (WARMUP_ITERATIONS + 1) * it + 0.3

    # -- processes -----------------------------------------------------------------------------------
    def _start_service(self) -> HostProcess:
        q = self.qps or 1.0
        cfg = ServiceConfig(family=self.service_family, size=self.size, qps=q, stream="", ready="", control="",
                            state="", device=self.device, max_batch=self.max_batch, seed=self.seed, paused=True,
                            max_s=self._life_s())
        h = HostProcess("service", self.work, service_target, cfg.as_dict(), self._env(None), self.python, qps=q)
        self.stream = StreamReader(h.files["stream"])
        return h

    def _life_s(self) -> float:
        return max(3600.0, 2 * (self.deadline_s or 0.0))

    def _env(self, sm_pct: int | None) -> dict[str, str]:
        env = {k: v for k, v in self.base_env.items() if k != "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}
        if sm_pct is not None and self.method == "mps":
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(sm_pct)
        return env

    def _start_job(self, sm_pct: int | None) -> HostProcess:
        name = "job-solo" if sm_pct is None else f"job-sm{sm_pct}"
        cfg = JobConfig(family=self.job_family, size=self.size, stream="", ready="", control="", state="",
                        device=self.device, seed=self.seed, max_s=self._life_s())
        h = HostProcess(name, self.work, job_target, cfg.as_dict(), self._env(sm_pct), self.python)
        self.iters[name] = IterationReader(h.files["stream"])
        return h

    def _wait_ready(self, hosts: list[HostProcess]) -> None:
        t0 = time.monotonic()
        end = t0 + min(self.startup_s, max(1.0, self.left_s() - 1.0))
        while not all(h.poll_ready() for h in hosts):
            if self.stop():
                raise Stopped()
            for h in hosts:
                why = h.failure()
                if why:
                    raise RuntimeError(why)
            if time.monotonic() > end:
                late = [h.name for h in hosts if not h.ready]
                raise RuntimeError(f"{', '.join(late)} not ready after {time.monotonic() - t0:.0f} s")
            time.sleep(0.02)  # polling the processes' ready files (they have no other way to tell)
        self.job_start_s = max(self.job_start_s * 0.5, time.monotonic() - t0)
        for h in hosts:
            if h.name.startswith("job"):
                self.job_processes[h.name] = {k: (h.ready or {}).get(k) for k in JOB_READY_FIELDS}

    def _job_host(self, sm_pct: int | None) -> HostProcess:
        return self.jobs[sm_pct] if self.per_sm else self.jobs[None]

    def _memory_cap(self) -> int | None:
        """How many more job processes the GPU holds beside what runs (None: no limit known)."""
        solo = self.jobs.get(None)
        need = (solo.ready or {}).get("memory_reserved_bytes") if solo else None
        if self.recorder is None or self.recorder.sampler.source != "measured" or not need:
            return None
        _t, data = self.recorder.ring.last(1)
        if len(data) == 0:
            return None
        col = self.recorder.ring.column
        free = float(data[-1][col("mem_total_bytes")] - data[-1][col("mem_used_bytes")])
        if not math.isfinite(free):
            return None
        per = float(need) + CONTEXT_BYTES
        return max(0, int((free - 2 * 2**30 - 0.1 * free) // per))

    # -- the service ---------------------------------------------------------------------------------
    def _served_past(self, end_unix: float) -> None:
        """Wait until every request that arrived by ``end_unix`` has been served (a later arrival was served)."""
        assert self.stream is not None
        deadline = time.monotonic() + 2.0 + 10.0 / (self.qps or 1.0)
        while True:
            self.stream.read()
            last = self.stream.last_arrival()
            if (last is not None and last > end_unix) or time.monotonic() > deadline:
                return
            time.sleep(0.005)  # polling the stream file for the service's next batch

    def _service_window(self, start: float, end: float) -> dict[str, Any]:
        assert self.stream is not None
        got = self.stream.window(start, end)
        dur = max(1e-9, end - start)
        stats = latency_stats(got["latencies"])
        stats.update(achieved_qps=len(got["latencies"]) / dur, served_qps=got["served"] / dur,
                     busy_frac=min(1.0, got["busy_s"] / dur), batches=got["batches"],
                     mean_batch=(got["batched"] / got["batches"]) if got["batches"] else None)
        return stats

    # -- windows -------------------------------------------------------------------------------------
    def _metrics(self, start: float, end: float) -> dict | None:
        if self.recorder is None:
            return {"error": self.metrics_note} if self.metrics_note else None
        try:
            return _finite(self.recorder.window(start, end, self.metrics_note, strict=True).as_dict())
        except MetricsUnavailable as exc:
            return {"error": str(exc)}

    def _record(self, kind: str, start: float | None, end: float | None, **fields: Any) -> dict[str, Any]:
        w: dict[str, Any] = {"index": self._index, "kind": kind, "start_unix": start, "end_unix": end,
                             "duration_s": (end - start) if start is not None and end is not None else None, **fields}
        self._index += 1
        if start is not None and end is not None:
            m = self._metrics(start, end)
            w["metrics"] = m
            ok = m is not None and "error" not in m
            w["sm_clock_mhz"] = m.get("sm_clock_mhz") if ok else None
            w["sm_clock_min_mhz"] = m.get("sm_clock_min_mhz") if ok else None
            w["host"] = self.host.window(start, end) if self.host is not None else None
        w = _finite(w)
        self.windows.append(w)
        if end is not None:
            if self.stream is not None:
                self.stream.drop_before(end - 1.0)
            for r in self.iters.values():
                r.drop_before(end - 1.0)
        return w

    def _utilization(self, metrics: dict | None, latency: dict) -> float | None:
        if not self.simulated_metrics and metrics and "error" not in metrics:
            u = metrics.get("gpu_util_pct")
            return None if u is None else u / 100.0
        return latency.get("busy_frac")

    def _set_phase(self, phase: str, sm_pct: int = 100) -> None:
        if self.phase is not None:
            self.phase.sm_pct = sm_pct
            self.phase.phase = phase

    def service_solo(self) -> dict[str, Any]:
        assert self.service is not None
        self.service.control(self.stop, paused=False, qps=self.qps)
        self._set_phase("service")
        self._sleep(0.2)  # arrivals under way
        start = time.time()
        self._sleep(self.baseline_window_s)
        end = time.time()
        self._served_past(end)
        lat = {**self._service_window(start, end), "job_type": self.service_job_type}
        w = self._record("service_solo", start, end, latency=lat)
        w["utilization"] = self._utilization(w.get("metrics"), lat)
        log.info("service alone: avg %s ms, p99 %s ms, %d requests, utilization %s", _r(lat["avg_ms"]),
                 _r(lat["p99_ms"]), lat["requests"], _r(w["utilization"]))
        return w

    def _run_job(self, host: HostProcess, window_s: float) -> tuple[dict | None, str | None]:
        """Release the job, skip its first iterations, measure ``window_s`` seconds, pause it: (iterations, error)."""
        reader = self.iters[host.name]
        reader.read()
        released = time.time()
        host.control(self.stop, paused=False)
        allowed = 10.0 + 20 * self.iteration_s()
        limit = time.monotonic() + allowed
        while True:  # the first iterations after a pause are left out
            reader.read()
            after = reader.started_after(released)
            if len(after) >= WARMUP_ITERATIONS:
                start = after[WARMUP_ITERATIONS - 1][1]
                break
            if self.stop():
                raise Stopped()
            why = host.failure()
            if why:
                raise RuntimeError(why)
            if time.monotonic() > limit:
                host.control(self.stop, paused=True)
                return None, f"{host.name}: no iteration within {allowed:.0f} s"
            time.sleep(0.002)  # polling the job's iteration stream
        self._sleep(max(0.0, start + window_s - time.time()))
        end = time.time()
        host.control(self.stop, paused=True)
        reader.read()
        d = sorted(reader.window(start, end))
        if not d:
            return None, f"{host.name}: no whole iteration within the {end - start:.2f} s window"
        return {"format": "muxflow-iteration-window/1", "iterations": len(d), "mean_s": sum(d) / len(d),
                "p50_s": percentile(d, 50), "p95_s": percentile(d, 95), "min_s": d[0], "max_s": d[-1],
                "warmup_iterations": WARMUP_ITERATIONS, "window_start_unix": start, "window_end_unix": end,
                "released_unix": released, "process": host.name}, None

    def job_solo(self, label: str) -> dict[str, Any]:
        assert self.service is not None
        self.service.control(self.stop, paused=True)
        self._set_phase("job")
        it, err = self._run_job(self._job_host(None), self.job_window_s(self.baseline_window_s))
        start, end = (it or {}).get("window_start_unix"), (it or {}).get("window_end_unix")
        w = self._record("job_solo", start, end, round=label, iterations=it, **({"error": err} if err else {}))
        self._set_phase("idle")
        log.info("job alone (%s): %s", label, err or f"mean {_r((it or {}).get('mean_s'), 5)} s")
        return w

    def colocated(self, sm_pct: int, rep: int) -> dict[str, Any]:
        assert self.service is not None
        self.service.control(self.stop, paused=False, qps=self.qps)
        self._set_phase("both", sm_pct)
        it, err = self._run_job(self._job_host(sm_pct), self.job_window_s(self.window_s))
        self._set_phase("service")
        start, end = (it or {}).get("window_start_unix"), (it or {}).get("window_end_unix")
        fields: dict[str, Any] = {"sm_pct": sm_pct, "rep": rep, "iterations": it}
        if start is not None and end is not None:
            self._served_past(end)
            fields["latency"] = self._service_window(start, end)
        if err:
            fields["error"] = err
        w = self._record("colocated", start, end, **fields)
        lat = w.get("latency") or {}
        log.info("SM %d %% (repetition %d): %s", sm_pct, rep + 1, err or
                 f"iteration {_r((it or {}).get('mean_s'), 5)} s, avg {_r(lat.get('avg_ms'))} ms")
        return w

    # -- QPS -----------------------------------------------------------------------------------------
    def _qps_step(self, q: float) -> dict[str, Any]:
        assert self.service is not None
        self.service.control(self.stop, paused=True)  # what queued at the last rate is served first
        self.service.control(self.stop, paused=False, qps=q)
        self._set_phase("service")
        self.qps = q
        self._sleep(min(1.0, max(0.15, 5.0 / q)))  # the queue settles at the new rate
        start = time.time()
        self._sleep(self.auto_step_s)
        end = time.time()
        self._served_past(end)
        lat = self._service_window(start, end)
        m = self._metrics(start, end)
        ok = m is not None and "error" not in m
        return {"qps": q, "start_unix": start, "end_unix": end, "latency": lat, "metrics": m,
                "utilization": self._utilization(m, lat), "sm_clock_mhz": m.get("sm_clock_mhz") if ok else None,
                "host": self.host.window(start, end) if self.host else None}

    def choose_qps(self) -> None:
        self.utilization_source = ("busy fraction of the service (simulated metrics)" if self.simulated_metrics
                                   else "GPU utilization (NVML)")
        if self.qps_mode == "fixed":
            self.qps_selection = {"mode": "fixed", "qps": self.qps, "utilization_source": self.utilization_source,
                                  "why": "given"}
            return
        lo, hi = self.auto_target
        times = ((self.service.ready if self.service else None) or {}).get("service_time_s") or {}
        t1 = float(times.get("1") or 0.01)
        t_max = float(times.get("max") or t1)
        choice = auto_qps(self._qps_step, t1=t1, t_max=t_max, max_batch=self.max_batch, target=(lo, hi),
                          max_steps=self.auto_max_steps, p99_factor=self.p99_factor,
                          can_step=lambda: self.fits(self.auto_step_s + 1.5 + self._minimal_sweep_s()))
        choice["utilization_source"] = self.utilization_source
        self.qps = choice["qps"]
        self.qps_selection = choice
        if not choice.get("in_target"):
            self.caveats.append(f"QPS calibration: {choice['why']}")

    def _minimal_sweep_s(self) -> float:
        return 2 * self.cost("job_solo") + 2 * self.cost("service_solo") + self.cost("colocated")

    # -- the run -------------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        svc = (self.service.ready if self.service else None) or {}
        return {
            "method": self.method, "method_note": self.method_note, "gpu_type": self.gpu_type,
            "service_family": self.service_family, "service_job_type": self.service_job_type, "qps": self.qps,
            "qps_mode": self.qps_mode, "qps_selection": self.qps_selection, "max_batch": self.max_batch,
            "job_family": self.job_family, "job_type": self.job_type, "size": self.size, "window_s": self.window_s,
            "baseline_window_s": self.baseline_window_s, "utilization_source": self.utilization_source,
            "started_unix": self.started_unix, "device": self.metrics_device, "gpu": self.gpu_identity,
            "service_device": svc.get("device"), "service_time_s": svc.get("service_time_s"),
            "metrics_note": self.metrics_note, "caveats": list(self.caveats),
            "model_iter_time_s": self.model_iter_time_s, "order": self.order_used, "rounds": self.order,
            "deadline_s": self.deadline_s,
            "job_processes": self.job_processes,
        }

    def report(self, final: bool) -> dict[str, Any]:
        rep = build_report(self.meta(), self.windows, sm_pcts=self.sm_pcts, repeat=self.repeat,
                           tolerance=self.tolerance)
        planned = len(self.sm_pcts) * self.repeat
        attempted = sum(1 for w in self.windows if w.get("kind") == "colocated")
        rep["repetitions_planned"] = planned
        why = self.error or self.incomplete
        if why is None and final and attempted < planned:
            why = f"{attempted} of {planned} co-located windows measured"
        rep["complete"] = bool(final and why is None)
        rep["why_incomplete"] = None if rep["complete"] else (why or "running")
        if self.error:
            rep["error"] = self.error
        rep["elapsed_s"] = time.monotonic() - self.t0
        if final:
            rep["ended_unix"] = time.time()
        return rep

    def _progress(self) -> None:
        rep = self.report(final=False)
        if self.write_report:
            write_json_atomic(self.dir / REPORT_FILE, rep)
        if self.on_progress is not None:
            self.on_progress(rep)

    def _start(self) -> None:
        from executors.node.gpu_type import gpu_identity

        self.gpu_identity = gpu_identity(0) if self.gpu else None
        private_work_dir(self.work)
        if self.method == "mps":
            self.mps_root = Path(tempfile.mkdtemp(prefix="muxflow-mps-"))
            self.mps = Mps(self.mps_root)
            err = self.mps.start()
            if err:
                self.method, self.method_note = "no-mps", f"no MPS ({err}): SM % not enforced"
        self.base_env = {**os.environ, **(self.mps.env if self.mps.started else {})}
        self.host = HostLoad().start()
        if self.simulated_metrics:
            self.phase = PhaseModel(self.service_family, self.job_type, self.gpu_type, self.service_mem_bytes or 0.0,
                                    self.seed, self._load)
            self.model_iter_time_s = simulated_offline_iter_time_s(self.job_type, self.gpu_type)
        try:
            opened = open_sampler(self.metrics, lambda: self.phase)
            ring = max(600.0, 4 * max(self.window_s, self.baseline_window_s) + 120.0)
            self.recorder = WindowRecorder(opened.sampler, opened.gpu_index, 0.05, max_s=ring).start()
            self.metrics_note, self.metrics_device = opened.note, opened.device
        except MetricsUnavailable as exc:
            self.recorder, self.metrics_note = None, str(exc)
        self.service = self._start_service()
        self.jobs[None] = self._start_job(None)
        self._wait_ready([self.service, self.jobs[None]])
        order = self.order_wish
        # under MPS the share binds at a process's CUDA context: one job process per SM %; else one serves all
        self.per_sm = self.method == "mps" if self.per_sm_wish is None else self.per_sm_wish
        if self.per_sm:
            cap = self._memory_cap()
            fits_all = cap is None or cap >= len(self.sm_pcts)
            if order == "auto":
                order = "interleaved" if fits_all else "sm-major"
            elif order == "interleaved" and not fits_all:
                raise RuntimeError(f"order interleaved: the GPU holds {cap} more job processes, "
                                   f"{len(self.sm_pcts)} needed")
            if order == "sm-major" and cap is not None and cap < 1:
                raise RuntimeError("the GPU has no room for a second job process beside the solo one")
            if order == "interleaved":
                for sm in self.sm_pcts:
                    self.jobs[sm] = self._start_job(sm)
                self._wait_ready([self.jobs[sm] for sm in self.sm_pcts])
        elif order == "auto":
            order = "interleaved"
        self.order_used = order
        self.order = plan_rounds(self.sm_pcts, self.repeat, order)

    def _load(self) -> float:
        from scheduler_core.gpu_specs import get_spec
        from scheduler_core.online.load import capacity_qps
        from scheduler_core.workloads import ONLINE_FAMILIES

        cap = capacity_qps(ONLINE_FAMILIES[self.service_family], get_spec(self.gpu_type))
        return (self.qps or 1.0) / cap

    def load(self) -> float:
        """The service's load (share of its family's capacity on this GPU type) for the simulated model."""
        return min(1.0, max(0.05, self._load()))

    def _stop_all(self) -> None:
        hosts = [h for h in [self.service, *self.jobs.values()] if h is not None]
        for h in dict.fromkeys(hosts):
            try:
                write_json(h.files["control"], h._wish(True))
            except OSError:
                pass
        for h in dict.fromkeys(hosts):
            h.stop()
        if self.recorder is not None:
            self.recorder.stop()
        if self.host is not None:
            self.host.stop()
        self.mps.stop()
        if self.mps_root is not None:
            shutil.rmtree(self.mps_root, ignore_errors=True)

    def run(self, sm_pcts: list[int]) -> dict[str, Any]:
        self.t0 = time.monotonic()
        self._end = None if self.deadline_s is None else self.t0 + self.deadline_s
        self.started_unix = time.time()
        self.sm_pcts = list(sm_pcts)
        try:
            self._start()
            self.choose_qps()
            self._progress()
            self._sweep()
        except Stopped:
            self.incomplete = "stopped by a signal"
        except RuntimeError as exc:
            self.error = str(exc)
        finally:
            self._stop_all()
        rep = self.report(final=True)
        if self.write_report:
            write_json_atomic(self.dir / REPORT_FILE, rep)
        if self.on_progress is not None:
            self.on_progress(rep)
        for c in rep["caveats"]:
            log.warning("%s", c)
        return rep

    def _sweep(self) -> None:
        """Interleaved: the job alone, the service alone, then rounds of (point, service alone) over every SM %,
        the job alone after each round. SM-major (the GPU holds one job process per SM % at a time): the same per
        SM %, its repetitions in a row, with its process started before and stopped after."""
        need = self._minimal_sweep_s()
        if not self.fits(need):
            self.incomplete = (f"deadline: one point with its baselines needs about {need:.0f} s, "
                               f"{self.left_s():.0f} s left")
            return
        self.job_solo("before")
        self.service_solo()
        self._progress()
        for r, block in enumerate(self.order):
            sm_major = self.order_used == "sm-major"
            if sm_major and self.per_sm:
                sm = block[0]
                if not self.fits(self.cost("job_start") + self.cost("colocated") + self.cost("service_solo")
                                 + self.cost("job_solo")):
                    self.incomplete = f"deadline: no time left to start the job at SM {sm} %"
                    return
                self.jobs[sm] = self._start_job(sm)
                self._wait_ready([self.jobs[sm]])
            measured = 0
            for i, sm in enumerate(block):
                rep = i if sm_major else r
                need = self.cost("colocated") + self.cost("service_solo") + self.cost("job_solo")
                if not self.fits(need):
                    self.incomplete = (f"deadline: stopped before SM {sm} % repetition {rep + 1} (it needs about "
                                       f"{need:.0f} s with its baselines, {self.left_s():.0f} s left)")
                    break
                self.colocated(sm, rep)
                self.service_solo()
                measured += 1
                self._progress()
            if sm_major and self.per_sm:
                self.jobs.pop(block[0]).stop()
            if measured:
                if self.fits(self.cost("job_solo")):
                    self.job_solo(f"after {'SM ' + str(block[0]) + ' %' if sm_major else 'round ' + str(r + 1)}")
                    self._progress()
                elif self.incomplete is None:
                    self.incomplete = "deadline: no time left for the job's baseline after the last points"
            if self.incomplete:
                return


def auto_qps(step: Callable[[float], dict], *, t1: float, t_max: float, max_batch: int,
             target: tuple[float, float] = DEFAULT_AUTO_TARGET, max_steps: int = 8, p99_factor: float = 5.0,
             can_step: Callable[[], bool] = lambda: True) -> dict[str, Any]:
    """Raise the offered load until the service's solo utilization is within ``target`` with its p99 bounded.

    ``step(qps)`` serves ``qps`` alone for a short window and returns its record (``utilization``, ``latency``
    with ``p99_ms``, ``achieved_qps`` and ``served_qps``). ``t1``/``t_max``: the service time of a batch of 1
    and of ``max_batch`` (the first guess: 30 % busy at batches of 1). Bounded: p99 at most
    max(``p99_factor`` × the p99 of the lightest step, 4 × a full batch's service time) and the service
    keeping up (served ≥ 90 % of what arrived). Returns the choice: ``qps``, ``in_target``, ``why``, the
    ``steps`` and the bound."""
    lo, hi = target
    mid = (lo + hi) / 2.0
    q = max(1.0, 0.3 / max(t1, 1e-4))
    steps: list[dict] = []
    below, above = None, None  # the highest rate under the target, the lowest over it (or unbounded)
    bound_ms = None
    chosen, why = None, None
    for _ in range(max_steps):
        if not can_step():
            why = "stopped early to leave time for the sweep"
            break
        s = step(q)
        lat = s.get("latency") or {}
        u, p99 = s.get("utilization"), lat.get("p99_ms")
        if bound_ms is None and p99 is not None:
            bound_ms = max(p99_factor * p99, 4000.0 * t_max)
        arrived, served = lat.get("achieved_qps") or 0.0, lat.get("served_qps") or 0.0
        kept_up = served >= 0.9 * arrived if arrived > 0 else False
        bounded = p99 is not None and bound_ms is not None and p99 <= bound_ms and kept_up
        s["bounded"] = bounded
        steps.append(s)
        if u is None:
            why = "no utilization reading"
            break
        if bounded and lo <= u <= hi:
            chosen, why = s, (f"{u:.2f} utilization at {q:.4g} QPS is within {lo:g}..{hi:g} with p99 "
                              f"{p99:.2f} ms <= {bound_ms:.2f} ms")
            break
        if bounded and u < lo:
            below = q if below is None else max(below, q)
        else:
            above = q if above is None else min(above, q)
        if below is not None and above is not None:
            if above / below < 1.05:
                why = f"the load that reaches {lo:g} is too close to the one that leaves p99 unbounded"
                break
            q = math.sqrt(below * above)
        elif above is None:
            q = q * min(4.0, max(1.25, mid / max(u, 1e-3)))
        else:
            q = q * (max(0.25, min(0.8, mid / u)) if bounded else 0.5)
    if chosen is None:
        ok = [s for s in steps if s.get("bounded") and s.get("utilization") is not None and s["utilization"] <= hi]
        if ok:
            chosen = max(ok, key=lambda s: s["utilization"])
            why = (f"target {lo:g}..{hi:g} not reached ({why or f'{len(steps)} steps'}): the highest utilization "
                   f"with p99 bounded, {chosen['utilization']:.2f} at {chosen['qps']:.4g} QPS")
        elif steps:
            chosen = min(steps, key=lambda s: s["qps"])
            why = (f"target {lo:g}..{hi:g} not reached ({why or f'{len(steps)} steps'}) and no step had p99 "
                   f"bounded: the lightest, {chosen['qps']:.4g} QPS")
        else:
            return {"mode": "auto", "qps": q, "in_target": False, "target": [lo, hi], "steps": [],
                    "p99_bound_ms": None, "why": f"no calibration step ran ({why}); the first guess, {q:.4g} QPS"}
    return {"mode": "auto", "qps": chosen["qps"], "utilization": chosen.get("utilization"),
            "in_target": chosen.get("utilization") is not None and lo <= chosen["utilization"] <= hi
            and bool(chosen.get("bounded")),
            "target": [lo, hi], "p99_bound_ms": bound_ms, "why": why, "steps": _finite(steps)}


def _r(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def parse_qps(text: str) -> float | str:
    if text.strip().lower() == "auto":
        return "auto"
    try:
        q = float(text)
    except ValueError:
        raise ValueError(f"qps: a positive number or auto, got {text!r}") from None
    if not (math.isfinite(q) and q > 0):
        raise ValueError(f"qps: must be a positive number, got {text!r}")
    return q


def parse_fraction_range(text: str, name: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{name}: two fractions LOW,HIGH, got {text!r}") from None
    if not 0 < lo < hi <= 1:
        raise ValueError(f"{name}: 0 < LOW < HIGH <= 1, got {text!r}")
    return lo, hi


def parse_sm(text: str) -> list[int]:
    try:
        sms = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"sm: comma-separated percentages within 1..100, got {text!r}") from None
    if not sms or any(not 1 <= x <= 100 for x in sms) or len(set(sms)) != len(sms):
        raise ValueError(f"sm: percentages within 1..100, got {text!r}")
    return sms


class _ArgParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and status 2, as every other bad input
        self.exit(2, f"error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    ap = _ArgParser(prog="python -m executors.node.profiling.colocate", description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--gpu-type", required=True, help="a known GPU type, or auto (the type of this node's GPU)")
    ap.add_argument("--service", required=True, help="online reference family: cnn | transformer | recommender")
    ap.add_argument("--qps", required=True, help="the service's offered load, or auto (a solo calibration)")
    ap.add_argument("--job", required=True, help="offline reference family")
    ap.add_argument("--size", default="gpu")
    ap.add_argument("--sm", default="10,30,50,70,90", help="comma-separated SM percentages")
    ap.add_argument("--window", type=float, default=30.0, help="seconds of each co-located measurement")
    ap.add_argument("--baseline-window", type=float, default=None,
                    help="seconds of each solo baseline (default: --window)")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions of every SM %% (interleaved rounds)")
    ap.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH,
                    help="dynamic batching: the most queued requests the service serves at once")
    ap.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                    help="baselines before and after a point differing by more: the point is unstable")
    ap.add_argument("--auto-target", default=",".join(str(x) for x in DEFAULT_AUTO_TARGET),
                    help="--qps auto: the solo utilization range to reach, LOW,HIGH")
    ap.add_argument("--deadline", type=float, default=None, help="seconds the whole run may take")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--metrics", choices=("auto", "nvml", "simulated"), default="auto")
    ap.add_argument("--mps", choices=("auto", "off"), default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--startup", type=float, default=180.0, help="seconds allowed for a process to start")
    ap.add_argument("--service-mem", type=float, default=None, help="the service's memory (bytes), simulated model")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        from executors.node.gpu_type import resolve_gpu_type

        gpu_type = resolve_gpu_type(a.gpu_type)
        sms = parse_sm(a.sm)
        qps = parse_qps(a.qps)
        target = parse_fraction_range(a.auto_target, "auto-target")
        if a.deadline is not None and not a.deadline > 0:
            raise ValueError("deadline: must be a positive number of seconds")
        stop: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _f: stop.append(signum))
        h = Harness(Path(a.run_dir), gpu_type=gpu_type, service_family=a.service, qps=qps, job_family=a.job,
                    size=a.size, window_s=a.window, baseline_window_s=a.baseline_window, repeat=a.repeat,
                    max_batch=a.max_batch, tolerance=a.tolerance, auto_target=target, deadline_s=a.deadline,
                    device=a.device, metrics=a.metrics, mps=a.mps, seed=a.seed, startup_s=a.startup,
                    service_mem_bytes=a.service_mem, stop=lambda: bool(stop))
    except (ValueError, KeyError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"error: {' '.join(str(msg).split())}", file=sys.stderr)
        return 2
    Path(a.run_dir).mkdir(parents=True, exist_ok=True)
    rep = h.run(sms)
    ok = [p for p in rep["points"] if not p.get("error")]
    print(f"colocation ({rep['method']}): {len(ok)}/{len(sms)} points, {rep['repetitions_measured']} windows"
          + (f"; error: {rep['error']}" if rep.get("error") else "")
          + (f"; incomplete: {rep['why_incomplete']}" if not rep["complete"] and not rep.get("error") else ""),
          flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
