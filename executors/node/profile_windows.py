"""Profiling windows measured by the node agent: a job profiled in its own Slurm job (executors.scheduler.profiling.windows).

A job in its profiling window runs alone on one GPU of this node, as its owner. The agent, root on the node, is
what measures it, so that nothing the job writes needs to reach MuxFlow's host and no MuxFlow code runs inside
the job:

- the windows are the node's running Slurm jobs whose comment carries a verified plan of kind ``profile``
  (:mod:`executors.slurm.plan`; a plan that does not verify is no window);
- for each, the GPU is sampled on a thread of its own (:class:`executors.node.profiling.metrics.WindowRecorder`:
  NVML on a GPU node, the simulated model of the job's type on a node without a GPU, as solo profiling always
  did);
- the job's iteration report (``<job dir>/<Slurm job id>/iteration.json``, written by the job through
  :class:`executors.job.runtime.Runtime`) is read **as user input**: only a regular file, not a link, owned by the
  job's user, in the job's directory the Prolog made (a directory of the job's user inside a root-owned one),
  at most 256 KiB, of the report format, its numbers finite and non-negative; anything else is refused with
  the reason, which the profiler reports;
- every ``report_s`` the window's report (iterations, the GPU metrics over the measured iterations, where it
  runs) goes into the profiling run's row, only while that run is open and belongs to that Slurm job; once more
  (``final``) when the window has ended;
- the CPU time the job's processes use over the window (``job_cpu_s``): on a node without a GPU, the simulated
  GPU's busy model applies to a job that does work, and a job whose processes stay idle (``sleep``) kept its
  simulated GPU idle too;
- whether the job **checkpoints on MuxFlow's signals** is read from the kernel: the signals its processes (those
  under its slurmstepd, :func:`executors.node.xcuda_check.job_of_processes`) catch (``SigCgt`` in
  ``/proc/<pid>/status``); a job seen catching SIGUSR1 or SIGTERM during its window is one that checkpoints
  (``checkpoint_signals`` in the report) unless its batch shell would die of them first (``shell_dies_first``),
  which the planner needs: a job that does not checkpoint would lose its progress if moved, so it is never moved.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import pwd
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executors.job.runtime.profiling import REPORT_FORMAT
from executors.node.job_files import JobFileRefused, job_directory, read_job_file
from executors.node.placements import list_slurm_jobs
from executors.node.profiling.metrics import (
    MetricsUnavailable,
    WindowRecorder,
    open_sampler,
    simulated_job_model,
    simulated_offline_iter_time_s,
    simulated_offline_model,
)
from executors.node.xcuda_check import Proc, read_procs, user_pids_of_jobs
from executors.slurm import plan as plans
from executors.slurm.models import RUNNING
from executors.store import models as m
from executors.store.profiling import record_window_report

log = logging.getLogger(__name__)

FORMAT = "muxflow-window-report/1"
REPORT_NAME = "iteration.json"
MAX_REPORT_BYTES = 256 * 1024
# The iteration report's fields the agent keeps: every one a finite number >= 0 (or null), but these.
_TEXT_FIELDS = {"format": 64, "stopped_by": 16, "host": 128, "signal": 32}
PROGRESS_SIGNALS = ("runtime", "optimizer-step")  # what counted the iterations: MuxFlow's runtime, or its hook
_BOOL_FIELDS = ("final", "observed")
_NUMBER_FIELDS = ("iterations", "warmup_iterations", "total_iterations", "mean_s", "p50_s", "p95_s", "min_s", "max_s",
                  "first_iteration_s", "elapsed_s", "window_start_unix", "window_end_unix", "started_unix",
                  "last_step", "max_iterations", "max_seconds", "pid")
_INT_FIELDS = ("iterations", "warmup_iterations", "total_iterations", "last_step", "pid")
SIGUSR1, SIGTERM = 10, 15  # Linux numbers
CHECKPOINT_SIGNALS = {SIGUSR1: "SIGUSR1", SIGTERM: "SIGTERM"}  # what MuxFlow sends before a move


def signal_masks(pid: int, proc_root: Path) -> tuple[set[int], set[int]]:
    """The signals a process catches (``SigCgt`` of ``/proc/<pid>/status``) and ignores (``SigIgn``); empty
    when unreadable."""
    masks = {"SigCgt:": set(), "SigIgn:": set()}
    try:
        for line in (proc_root / str(pid) / "status").read_text().splitlines():
            key = line.split(":", 1)[0] + ":"
            if key in masks:
                bits = int(line.split()[1], 16)
                masks[key] = {n for n in range(1, 65) if bits >> (n - 1) & 1}
    except (OSError, ValueError, IndexError):
        pass
    return masks["SigCgt:"], masks["SigIgn:"]


def job_user_pids(slurm_job_id: int, procs: dict[int, Proc], proc_root: Path) -> set[int]:
    """The processes of the job that run as its user (slurmstepd and anything else of root's left out)."""
    return user_pids_of_jobs(procs, {slurm_job_id}, proc_root).get(slurm_job_id, set())


def job_checkpoint_signals(slurm_job_id: int, procs: dict[int, Proc], proc_root: Path,
                           pids: set[int] | None = None) -> tuple[set[str], bool]:
    """The checkpoint signals (SIGUSR1, SIGTERM) some process of the job catches now, and whether its batch shell
    would die of them first: Slurm signals every process of the job, the batch shell included, and when the
    batch shell ends Slurm (``proctrack/cgroup``) kills what is left of the job, so a shell that neither catches
    nor ignores both takes the program down before its checkpoint is written (``trap '' USR1 TERM`` in the
    script, or ``exec`` of the program, avoids that). ``pids``: the job's user processes, when already known."""
    pids = job_user_pids(slurm_job_id, procs, proc_root) if pids is None else pids
    caught: set[str] = set()
    shell_dies = False
    for pid in pids:
        cgt, ign = signal_masks(pid, proc_root)
        caught |= {CHECKPOINT_SIGNALS[n] for n in cgt if n in CHECKPOINT_SIGNALS}
        if procs[pid].ppid not in pids and not set(CHECKPOINT_SIGNALS) <= cgt | ign:  # a top process: the shell
            shell_dies = True
    return caught, shell_dies


def job_cpu_delta(seen: dict[int, float], procs: dict[int, Proc]) -> float:
    """CPU seconds the job's processes used since ``seen`` (updated in place): a process first seen counts all of its
    time (the window is the job's whole run so far), one that went away between two reads loses what it used after
    the last read (a sampling interval's worth at most)."""
    used = 0.0
    for pid, p in procs.items():
        used += max(0.0, p.cpu_s - seen.get(pid, 0.0))
        seen[pid] = p.cpu_s
    return used


@dataclass(frozen=True)
class WindowJob:
    """A job in its profiling window on this node."""

    slurm_job_id: int
    run_id: int
    job_id: int
    gpu_index: int
    uid: int | None            # the job's user (None: unknown to this node: its report is not read)
    started_epoch_s: float | None = None


class ReportRefused(ValueError):
    """The job's iteration report is not one the agent takes; the message says why."""


def read_iteration_report(job_dir: Path, slurm_job_id: int, uid: int | None) -> dict[str, Any] | None:
    """The job's iteration report, checked as user input; None when there is none yet; :class:`ReportRefused`."""
    try:
        with job_directory(job_dir, slurm_job_id, uid) as d:
            data = None if d is None else read_job_file(d, REPORT_NAME, uid, MAX_REPORT_BYTES)
    except JobFileRefused as exc:
        raise ReportRefused(str(exc)) from None
    return None if data is None else parse_iteration_report(data)


def parse_iteration_report(data: bytes) -> dict[str, Any]:
    """The fields of an iteration report the profile uses, validated; :class:`ReportRefused` for anything else."""
    if len(data) > MAX_REPORT_BYTES:
        raise ReportRefused(f"{REPORT_NAME} is over {MAX_REPORT_BYTES} bytes")
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ReportRefused(f"{REPORT_NAME} is not JSON") from None
    if not isinstance(raw, dict) or raw.get("format") != REPORT_FORMAT:
        raise ReportRefused(f"{REPORT_NAME} is not a {REPORT_FORMAT} report")
    out: dict[str, Any] = {}
    for k, limit in _TEXT_FIELDS.items():
        v = raw.get(k)
        if v is not None:
            if not isinstance(v, str):
                raise ReportRefused(f"{REPORT_NAME}: {k} is not text")
            out[k] = v[:limit]
    if out.get("signal") not in (None, *PROGRESS_SIGNALS):
        raise ReportRefused(f"{REPORT_NAME}: signal is not one of {', '.join(PROGRESS_SIGNALS)}")
    for k in _BOOL_FIELDS:
        v = raw.get(k)
        if v is not None and not isinstance(v, bool):
            raise ReportRefused(f"{REPORT_NAME}: {k} is not true or false")
        out[k] = bool(v)
    for k in _NUMBER_FIELDS:
        v = raw.get(k)
        if v is None:
            out[k] = None
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0 or v > 1e15:
            raise ReportRefused(f"{REPORT_NAME}: {k}={str(v)[:32]} is not a finite number >= 0")
        if k in _INT_FIELDS and v != int(v):
            raise ReportRefused(f"{REPORT_NAME}: {k} is not a whole number")
        out[k] = int(v) if k in _INT_FIELDS else float(v)
    ws, we = out.get("window_start_unix"), out.get("window_end_unix")
    if ws is not None and we is not None and we < ws:
        raise ReportRefused(f"{REPORT_NAME}: its window ends before it starts")
    return out


@dataclass
class _Active:
    job: WindowJob
    recorder: Any                      # executors.node.profiling.metrics.WindowRecorder
    base: dict[str, Any]               # what does not change: where, what, the metrics' source
    started_unix: float
    last_write: float = -math.inf
    iteration_report: dict[str, Any] | None = None
    report_error: str | None = None
    checkpoint_signals: set[str] = field(default_factory=set)
    shell_dies_first: bool = False
    cpu_seen: dict[int, float] = field(default_factory=dict)  # pid → CPU seconds it had when last read
    cpu_s: float = 0.0                 # CPU time the job's processes used in the window (as far as seen)


@dataclass
class ProfileWindows:
    """Follows the node's profiling windows and writes their reports into their profiling runs' rows."""

    store: Any
    node: str
    read_windows: Callable[[], list[WindowJob]]
    job_dir: Path
    gpu_types: dict[int, str]           # GPU index -> type on this node
    simulated: bool
    interval_s: float = 0.05
    report_s: float = 1.0
    seed: int = 0
    wall: Callable[[], float] = time.time
    proc_root: Path = Path("/proc")
    _active: dict[int, _Active] = field(default_factory=dict)

    def once(self) -> None:
        now = self.wall()
        current = {w.slurm_job_id: w for w in self.read_windows()}
        for sid in sorted(set(self._active) - set(current)):
            self._end(self._active.pop(sid), now)
        for sid, w in current.items():
            a = self._active.get(sid)
            if a is not None and (a.job.run_id, a.job.gpu_index) != (w.run_id, w.gpu_index):
                self._end(self._active.pop(sid), now)  # another window of the job (requeued and reopened)
                a = None
            if a is None:
                a = self._start(w, now)
                if a is None:
                    continue
                self._active[sid] = a
            if now - a.last_write >= self.report_s:
                self._write(a, now, final=False)

    def close(self) -> None:
        now = self.wall()
        for sid in list(self._active):
            self._end(self._active.pop(sid), now)

    # -- one window ------------------------------------------------------------------------------
    def _start(self, w: WindowJob, now: float) -> _Active | None:
        with self.store.session() as s:
            run = s.get(m.ProfilingRun, w.run_id)
            job = s.get(m.OfflineJob, w.job_id)
            if run is None or job is None or run.job_id != job.id or job.slurm_job_id != w.slurm_job_id:
                log.warning("Slurm job %d on %s GPU %d: its window names run %d of job %d, which this store does not "
                            "know as that job's: not measured", w.slurm_job_id, self.node, w.gpu_index, w.run_id,
                            w.job_id)
                return None
            job_type, mem = job.job_type, (float(job.mem_bytes) if job.mem_bytes else None)
            gpu_type = run.gpu_type
        base: dict[str, Any] = {"format": FORMAT, "host": self.node, "gpu_index": w.gpu_index,
                                "slurm_job_id": w.slurm_job_id, "job_type": job_type, "gpu_type": gpu_type}
        seed = self.seed * 1_000_003 + w.job_id
        recorder = None
        try:
            kind = "simulated" if self.simulated else "nvml"
            opened = open_sampler(kind, lambda: simulated_offline_model(job_type, gpu_type, seed, mem),
                                  env={"CUDA_VISIBLE_DEVICES": str(w.gpu_index)})
            recorder = WindowRecorder(opened.sampler, opened.gpu_index, self.interval_s, wall=self.wall).start()
            base.update(metrics_note=opened.note, device=opened.device)
            if opened.sampler.source == "simulated":
                model = simulated_job_model(job_type, mem)
                base.update(metrics_model=model.note, metrics_generic=model.generic,
                            model_iter_time_s=simulated_offline_iter_time_s(job_type, gpu_type, mem))
        except (MetricsUnavailable, KeyError, ValueError) as exc:
            base["metrics_error"] = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
        log.info("profiling window of Slurm job %d (run %d) on GPU %d: measuring", w.slurm_job_id, w.run_id,
                 w.gpu_index)
        return _Active(w, recorder, base, w.started_epoch_s or now)

    def _report(self, a: _Active, now: float, final: bool) -> dict[str, Any]:
        try:
            it = read_iteration_report(self.job_dir, a.job.slurm_job_id, a.job.uid)
            if it is not None:
                a.iteration_report, a.report_error = it, None
        except ReportRefused as exc:
            if str(exc) != a.report_error:
                log.warning("Slurm job %d: iteration report refused: %s", a.job.slurm_job_id, exc)
            a.report_error = str(exc)
        if not final:  # the union over the window: a handler installed late still counts
            try:
                procs = read_procs(self.proc_root)
                pids = job_user_pids(a.job.slurm_job_id, procs, self.proc_root)  # once for both readings below
                caught, shell_dies = job_checkpoint_signals(a.job.slurm_job_id, procs, self.proc_root, pids)
                a.checkpoint_signals |= caught
                a.shell_dies_first = a.shell_dies_first or (shell_dies and bool(caught))
                a.cpu_s += job_cpu_delta(a.cpu_seen, {p: procs[p] for p in pids})
            except OSError as exc:
                log.debug("cannot read the processes of Slurm job %d: %s", a.job.slurm_job_id, exc)
        rep = {**a.base, "started_unix": a.started_unix, "updated_unix": now,
               "elapsed_s": max(0.0, now - a.started_unix),
               "final": final, "iteration_report": a.iteration_report, "report_error": a.report_error,
               "checkpoint_signals": sorted(a.checkpoint_signals), "shell_dies_first": a.shell_dies_first,
               "job_cpu_s": round(a.cpu_s, 3)}
        if a.recorder is not None:
            it = a.iteration_report or {}
            try:
                w = a.recorder.window(it.get("window_start_unix"), it.get("window_end_unix"),
                                      a.base.get("metrics_note", ""))
                rep["metrics"], rep["metrics_source"] = w.as_dict(), w.source
            except MetricsUnavailable as exc:
                rep["metrics_error"] = str(exc)
        return rep

    def _write(self, a: _Active, now: float, final: bool) -> None:
        rep = self._report(a, now, final)
        started = dt.datetime.fromtimestamp(a.started_unix, dt.UTC)
        try:
            with self.store.session() as s:
                if not record_window_report(s, a.job.run_id, a.job.slurm_job_id, self.node, a.job.gpu_index, started,
                                            rep):
                    log.info("run %d is no longer open: its window's report is not written", a.job.run_id)
        except Exception as exc:  # the store briefly away: the next report carries everything
            log.warning("cannot write the report of run %d: %s", a.job.run_id, exc)
            return
        a.last_write = now

    def _end(self, a: _Active, now: float) -> None:
        self._write(a, now, final=True)
        if a.recorder is not None:
            a.recorder.stop()
        log.info("profiling window of Slurm job %d (run %d) ended", a.job.slurm_job_id, a.job.run_id)


def slurm_windows(client_factory: Callable[[], object], node: str, key: bytes,
                  users: Callable[[str], int | None] | None = None) -> Callable[[], list[WindowJob]]:
    """The jobs Slurm runs on ``node`` in a verified profiling window."""
    def uid_of(name: str) -> int | None:
        try:
            return pwd.getpwnam(name).pw_uid
        except KeyError:
            return None

    lookup = users or uid_of

    def read() -> list[WindowJob]:
        out = []
        for j in list_slurm_jobs(client_factory):
            if j.state != RUNNING or node not in j.nodes:
                continue
            p = plans.try_decode(j.comment, key, j.job_id)
            if p is None or p.kind != "profile" or p.run_id is None:
                continue
            started = j.start_time_utc.timestamp() if j.start_time_utc is not None else None
            out.append(WindowJob(j.job_id, p.run_id, p.job_id, p.gpu_index, lookup(j.user_name), started))
        return out

    return read


class ProfileWindowsThread:
    """A :class:`ProfileWindows` every ``interval_s`` on a thread of its own."""

    def __init__(self, windows: ProfileWindows, interval_s: float = 1.0):
        self.windows = windows
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="profile-windows", daemon=True)

    def start(self) -> ProfileWindowsThread:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.windows.once()
            except Exception:  # Slurm or the store briefly away: the next pass sees the windows again
                log.exception("profile windows: pass failed; trying again")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.windows.close()
