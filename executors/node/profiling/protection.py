"""Protection experiment: does MuxFlow's protection stack keep an online service within its allowance?

    python -m executors.node.profiling.protection --out DIR --deadline S [--simulate] [--qps Q] [--max-batch B]

An online reference service (``executors.job.workloads.serve``: open-loop arrivals, per-request latency queueing
included) and an offline reference job (``executors.job.workloads.train``: a training loop on the runtime helper)
share one GPU, as production runs them. Each set-up below configures what production would for a placed job at
``--share`` % of the SMs (the plan's share) and ``--mem-quota`` of memory, with the product's own code and
commands:

- **a — time-slicing**: no MPS; the two processes' contexts take turns on the GPU.
- **b — MPS share**: a private MPS control daemon; before the job starts, the commands the Prolog
  (``executors/node/slurm/prolog.sh``) sends — ``set_default_active_thread_percentage <share>``,
  ``set_default_device_pinned_mem_limit <gpu> <quota>M``, and for the running server (the service's)
  ``set_active_thread_percentage``/``set_device_pinned_mem_limit`` — and in the job's environment what the
  TaskProlog (``task_prolog.sh``) exports without xCUDA: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<share>``. The
  service, an MPS client from before, keeps the whole GPU.
- **c — MPS share + xCUDA**: b, and the job preloaded with xCUDA with the TaskProlog's ``XCUDA_*`` settings (GPU
  index, memory quota, gains, counters directory) as its limits: the test build (``build/test/libxcuda.so``,
  ``XCUDA_TEST_ENV_CONFIG=1``), since the installed library takes them from a Slurm job's root plan, which an
  experiment outside Slurm has not got; the GPU record it paces by is written by the node
  agent's own loop (``executors.node.agent``: ``NodeAgent``/``GpuLoop`` over an ``NvmlSampler``, a ``MemorySink``)
  from NVML every 10 ms, with ``T_SM`` = 0.85 of the GPU's highest SM clock as ``executors.node.wiring`` sets it,
  and target load ``U_GPU`` 0.9 (xCUDA's default, the product's ``XCUDA_TARGET_UTIL``) unless ``--target-util``.
  SysMonitor runs in that loop but does not evict: when it would have, the time is recorded.
- **d — the full stack**: c, and SysMonitor's eviction on entry to Overlimit kills the job (SIGTERM to its process
  group: xCUDA's graceful exit, then the runtime's), as the Slurm evictor's requeue would.
- **e — d at lower MPS client priority**: d with ``CUDA_MPS_CLIENT_PRIORITY=1`` in the job's environment, and
  ``set_default_client_priority 1`` sent to the daemon for the job's start (0 again after; its answer recorded:
  older daemons do not know it).
- **f — static SM partitions**: a control daemon started with ``-S`` (CUDA 13.1+): ``sm_partition add`` gives the
  job ``--share`` % of the chunks and the service the rest (``CUDA_MPS_SM_PARTITION``); no xCUDA. Where the daemon
  does not support it the set-up is recorded ``unsupported: <why>``.

Every set-up runs the node agent (so SysMonitor's view of the GPU, and when it would have evicted, is recorded for
all; the agent's error detector and xCUDA check are not part of the experiment). Windows, per set-up and
repetition (``--reps``, 3 by default where the deadline allows; the order of the set-ups rotates from one
repetition to the next): the service alone for ``--baseline`` seconds (2 s; the solo reference of a window pools
the baselines before and after it), then the job — a process started ahead (imports), released after the baseline
to make its CUDA context, model and first iterations (``--warmup``), so a process start costs no co-located
time — co-located for ``--window`` seconds (4 s) from the moment it is released into its measured iterations,
then stopped. Set-ups sharing an MPS daemon share one service process, started once (its MPS server is the one the
Prolog's per-server caps address); the time-slicing windows come half before and half after the MPS ones, so a
drift of the machine does not favour either. The job's solo speed is measured once, alone, first. A window costs
about 10 s, so ~180 s hold about 14 windows: the deadline, not ``--reps``, bounds the repetitions there.

Measured, per window: the service's average and p99 latency slowdown (co-located ÷ solo), the job's normalized
throughput (iterations completed in the window per second ÷ the same alone), the per-second p99 series of the
window, whether the window's p99 stays within the service's allowance (``--allowance``: the product's
``slowdown_allowance``, +25 % by default), and the recovery time: the seconds from the job's release until the p99
series is back within the allowance for the rest of the window (0: it never left; null: not by the window's end); the
eviction (when, why; the service's latency from then to the window's end) and SysMonitor's states; the GPU's SM
activity as the agent sampled it (GPM, or NVML utilization where the GPU has none); xCUDA's counters (launches,
waits, paced rate, fallback) and the MPS control daemon's answers. Per set-up: mean, std, min and max of the
slowdowns and the throughput over repetitions, how many windows stayed within the allowance, and the mark of the
best published bar — Tally (ASPLOS'25) keeps co-located inference within +7.2 % p99: a set-up meets it with a mean
p99 slowdown ≤ 1.072 at a mean normalized throughput ≥ 0.5.

Decision rule (``results.recommended``): the set-up with the lowest mean p99 slowdown among those whose mean
offline throughput is ≥ 0.5; if none reaches 0.5, the lowest mean p99 slowdown overall. ``results.setups`` holds
every window and each set-up's spread, ``results.setups_summary`` the means, ``results.tally_bar`` who meets it.

``--simulate`` (no GPU): the same flow with both workloads on the CPU at size tiny and the agent sampling the
simulated GPU (``executors.node.simgpu``, the job on it unrestricted while it runs); MPS, xCUDA, client priority
and static partitions are recorded ``not available: no GPU``, so a and d (SysMonitor evicting on the simulated
metrics) run and the others do not. Its numbers are labelled simulated. The part file ``DIR/protection.json``
(``muxflow.gpu-check.part/1``) is rewritten after every window; ``--deadline`` is planned against, and a run cut
short says so (``complete: false``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import logging
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executors.job.runtime.timing import finite_or_none, percentile, write_json_atomic
from executors.job.workloads.models import JOB_FAMILIES, SERVICE_FAMILIES, workload_size
from executors.node.agent import AgentConfig, GpuBinding, MemorySink, NodeAgent
from executors.node.evictor import CallbackEvictor
from executors.node.gpu_check_part import part_document
from executors.node.placements import OfflineOnGpu, StaticPlacements
from executors.node.profiling.child import Child
from executors.node.profiling.colocate import Mps, latency_stats
from executors.node.profiling.protection_child import BOOT, GATE
from executors.node.sampler import GpuSampler, nvml_available
from executors.node.xcuda import shm

log = logging.getLogger(__name__)

PART = "protection"
REPORT_FILE = f"{PART}.json"
ROOT = Path(__file__).resolve().parents[3]   # the repository: children import the product from here
TALLY_P99_SLOWDOWN = 1.072   # Tally (ASPLOS'25): co-located inference within +7.2 % p99
MIN_TPUT = 0.5               # offline normalized throughput the bar and the decision rule ask for
JOB_ID = 1                   # the job's id in the agent's placements
MIB = 1 << 20
NO_GPU = "not available: no GPU"


def default_allowance() -> float:
    """The product's default online slowdown allowance (a service's ``slowdown_allowance``, the per-minute cap under
    its budget: 0.25 = +25 %)."""
    from scheduler_core.online.latency_budget import DEFAULT_SLOWDOWN_ALLOWANCE

    return float(DEFAULT_SLOWDOWN_ALLOWANCE)


@dataclass(frozen=True)
class Setup:
    key: str
    name: str
    configures: str
    mps: bool = False         # a private MPS daemon, the Prolog's caps, the job's active thread percentage
    xcuda: bool = False       # the job preloaded with xCUDA, the agent writing the GPU record
    evicts: bool = False      # SysMonitor's Overlimit stops the job
    priority: bool = False    # the job an MPS client of lower priority
    static: bool = False      # static SM partitions (daemon -S)


SETUPS: tuple[Setup, ...] = (
    Setup("a", "time-slicing", "no MPS: the two contexts time-slice the GPU"),
    Setup("b", "MPS share", "MPS: the Prolog's active thread percentage and pinned memory limit, the job's "
          "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", mps=True),
    Setup("c", "MPS share + xCUDA", "b, and xCUDA pacing the job from the node agent's GPU record (NVML)",
          mps=True, xcuda=True),
    Setup("d", "full stack", "c, and SysMonitor evicting the job on Overlimit", mps=True, xcuda=True, evicts=True),
    Setup("e", "full stack, low MPS priority", "d with the job at MPS client priority 1 (below normal)",
          mps=True, xcuda=True, evicts=True, priority=True),
    Setup("f", "static SM partitions", "MPS static partitioning (-S): the job's share of the SM chunks, the "
          "service the rest", static=True),
)
SETUP = {s.key: s for s in SETUPS}
COMPONENTS = ("mps", "xcuda", "priority", "static")


# -- statistics (pure) ---------------------------------------------------------------------------

def spread(values: Iterable[float | None]) -> dict[str, Any]:
    """n, mean, std (sample; null below 2 values), min, max of the values that are numbers."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return {"n": 0, "mean": None, "std": None, "min": None, "max": None}
    return {"n": len(xs), "mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else None,
            "min": min(xs), "max": max(xs)}


