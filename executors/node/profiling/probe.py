"""The solo-profiling wrapper that runs on a profile node, around a copy of the job's script.

    python -m executors.node.profiling.probe --run-dir DIR --job-type T --gpu-type G|auto [--mem-bytes B] \\
        [--metrics auto|nvml|simulated] [--iters 20] [--seconds 120] [--warmup 2] [--deadline 570] -- job.sh

It starts the job in profiling mode (``MUXFLOW_PROFILE_*``: a dry run that
stops after N iterations or T seconds and writes ``DIR/iteration.json``),
samples the GPU the job sees while it runs (:mod:`executors.node.profiling.metrics`),
stops the job if it is still running at ``--deadline`` seconds, and writes
``DIR/probe.json``: the child's exit, the iteration report, the GPU metrics of
the measured iterations' window and the end of the child's stderr. ``--gpu-type auto``
is the type of the node's first GPU by its NVML name (:mod:`executors.node.gpu_type`). What the
profile becomes, or why profiling failed, is decided by the controller
(:mod:`executors.scheduler.profiling.outcome`) from that file. SIGTERM (Slurm's time
limit, a cancel) stops the job and still writes the file.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any

from executors.job.runtime.profiling import ProfilingMode
from executors.job.runtime.timing import write_json_atomic
from executors.node.gpu_type import resolve_gpu_type
from executors.node.profiling.child import Child
from executors.node.profiling.metrics import (
    MetricsUnavailable,
    WindowRecorder,
    open_sampler,
    simulated_job_model,
    simulated_offline_iter_time_s,
    simulated_offline_model,
)

log = logging.getLogger(__name__)
FORMAT = "muxflow-probe-report/1"
PROBE_FILE = "probe.json"
ITERATION_FILE = "iteration.json"


def read_json(path: Path, owner: int | None = None, max_bytes: int = 16 << 20) -> dict[str, Any] | None:
    """A JSON object from ``path``, or None. With ``owner``: only from a regular file (not a link) that uid owns, so a
    report another user planted in a shared run directory is never read as the run's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        if owner is not None and st.st_uid != owner:
            log.warning("%s is owned by uid %d, not %d: not read", path, st.st_uid, owner)
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            data = json.loads(f.read(max_bytes).decode("utf-8"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def run_probe(run_dir: Path, command: list[str], *, job_type: str, gpu_type: str, metrics: str = "auto",
              iterations: int = 20, seconds: float = 120.0, warmup: int = 2, deadline_s: float = 570.0,
              seed: int = 0, interval_s: float = 0.05, cwd: str | None = None, mem_bytes: float | None = None,
              stop: Any = lambda: False) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    iteration_path = run_dir / ITERATION_FILE
    iteration_path.unlink(missing_ok=True)
    mode = ProfilingMode(max_iterations=iterations, max_seconds=seconds, warmup_iterations=warmup,
                         report_path=iteration_path)
    env = {**os.environ, **mode.to_env(), "MUXFLOW_CHECKPOINT_DIR": str(run_dir / "ckpt"),
           "MUXFLOW_PROFILING_RUN": str(run_dir)}
    report: dict[str, Any] = {"format": FORMAT, "job_type": job_type, "gpu_type": gpu_type, "command": command,
                              "host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
                              "deadline_s": deadline_s, "started_unix": time.time()}
    recorder = None
    model_iter_time_s = None
    try:
        opened = open_sampler(metrics, lambda: simulated_offline_model(job_type, gpu_type, seed, mem_bytes))
        recorder = WindowRecorder(opened.sampler, opened.gpu_index, interval_s, max_s=deadline_s + 60).start()
        report["metrics_note"], report["device"] = opened.note, opened.device
        if opened.sampler.source == "simulated":
            model = simulated_job_model(job_type, mem_bytes)
            report["metrics_model"], report["metrics_generic"] = model.note, model.generic
            model_iter_time_s = simulated_offline_iter_time_s(job_type, gpu_type, mem_bytes)
    except (MetricsUnavailable, KeyError, ValueError) as exc:
        report["metrics_error"] = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
    try:
        child = Child(command, env, cwd=cwd)
    except OSError as exc:
        if recorder is not None:
            recorder.stop()
        report.update(exit_code=None, start_error=f"cannot start {command[0]}: {exc}", elapsed_s=0.0)
        write_json_atomic(run_dir / PROBE_FILE, report)
        return report
    rc = child.wait(deadline_s, stop)
    terminated = rc is None and not child.killed_at_deadline
    if rc is None:
        rc = child.terminate()
    else:
        child.terminate(grace_s=1.0)  # whatever the job left running in its group
    if recorder is not None:
        recorder.stop()
    it = read_json(iteration_path)
    report.update(exit_code=rc, killed_at_deadline=child.killed_at_deadline, terminated=terminated,
                  elapsed_s=child.elapsed_s, iteration_report=it, stderr_tail=child.stderr_tail(),
                  ended_unix=time.time())
    if recorder is not None:
        try:
            w = recorder.window((it or {}).get("window_start_unix"), (it or {}).get("window_end_unix"),
                                report.get("metrics_note", ""))
            report["metrics"] = w.as_dict()
            report["metrics_source"] = w.source
            if model_iter_time_s is not None:
                report["model_iter_time_s"] = model_iter_time_s
        except MetricsUnavailable as exc:
            report["metrics_error"] = str(exc)
    write_json_atomic(run_dir / PROBE_FILE, report)
    return report


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("error: usage: probe [options] -- command ...", file=sys.stderr)
        return 2
    split = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m executors.node.profiling.probe")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--job-type", required=True)
    ap.add_argument("--gpu-type", required=True, help="a known GPU type, or auto: the type of NVML's GPU 0")
    ap.add_argument("--mem-bytes", type=float, default=None, help="the job's GPU memory need (the generic model's)")
    ap.add_argument("--metrics", choices=("auto", "nvml", "simulated"), default="auto")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--deadline", type=float, default=570.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--interval-ms", type=float, default=50.0)
    ap.add_argument("--cwd", default=None, help="run the job here (default: the probe's directory)")
    a = ap.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        print("error: no command after --", file=sys.stderr)
        return 2
    try:
        gpu_type = resolve_gpu_type(a.gpu_type)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _f: stop.append(signum))
    cwd = a.cwd if a.cwd and os.path.isdir(a.cwd) and os.access(a.cwd, os.X_OK) else None
    rep = run_probe(Path(a.run_dir), command, job_type=a.job_type, gpu_type=gpu_type, metrics=a.metrics,
                    iterations=a.iters, seconds=a.seconds, warmup=a.warmup, deadline_s=a.deadline, seed=a.seed,
                    interval_s=a.interval_ms / 1000.0, cwd=cwd, mem_bytes=a.mem_bytes, stop=lambda: bool(stop))
    it = rep.get("iteration_report") or {}
    print(f"probe: exit {rep.get('exit_code')}, {it.get('iterations', 0)} iterations, "
          f"mean {it.get('mean_s')} s, metrics {rep.get('metrics_source') or rep.get('metrics_error')}", flush=True)
    rc = rep.get("exit_code")
    return rc if isinstance(rc, int) and 0 <= rc < 256 else 1


if __name__ == "__main__":
    raise SystemExit(main())
