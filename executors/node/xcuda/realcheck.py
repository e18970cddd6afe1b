"""xCUDA on the real CUDA driver: the ``xcuda`` part of ``make gpu-check``.

    python -m executors.node.xcuda.realcheck --out DIR --deadline S [--simulate]

Writes ``DIR/xcuda.json`` (``muxflow.gpu-check.part/1``), rewritten after each finished check, so a run stopped at
any moment leaves what it measured. Every workload is a fresh child process with ``LD_PRELOAD=libxcuda.so`` (from
``executors/node/xcuda/build``, built with ``make`` when a compiler is there), time-boxed. The checks, each a key of
``results``, in the order they run:

- ``fallback``, ``quota``, ``graphs`` and ``exit``, side by side (none measures the GPU's speed):
  ``fallback`` — no GPU record: the launches/s of a tight ``x.add_(1)`` loop, against
  ``XCUDA_FALLBACK_LAUNCH_RATE`` (2,000/s by default);
  ``quota`` — a 2 GiB quota with PyTorch's three allocators (``cuMemAlloc_v2``; ``cuMemCreate`` with
  ``expandable_segments:True``; ``cuMemAllocAsync`` with ``backend:cudaMallocAsync``, and
  ``cuMemAllocFromPoolAsync`` called on the driver): 1 GiB is granted, 1.5 GiB more refused (out of memory),
  1.8 GiB granted once the first is freed; ``torch.cuda.mem_get_info`` reports the quota as the total;
  ``graphs`` — a captured CUDA graph replays to the eager result, one gate token per replay;
  ``exit`` — SIGTERM in the middle of the work: a training job on muxflow's runtime (its handler finishes the
  step, saves a checkpoint, exits 0) checkpoints with its contexts kept; a loop with no handler dies of the
  signal, its contexts released first;
- ``overhead`` — a training loop (torchvision's ResNet-18 at batch 64, else the project's reference CNN) without
  xCUDA: its speed and its own load, the baseline of tracking; then the same job under xCUDA with a record
  whose target is above its load (the gate stays open): its speed against the first run's;
- ``tracking`` — the same job under xCUDA at targets 0.3, 0.5 and 0.7: the record is written by the node agent's
  own loop (:class:`executors.node.agent.GpuLoop` fed by :class:`executors.node.sampler.NvmlSampler`, ticking
  every ``AgentConfig.interval_s``); the time series of the record, the job's xCUDA counters and steps, and
  xCUDA's controller trace (replayable through :mod:`executors.node.xcuda.trace`) are stored with the
  steady-state load after ``--settle`` seconds, its error and the job's speed against its unthrottled speed. A
  target the job's own load stays under (it cannot reach it) is passed when xCUDA leaves the job's speed alone.

Each is started only when the deadline leaves it room (tracking shortens its runs to fit, down to the settling
time plus a few seconds); what did not fit is listed in ``why_incomplete``.

``--simulate`` is the CPU half: no GPU and no torch. The same checks run against xCUDA's fake driver with the C
test harness (``build/xcuda_harness``) as the workload where that means something: the fallback rate, the quota
with ``cuMemAlloc_v2``/``cuMemCreate``/``cuMemAllocAsync``/``cuMemAllocFromPoolAsync``, the gate staying open under
a low-load record, and tracking through the same agent loop with a simulated GPU (:class:`ToyGpu`: each launch
keeps it busy a fixed time). CUDA graphs need a GPU. Its numbers are labelled ``"method": "simulated"``.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

from executors.job.runtime.timing import write_json_atomic
from executors.node.gpu_check_part import now_iso, part_document
from executors.node.xcuda.build import XCUDA_DIR, Artifacts, BuildError, build, missing_tools
from executors.node.xcuda.realcheck_loop import (
    AgentLoop,
    Child,
    Recorder,
    ToyGpu,
    downsample,
    kill_all_children,
    read_stats,
    controller_trace,
    mirror_check,
    series,
    steady_state,
)

log = logging.getLogger(__name__)

PART = "xcuda"
REPO_ROOT = Path(__file__).resolve().parents[3]
GIB = 2**30
QUOTA_BYTES = 2 * GIB
FALLBACK_RATE = 2000.0            # xCUDA's XCUDA_FALLBACK_LAUNCH_RATE default (README "Configuration")
CHECKS = ("fallback", "quota", "graphs", "exit", "overhead", "tracking")   # keys of "results", in the order they run
ALLOC_HOOKS = ("cuMemAlloc_v2", "cuMemCreate", "cuMemAllocAsync", "cuMemAllocAsync_ptsz", "cuMemAllocFromPoolAsync",
               "cuMemAllocFromPoolAsync_ptsz", "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuMemRelease",
               "cuMemGetInfo_v2", "cuGraphLaunch")
# PyTorch's allocators: name -> (PYTORCH_CUDA_ALLOC_CONF, the driver entry point it allocates with)
TORCH_ALLOCATORS = {"native": (None, "cuMemAlloc_v2"),
                    "expandable_segments": ("expandable_segments:True", "cuMemCreate"),
                    "cudaMallocAsync": ("backend:cudaMallocAsync", "cuMemAllocAsync")}
# The fake driver's harness: allocation kind -> the entry point it calls
HARNESS_ALLOCATORS = {"cuMemAlloc_v2": "v2", "cuMemCreate": "create", "cuMemAllocAsync": "async",
                      "cuMemAllocFromPoolAsync": "pool"}


class _Terminated(BaseException):
    """SIGTERM/SIGINT: stop, keep what was measured (a BaseException, as KeyboardInterrupt: no ``except Exception``
    on the way, the logging module's included, swallows it)."""


@dataclass(frozen=True)
class Plan:
    """Durations (s) and settings of one run; ``--simulate`` has its own, shorter."""

    fallback_s: float
    overhead_warmup_s: float
    overhead_measure_s: float
    tracking_s: float
    settle_s: float
    min_steady_s: float             # tracking shorter than settle + this is not started
    startup_s: float                # a workload's start-up (import, CUDA context, model) until measured
    targets: tuple[float, ...] = (0.3, 0.5, 0.7)
    overhead_target: float = 1.0    # U_GPU never exceeds 1 with a_C = 1: the gate stays open
    tolerance: float = 0.05
    max_points: int = 2000          # per stored series (agent ticks); more are averaged in groups
    batch: int = 64
    graph_replays: int = 200
    clock_threshold: str = "none"   # T_SM in the record: "none" (0: a_C = 1, U_GPU = U_SM) or "agent" (0.85 x max)
    toy_kernel_s: float = 200e-6    # --simulate: GPU time of one launch
    slack_s: float = 3.0            # per workload, on top of start-up and run time: ending, reading, writing

    def overhead_cost(self) -> float:
        return 2 * (self.startup_s + self.overhead_warmup_s + self.overhead_measure_s + self.slack_s)

    def tracking_cost(self, seconds: float) -> float:
        return self.startup_s + seconds + self.slack_s


GPU_PLAN = Plan(fallback_s=3.0, overhead_warmup_s=3.0, overhead_measure_s=5.0, tracking_s=15.0, settle_s=3.0,
                min_steady_s=5.0, startup_s=10.0)
SIM_PLAN = Plan(fallback_s=1.0, overhead_warmup_s=0.0, overhead_measure_s=0.5, tracking_s=3.0, settle_s=1.5,
                min_steady_s=0.8, startup_s=0.3, max_points=500, slack_s=0.5)


def hooked(names: tuple[str, ...] = ALLOC_HOOKS) -> dict[str, bool]:
    """Which of ``names`` xCUDA interposes (``src/hooks.def``, the list every table is generated from)."""
    text = (XCUDA_DIR / "src" / "hooks.def").read_text()
    found = set(re.findall(r"^XCUDA_(?:HOOK|LAUNCH)\((\w+),", text, flags=re.M))
    return {n: n in found for n in names}


# -- the part file ------------------------------------------------------------------------------

class Part:
    """``DIR/xcuda.json``: created at the start, rewritten (atomically) after each finished check. Checks that run
    side by side store their results from their own threads: every change and write holds one lock."""

    def __init__(self, out_dir: Path, deadline_s: float, simulate: bool):
        self.path = out_dir / f"{PART}.json"
        self.t0 = time.monotonic()
        self.deadline_at = self.t0 + deadline_s
        self.skipped: list[str] = []
        self._lock = threading.RLock()
        self.doc: dict[str, Any] = part_document(PART, "simulated" if simulate else "real-driver",
                                                  results={"deadline_s": deadline_s})

    @property
    def method(self) -> str:
        return self.doc["method"]

    def remaining(self) -> float:
        return self.deadline_at - time.monotonic()

    def write(self) -> None:
        with self._lock:
            self.doc["results"]["elapsed_s"] = round(time.monotonic() - self.t0, 2)
            write_json_atomic(self.path, self.doc)

    def put(self, name: str, result: dict[str, Any]) -> None:
        """Stores a check's result (``results[name]``) and rewrites the file."""
        with self._lock:
            self.doc["results"][name] = {"method": self.method, **result}
            self.write()

    def get(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self.doc["results"].get(name)

    def set(self, key: str, value: Any) -> None:
        with self._lock:
            self.doc["results"][key] = value

    def error(self, message: str) -> None:
        with self._lock:
            self.doc["errors"].append(message)

    def skip(self, what: str) -> None:
        with self._lock:
            self.skipped.append(what)

    def finish(self, why_incomplete: str | None) -> None:
        with self._lock:
            self.doc["ended"] = now_iso()
            self.doc["complete"] = why_incomplete is None
            self.doc["why_incomplete"] = why_incomplete
            self.write()


# -- the run's context --------------------------------------------------------------------------

@dataclass
class Ctx:
    part: Part
    plan: Plan
    simulate: bool
    artifacts: Artifacts
    work: Path                      # DIR/.xcuda-work: stats directories
    record_dir: Path                # a private directory under /dev/shm for the records
    startups: list[float] = field(default_factory=list)
    unthrottled: dict[str, Any] | None = None

    def scratch(self, name: str) -> Path:
        d = self.work / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def startup_s(self) -> float:
        """The planned start-up of a workload: the plan's guess until one was measured, then the slowest + 1 s."""
        return self.plan.startup_s if not self.startups else max(self.startups) + 1.0

    def note_startup(self, child: Child) -> float | None:
        ready = child.event("ready")
        if ready is None:
            return None
        s = float(ready["t"]) - child.spawned
        self.startups.append(s)
        return round(s, 3)

    def env(self, *, preload: bool, record: Path | None = None, stats_dir: Path | None = None,
            log_level: str = "info", extra: dict[str, str] | None = None) -> dict[str, str]:
        """A workload's environment: no XCUDA_* or allocator setting of the caller's; the record at ``record`` (a
        path that does not exist when None: fallback pacing), counters in ``stats_dir``."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("XCUDA_") and k not in ("LD_PRELOAD", "PYTORCH_CUDA_ALLOC_CONF")}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["PYTHONUNBUFFERED"] = "1"
        if preload:
            # The test library (the same code): the check sets its own record and quota through the environment,
            # which the installed library takes from a root plan only
            env["LD_PRELOAD"] = str(self.artifacts.test_library)
            env["XCUDA_TEST_ENV_CONFIG"] = "1"
        env["XCUDA_SHM_PATH"] = str(record if record is not None else self.record_dir / "no-record")
        env["XCUDA_LOG_LEVEL"] = log_level
        if stats_dir is not None:
            env["XCUDA_STATS_DIR"] = str(stats_dir)
        if self.simulate:
            fake = str(self.artifacts.fake_dir)
            env["LD_LIBRARY_PATH"] = os.pathsep.join([fake] + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH")
                                                               else []))
        env.update(extra or {})
        return env

    def work_argv(self, kind: str, *args: str) -> list[str]:
        return [sys.executable, "-m", "executors.node.xcuda.realcheck_work", kind, *args]

    def timeout(self, cost_s: float) -> float:
        """A workload's time box: its planned cost with slack, never past the deadline."""
        slack = 5.0 if self.simulate else 20.0
        return max(1.0, min(cost_s + slack, self.part.remaining() - 1.0))


def _status(passed: bool | None) -> str:
    return "error" if passed is None else ("passed" if passed else "failed")


def _kv(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", line))


def _lines(child: Child, prefix: str) -> list[str]:
    return [ln for ln in child.text if ln.startswith(prefix)]


# -- 1: the fallback rate -----------------------------------------------------------------------

def check_fallback(ctx: Ctx) -> dict[str, Any]:
    p = ctx.plan
    stats_dir = ctx.scratch("fallback-stats")
    argv = ([str(ctx.artifacts.harness), "init", "launch-for", str(p.fallback_s)] if ctx.simulate
            else ctx.work_argv("launches", "--seconds", str(p.fallback_s)))
    child = Child(argv, ctx.env(preload=True, stats_dir=stats_dir), REPO_ROOT)
    rc = child.wait(ctx.timeout(ctx.startup_s() + p.fallback_s))
    out: dict[str, Any] = {"expected_per_s": FALLBACK_RATE, "seconds": p.fallback_s,
                           "workload": "xcuda_harness launch-for (fake driver)" if ctx.simulate
                           else "torch x.add_(1) loop"}
    fail = child.failure(rc)
    if fail:
        return out | {"status": "error", "error": fail}
    st = read_stats(stats_dir / f"xcuda-{child.pid}.stats")
    if ctx.simulate:
        kv = _kv(_lines(child, "launched")[0])
        n, secs = int(kv["n"]), float(kv["seconds"])
        correct = True
    else:
        done = child.event("done") or {}
        n, secs, correct = int(done["launches"]), float(done["seconds"]), bool(done["result_correct"])
        out["startup_s"] = ctx.note_startup(child)
        out["preloaded"] = bool(done.get("preloaded"))
    rate = n / secs
    rel = rate / FALLBACK_RATE - 1.0
    warned = any("no usable GPU record" in ln for ln in [*child.stderr_head, *child.stderr_tail])
    fallback_flag = None if st is None else st.fallback
    out.update(launches=n, measured_s=round(secs, 4), launches_per_s=round(rate, 1), relative_error=round(rel, 4),
               fallback_flag=fallback_flag, warned_once=warned, result_correct=correct)
    return out | {"status": _status(abs(rel) <= 0.1 and fallback_flag is True and correct)}


# -- 2: the memory quota ------------------------------------------------------------------------

def _quota_verdict(steps: list[dict], total: int | None) -> bool:
    pattern = (len(steps) == 3 and steps[0].get("ok") is True and steps[1].get("ok") is False
               and bool(steps[1].get("oom")) and steps[2].get("ok") is True)
    return pattern and total == QUOTA_BYTES


def check_quota(ctx: Ctx) -> dict[str, Any]:
    """GPU: one process per PyTorch allocator, all at once. Simulated: the harness, one per entry point."""
    base = {"quota_bytes": QUOTA_BYTES, "hooked": hooked(), "allocators": {}}
    children: dict[str, tuple[Child, Path]] = {}
    quota_env = {"XCUDA_MEM_QUOTA_BYTES": str(QUOTA_BYTES)}
    if ctx.simulate:
        for entry, kind in HARNESS_ALLOCATORS.items():
            stats_dir = ctx.scratch(f"quota-{kind}-stats")
            argv = [str(ctx.artifacts.harness), "init", "alloc", kind, str(GIB), "alloc", kind, str(3 * GIB // 2),
                    "free", "0", "alloc", kind, str(int(1.8 * GIB)), "meminfo"]
            children[entry] = (Child(argv, ctx.env(preload=True, stats_dir=stats_dir, extra=quota_env), REPO_ROOT),
                               stats_dir)
    else:
        for name, (conf, _entry) in TORCH_ALLOCATORS.items():
            stats_dir = ctx.scratch(f"quota-{name}-stats")
            extra = dict(quota_env) | ({"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else {})
            args = ["--quota-bytes", str(QUOTA_BYTES)] + (["--driver-pool"] if name == "cudaMallocAsync" else [])
            children[name] = (Child(ctx.work_argv("quota", *args), ctx.env(preload=True, stats_dir=stats_dir,
                                                                           extra=extra), REPO_ROOT), stats_dir)
    timeout = ctx.timeout(ctx.startup_s() + 10.0)
    verdicts: list[bool | None] = []
    for name, (child, stats_dir) in children.items():
        rc = child.wait(max(1.0, timeout - (time.monotonic() - child.spawned)))
        fail = child.failure(rc)
        if fail:
            base["allocators"][name] = {"status": "error", "error": fail}
            verdicts.append(None)
            continue
        if ctx.simulate:
            steps = []
            whats = ["1 GiB", "+1.5 GiB", "1.8 GiB after freeing"]
            for what, nbytes, line in zip(whats, (GIB, 3 * GIB // 2, int(1.8 * GIB)), _lines(child, "alloc")):
                rc_alloc = int(_kv(line)["rc"])
                steps.append({"what": what, "bytes": nbytes, "ok": rc_alloc == 0, "rc": rc_alloc,
                              "oom": rc_alloc == 2})
            info = _kv(_lines(child, "meminfo")[0])
            total, free = int(info["total"]), int(info["free"])
            st = read_stats(stats_dir / f"xcuda-{child.pid}.stats")
            r = {"entry_point": name, "steps": steps, "reported_total_bytes": total,
                 "reported_free_bytes_holding_1_8": free,
                 "refused_by_xcuda": None if st is None else st.mem_refused}
        else:
            done = child.event("done") or {}
            steps = done.get("steps", [])
            total = (done.get("mem_get_info_before") or {}).get("total")
            stats = done.get("stats") or {}
            r = {"entry_point": TORCH_ALLOCATORS[name][1], "alloc_conf": TORCH_ALLOCATORS[name][0],
                 "torch_backend": done.get("allocator"), "preloaded": done.get("preloaded"), "steps": steps,
                 "reported_total_bytes": total,
                 "reported_free_bytes_holding_1_8": (done.get("mem_get_info_holding_1_8") or {}).get("free"),
                 "refused_by_xcuda": stats.get("mem_refused"), "peak_charged_bytes": stats.get("mem_peak_bytes"),
                 "startup_s": ctx.note_startup(child)}
            if "driver_pool" in done:
                dp = done["driver_pool"]
                dp_ok = "error" not in dp and _quota_verdict(dp.get("steps", []), QUOTA_BYTES)
                base["allocators"]["driver:cuMemAllocFromPoolAsync"] = dp | {"status": _status(dp_ok)}
        ok = _quota_verdict(steps, total)
        verdicts.append(ok)
        base["allocators"][name] = r | {"status": _status(ok)}
    verdicts += [a["status"] == "passed" for k, a in base["allocators"].items() if k.startswith("driver:")]
    status = "error" if any(v is None for v in verdicts) else _status(all(verdicts))
    return base | {"status": status}


# -- 3: CUDA graphs -----------------------------------------------------------------------------

def check_graphs(ctx: Ctx) -> dict[str, Any]:
    p = ctx.plan
    stats_dir = ctx.scratch("graphs-stats")
    child = Child(ctx.work_argv("graphs", "--replays", str(p.graph_replays)),
                  ctx.env(preload=True, stats_dir=stats_dir), REPO_ROOT)
    rc = child.wait(ctx.timeout(ctx.startup_s() + 5.0))
    fail = child.failure(rc)
    if fail:
        return {"status": "error", "error": fail}
    done = dict(child.event("done") or {})
    done.pop("ev", None)
    done.pop("stats", None)
    tokens = done.get("gate_tokens")
    done["tokens_per_replay"] = None if tokens is None else round(tokens / p.graph_replays, 3)
    done["startup_s"] = ctx.note_startup(child)
    ok = bool(done.get("result_correct")) and done.get("preloaded") is True and tokens == p.graph_replays
    return done | {"pacing": "fallback rate (no GPU record)", "status": _status(ok)}


# -- graceful exit: a checkpointing job keeps its context, a terminated one releases it ---------------

EXIT_KEPT = "synchronized and kept"      # xCUDA's log line when the program handles the signal itself
EXIT_RELEASED = "context(s) released"    # ... and when the signal terminates it


def _signalled(ctx: Ctx, child: Child, started: Callable[[], bool], wait_s: float) -> dict[str, Any]:
    """Waits for ``started()`` (the workload is launching), sends SIGTERM, waits for the exit."""
    end = time.monotonic() + wait_s
    while not started() and child.proc.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    out: dict[str, Any] = {"signalled": False}
    if child.proc.poll() is None and started():
        os.kill(child.pid, signal.SIGTERM)
        out["signalled"] = True
    rc = child.wait(ctx.timeout(30.0) if out["signalled"] else 0.0)
    lines = [*child.stderr_head, *child.stderr_tail]
    out.update(exit_status=rc, xcuda_kept=any(EXIT_KEPT in ln for ln in lines),
               xcuda_released=any(EXIT_RELEASED in ln for ln in lines))
    err = child.event("error")
    if err is not None:
        out["error"] = str(err.get("error"))[:500]
    elif not out["signalled"]:
        out["error"] = child.failure(rc) or "the workload never started launching"
    return out


def check_exit(ctx: Ctx) -> dict[str, Any]:
    """SIGTERM to a preloaded process in the middle of its work (xCUDA's fallback pacing holds launches at the
    gate, so some are held when the signal comes): a training job on muxflow's runtime (it handles SIGTERM:
    finish the step, save a checkpoint, exit 0) must checkpoint, with its contexts kept; a loop with no handler
    must die of the signal, its contexts released first."""
    ckpt = ctx.scratch("exit-checkpoint")
    if ctx.simulate:
        h = ctx.artifacts.harness
        job = Child([str(h), "init", "sig", "SIGTERM", "record", "sigaction", "burst"], ctx.env(preload=True),
                    REPO_ROOT)
        handled = _signalled(ctx, job, lambda: "ready" in job.text, ctx.startup_s() + 10.0)
        after = [ln for ln in job.text if ln.startswith("after-signal")]
        handled["after_signal"] = after[0] if after else None
        handled_ok = handled["exit_status"] == 0 and bool(after) and "errors=0" in after[0]
        plain = Child([str(h), "init", "burst"], ctx.env(preload=True), REPO_ROOT)
        default = _signalled(ctx, plain, lambda: "ready" in plain.text, ctx.startup_s() + 10.0)
        workload = "xcuda_harness burst (fake driver)"
    else:
        job = Child(ctx.work_argv("checkpoint", "--ckpt", str(ckpt), "--batch", str(ctx.plan.batch)),
                    ctx.env(preload=True), REPO_ROOT)
        handled = _signalled(ctx, job, lambda: len(job.step_times) >= 3, ctx.startup_s() + 30.0)
        handled["steps_before"] = len(job.step_times)
        handled["checkpoints"] = sorted(f.name for f in ckpt.iterdir() if f.is_file())
        handled_ok = handled["exit_status"] == 0 and bool(handled["checkpoints"])
        plain = Child(ctx.work_argv("launches", "--seconds", "120"), ctx.env(preload=True), REPO_ROOT)
        default = _signalled(ctx, plain, lambda: plain.event("ready") is not None, ctx.startup_s() + 30.0)
        workload = "muxflow's job runtime training ResNet-18; a torch x.add_(1) loop"
    handled["status"] = _status(handled_ok and handled["xcuda_kept"] and not handled["xcuda_released"])
    default["status"] = _status(default["exit_status"] == -signal.SIGTERM and default["xcuda_released"])
    return {"workload": workload, "pacing": "fallback rate (no GPU record)", "handled": handled,
            "default_action": default,
            "status": _status(handled["status"] == "passed" and default["status"] == "passed")}


# -- 4, 5: a job under the agent's record -------------------------------------------------------

def _sampler(ctx: Ctx, toy: ToyGpu | None) -> Any:
    if ctx.simulate:
        from executors.node.sampler import SimulatedSampler

        return SimulatedSampler(models={0: toy})
    from executors.node.sampler import NvmlSampler

    return NvmlSampler([0])


def _clock_threshold(ctx: Ctx, sampler: Any) -> float:
    if ctx.plan.clock_threshold == "none":
        return 0.0
    s = sampler.sample(0, time.time())
    c_max = float("nan") if s is None else s.sm_clock_max_mhz
    return 0.85 * c_max if math.isfinite(c_max) else 0.0  # as executors.node.wiring binds a GPU


def run_job(ctx: Ctx, name: str, *, preload: bool, target: float | None, seconds: float, settle_s: float,
            toy: ToyGpu | None = None, max_points: int | None = None, keep_trace: bool = True) -> dict[str, Any]:
    """One training job (``--simulate``: the harness launching for ``seconds``) while the agent's loop publishes
    the GPU record with ``target``; the series, the controller trace and their steady state."""
    p = ctx.plan
    stats_dir = ctx.scratch(f"{name}-stats") if preload else None
    record = ctx.record_dir / f"gpu0-{name}"
    sampler = _sampler(ctx, toy)
    threshold = _clock_threshold(ctx, sampler)
    rec = Recorder(record)
    agent = AgentLoop(sampler, record, target_util=target or 0.0, clock_threshold_mhz=threshold, on_tick=rec.tick)
    child: Child | None = None
    try:
        agent.start()
        argv = ([str(ctx.artifacts.harness), "init", "launch-for", str(seconds)] if ctx.simulate
                else ctx.work_argv("train", "--seconds", str(seconds), "--batch", str(p.batch)))
        child = Child(argv, ctx.env(preload=preload, record=record, stats_dir=stats_dir,
                                    log_level="debug" if preload else "info"), REPO_ROOT)
        if stats_dir is not None:
            rec.stats_path = stats_dir / f"xcuda-{child.pid}.stats"
            if toy is not None:
                toy.watch(rec.stats_path)
        rc = child.wait(ctx.timeout(ctx.startup_s() + seconds))
    finally:
        agent.stop()
        sampler.close()
        if child is not None:
            child.kill()
    out: dict[str, Any] = {"target": target, "preloaded": preload, "seconds": seconds,
                           "clock_threshold_mhz": round(threshold, 1), "agent": agent.summary(),
                           "record_read_errors": rec.record_errors}
    fail = child.failure(rc)
    if fail:
        out.update(status="error", error=fail)
    start = child.event("start")
    t0 = float(start["t"]) if start is not None else child.spawned
    if ctx.simulate:
        cols = series(rec.rows, t0, steps_from_launches=True)
        progress = [(t, float(s)) for t, s, g in zip(cols["t_s"], cols["steps"], cols["gate_open"]) if g is not None]
        out["speed_unit"] = "launches/s"
        kv = _kv(_lines(child, "launched")[0]) if _lines(child, "launched") else {}
        if kv:
            out["overall_launches_per_s"] = round(int(kv["n"]) / float(kv["seconds"]), 1)
    else:
        cols = series(rec.rows, t0, child.step_times)
        progress = [(t - t0, float(i + 1)) for i, t in enumerate(child.step_times)]
        out["speed_unit"] = "steps/s"
        out["startup_s"] = ctx.note_startup(child)
        done = child.event("done")
        if done is not None:
            out["workload"] = {k: done.get(k) for k in ("model", "batch", "steps", "seconds", "steps_per_s",
                                                        "loss_finite", "preloaded")}
    out["steady"] = steady_state(cols["t_s"], cols["u_gpu"], target, settle_s, progress, p.tolerance,
                                 cols["gate_open"], cols["launches_per_s"])
    stored, group = downsample(cols, max_points or p.max_points)
    out["series"] = {"interval_s": agent.interval_s * group, "averaged_ticks": group, "t0": "first training step"
                     if start is not None else "workload start", "t0_monotonic_s": round(t0, 6), **stored}
    if preload:
        runs, ctl = controller_trace(child.trace, t0)
        out["controller_check"] = mirror_check(runs, settle_s)
        if keep_trace:
            out["controller"] = {"period_ms": 20, "t0": out["series"]["t0"], "t0_monotonic_s": round(t0, 6), **ctl}
    out.setdefault("status", "measured")
    return out


def overhead_plain(ctx: Ctx) -> dict[str, Any]:
    """The job without xCUDA (the agent's loop sampling it all the same): its speed and its own load, the baseline
    of the tracking check."""
    p = ctx.plan
    toy = ToyGpu(constant_u_sm=0.05) if ctx.simulate else None
    plain = run_job(ctx, "overhead-plain", preload=False, target=None,
                    seconds=p.overhead_warmup_s + p.overhead_measure_s, settle_s=p.overhead_warmup_s, toy=toy,
                    max_points=500)
    if "error" not in plain and not ctx.simulate:
        ctx.unthrottled = {"steps_per_s": plain["steady"]["steps_per_s"], "mean_u_gpu": plain["steady"]["mean_u_gpu"],
                           "u_gpu_is": "U_SM (no clock information: a_C = 1)" if p.clock_threshold == "none"
                           else "U_SM x a_C with the agent's T_SM"}
    return plain


def check_overhead(ctx: Ctx, plain: dict[str, Any]) -> dict[str, Any]:
    """The job with xCUDA under a record whose target is above its load, against ``plain`` (without xCUDA)."""
    p = ctx.plan
    toy = ToyGpu(constant_u_sm=0.05) if ctx.simulate else None
    paced = run_job(ctx, "overhead-xcuda", preload=True, target=p.overhead_target,
                    seconds=p.overhead_warmup_s + p.overhead_measure_s, settle_s=p.overhead_warmup_s, toy=toy,
                    max_points=500, keep_trace=False)
    out: dict[str, Any] = {"target": p.overhead_target, "without_xcuda": plain, "with_xcuda": paced}
    if "error" in plain or "error" in paced:
        return out | {"status": "error"}
    if ctx.simulate:  # the harness reports its own rate; the fake driver's launch costs nanoseconds
        a, b = plain.get("overall_launches_per_s"), paced.get("overall_launches_per_s")
    else:
        a, b = plain["steady"]["steps_per_s"], paced["steady"]["steps_per_s"]
    ratio = round(b / a, 4) if a and b else None
    open_frac = paced["steady"]["gate_open_frac"]
    agrees = paced.get("controller_check", {}).get("mirror_agrees")
    out.update(speed_ratio=ratio, gate_open_frac=open_frac, mirror_agrees=agrees,
               unthrottled_mean_u_gpu=plain["steady"]["mean_u_gpu"])
    if ratio is None or open_frac is None:
        return out | {"status": "error", "error": "no speed or gate state measured"}
    ok = open_frac >= 0.9 and agrees is True and (ctx.simulate or ratio >= 0.95)
    return out | {"status": _status(ok)}


def check_tracking(ctx: Ctx, put: Any, reserve_s: float = 0.0) -> dict[str, Any]:
    """Each target in turn; ``put(result)`` stores the check so far after each. The runs share what the deadline
    leaves, less ``reserve_s`` (for what comes after) while that still gives every target the settling time and
    ``Plan.min_steady_s`` plus two seconds; else they take it all."""
    p = ctx.plan
    base = ctx.unthrottled
    out: dict[str, Any] = {"targets": {}, "settle_s": p.settle_s, "tolerance": p.tolerance,
                           "clock_threshold": p.clock_threshold, "unthrottled": base, "status": "running"}
    verdicts: list[bool | None] = []
    skipped: list[str] = []
    for i, target in enumerate(p.targets):
        left = len(p.targets) - i
        overhead_s = ctx.startup_s() + p.slack_s            # a run's cost besides its own seconds
        shortest = overhead_s + p.settle_s + p.min_steady_s
        budget = ctx.part.remaining() - 2.0
        if i == 0 and budget - reserve_s < left * (shortest + 2.0):
            reserve_s = 0.0                                  # every target first, then what comes after
        budget -= reserve_s
        fit = min(left, int(budget // shortest))            # the targets still to run that can run at all
        if fit == 0:
            skipped.append(f"{target:g}")
            out["targets"][f"{target:g}"] = {"status": "skipped", "why": "deadline"}
            continue
        seconds = round(min(p.tracking_s, budget / fit - overhead_s), 1)
        r = run_job(ctx, f"track-{target:g}", preload=True, target=target, seconds=seconds, settle_s=p.settle_s,
                    toy=ToyGpu(kernel_s=p.toy_kernel_s) if ctx.simulate else None)
        st = r["steady"]
        achievable = target
        speed = None
        if base is not None and base.get("mean_u_gpu") is not None:
            achievable = min(target, base["mean_u_gpu"])
            if base.get("steps_per_s") and st["steps_per_s"] is not None:
                speed = r["speed_vs_unthrottled"] = round(st["steps_per_s"] / base["steps_per_s"], 4)
        r["achievable_target"] = round(achievable, 4)
        err = None if st["mean_u_gpu"] is None else round(st["mean_u_gpu"] - achievable, 4)
        r["error_vs_achievable"] = err
        # A target above the job's unthrottled load (by more than the tolerance) is one it never reaches: xCUDA
        # must leave it alone. Its load there is no test of tracking (a baseline measured cold can read low).
        unreachable = achievable < target - p.tolerance
        r["regime"] = "under target: not paced" if unreachable else "tracking"
        agrees = r.get("controller_check", {}).get("mirror_agrees")
        if r.get("status") == "error" or err is None or (unreachable and speed is None):
            r["status"] = "error"
            verdicts.append(None)
        else:
            ok = (speed >= 1.0 - p.tolerance if unreachable else abs(err) <= p.tolerance) and agrees is True
            r["status"] = _status(ok)
            verdicts.append(ok)
        out["targets"][f"{target:g}"] = r
        put(out)
    if skipped:
        out["skipped_targets"] = skipped
        ctx.part.skip(f"tracking at {', '.join(skipped)}")
    if not verdicts:
        out["status"] = "skipped"
    elif any(v is None for v in verdicts):
        out["status"] = "error"
    else:
        out["status"] = _status(all(verdicts))
    return out


# -- the run ------------------------------------------------------------------------------------

def _library(simulate: bool) -> tuple[Artifacts | None, dict[str, Any]]:
    art = Artifacts.at()
    need = [art.library] + ([art.harness, art.fake_dir / "libcuda.so.1"] if simulate else [])
    info: dict[str, Any] = {"path": str(art.library.relative_to(REPO_ROOT)), "built": False, "error": None}
    if not missing_tools():
        t = time.monotonic()
        try:
            art = build(jobs=max(1, min(8, os.cpu_count() or 1)))
            info.update(built=True, build_s=round(time.monotonic() - t, 2))
        except BuildError as exc:
            info["error"] = str(exc)[-2000:]
    if all(p.exists() for p in need):
        return art, info
    if info["error"] is None:
        info["error"] = f"xCUDA is not built and cannot be: missing {', '.join(missing_tools())}"
    return None, info


def _gpu_identity(part: Part) -> bool:
    """Fills ``gpu``; False when there is no GPU to check."""
    from executors.node.sampler import nvml_available

    ok, why = nvml_available()
    if not ok:
        part.error(f"no GPU: {why}")
        return False
    try:
        from executors.node.gpu_type import gpu_identity

        part.doc["gpu"] = gpu_identity(index=0)
    except Exception as exc:  # the identity is context; the checks do not need it
        part.error(f"GPU identity unavailable: {type(exc).__name__}: {exc}")
    return True


def _nvml_gpm_interval() -> float:
    """How often the agent's NVML sampler recomputes GPM's SM activity (its default, as the agent builds it)."""
    import inspect

    from executors.node.sampler import NvmlSampler

    return inspect.signature(NvmlSampler).parameters["gpm_interval_s"].default


def _on_signal(signum: int, frame: object) -> NoReturn:
    raise _Terminated(signal.Signals(signum).name)


def _timed(ctx: Ctx, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Runs one check and stores its result (an exception is the check's error, not the part's end)."""
    t = time.monotonic()
    try:
        result = fn()
    except Exception as exc:
        log.exception("check %s failed", name)
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
        ctx.part.error(f"{name}: {type(exc).__name__}: {exc}")
    result = {**result, "wall_s": round(time.monotonic() - t, 2)}
    ctx.part.put(name, result)
    return result


def _side_by_side(ctx: Ctx) -> None:
    """The fallback rate, the quota and (on a GPU) CUDA graphs, each in processes of its own, at the same time: none
    measures the GPU's speed, and the fallback rate is the pacing thread's own clock."""
    jobs: dict[str, Callable[[], dict[str, Any]]] = {"fallback": lambda: check_fallback(ctx),
                                                     "quota": lambda: check_quota(ctx),
                                                     "exit": lambda: check_exit(ctx)}
    if ctx.simulate:
        ctx.part.put("graphs", {"status": "needs_gpu",
                                "why": "CUDA graphs need the real driver (the fake one has no graphs)"})
    else:
        jobs["graphs"] = lambda: check_graphs(ctx)
    threads = [threading.Thread(target=_timed, args=(ctx, name, fn), name=f"xcuda-check-{name}", daemon=True)
               for name, fn in jobs.items()]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except BaseException:  # stopped: end the workloads, let each check store what it has, then go on stopping
        kill_all_children()
        for t in threads:
            t.join(timeout=10.0)
        raise


def run(out_dir: Path, deadline_s: float, simulate: bool, plan: Plan) -> Part:
    """The checks, each started only when the deadline leaves it room: the fallback rate, the quota, CUDA graphs and
    the graceful exit side by side; the job without xCUDA (the baseline), then with xCUDA under target (the
    overhead); tracking, in what is left."""
    # The agent's loop is imported before the deadline's clock starts: its import (numpy, the agent's modules) takes
    # seconds on a loaded machine, and the deadline is for the checks.
    agent_interval: float | None = None
    agent_error: str | None = None
    try:
        from executors.node.agent import AgentConfig

        agent_interval = AgentConfig().interval_s
    except Exception as exc:
        agent_error = f"the node agent's loop cannot be imported: {type(exc).__name__}: {exc}"
    part = Part(out_dir, deadline_s, simulate)
    part.set("config", asdict(plan) | {
        "quota_bytes": QUOTA_BYTES, "fallback_rate_expected": FALLBACK_RATE, "record": "a private /dev/shm file",
        "agent_interval_s": agent_interval, "gpm_interval_s": None if simulate else _nvml_gpm_interval()})
    if agent_error:
        part.error(agent_error)
    part.write()
    work = out_dir / f".{PART}-work"
    record_dir = Path(tempfile.mkdtemp(prefix="xcuda-check-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    why: str | None = None
    try:
        art, lib = _library(simulate)
        part.set("library", lib)
        if art is None:
            part.error(f"xCUDA library: {lib['error']}")
            part.finish("xCUDA could not be built")
            return part
        if not simulate and not _gpu_identity(part):
            for name in CHECKS:
                part.set(name, {"method": part.method, "status": "skipped", "why": "no GPU"})
            part.finish("no GPU")
            return part
        part.write()
        ctx = Ctx(part, plan, simulate, art, work, record_dir)
        p = plan
        job_s = p.overhead_warmup_s + p.overhead_measure_s

        def fits(what: str, need: float) -> bool:
            if part.remaining() >= need + 1.0:
                return True
            part.skip(what)
            return False

        def skipped(need: float) -> dict[str, Any]:
            return {"status": "skipped",
                    "why": f"deadline: {max(0.0, part.remaining()):.1f} s left, {need + 1.0:.1f} s needed"}

        need = p.startup_s + max(p.fallback_s, 0.0 if simulate else 5.0) + p.slack_s
        if fits("fallback, quota, graphs, exit", need):
            _side_by_side(ctx)
        else:
            for name in ("fallback", "quota", "graphs", "exit"):
                part.put(name, skipped(need))
        plain: dict[str, Any] | None = None
        need = ctx.startup_s() + job_s + p.slack_s
        if fits("overhead", need):
            t = time.monotonic()
            part.put("overhead", {"status": "running"})
            plain = overhead_plain(ctx)
            plain_s = round(time.monotonic() - t, 2)
            part.put("overhead", {"without_xcuda": plain, "status": "running", "wall_s": plain_s})
            # the run with xCUDA right after the one without: the GPU as warm for both
            need = ctx.startup_s() + job_s + p.slack_s
            if fits("overhead with xCUDA", need):
                result = _timed(ctx, "overhead", lambda: check_overhead(ctx, plain))
                part.put("overhead", result | {"wall_s": round(result["wall_s"] + plain_s, 2)})
            else:
                part.put("overhead", {"without_xcuda": plain, "status": "skipped", "wall_s": plain_s,
                                      "why": f"the run with xCUDA: {skipped(need)['why']}"})
        else:
            part.put("overhead", skipped(need))
        need = ctx.startup_s() + p.settle_s + p.min_steady_s + p.slack_s
        if fits("tracking", need):
            part.put("tracking", {"status": "running"})
            _timed(ctx, "tracking", lambda: check_tracking(ctx, lambda r: part.put("tracking", r)))
        else:
            part.put("tracking", skipped(need))
        if part.skipped:
            why = f"deadline ({deadline_s:g} s): not run: {'; '.join(part.skipped)}"
    except _Terminated as exc:
        kill_all_children()
        why = f"stopped by {exc}"
        for name in CHECKS:  # what was running keeps what it had stored (tracking: its finished targets)
            so_far = part.get(name)
            if so_far is not None and so_far.get("status") == "running":
                part.set(name, {**so_far, "status": "stopped", "why": f"stopped by {exc}"})
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):  # what was measured gets written whatever comes now
            signal.signal(sig, signal.SIG_IGN)
        kill_all_children()
        shutil.rmtree(record_dir, ignore_errors=True)
    part.finish(why)
    return part


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, status 2 (the part interface)
        sys.stderr.write(f"error: {message}\n")
        sys.exit(2)


def _targets(s: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {s!r}") from None
    if not vals or not all(0.0 < v <= 2.0 for v in vals):
        raise argparse.ArgumentTypeError("targets must be in (0, 2]")
    return vals


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="python -m executors.node.xcuda.realcheck",
                 description="xCUDA on the real CUDA driver: fallback rate, quota, CUDA graphs, overhead, tracking "
                             "(the xcuda part of make gpu-check).")
    ap.add_argument("--out", required=True, type=Path, help="directory for xcuda.json")
    ap.add_argument("--deadline", required=True, type=float, help="seconds of wall clock the part may use")
    ap.add_argument("--simulate", action="store_true", help="no GPU: the fake driver and a simulated GPU")
    ap.add_argument("--targets", type=_targets, help="tracking targets, comma-separated (default 0.3,0.5,0.7)")
    ap.add_argument("--tracking-seconds", type=float, help="training time per target")
    ap.add_argument("--settle", type=float, help="seconds discarded before the steady state")
    ap.add_argument("--batch", type=int, help="training batch (default 64)")
    ap.add_argument("--clock-threshold", choices=("none", "agent"),
                    help="T_SM in the record: none (a_C = 1, the default) or the agent's 0.85 x max SM clock")
    a = ap.parse_args(argv)
    if not (a.deadline > 0 and math.isfinite(a.deadline)):
        ap.error("--deadline must be a positive number of seconds")
    for opt in ("tracking_seconds", "settle", "batch"):
        v = getattr(a, opt)
        if v is not None and not v > 0:
            ap.error(f"--{opt.replace('_', '-')} must be positive")
    if a.out.exists() and not a.out.is_dir():
        ap.error(f"--out {a.out} is not a directory")
    plan = SIM_PLAN if a.simulate else GPU_PLAN
    changes = {k: v for k, v in (("targets", a.targets), ("tracking_s", a.tracking_seconds), ("settle_s", a.settle),
                                 ("batch", a.batch), ("clock_threshold", a.clock_threshold)) if v is not None}
    plan = replace(plan, **changes)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    a.out.mkdir(parents=True, exist_ok=True)
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        part = run(a.out, a.deadline, a.simulate, plan)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    checks = part.doc["results"]
    print(f"xcuda: {'complete' if part.doc['complete'] else 'incomplete'}; "
          + ", ".join(f"{k} {checks[k].get('status')}" for k in CHECKS if k in checks) + f" -> {part.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