def buckets(times: Iterable[float], start: float, end: float, bucket_s: float = 1.0) -> list[list[int]]:
    """The positions of ``times`` in [start, end) by ``bucket_s`` bucket. A remainder of half a bucket or more is a
    bucket of its own, a shorter one joins the last bucket (a window ends a little after its nominal length)."""
    if end <= start:
        return []
    n = max(1, int((end - start) / bucket_s + 0.5))
    out: list[list[int]] = [[] for _ in range(n)]
    for i, t in enumerate(times):
        if start <= t < end:
            out[min(n - 1, int((t - start) // bucket_s))].append(i)
    return out


def per_second_p99(requests: Sequence[tuple[float, float]], start: float, end: float,
                   bucket_s: float = 1.0) -> list[float | None]:
    """p99 latency (ms) of the requests that arrived in each ``bucket_s`` of [start, end) (:func:`buckets`); null
    for a bucket without requests. ``requests``: (arrival, latency) in seconds."""
    return [None if not b else 1000.0 * percentile(sorted(requests[i][1] for i in b), 99)
            for b in buckets((arr for arr, _ in requests), start, end, bucket_s)]


def recovery_s(series_ms: Sequence[float | None], threshold_ms: float, bucket_s: float = 1.0) -> float | None:
    """Seconds from the series' start until its p99 is within ``threshold_ms`` for good (every later bucket with
    requests within it): 0 when it never left, null when the last bucket with requests is over it (or none has)."""
    seen = [(i, v) for i, v in enumerate(series_ms) if v is not None]
    if not seen or seen[-1][1] > threshold_ms:
        return None
    first = 0
    for i, v in seen:
        if v > threshold_ms:
            first = i + 1
    return first * bucket_s


def meets_tally(p99_slowdown: float | None, norm_tput: float | None) -> bool | None:
    """Tally's bar (ASPLOS'25): p99 within +7.2 % at ≥ 50 % offline throughput; null without both figures."""
    if p99_slowdown is None or norm_tput is None:
        return None
    return p99_slowdown <= TALLY_P99_SLOWDOWN and norm_tput >= MIN_TPUT


def recommend(summaries: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The best-protecting set-up: the lowest mean p99 slowdown among set-ups whose mean normalized throughput is
    ≥ 0.5; if none, the lowest mean p99 slowdown. ``summaries``: key → {"p99": mean p99 slowdown, "tput": mean
    normalized throughput}; set-ups without a p99 take no part. Ties go to the earlier key."""
    cands = {k: v for k, v in summaries.items() if v.get("p99") is not None}
    if not cands:
        return None
    fast = {k: v for k, v in cands.items() if v.get("tput") is not None and v["tput"] >= MIN_TPUT}
    pool = fast or cands
    key = min(sorted(pool), key=lambda k: pool[k]["p99"])
    rule = (f"lowest mean p99 slowdown among set-ups with mean offline throughput >= {MIN_TPUT:g}" if fast else
            f"no set-up reached offline throughput {MIN_TPUT:g}: lowest mean p99 slowdown")
    return {"setup": key, "p99_slowdown": pool[key]["p99"], "norm_tput": pool[key].get("tput"), "rule": rule,
            "candidates": sorted(pool)}


def select_setups(available: dict[str, str]) -> tuple[list[Setup], dict[str, str]]:
    """The set-ups to run given what is available (component → "ok" or why not), and each one's status.

    A set-up runs with the components it has, the missing ones named in its status; it is not run when nothing of
    its own is left (all its components missing and it does not evict) or when what is left is what an earlier
    set-up already runs (on the CPU, e is d)."""
    runnable: list[Setup] = []
    status: dict[str, str] = {}
    seen: set[frozenset[str]] = set()
    for s in SETUPS:
        needs = [c for c in COMPONENTS if getattr(s, c)]
        missing = {c: available.get(c, "not available") for c in needs if available.get(c) != "ok"}
        effective = frozenset([c for c in needs if c not in missing] + (["evicts"] if s.evicts else []))
        nothing_left = bool(needs) and len(missing) == len(needs) and not s.evicts
        if nothing_left or effective in seen:
            if missing and all(v == NO_GPU for v in missing.values()):
                status[s.key] = NO_GPU
            else:
                status[s.key] = "; ".join(f"{c}: {why}" for c, why in missing.items()) or "not run"
            continue
        seen.add(effective)
        runnable.append(s)
        status[s.key] = "planned" + ("" if not missing else " without " + "; ".join(
            f"{c} ({why})" for c, why in missing.items()))
    return runnable, status


def _headline(entry: dict[str, Any]) -> dict[str, Any]:
    """A set-up's few figures, for the gpu-check summary."""
    s = entry["summary"]
    return {"name": entry["name"], "status": entry["status"], "windows": s["windows"],
            "slowdown_avg": s["slowdown_avg"]["mean"], "slowdown_p99": s["slowdown_p99"]["mean"],
            "slowdown_p99_std": s["slowdown_p99"]["std"], "norm_tput": s["norm_tput"]["mean"],
            "within_allowance": s["within_allowance"], "recovered": s["recovered"], "evicted": s["evicted"],
            "meets_tally_bar": s["meets_tally_bar"]}


def _ratio(a: float | None, b: float | None) -> float | None:
    return finite_or_none(a / b) if a is not None and b else None


def window_figures(requests: Sequence[tuple[float, float]], before: tuple[float, float] | None,
                   after: tuple[float, float] | None, start: float, end: float, allowance: float,
                   iterations: Sequence[float], solo_rate: float | None) -> dict[str, Any]:
    """The figures of one co-located window [start, end) from the service's requests (arrival, latency s) and the
    job's iteration ends: the solo reference pools the baselines before and after."""
    def lat_in(span: tuple[float, float] | None) -> list[float]:
        return [] if span is None else [lat for arr, lat in requests if span[0] <= arr < span[1]]

    b, a = lat_in(before), lat_in(after)
    solo, colo = latency_stats(b + a), latency_stats(lat_in((start, end)))
    threshold = None if solo["p99_ms"] is None else solo["p99_ms"] * (1.0 + allowance)
    series = per_second_p99(requests, start, end)
    done = sum(1 for t in iterations if start <= t < end)
    rate = done / (end - start) if end > start else None
    tput = _ratio(rate, solo_rate)
    p99 = _ratio(colo["p99_ms"], solo["p99_ms"])
    return {
        "before": None if before is None else {"start_unix": before[0], "end_unix": before[1], **latency_stats(b)},
        "after": None if after is None else {"start_unix": after[0], "end_unix": after[1], **latency_stats(a)},
        "solo": {**solo, "from": "before and after" if after is not None else "before"},
        "colocated": {"start_unix": start, "end_unix": end, **colo},
        "slowdown_avg": _ratio(colo["avg_ms"], solo["avg_ms"]), "slowdown_p99": p99,
        "threshold_p99_ms": finite_or_none(threshold) if threshold is not None else None,
        "within_allowance": None if threshold is None or colo["p99_ms"] is None else colo["p99_ms"] <= threshold,
        "p99_series_ms": [finite_or_none(v) if v is not None else None for v in series],
        "recovery_s": None if threshold is None else recovery_s(series, threshold),
        "offline": {"iterations": done, "rate_per_s": finite_or_none(rate) if rate is not None else None,
                    "norm_tput": tput},
        "tally_bar": meets_tally(p99, tput),
    }


def summarize_setup(windows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ok = [w for w in windows if w.get("slowdown_p99") is not None]
    within = [w["within_allowance"] for w in ok if w.get("within_allowance") is not None]
    out = {
        "windows": len(ok), "slowdown_avg": spread(w["slowdown_avg"] for w in ok),
        "slowdown_p99": spread(w["slowdown_p99"] for w in ok),
        "norm_tput": spread(w["offline"]["norm_tput"] for w in ok),
        "within_allowance": f"{sum(within)}/{len(within)}",
        "recovery_s": spread(w["recovery_s"] for w in ok),
        "recovered": f"{sum(1 for w in ok if w.get('recovery_s') is not None)}/{len(ok)}",
        "evicted": sum(1 for w in ok if (w.get("eviction") or {}).get("evicted")),
    }
    out["meets_tally_bar"] = meets_tally(out["slowdown_p99"]["mean"], out["norm_tput"]["mean"])
    return out


# -- MPS ------------------------------------------------------------------------------------------

class MpsDaemon:
    """A private MPS control daemon (``colocate.Mps``; ``static``: started with ``-S``) and its control commands."""

    def __init__(self, root: Path, static: bool = False):
        self.mps = Mps(root)
        self.static = static
        self.env = dict(self.mps.env)
        self.exe = shutil.which("nvidia-cuda-mps-control")

    def start(self) -> str | None:
        """None when started, else why not."""
        return self.mps.start(static=self.static)

    def ctl(self, command: str, timeout_s: float = 15.0) -> dict[str, Any]:
        """One control command; its exit status and answer, for the record."""
        try:
            r = subprocess.run([self.exe or "nvidia-cuda-mps-control"], input=command + "\n",
                               env={**os.environ, **self.env}, capture_output=True, text=True, timeout=timeout_s,
                               check=False)
            return {"command": command, "rc": r.returncode, "out": (r.stdout + r.stderr).strip()[:500]}
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {"command": command, "rc": None, "out": str(exc)[:500]}

    def servers(self) -> list[int]:
        r = self.ctl("get_server_list")
        return [int(x) for x in r["out"].split() if x.isdigit()] if r["rc"] == 0 else []

    def stop(self) -> None:
        try:
            self.mps.stop()
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("MPS control daemon did not quit: %s", exc)


def prolog_caps(daemon: MpsDaemon, gpu: int, pct: int, mem_bytes: int | None) -> list[dict[str, Any]]:
    """The caps ``prolog.sh`` sets for a placed job through the GPU's control daemon: the share as the default
    active thread percentage and the quota as the default pinned memory limit (for the next server), and the same
    on a running server of the job's user (its new clients observe them; existing ones keep theirs)."""
    sent = [daemon.ctl(f"set_default_active_thread_percentage {pct}")]
    limit = None if not mem_bytes else f"{mem_bytes // MIB}M"
    if limit:
        sent.append(daemon.ctl(f"set_default_device_pinned_mem_limit {gpu} {limit}"))
    me = os.getuid()
    for pid in daemon.servers():
        try:
            if os.stat(f"/proc/{pid}").st_uid != me:
                continue
        except OSError:
            continue
        sent.append(daemon.ctl(f"set_active_thread_percentage {pid} {pct}"))
        if limit:
            sent.append(daemon.ctl(f"set_device_pinned_mem_limit {pid} {gpu} {limit}"))
    return sent


def task_env(gpu: int, pct: int, pipe_env: dict[str, str], xcuda_lib: Path | None = None,
             mem_bytes: int | None = None, record: Path | None = None, stats_dir: Path | None = None,
             gains: dict[str, float | None] | None = None) -> dict[str, str]:
    """What ``task_prolog.sh`` exports for a placed job (the MPS pipe, the share; with ``xcuda_lib`` the preload and
    its settings), plus ``XCUDA_SHM_PATH`` for the experiment's own record (production uses the default path) and
    ``XCUDA_TEST_ENV_CONFIG=1``: ``xcuda_lib`` is the test build, which then takes these settings as its plan (the
    installed library reads a Slurm job's root plan and would ignore them)."""
    env = {**pipe_env, "MUXFLOW_PLANNED_GPU": str(gpu), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct)}
    if xcuda_lib is not None:
        env.update({"LD_PRELOAD": str(xcuda_lib), "XCUDA_TEST_ENV_CONFIG": "1", "XCUDA_GPU_INDEX": str(gpu)})
        if stats_dir is not None:
            env["XCUDA_STATS_DIR"] = str(stats_dir)
        if mem_bytes:
            env["XCUDA_MEM_QUOTA_BYTES"] = str(int(mem_bytes))
        for name, v in (gains or {}).items():
            if v is not None:
                env[f"XCUDA_{name.upper()}"] = repr(float(v))
        if record is not None:
            env["XCUDA_SHM_PATH"] = str(record)
    return env


def parse_lspart(text: str) -> tuple[int, int] | None:
    """(free chunks, used chunks) of the first device ``lspart`` lists, or None."""
    m = re.search(r"free chunks\s+(\d+),\s*used chunks\s+(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_partition(text: str) -> str | None:
    """The partition id ``sm_partition add`` answers (``Partition <id> created``), or None."""
    m = re.search(r"Partition\s+(\S+)\s+created", text) or re.search(r"(GPU-[0-9A-Za-z-]+/\S+)", text)
    return m.group(1) if m else None


def _base_env() -> dict[str, str]:
    """Our environment without anything that would change how a child shares the GPU or runs its loop."""
    drop = ("CUDA_MPS_", "XCUDA_", "MUXFLOW_PROFILE_", "MUXFLOW_ITERATION_REPORT", "MUXFLOW_CHECKPOINT_DIR")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


# -- the two processes --------------------------------------------------------------------------

class Stopped(Exception):
    """The run was told to stop (SIGTERM) or its deadline came."""


class _Lines:
    """A file a child appends whitespace-separated numbers to, read incrementally (complete lines only)."""

    def __init__(self, path: Path):
        self.path = path
        self.pos = 0
        self.rows: list[tuple[float, ...]] = []

    def read(self) -> list[tuple[float, ...]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            return self.rows
        end = data.rfind(b"\n") + 1
        self.pos += end
        for line in data[:end].decode(errors="replace").splitlines():
            try:
                self.rows.append(tuple(float(x) for x in line.split()))
            except ValueError:
                continue
        return self.rows


class Proc:
    """A child of the experiment (``protection_child``), its files under the work directory."""

    def __init__(self, kind: str, tag: str, work: Path, env: dict[str, str], args: list[str]):
        self.tag = tag
        self.files = {k: work / f"{tag}.{k}" for k in ("imported", "ready", "stream", "iterations")}
        for f in self.files.values():
            f.unlink(missing_ok=True)
        extra = (["--stream", str(self.files["stream"])] if kind == "serve" else
                 ["--imported", str(self.files["imported"]), "--iterations", str(self.files["iterations"])])
        self.child = Child([sys.executable, "-c", BOOT, kind, *args, "--ready", str(self.files["ready"]), *extra],
                           env, cwd=str(ROOT), stdout=subprocess.DEVNULL)
        self.lines = _Lines(self.files["stream" if kind == "serve" else "iterations"])
        self.rc: int | None = None
        self.spawned = time.monotonic()
        self.stats_dir: Path | None = None   # a job's xCUDA counters directory

    @property
    def pid(self) -> int:
        return self.child.proc.pid

    def alive(self) -> bool:
        return self.child.proc.poll() is None

    def signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace_s: float) -> int:
        if self.rc is None:
            self.rc = self.child.terminate(grace_s=grace_s)
        return self.rc

    def why_dead(self) -> str:
        rc = self.child.proc.poll()
        return f"{self.tag} exited ({rc}): {self.child.stderr_tail()[-600:].strip()}"


# -- the node agent ------------------------------------------------------------------------------

class AgentRun:
    """The node agent's core for the experiment's GPU: its ``NodeAgent`` over the given sampler with one binding
    (the xCUDA record when ``record`` is set), a ``MemorySink``, and an evictor that calls ``on_evict``."""

    def __init__(self, sampler: GpuSampler, gpu_index: int, record: Path | None, target_util: float,
                 on_evict: Callable[[int, str], list[int]], placements: StaticPlacements, keep_s: float,
                 interval_s: float = 0.01):
        self.gpu_index = gpu_index
        self.simulated = sampler.source == "simulated"
        first = sampler.sample(gpu_index, time.time())
        cmax = first.sm_clock_max_mhz if first is not None else math.nan
        self.clock_threshold_mhz = 0.85 * cmax if math.isfinite(cmax) else 0.0  # as executors.node.wiring
        self.sink = MemorySink()
        binding = GpuBinding(gpu_index, gpu_index, record, clock_threshold_mhz=self.clock_threshold_mhz,
                             target_util=target_util)
        cfg = AgentConfig(interval_s=interval_s, ring_window_s=keep_s)
        self.agent = NodeAgent(sampler, [binding], CallbackEvictor(on_evict), self.sink, cfg, placements=placements)
        self.thread = threading.Thread(target=self._run, name="protection-node-agent", daemon=True)
        self.error: str | None = None
        self.states: list[tuple[float, str]] = []
        self.agent.on_tick = self._tick

    def _tick(self, agent: NodeAgent) -> None:
        state = agent.loops[self.gpu_index].monitor.state.value
        if not self.states or self.states[-1][1] != state:
            self.states.append((time.time(), state))

    def _run(self) -> None:
        try:
            self.agent.run()
        except Exception as exc:  # the loop died (an NVML or record failure): the window says so
            log.exception("node agent loop failed")
            self.error = f"{type(exc).__name__}: {exc}"

    def start(self) -> AgentRun:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.agent.stop()
        self.thread.join(timeout=30.0)

    def gpu(self, start: float, end: float) -> dict[str, Any]:
        loop = self.agent.loops[self.gpu_index]
        t, data = loop.ring.since(0)
        inside = (t >= start) & (t < end)
        t, data = t[inside], data[inside]
        sm = data[:, loop.ring.column("sm_activity_pct")]
        clk = data[:, loop.ring.column("sm_clock_mhz")] / data[:, loop.ring.column("sm_clock_max_mhz")]

        def fin(xs) -> list[float]:
            return [float(x) for x in xs if math.isfinite(x)]

        secs = []
        for b in buckets(t, start, end):
            v = fin(sm[b])
            secs.append(finite_or_none(statistics.fmean(v)) if v else None)
        s, c = fin(sm), fin(clk)
        gpm = bool(fin(data[:, loop.ring.column("sm_occupancy_pct")]))
        return {"samples": len(t),
                "sm_activity_source": "simulated" if self.simulated else "GPM" if gpm else "NVML utilization (no GPM)",
                "sm_activity_avg_pct": finite_or_none(statistics.fmean(s)) if s else None,
                "sm_activity_max_pct": max(s) if s else None,
                "sm_clock_frac_avg": finite_or_none(statistics.fmean(c)) if c else None,
                "sm_activity_series_pct": secs, "overruns": self.agent.overruns,
                "clock_threshold_mhz": self.clock_threshold_mhz}


# -- the experiment ---------------------------------------------------------------------------------

@dataclass
class Params:
    simulate: bool
    service: str
    job: str
    size: str
    device: str
    qps: float
    max_batch: int
    share: int
    mem_quota: str
    target_util: float | None
    gains: dict[str, float | None]
    window_s: float
    baseline_s: float
    reps: int
    allowance: float
    gpu_type: str
    sim_load: float
    warmup: int
    seed: int


@dataclass
class Item:
    setup: Setup
    rep: int
    order: int


@dataclass
class Block:
    kind: str                 # 'plain' | 'mps' | 'static'
    items: list[Item]
    name: str = ""


@dataclass
class Estimates:
    """Seconds the next steps are planned with (the largest seen so far once measured)."""

    service_start: float
    job_start: float          # spawn to imported
    init: float               # CUDA context, model, warm-up
    stop: float
    teardown: float
    seen: dict[str, float] = field(default_factory=dict)

    def saw(self, name: str, seconds: float) -> None:
        """A measured duration: the first replaces the initial guess, later ones can only raise it."""
        self.seen[name] = max(self.seen.get(name, 0.0), seconds)
        setattr(self, name, self.seen[name])


class Experiment:
    def __init__(self, p: Params, out_dir: Path, deadline_s: float, stop: threading.Event,
                 t0: float | None = None):
        self.p = p
        self.out_dir = out_dir
        self.work = out_dir / f".{PART}-work"
        self.t0 = time.monotonic() if t0 is None else t0
        self.t_end = self.t0 + deadline_s
        self.stop_ev = stop
        gpu = not p.simulate
        # first guesses (a torch process's start on a GPU node, on a busy CPU); each is replaced once measured
        self.est = Estimates(service_start=15.0 if gpu else 6.0, job_start=8.0 if gpu else 5.0,
                             init=6.0 if gpu else 3.0, stop=3.0 if gpu else 1.5, teardown=8.0 if gpu else 3.0)
        self.settle_s = 0.3
        self.procs: list[Proc] = []
        self.daemons: list[MpsDaemon] = []
        self.record_dir: Path | None = None
        self.mps_root: Path | None = None
        self.placements = StaticPlacements()
        self.gpu_index = 0
        self.gpu_uuid: str | None = None
        self.mem_bytes: int | None = None
        self.xcuda_lib: Path | None = None
        self.available: dict[str, str] = {}
        self.solo_rate: float | None = None
        self.windows: list[dict[str, Any]] = []
        self.raw: list[dict[str, Any]] = []       # per window: its block's requests, spans, iterations
        self.current: dict[str, Any] | None = None
        self.cut: str | None = None
        self.status: dict[str, str] = {}
        self.failures: dict[str, list[str]] = {}   # set-up → why a block of it failed
        self.solo: dict[str, Any] | None = None
        self.partitions: dict[str, Any] | None = None
        self.plan_text: list[str] | None = None
        self._stats_n = 0
        self._lock = threading.Lock()      # the file
        self._ev_lock = threading.Lock()   # the window the agent's evictor acts on
        self.doc: dict[str, Any] = part_document(PART, "simulated" if p.simulate else "no-mps", why_incomplete=None)

    # -- time --
    def left(self) -> float:
        return self.t_end - time.monotonic()

    def check(self) -> None:
        """Stopped when told to, or when only the time to tear down is left."""
        if self.stop_ev.is_set():
            raise Stopped("stopped by a signal")
        if self.left() <= self.est.teardown / 2:
            raise Stopped("deadline reached")

    def sleep(self, seconds: float) -> None:
        """Wait (for the service to serve alone, for a window to pass); a stop or the deadline ends it early."""
        end = time.monotonic() + seconds
        while True:
            self.check()
            rest = end - time.monotonic()
            if rest <= 0:
                return
            self.stop_ev.wait(min(rest, 0.1))

    def timeout(self, expected_s: float) -> float:
        """How long to wait for a step expected to take ``expected_s``: a stuck child must not eat the run."""
        return max(5.0, min(self.left() - self.est.teardown, max(30.0, 3.0 * expected_s)))

    def wait_for(self, proc: Proc, name: str, timeout_s: float) -> None:
        """Wait until ``proc`` has written its ``name`` file (a child announcing a stage); RuntimeError if it died or
        took longer than ``timeout_s``."""
        end = time.monotonic() + timeout_s
        path = proc.files[name]
        while not path.exists():
            self.check()
            if not proc.alive():
                raise RuntimeError(f"{name}: {proc.why_dead()}")
            if time.monotonic() > end:
                raise RuntimeError(f"{proc.tag} not {name} after {timeout_s:.0f} s")
            self.stop_ev.wait(0.02)  # polling a child's stage file

    # -- the file --
    def write(self) -> None:
        with self._lock:
            self.doc["results"] = self.results()
            write_json_atomic(self.out_dir / REPORT_FILE, self.doc)

    def results(self) -> dict[str, Any]:
        p = self.p
        for w, raw in zip(self.windows, self.raw):
            if raw.get("start") is None or raw.get("end") is None:
                continue
            reqs = [(r[0], r[1]) for r in raw["requests"].read() if len(r) == 2]
            its = [r[0] for r in raw["iterations"].read() if r] if raw.get("iterations") else []
            w.update(window_figures(reqs, raw["before"], raw.get("after"), raw["start"], raw["end"], p.allowance,
                                    its, self.solo_rate))
            ev = raw.get("evicted_at")
            if ev is not None and ev < raw["end"]:  # the service once the job was stopped, to the window's end
                after = latency_stats([lat for arr, lat in reqs if ev <= arr < raw["end"]])
                w["after_eviction"] = {**after, "slowdown_p99": _ratio(after["p99_ms"], w["solo"]["p99_ms"])}
        setups: dict[str, Any] = {}
        means: dict[str, dict[str, Any]] = {}
        for s in SETUPS:
            mine = [w for w in self.windows if w["setup"] == s.key]
            status = self.status.get(s.key, "not run")
            entry = {"name": s.name, "configures": s.configures, "status": status,
                     "windows": mine, "summary": summarize_setup(mine)}
            setups[s.key] = entry
            if entry["summary"]["windows"]:
                means[s.key] = {"p99": entry["summary"]["slowdown_p99"]["mean"],
                                "tput": entry["summary"]["norm_tput"]["mean"]}
        return {
            "simulated": p.simulate,
            "parameters": {
                "service": p.service, "job": p.job, "size": p.size, "device": p.device, "qps": p.qps,
                "max_batch": p.max_batch, "share_pct": p.share, "mem_quota": p.mem_quota,
                "mem_quota_bytes": self.mem_bytes, "target_util": p.target_util if p.target_util is not None else 0.9,
                "gains": p.gains, "window_s": p.window_s, "baseline_s": p.baseline_s, "reps": p.reps,
                "allowance": p.allowance,
                **({"simulated_gpu_type": p.gpu_type, "simulated_load": p.sim_load} if p.simulate else {}),
            },
            "availability": dict(self.available),
            "solo_job": self.solo,
            "setups": setups,
            "setups_summary": {k: _headline(e) for k, e in setups.items()},
            "tally_bar": {"source": "Tally (ASPLOS'25): co-located inference within +7.2 % p99",
                          "p99_slowdown_max": TALLY_P99_SLOWDOWN, "norm_tput_min": MIN_TPUT,
                          "met_by": [k for k, e in setups.items() if e["summary"]["meets_tally_bar"]]},
            "recommended": recommend(means),
            "plan": self.plan_text,
        }

    # -- probing --
    def probe(self) -> None:
        p = self.p
        if p.simulate:
            for c in COMPONENTS:
                self.available[c] = NO_GPU
            return
        import pynvml

        self.gpu_index = _visible_index(pynvml)
        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(self.gpu_index)
            u = pynvml.nvmlDeviceGetUUID(h)
            self.gpu_uuid = u.decode() if isinstance(u, bytes) else str(u)
            total = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
        finally:
            pynvml.nvmlShutdown()
        try:
            from executors.node.gpu_type import gpu_identity

            self.doc["gpu"] = gpu_identity(index=self.gpu_index)
        except Exception as exc:  # the identity helper missing or failing: the run goes on without it
            self.doc["errors"].append(f"GPU identity unavailable: {type(exc).__name__}: {exc}")
        self.mem_bytes = _quota_bytes(p.mem_quota, total)
        self.available["mps"] = "ok" if shutil.which("nvidia-cuda-mps-control") else \
            "not available: nvidia-cuda-mps-control not found"
        self.available["priority"] = self.available["mps"]
        self.available["xcuda"] = self._xcuda()
        self.available["static"] = self._static_probe() if self.available["mps"] == "ok" else \
            f"unsupported: {self.available['mps']}"
        self.doc["method"] = "mps" if self.available["mps"] == "ok" else "no-mps"
        if Path("/tmp/nvidia-mps/control").exists():
            self.doc["errors"].append("an MPS control daemon answers at /tmp/nvidia-mps: the time-slicing set-up's "
                                      "processes (no pipe directory of their own) may be its clients")

    def _xcuda(self) -> str:
        from executors.node.xcuda.build import Artifacts, BuildError, build

        lib = Artifacts.at().test_library  # the environment as the plan: see task_env
        if not lib.exists():
            try:
                lib = build(timeout_s=max(10.0, min(120.0, self.left() / 4))).test_library
            except (BuildError, OSError, subprocess.TimeoutExpired) as exc:
                return f"not available: libxcuda.so not built ({str(exc).splitlines()[0] if str(exc) else exc})"
        self.xcuda_lib = lib
        try:
            base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
            self.record_dir = Path(tempfile.mkdtemp(prefix="muxflow-protection-", dir=base))
            shm.check_record_dir(self.record_dir)
        except (OSError, shm.RecordPathError) as exc:
            return f"not available: no directory for the GPU record ({exc})"
        return "ok"

    def _static_probe(self) -> str:
        d = MpsDaemon(self.mps_dir("static-probe"), static=True)
        err = d.start()
        if err:
            return f"unsupported: {err}"
        try:
            r = d.ctl("lspart")
            if parse_lspart(r["out"]) is None:
                return f"unsupported: lspart answered {r['out'][:200]!r} (rc {r['rc']})"
            return "ok"
        finally:
            d.stop()

    # -- planning --
    def plan(self) -> list[Block]:
        """The blocks to run: set-ups grouped by the daemon they need, repetitions rotating the order; the
        time-slicing block split in two, before and after the others."""
        runnable, status = select_setups(self.available)
        self.status.update(status)

        def kind(s: Setup) -> str:
            if s.static and self.available.get("static") == "ok":
                return "static"
            return "mps" if s.mps and self.available.get("mps") == "ok" else "plain"

        groups: dict[str, list[Setup]] = {}
        for s in runnable:
            groups.setdefault(kind(s), []).append(s)

        def rotated(ss: list[Setup], reps: Iterable[int]) -> list[Item]:
            out = []
            for r in reps:
                k = r % len(ss)
                out.extend(Item(s, r, i) for i, s in enumerate(ss[k:] + ss[:k]))
            return out

        reps = self.p.reps
        first = (reps + 1) // 2
        blocks = []
        if "plain" in groups:
            blocks.append(Block("plain", rotated(groups["plain"], range(first)), "plain-1"))
        for k in ("mps", "static"):
            if k in groups:
                blocks.append(Block(k, rotated(groups[k], range(reps)), k))
        if "plain" in groups and reps > first:
            blocks.append(Block("plain", rotated(groups["plain"], range(first, reps)), "plain-2"))
        self.plan_text = [f"{b.name}: " + " ".join(f"{it.setup.key}{it.rep}" for it in b.items) for b in blocks]
        return blocks

    # -- environments --
    def job_env(self, s: Setup, daemon: MpsDaemon | None, partition: str | None, stats_dir: Path) -> dict[str, str]:
        env = _base_env()
        if daemon is not None and daemon.static:
            env.update(daemon.env)
            env["CUDA_MPS_SM_PARTITION"] = partition or ""
        elif daemon is not None:
            lib = self.xcuda_lib if s.xcuda and self.available.get("xcuda") == "ok" else None
            record = self.record_path if lib is not None else None
            env.update(task_env(self.gpu_index, self.p.share, daemon.env, lib, self.mem_bytes, record, stats_dir,
                                self.p.gains))
        elif s.xcuda and self.available.get("xcuda") == "ok":  # xCUDA on a GPU without MPS
            env.update({k: v for k, v in task_env(self.gpu_index, self.p.share, {}, self.xcuda_lib, self.mem_bytes,
                                                  self.record_path, stats_dir, self.p.gains).items()
                        if k.startswith(("XCUDA_", "LD_PRELOAD"))})
        if s.priority and self.available.get("priority") == "ok" and daemon is not None:
            env["CUDA_MPS_CLIENT_PRIORITY"] = "1"
        return env

    def mps_dir(self, name: str) -> Path:
        """A daemon's pipe and log directories: under a short temporary path (the control socket's path must fit
        a Unix socket address, which the part's own directory may not)."""
        if self.mps_root is None:
            self.mps_root = Path(tempfile.mkdtemp(prefix="mxf-mps-"))
        return self.mps_root / name

    @property
    def record_path(self) -> Path | None:
        return None if self.record_dir is None else self.record_dir / f"muxflow-gpu-{self.gpu_index}"

    def spawn_job(self, tag: str, env: dict[str, str]) -> Proc:
        p = self.p
        proc = Proc("job", tag, self.work, env, ["--family", p.job, "--size", p.size, "--device", p.device,
                                                 "--seed", str(p.seed), "--warmup", str(p.warmup)])
        self.procs.append(proc)
        return proc

    def start_job(self, proc: Proc) -> None:
        """Through the first gate: wait for its imports, release it to make its context and warm up, wait for it."""
        self.wait_for(proc, "imported", self.timeout(self.est.job_start))
        t = time.monotonic()
        proc.signal(GATE)
        self.wait_for(proc, "ready", self.timeout(self.est.init))
        self.est.saw("init", time.monotonic() - t)

    def stop_proc(self, proc: Proc) -> int:
        t = time.monotonic()
        rc = proc.stop(grace_s=15.0 if not self.p.simulate else 5.0)
        self.est.saw("stop", time.monotonic() - t)
        return rc

    # -- the agent --
    def agent_for(self, s: Setup, on_evict: Callable[[int, str], list[int]]) -> AgentRun:
        p = self.p
        if p.simulate:
            sampler = self._simulated_sampler()
        else:
            from executors.node.sampler import NvmlSampler

            sampler = NvmlSampler([self.gpu_index])
        record = self.record_path if s.xcuda and self.available.get("xcuda") == "ok" else None
        keep = self.p.window_s + self.est.init + 120.0
        return AgentRun(sampler, self.gpu_index, record, p.target_util or 0.0, on_evict, self.placements, keep)

    def _simulated_sampler(self):
        from executors.data.calibration import default_catalog
        from executors.node.sampler import SimulatedSampler
        from executors.node.simgpu import Replica, SimulatedGpu
        from scheduler_core.gpu_specs import get_spec
        from scheduler_core.interference.gpu_model import OnlineModel
        from scheduler_core.online.load import capacity_qps
        from scheduler_core.workloads import ONLINE_FAMILIES

        catalog = default_catalog()
        spec = get_spec(self.p.gpu_type)
        fam = ONLINE_FAMILIES[self.p.service]
        model = OnlineModel.of(fam, catalog.online[fam.name], spec)
        qps = self.p.sim_load * capacity_qps(fam, spec)
        rep = Replica("reference", fam.name, float(fam.mem_bytes), qps, qps, 0.0)
        gpu = SimulatedGpu(self.gpu_index, spec, model, rep, self.placements, lambda _t: qps,
                           seed=self.p.seed + len(self.windows), xcuda_target_util=None)
        return SimulatedSampler(models={self.gpu_index: gpu})

    def _placed(self, s: Setup, started: float) -> OfflineOnGpu:
        traits = None
        if self.p.simulate:
            from executors.data.calibration import default_catalog
            from scheduler_core.interference.gpu_model import offline_traits

            traits = offline_traits(workload_size(self.p.job, "gpu").job_type, default_catalog())
        pct = self.p.share if (s.mps or s.static) and self.available.get("mps") == "ok" else 100
        return OfflineOnGpu(JOB_ID, None, pct, int(self.mem_bytes or 0), traits, started)

    # -- running --
    def run(self) -> dict[str, Any]:
        try:
            self.work.mkdir(parents=True, exist_ok=True)
            self.probe()
            blocks = self.plan()
            self.write()
            self.solo_job()
            for b in blocks:
                if self.cut:
                    break
                self.run_block(b)
        except Stopped as exc:
            self.cut = self.cut or str(exc)
        except Exception as exc:  # a failure of the experiment itself: recorded, the file still written
            log.exception("protection experiment failed")
            self.doc["errors"].append(f"{type(exc).__name__}: {exc}")
            self.cut = self.cut or f"failed: {exc}"
        finally:
            self.teardown()
        for s in SETUPS:
            st = self.status.get(s.key, "")
            if st.startswith("planned"):
                ran = any(w["setup"] == s.key and w.get("slowdown_p99") is not None for w in self.windows)
                failed = "; ".join(self.failures.get(s.key, []))
                if ran:
                    self.status[s.key] = "ran" + st[len("planned"):] + (f"; failed: {failed}" if failed else "")
                else:
                    self.status[s.key] = f"failed: {failed}" if failed else "not run: " + (self.cut or "no window")
        self.doc["complete"] = self.cut is None
        self.doc["why_incomplete"] = self.cut
        self.doc["ended"] = _iso(time.time())
        self.write()
        return self.doc

    def need(self, what: str) -> bool:
        """Whether ``what`` fits the time left, else the run is cut (it says why)."""
        e, p = self.est, self.p
        item = self.settle_s + p.baseline_s + e.init + p.window_s + e.stop
        cost = {"solo": e.job_start + e.init + 1.5 * p.window_s + e.stop,
                "block": e.service_start + item + p.baseline_s,
                "item": item + p.baseline_s}[what]
        left = self.left() - e.teardown
        if left >= cost:
            return True
        self.cut = f"deadline: {what} needs ~{cost:.0f} s, {max(0.0, left):.0f} s left"
        return False

    def solo_job(self) -> None:
        if not self.need("solo"):
            return
        proc = self.spawn_job("solo-job", _base_env())
        try:
            self.wait_for(proc, "imported", self.timeout(self.est.job_start))
            self.est.saw("job_start", time.monotonic() - proc.spawned)
            self.start_job(proc)
            t = time.time()
            proc.signal(GATE)
            span = 1.5 * self.p.window_s  # longer than a window: the reference every window is divided by
            self.sleep(span)
            end = time.time()
            its = [r[0] for r in proc.lines.read() if r]
            done = sum(1 for x in its if t <= x < end)
            self.solo_rate = done / (end - t) if done else None
            self.solo = {"iterations": done, "seconds": end - t, "rate_per_s": finite_or_none(self.solo_rate or 0.0),
                         "iteration_s": finite_or_none((end - t) / done) if done else None}
        except RuntimeError as exc:
            self.solo = {"error": str(exc)}
            self.doc["errors"].append(f"solo job: {exc}")
        finally:
            self.stop_proc(proc)
        self.write()

    def run_block(self, b: Block) -> None:
        if not self.need("block"):
            return
        p = self.p
        daemon: MpsDaemon | None = None
        svc_partition = job_partition = None
        if b.kind in ("mps", "static"):
            daemon = MpsDaemon(self.mps_dir(b.name), static=b.kind == "static")
            err = daemon.start()
            if err:
                self._block_failed(b, f"MPS control daemon: {err}")
                return
            self.daemons.append(daemon)
            if b.kind == "static":
                try:
                    job_partition, svc_partition = self._partitions(daemon)
                except RuntimeError as exc:
                    self._block_failed(b, f"unsupported: {exc}")
                    daemon.stop()
                    self.daemons.remove(daemon)
                    return
        env = _base_env()
        if daemon is not None:
            env.update(daemon.env)
            if svc_partition:
                env["CUDA_MPS_SM_PARTITION"] = svc_partition
        t = time.monotonic()
        service = Proc("serve", f"service-{b.name}", self.work, env,
                       ["--family", p.service, "--size", p.size, "--device", p.device, "--qps", repr(p.qps),
                        "--max-batch", str(p.max_batch), "--seed", str(p.seed)])
        self.procs.append(service)
        stats_root = self.work / "xcuda-stats"
        stats_root.mkdir(mode=0o700, exist_ok=True)
        jobs: dict[int, Proc] = {}

        def job_of(i: int) -> Proc:
            if i not in jobs:
                it = b.items[i]
                self._stats_n += 1
                stats = stats_root / str(self._stats_n)  # the job's own directory (as the Prolog makes it)
                stats.mkdir(mode=0o700, exist_ok=True)
                proc = self.spawn_job(f"job-{b.name}-{i}-{it.setup.key}{it.rep}",
                                      self.job_env(it.setup, daemon, job_partition, stats))
                proc.stats_dir = stats
                jobs[i] = proc
            return jobs[i]

        last: dict[str, Any] | None = None   # the previous window's raw record: the next baseline is its "after"
        try:
            job_of(0)  # its imports overlap the service's start
            try:
                self.wait_for(service, "ready", self.timeout(self.est.service_start))
            except RuntimeError as exc:
                self._block_failed(b, f"service: {exc}")
                return
            self.est.saw("service_start", time.monotonic() - t)
            for i, it in enumerate(b.items):
                if not self.need("item"):
                    break
                if not service.alive():
                    self._block_failed(b, f"service: {service.why_dead()}")
                    break
                job = job_of(i)
                try:  # its imports (CPU) done before the service's solo baseline
                    self.wait_for(job, "imported", self.timeout(self.est.job_start))
                except RuntimeError as exc:
                    self._new_window(b, it, (None, None))[0]["error"] = str(exc)
                    self.doc["errors"].append(f"window {it.setup.key}{it.rep}: {exc}")
                    continue
                before = self.baseline()
                if last is not None:
                    last["after"] = before
                    self.write()
                last = self.window(b, it, job, daemon, service, before,
                                   (lambda k=i + 1: job_of(k) if k < len(b.items) else None))
                self.write()
            if last is not None and service.alive():
                last["after"] = self.baseline()
        except Stopped as exc:
            self.cut = self.cut or str(exc)
        finally:
            for proc in jobs.values():
                proc.stop(grace_s=5.0)
            service.stop(grace_s=10.0)
            if daemon is not None:
                daemon.stop()
                self.daemons.remove(daemon)
            self.write()

    def _block_failed(self, b: Block, why: str) -> None:
        log.error("block %s: %s", b.name, why)
        self.doc["errors"].append(f"block {b.name}: {why}")
        for s in {it.setup.key for it in b.items}:
            self.failures.setdefault(s, []).append(f"block {b.name}: {why}")
            if b.kind == "static":
                self.available["static"] = why if why.startswith("unsupported") else f"unsupported: {why}"

    def _partitions(self, daemon: MpsDaemon) -> tuple[str, str]:
        r = daemon.ctl("lspart")
        chunks = parse_lspart(r["out"])
        if chunks is None:
            raise RuntimeError(f"lspart answered {r['out'][:200]!r}")
        total = sum(chunks)
        mine = max(1, round(self.p.share / 100.0 * total))
        if total - mine < 1:
            raise RuntimeError(f"{total} chunks: none left for the service at {self.p.share} %")
        got = []
        for n in (mine, total - mine):
            a = daemon.ctl(f"sm_partition add {self.gpu_uuid} {n}")
            pid = parse_partition(a["out"])
            if pid is None:
                raise RuntimeError(f"sm_partition add answered {a['out'][:200]!r}")
            got.append(pid)
        self.partitions = {"chunks": total, "job_chunks": mine, "job": got[0], "service": got[1]}
        return got[0], got[1]

    def baseline(self) -> tuple[float, float]:
        self.sleep(self.settle_s)
        t = time.time()
        self.sleep(self.p.baseline_s)
        return t, time.time()

    def window(self, b: Block, it: Item, job: Proc, daemon: MpsDaemon | None, service: Proc,
               before: tuple[float, float], prespawn: Callable[[], Proc | None]) -> dict[str, Any]:
        """One co-located window: the Prolog's caps, the agent, the job through its gates, ``window_s`` together,
        the job stopped; its raw record (the figures are derived from it at every write)."""
        s = it.setup
        rec, raw = self._new_window(b, it, (service.lines, before))
        state: dict[str, Any] = {"job": job, "evicted_at": None, "reason": None, "would": [], "evicts": s.evicts}
        with self._ev_lock:
            self.current = state
        if daemon is not None and not daemon.static:
            rec["mps"] = prolog_caps(daemon, self.gpu_index, self.p.share, self.mem_bytes)
            if s.priority:
                rec["mps"].append(daemon.ctl("set_default_client_priority 1"))
        if b.kind == "static":
            rec["partitions"] = self.partitions
        agent: AgentRun | None = None
        rc = None
        try:
            try:
                agent = self.agent_for(s, self._on_evict).start()
            except Exception as exc:  # NVML or the GPU record refused: this window cannot run
                raise RuntimeError(f"node agent: {type(exc).__name__}: {exc}") from exc
            self.start_job(job)
            if not service.alive():
                raise RuntimeError(service.why_dead())
            t_go = time.time()
            self.placements.set(self.gpu_index, (self._placed(s, t_go),))
            job.signal(GATE)
            raw.update(start=t_go, iterations=job.lines)
            prespawn()
            self.sleep(self.p.window_s)
            t_end = time.time()
            raw["end"] = t_end
            rec["xcuda"] = self._xcuda_stats(job) if s.xcuda and self.available.get("xcuda") == "ok" else None
        except RuntimeError as exc:
            rec["error"] = str(exc)
            self.doc["errors"].append(f"window {s.key}{it.rep}: {exc}")
        finally:
            self.placements.set(self.gpu_index, ())
            with self._ev_lock:
                self.current = None
            if raw.get("start") is not None and raw.get("end") is None:  # cut short: no figures from it
                raw["start"] = None
                rec["error"] = rec["error"] or "window cut short"
            rc = self.stop_proc(job)
            if agent is not None:
                agent.stop()
            if daemon is not None and s.priority and not daemon.static:
                rec["mps"].append(daemon.ctl("set_default_client_priority 0"))
        if agent is not None and agent.error:
            rec["error"] = rec["error"] or f"node agent: {agent.error}"
            self.doc["errors"].append(f"window {s.key}{it.rep}: node agent: {agent.error}")
        t_go = raw.get("start")
        ev_at = raw["evicted_at"] = state["evicted_at"]
        rec["offline_exit"] = rc
        rec["eviction"] = {
            "evicts": s.evicts, "evicted": ev_at is not None,
            "at_s": None if ev_at is None or t_go is None else ev_at - t_go, "reason": state["reason"],
            "would_evict_at_s": [x - t_go for x, _ in state["would"]] if t_go is not None else [],
        }
        if t_go is not None and agent is not None:
            end = raw.get("end", time.time())
            rec["gpu"] = agent.gpu(t_go, end)
            rec["health"] = [[round(t - t_go, 3), st] for t, st in agent.states]
        return raw

    def _new_window(self, b: Block, it: Item, source: tuple) -> tuple[dict[str, Any], dict[str, Any]]:
        rec: dict[str, Any] = {"setup": it.setup.key, "rep": it.rep, "order": it.order, "block": b.name,
                               "error": None}
        raw: dict[str, Any] = {"requests": source[0], "before": source[1], "start": None}
        self.windows.append(rec)
        self.raw.append(raw)
        return rec, raw

    def _on_evict(self, gpu_id: int, reason: str) -> list[int]:
        """The agent's evictor (its sampling thread): the set-ups that evict stop the job as a requeue would
        (SIGTERM to its process group); the others record when SysMonitor would have."""
        now = time.time()
        with self._ev_lock:
            st = self.current
            if st is None:
                return []
            if not st["evicts"]:
                st["would"].append((now, reason))
                return []
            if st["evicted_at"] is not None:
                return []
            st["evicted_at"], st["reason"] = now, reason
            job: Proc = st["job"]
        try:
            os.killpg(job.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        self.placements.set(self.gpu_index, ())
        return [JOB_ID]

    def _xcuda_stats(self, job: Proc) -> dict[str, Any] | None:
        from executors.node.xcuda.stats import StatsRefused, job_stats

        d = job.stats_dir
        if d is None:
            return None
        try:
            got = job_stats(d.parent, int(d.name), os.getuid(), [job.pid])
        except StatsRefused as exc:
            return {"error": str(exc)}
        st = got.get(job.pid)
        if st is None:
            return {"error": "no counters published (xCUDA not loaded, or no CUDA call yet)"}
        out = dataclasses.asdict(st)
        out["rate"] = finite_or_none(out["rate"])
        return out

    def teardown(self) -> None:
        for proc in self.procs:
            try:
                proc.stop(grace_s=3.0)
            except Exception:
                log.exception("stopping %s failed", proc.tag)
        for d in list(self.daemons):
            d.stop()
        self.daemons.clear()
        for d in (self.record_dir, self.mps_root):
            if d is not None:
                shutil.rmtree(d, ignore_errors=True)


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).isoformat()


def _visible_index(pynvml) -> int:
    """The NVML index of the first GPU this process sees (``CUDA_VISIBLE_DEVICES``: an index or a UUID)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if not first:
        return 0
    if first.isdigit():
        return int(first)
    pynvml.nvmlInit()
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            if (u.decode() if isinstance(u, bytes) else str(u)).startswith(first):
                return i
    finally:
        pynvml.nvmlShutdown()
    return 0


def _quota_bytes(text: str, device_bytes: int) -> int:
    """``40%`` of the device, or a number of bytes."""
    t = text.strip()
    if t.endswith("%"):
        pct = float(t[:-1])
        if not 0 < pct <= 100:
            raise ValueError(f"mem-quota: a percentage within (0, 100], got {text!r}")
        return int(device_bytes * pct / 100.0)
    v = int(float(t))
    if v <= 0:
        raise ValueError(f"mem-quota: a positive number of bytes or a percentage, got {text!r}")
    return v


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (the part interface)
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _sim_gpu_default() -> str:
    from scheduler_core.gpu_specs import get_spec

    try:
        get_spec("h200")
        return "h200"
    except KeyError:
        return "h100"


def parse(argv: list[str] | None) -> tuple[Params, Path, float]:
    ap = _Parser(prog="python -m executors.node.profiling.protection", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for protection.json")
    ap.add_argument("--deadline", type=float, required=True, help="seconds of wall clock for the whole part")
    ap.add_argument("--simulate", action="store_true", help="no GPU: CPU workloads (size tiny), simulated metrics")
    ap.add_argument("--service", default="cnn", help="online reference family (cnn: ResNet-18)")
    ap.add_argument("--job", default="transformer", help="offline reference family")
    ap.add_argument("--size", default=None, help="workload size (default: gpu; tiny with --simulate)")
    ap.add_argument("--qps", type=float, default=None, help="service load (default 200 on a GPU, 40 simulated)")
    ap.add_argument("--max-batch", type=int, default=None, help="service's dynamic batching (default 8; 1 simulated)")
    ap.add_argument("--share", type=int, default=20, help="the plan's SM share of the job, %% (MPS)")
    ap.add_argument("--mem-quota", default="40%", help="the plan's memory quota of the job: bytes or %% of the GPU")
    ap.add_argument("--target-util", type=float, default=None,
                    help="xCUDA's target U_GPU written into the GPU record (default: the job's own, 0.9)")
    ap.add_argument("--kp", type=float, default=None)
    ap.add_argument("--ki", type=float, default=None)
    ap.add_argument("--kd", type=float, default=None)
    ap.add_argument("--window", type=float, default=None, help="co-located seconds per window (4; 1.5 simulated)")
    ap.add_argument("--baseline", type=float, default=None, help="solo service seconds (2; 0.8 simulated)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each set-up, where the deadline allows")
    ap.add_argument("--allowance", type=float, default=None,
                    help="the service's p99 allowance (default: the product's slowdown_allowance, 0.25)")
    ap.add_argument("--gpu-type", default=None, help="simulated GPU type (--simulate; default h200)")
    ap.add_argument("--sim-load", type=float, default=0.8, help="simulated service load, share of capacity")
    ap.add_argument("--warmup", type=int, default=2, help="job iterations before its release")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    sim = a.simulate
    try:
        if a.deadline <= 0:
            raise ValueError("deadline: a positive number of seconds")
        if a.service not in SERVICE_FAMILIES:
            raise ValueError(f"service: one of {', '.join(SERVICE_FAMILIES)}, got {a.service!r}")
        if a.job not in JOB_FAMILIES:
            raise ValueError(f"job: one of {', '.join(JOB_FAMILIES)}, got {a.job!r}")
        size = a.size or ("tiny" if sim else "gpu")
        workload_size(a.service, size)
        workload_size(a.job, size)
        if not 1 <= a.share <= 100:
            raise ValueError(f"share: a percentage within 1..100, got {a.share}")
        if a.reps < 1 or a.warmup < 1:
            raise ValueError("reps and warmup: at least 1")
        window = a.window if a.window is not None else (1.5 if sim else 4.0)
        baseline = a.baseline if a.baseline is not None else (0.8 if sim else 2.0)
        qps = a.qps if a.qps is not None else (40.0 if sim else 200.0)
        mb = a.max_batch if a.max_batch is not None else (1 if sim else 8)
        if window <= 0 or baseline <= 0 or qps <= 0 or mb < 1:
            raise ValueError("window, baseline and qps must be positive, max-batch at least 1")
        if a.target_util is not None and not 0 < a.target_util <= 2:
            raise ValueError(f"target-util: within (0, 2], got {a.target_util}")
        if not 0 < a.sim_load <= 1:
            raise ValueError(f"sim-load: within (0, 1], got {a.sim_load}")
        allowance = default_allowance() if a.allowance is None else a.allowance
        if allowance < 0:
            raise ValueError(f"allowance: >= 0, got {allowance}")
        _quota_bytes(a.mem_quota, 1 << 40)
        gpu_type = a.gpu_type or _sim_gpu_default()
        if sim:
            from scheduler_core.gpu_specs import get_spec
            from scheduler_core.workloads import ONLINE_FAMILIES

            get_spec(gpu_type)
            if a.service not in ONLINE_FAMILIES:
                raise ValueError(f"service {a.service!r}: the simulated GPU models {', '.join(ONLINE_FAMILIES)}")
    except (ValueError, KeyError) as exc:
        print(f"error: {exc.args[0] if isinstance(exc, KeyError) and exc.args else exc}", file=sys.stderr)
        raise SystemExit(2) from None
    p = Params(simulate=sim, service=a.service, job=a.job, size=size, device="cpu" if sim else "cuda", qps=qps,
               max_batch=mb, share=a.share, mem_quota=a.mem_quota, target_util=a.target_util,
               gains={"kp": a.kp, "ki": a.ki, "kd": a.kd}, window_s=window, baseline_s=baseline, reps=a.reps,
               allowance=allowance, gpu_type=gpu_type, sim_load=a.sim_load, warmup=a.warmup, seed=a.seed)
    return p, Path(a.out), a.deadline


def _process_age_s() -> float:
    """Seconds since this process started (its deadline counts from there, imports included); 0 if unknown."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def main(argv: list[str] | None = None) -> int:
    t0 = time.monotonic() - (_process_age_s() if argv is None else 0.0)
    p, out, deadline = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # The agent's loop logs every window's partial minute and what SysMonitor would evict; the file has both.
    logging.getLogger("executors.node.agent").setLevel(logging.ERROR)
    if not p.simulate:
        ok, why = nvml_available()
        if not ok:
            log.warning("no GPU (%s): running the simulated experiment", why)
            p = dataclasses.replace(p, simulate=True, size="tiny", device="cpu", qps=40.0, max_batch=1,
                                    window_s=1.5, baseline_s=0.8)
            note = f"no GPU ({why}): ran simulated"
        else:
            note = None
    else:
        note = None
    out.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _s, _f: stop.set())
    exp = Experiment(p, out, deadline, stop, t0=t0)
    if note:
        exp.doc["errors"].append(note)
    doc = exp.run()
    rec = doc["results"].get("recommended")
    print(f"protection ({doc['method']}): {len(exp.windows)} windows, complete {doc['complete']}"
          + (f", recommended {rec['setup']}" if rec else "") + (f"; {doc['why_incomplete']}" if doc["why_incomplete"]
                                                                else ""), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
