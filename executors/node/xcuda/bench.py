"""xCUDA's overhead per intercepted call, measured on the fake driver (no GPU).

Runs ``build/xcuda_bench`` alternately without ``LD_PRELOAD=libxcuda.so``, with it, and with it publishing its
counters for the node agent (``XCUDA_STATS_DIR``); the added latency of a round is preloaded minus plain (and
publishing minus not), per statistic, and the median round is reported. Pacing reads a low-load GPU record, so
the gate is open and the figure is the interception cost itself, not a pacing delay.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from executors.machine import describe
from executors.node.xcuda.build import Artifacts, build
from executors.node.xcuda.shm import GpuSample, ShmWriter
from executors.node.xcuda.stats import decode

LOW_LOAD = GpuSample(u_sm=0.05, sm_clock_mhz=1590.0, clock_threshold_mhz=1290.0, clock_max_mhz=1590.0)
TARGET_ADDED_LAUNCH_MEDIAN_NS = 100.0
STATS = ("median_ns", "p99_ns", "mean_ns")


def _run(artifacts: Artifacts, calls: int, env: dict[str, str], preload: bool, timeout_s: float) -> dict[str, Any]:
    run_env = dict(env)
    if preload:
        # The test library: the benchmark sets its own record and quota through the environment (same code)
        run_env["LD_PRELOAD"] = str(artifacts.test_library)
        run_env["XCUDA_TEST_ENV_CONFIG"] = "1"
    proc = subprocess.run([str(artifacts.bench), str(calls)], env=run_env, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"xcuda_bench failed ({proc.returncode}): {proc.stderr[-2000:]}")
    result = json.loads(proc.stdout)
    if result["preloaded"] != preload:
        raise RuntimeError(f"xcuda_bench: expected preloaded={preload}, got {result['preloaded']}")
    result["stderr"] = proc.stderr
    return result


def run_overhead_bench(calls: int = 1_000_000, rounds: int = 3, timeout_s: float = 600.0) -> dict[str, Any]:
    """The figures ``muxflow bench xcuda`` prints (see the module docstring)."""
    artifacts = build()
    with tempfile.TemporaryDirectory(prefix="xcuda-bench-") as tmp:
        record = Path(tmp) / "gpu-record"
        with ShmWriter(record) as w:
            w.write(LOW_LOAD)
        env = {k: v for k, v in os.environ.items() if not k.startswith("XCUDA_") and k != "LD_PRELOAD"}
        env.update(LD_LIBRARY_PATH=str(artifacts.fake_dir), XCUDA_SHM_PATH=str(record),
                   XCUDA_SHM_STALE_MS="3600000", XCUDA_MEM_QUOTA_BYTES="none", XCUDA_LOG_LEVEL="info")
        stats_dir = Path(tmp) / "stats"
        stats_dir.mkdir()
        published_env = {**env, "XCUDA_STATS_DIR": str(stats_dir)}
        plain_runs, xcuda_runs, published_runs = [], [], []
        for _ in range(rounds):
            plain_runs.append(_run(artifacts, calls, env, False, timeout_s))
            xcuda_runs.append(_run(artifacts, calls, env, True, timeout_s))
            published_runs.append(_run(artifacts, calls, published_env, True, timeout_s))
        published = [decode(f.read_bytes()) for f in stats_dir.glob("xcuda-*.stats")]
    if not all("closed-loop pacing" in r["stderr"] for r in xcuda_runs + published_runs):
        raise RuntimeError("xCUDA did not use the low-load record: the figures would include pacing delays")
    if len(published) != rounds or not all(p.launches >= calls for p in published):
        raise RuntimeError(f"xCUDA did not publish its counters in every run: {published}")

    def summary(call: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for stat in STATS:
            plain = [r[call][stat] for r in plain_runs]
            hooked = [r[call][stat] for r in xcuda_runs]
            out[f"direct_{stat}"] = round(statistics.median(plain), 2)
            out[f"xcuda_{stat}"] = round(statistics.median(hooked), 2)
            out[f"added_{stat}"] = round(statistics.median(h - p for h, p in zip(hooked, plain)), 2)
        return out

    launch, alloc = summary("launch"), summary("alloc")
    # publishing the counters (XCUDA_STATS_DIR): the controller thread's work, never the launch path's
    for stat in STATS:
        pub = [r["launch"][stat] for r in published_runs]
        launch[f"published_{stat}"] = round(statistics.median(pub), 2)
        launch[f"added_by_publishing_{stat}"] = round(statistics.median(
            p - h["launch"][stat] for p, h in zip(pub, xcuda_runs)), 2)
    return {
        "benchmark": "xcuda interception overhead",
        "driver": "fake libcuda.so.1 (tests), no GPU: the driver's own cost is not in these figures",
        "machine": describe(),
        "calls_per_run": calls,
        "rounds": rounds,
        "path": "pointers from cuGetProcAddress, as the CUDA runtime uses them",
        "pacing": "closed loop on a low-load GPU record: gate open",
        "timer_median_ns": round(statistics.median(r["timer"]["median_ns"] for r in plain_runs), 2),
        "cuLaunchKernel": launch,
        "cuMemAlloc_v2": alloc,
        "target_added_launch_median_ns": TARGET_ADDED_LAUNCH_MEDIAN_NS,
        "meets_target": launch["added_median_ns"] <= TARGET_ADDED_LAUNCH_MEDIAN_NS,
    }
