"""The co-location harness: one online reference service and one offline reference job on one GPU.

    python -m executors.node.profiling.colocate --run-dir DIR --gpu-type a10 --service cnn --qps 40 \\
        --job transformer --size gpu --sm 10,30,50,70,90 --window 30

Runs on a node with a whole GPU (a job on the profile partition, or by hand), in
this order, each for ``--window`` seconds of measurement (paper §6, §7.1):

1. the service alone at ``--qps`` (open-loop arrivals): its solo latency (avg, p99) and GPU metrics;
2. the job alone, in profiling mode: its solo iteration time and GPU metrics;
3. for each SM %: the service, and once it is warm the job with
   ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = SM % (under MPS). The job's measured
   window defines the point; the service's requests that arrived inside it give
   the co-located latency. Offline normalized throughput = solo iteration time ÷
   co-located iteration time; online slowdown = co-located ÷ solo latency (avg and p99).

Method: ``mps`` when the node has a GPU and a private MPS control daemon could be
started for the run; ``no-mps`` with a GPU but no MPS (time-slicing: the SM % is
not enforced); ``cpu`` without a GPU: both run on the CPU, one thread each — a
test of the harness, not a measurement of GPU interference (such samples never
train a predictor). The report goes to ``DIR/colocation.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from executors.job.runtime.profiling import ProfilingMode
from executors.job.runtime.timing import finite_or_none, percentile, write_json_atomic
from executors.job.workloads.models import workload_size
from executors.node.profiling.child import Child
from executors.node.profiling.metrics import (
    MetricsUnavailable,
    WindowRecorder,
    open_sampler,
    simulated_offline_iter_time_s,
    simulated_offline_model,
    simulated_online_model,
)
from executors.node.profiling.probe import read_json
from executors.node.sampler import nvml_available
from scheduler_core.gpu_specs import get_spec
from scheduler_core.online.load import capacity_qps
from scheduler_core.workloads import ONLINE_FAMILIES

log = logging.getLogger(__name__)
FORMAT = "muxflow-colocation-report/1"
REPORT_FILE = "colocation.json"


def latency_stats(latencies_s: list[float]) -> dict[str, Any]:
    xs = sorted(latencies_s)
    return {"requests": len(xs), "avg_ms": finite_or_none(1000 * sum(xs) / len(xs)) if xs else None,
            "p99_ms": finite_or_none(1000 * percentile(xs, 99)) if xs else None}


class Mps:
    """A private MPS control daemon for this run (its own pipe and log directories)."""

    def __init__(self, root: Path):
        self.pipe, self.log = root / "mps-pipe", root / "mps-log"
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe), "CUDA_MPS_LOG_DIRECTORY": str(self.log)}
        self.started = False

    def start(self) -> str | None:
        """None when started, else why not."""
        exe = shutil.which("nvidia-cuda-mps-control")
        if exe is None:
            return "nvidia-cuda-mps-control not found"
        self.pipe.mkdir(parents=True, exist_ok=True)
        self.log.mkdir(parents=True, exist_ok=True)
        out = subprocess.run([exe, "-d"], env={**os.environ, **self.env}, capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            return f"nvidia-cuda-mps-control -d failed: {(out.stderr or out.stdout).strip()}"
        self.started = True
        return None

    def stop(self) -> None:
        if self.started:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env={**os.environ, **self.env},
                           capture_output=True, text=True, timeout=60)
            self.started = False


class Harness:
    def __init__(self, run_dir: Path, *, gpu_type: str, service_family: str, qps: float, job_family: str,
                 size: str, window_s: float, python: str = sys.executable, device: str = "auto",
                 metrics: str = "auto", mps: str = "auto", seed: int = 0, startup_s: float = 180.0,
                 service_mem_bytes: float | None = None, stop: Callable[[], bool] = lambda: False):
        self.dir = run_dir
        self.gpu_type, self.service_family, self.qps = gpu_type, service_family, qps
        self.job_family, self.size, self.window_s = job_family, size, window_s
        self.job_type = workload_size(job_family, size).job_type
        workload_size(service_family, size)  # validates the family/size
        self.python, self.device, self.metrics, self.seed = python, device, metrics, seed
        self.startup_s = startup_s
        self.stop = stop
        from executors.data.calibration import default_catalog  # noqa: F401 (fails early without data)

        self.service_mem_bytes = service_mem_bytes or float(ONLINE_FAMILIES[service_family].mem_bytes)
        self.gpu, why = nvml_available()
        self.mps = Mps(run_dir)
        if not self.gpu:
            self.method, self.method_note = "cpu", f"no GPU ({why}): both workloads on the CPU, one thread each"
        elif mps == "off":
            self.method, self.method_note = "no-mps", "MPS turned off: the GPU time-slices; SM % not enforced"
        else:
            err = self.mps.start()
            self.method = "no-mps" if err else "mps"
            self.method_note = f"no MPS ({err}): SM % not enforced" if err else "private MPS control daemon"
        self.base_env = {**os.environ, **(self.mps.env if self.mps.started else {})}

    # -- commands -------------------------------------------------------------------------------
    def _serve(self, tag: str, duration_s: float) -> tuple[list[str], dict[str, Path]]:
        files = {k: self.dir / f"{tag}.{k}.json" for k in ("report", "requests", "ready")}
        for f in files.values():
            f.unlink(missing_ok=True)
        argv = [self.python, "-m", "executors.job.workloads.serve", "--family", self.service_family, "--size", self.size,
                "--qps", repr(self.qps), "--duration", repr(duration_s), "--seed", str(self.seed),
                "--device", self.device, "--report", str(files["report"]), "--requests", str(files["requests"]),
                "--ready", str(files["ready"])]
        return argv, files

    def _train(self, tag: str, sm_pct: int | None) -> tuple[list[str], dict[str, str], Path]:
        report = self.dir / f"{tag}.iteration.json"
        report.unlink(missing_ok=True)
        mode = ProfilingMode(max_iterations=10**9, max_seconds=self.window_s, warmup_iterations=2,
                             report_path=report)
        env = {**self.base_env, **mode.to_env()}
        if sm_pct is not None and self.method == "mps":
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(sm_pct)
        argv = [self.python, "-m", "executors.job.workloads.train", "--family", self.job_family, "--size", self.size,
                "--ckpt", str(self.dir / f"{tag}.ckpt"), "--steps", str(10**9), "--seed", str(self.seed),
                "--device", self.device]
        return argv, env, report

    def _recorder(self, model: Callable[[], Callable[[float], Any]]):
        try:
            opened = open_sampler(self.metrics, model)
        except MetricsUnavailable as exc:
            return None, str(exc), None
        rec = WindowRecorder(opened.sampler, opened.gpu_index, 0.05, max_s=self.window_s + self.startup_s + 60)
        return rec.start(), opened.note, opened.device

    @staticmethod
    def _window(rec, start, end, note) -> dict | None:
        if rec is None:
            return None
        try:
            return rec.window(start, end, note).as_dict()
        except MetricsUnavailable as exc:
            return {"error": str(exc)}

    def _wait(self, child: Child, deadline_s: float, what: str) -> int:
        rc = child.wait(deadline_s, self.stop)
        if rc is None:
            child.terminate()
            raise RuntimeError(f"{what}: {'stopped' if not child.killed_at_deadline else 'timed out'} after "
                               f"{child.elapsed_s:.0f} s; stderr: {child.stderr_tail()[-500:]}")
        if rc != 0:
            raise RuntimeError(f"{what}: exit code {rc}; stderr: {child.stderr_tail()[-500:]}")
        return rc

    # -- phases ----------------------------------------------------------------------------------
    def solo_service(self) -> dict[str, Any]:
        argv, files = self._serve("solo-service", self.window_s)
        load = self.load()
        rec, note, device = self._recorder(lambda: simulated_online_model(
            self.service_family, self.gpu_type, load, self.service_mem_bytes, self.seed))
        child = Child(argv, self.base_env)
        try:
            self._wait(child, self.window_s + self.startup_s, "solo service")
        finally:
            if rec is not None:
                rec.stop()
        rep = read_json(files["report"]) or {}
        return {"latency": rep, "metrics": self._window(rec, rep.get("window_start_unix"),
                                                        rep.get("window_end_unix"), note), "device": device}

    def solo_job(self) -> dict[str, Any]:
        argv, env, report = self._train("solo-job", None)
        rec, note, device = self._recorder(lambda: simulated_offline_model(self.job_type, self.gpu_type, self.seed))
        child = Child(argv, env)
        try:
            self._wait(child, self.window_s + self.startup_s, "solo job")
        finally:
            if rec is not None:
                rec.stop()
        it = read_json(report) or {}
        out = {"iterations": it, "metrics": self._window(rec, it.get("window_start_unix"), it.get("window_end_unix"),
                                                          note), "device": device}
        if rec is not None and rec.sampler.source == "simulated":
            out["model_iter_time_s"] = simulated_offline_iter_time_s(self.job_type, self.gpu_type)
        return out

    def point(self, sm_pct: int) -> dict[str, Any]:
        tag = f"sm{sm_pct}"
        s_argv, files = self._serve(tag, self.window_s + 2 * self.startup_s)
        service = Child(s_argv, self.base_env)
        try:
            end = time.monotonic() + self.startup_s
            while not files["ready"].exists():  # the service is warm before the job starts
                if service.proc.poll() is not None or time.monotonic() > end or self.stop():
                    raise RuntimeError(f"service did not become ready; stderr: {service.stderr_tail()[-500:]}")
                time.sleep(0.05)
            t_argv, env, report = self._train(tag, sm_pct)
            self._wait(Child(t_argv, env), self.window_s + self.startup_s, f"job at {sm_pct}%")
        finally:
            service.terminate(grace_s=30.0)  # SIGTERM: it stops after the batch in progress and writes its files
        it = read_json(report) or {}
        start, stop = it.get("window_start_unix"), it.get("window_end_unix")
        reqs = json.loads(files["requests"].read_text()) if files["requests"].exists() else []
        inside = [lat for arr, lat in reqs if start is not None and start <= arr <= stop]
        return {"sm_pct": sm_pct, "iterations": it, "latency": latency_stats(inside),
                "requests_total": len(reqs)}

    def load(self) -> float:
        """The service's load (share of its family's capacity on this GPU type) for the simulated model."""
        cap = capacity_qps(ONLINE_FAMILIES[self.service_family], get_spec(self.gpu_type))
        return min(1.0, max(0.05, self.qps / cap))

    def run(self, sm_pcts: list[int]) -> dict[str, Any]:
        t0 = time.monotonic()
        report: dict[str, Any] = {
            "format": FORMAT, "method": self.method, "method_note": self.method_note, "gpu_type": self.gpu_type,
            "service_family": self.service_family, "qps": self.qps, "job_family": self.job_family,
            "job_type": self.job_type, "size": self.size, "window_s": self.window_s, "sm_pcts": sm_pcts,
            "started_unix": time.time(), "points": [],
        }
        try:
            report["solo_service"] = self.solo_service()
            report["solo_job"] = self.solo_job()
            report["device"] = report["solo_job"].get("device")
            solo_it = report["solo_job"]["iterations"].get("mean_s")
            solo_lat = report["solo_service"]["latency"]
            for sm in sm_pcts:
                if self.stop():
                    break
                try:
                    p = self.point(sm)
                except RuntimeError as exc:
                    report["points"].append({"sm_pct": sm, "error": str(exc)})
                    continue
                mean = p["iterations"].get("mean_s")
                lat = p["latency"]
                p["norm_tput"] = (solo_it / mean) if solo_it and mean else None
                p["slowdown_avg"] = (lat["avg_ms"] / solo_lat["avg_ms"]) if lat["avg_ms"] and solo_lat.get(
                    "avg_ms") else None
                p["slowdown_p99"] = (lat["p99_ms"] / solo_lat["p99_ms"]) if lat["p99_ms"] and solo_lat.get(
                    "p99_ms") else None
                if p["norm_tput"] is None or p["slowdown_avg"] is None:
                    p["error"] = "no co-located window (no job iterations or no request inside it)"
                report["points"].append(p)
        except RuntimeError as exc:
            report["error"] = str(exc)
        finally:
            self.mps.stop()
        report["elapsed_s"] = time.monotonic() - t0
        report["ended_unix"] = time.time()
        write_json_atomic(self.dir / REPORT_FILE, report)
        return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m executors.node.profiling.colocate", description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--gpu-type", required=True)
    ap.add_argument("--service", required=True, help="online reference family: cnn | transformer | recommender")
    ap.add_argument("--qps", type=float, required=True)
    ap.add_argument("--job", required=True, help="offline reference family")
    ap.add_argument("--size", default="gpu")
    ap.add_argument("--sm", default="10,30,50,70,90", help="comma-separated SM percentages")
    ap.add_argument("--window", type=float, default=30.0, help="seconds of each measurement")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--metrics", choices=("auto", "nvml", "simulated"), default="auto")
    ap.add_argument("--mps", choices=("auto", "off"), default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--startup", type=float, default=180.0, help="seconds allowed for a process to start")
    ap.add_argument("--service-mem", type=float, default=None, help="the service's memory (bytes), simulated model")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        sms = [int(x) for x in a.sm.split(",") if x.strip()]
        if not sms or any(not 1 <= x <= 100 for x in sms):
            raise ValueError(f"sm: percentages within 1..100, got {a.sm!r}")
        if a.qps <= 0 or a.window <= 0:
            raise ValueError("qps and window must be positive")
        stop: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _f: stop.append(signum))
        h = Harness(Path(a.run_dir), gpu_type=a.gpu_type, service_family=a.service, qps=a.qps, job_family=a.job,
                    size=a.size, window_s=a.window, device=a.device, metrics=a.metrics, mps=a.mps, seed=a.seed,
                    startup_s=a.startup, service_mem_bytes=a.service_mem, stop=lambda: bool(stop))
    except (ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    Path(a.run_dir).mkdir(parents=True, exist_ok=True)
    rep = h.run(sms)
    ok = [p for p in rep["points"] if not p.get("error")]
    print(f"colocation ({rep['method']}): {len(ok)}/{len(sms)} points"
          + (f"; error: {rep['error']}" if rep.get("error") else ""), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
