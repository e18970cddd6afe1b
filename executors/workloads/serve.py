"""An online inference service of a reference family at a given QPS, recording per-request latency.

    python -m executors.workloads.serve --family cnn --size tiny --qps 20 --duration 10 --report lat.json

Requests arrive open-loop (``executors.workloads.latency``) for ``--duration``
seconds; every request is served (latency = finish − arrival, queueing
included) and the report (avg/p50/p95/p99 ms, achieved QPS, the server's busy
fraction, the wall-clock window) is written as JSON to ``--report`` and printed
on stdout after ``MUXFLOW-LATENCY-REPORT``. ``--requests`` also writes every
request's wall-clock arrival and latency (for measuring a sub-window, as the
co-location harness does); ``--ready`` names a file created once the model is
warm and arrivals begin. Usable as a Slurm job script (``-p online``).
SIGTERM/SIGINT end it after the batch in progress, reporting what was served.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from executors.runtime.timing import write_json_atomic
from executors.workloads.device import describe, resolve_device, set_threads, synchronize
from executors.workloads.latency import REPORT_FORMAT, arrival_times, run_open_loop
from executors.workloads.models import FAMILIES, SIZES, batch_pool, build_model, parameter_count, workload_size

log = logging.getLogger(__name__)
STDOUT_MARKER = "MUXFLOW-LATENCY-REPORT "
POOL = 8  # distinct request payloads cycled through


def serve(family: str, size: str, qps: float, duration_s: float, *, seed: int = 0, device: str = "auto",
          max_batch: int = 1, threads: int | None = 1, warmup_requests: int = 5, arrivals: str = "poisson",
          clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
          should_stop: Callable[[], bool] = lambda: False, on_ready: Callable[[], None] = lambda: None,
          requests_out: list | None = None) -> dict[str, Any]:
    """Serve for ``duration_s`` of arrivals; the report. ``requests_out`` receives (arrival_unix, latency_s)."""
    w = workload_size(family, size)
    dev = resolve_device(device)
    set_threads(dev, threads)
    schedule = arrival_times(qps, duration_s, seed, arrivals)
    torch.manual_seed(seed)
    model = build_model(w).to(dev).eval()
    pool = batch_pool(w, max_batch, POOL, seed + 1, dev)
    served = [0]

    def handle(n: int) -> None:
        inputs, _ = pool[served[0] % POOL]
        with torch.inference_mode():
            model(*(x[:n] for x in inputs))
        synchronize(dev)
        served[0] += 1

    for _ in range(warmup_requests):  # lazy initialisation, kernel selection: not part of the measurement
        handle(1)
    served[0] = 0
    on_ready()
    start_wall = time.time()
    rec = run_open_loop(schedule, handle, clock, sleep, max_batch, should_stop)
    end_wall = time.time()
    if requests_out is not None:
        requests_out.extend((start_wall + a, f - a) for a, f in zip(rec.arrival_s, rec.finish_s))
    return {
        "format": REPORT_FORMAT, "family": family, "size": size, "job_type": w.job_type,
        "qps_target": qps, "duration_s": duration_s, "arrivals": arrivals, "max_batch": max_batch,
        "scheduled_requests": len(schedule), "stopped_early": rec.count < len(schedule),
        "device": describe(dev), "device_type": dev.type, "parameters": parameter_count(model),
        "window_start_unix": start_wall, "window_end_unix": end_wall, **rec.summary(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m executors.workloads.serve", description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=FAMILIES, required=True)
    ap.add_argument("--size", choices=SIZES, default="tiny")
    ap.add_argument("--qps", type=float, required=True)
    ap.add_argument("--duration", type=float, required=True, help="seconds of arrivals")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    ap.add_argument("--max-batch", type=int, default=1, help="dynamic batching of queued requests (1 = none)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads for torch")
    ap.add_argument("--arrivals", choices=("poisson", "uniform"), default="poisson")
    ap.add_argument("--report", help="write the JSON report here")
    ap.add_argument("--requests", help="write every request's [arrival_unix, latency_s] here (JSON)")
    ap.add_argument("--ready", help="create this file once warm, when arrivals begin")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _f: stop.append(signum))
    requests: list = []
    ready = (lambda: write_json_atomic(a.ready, {"ready_unix": time.time()})) if a.ready else (lambda: None)
    try:
        rep = serve(a.family, a.size, a.qps, a.duration, seed=a.seed, device=a.device, max_batch=a.max_batch,
                    threads=a.threads, arrivals=a.arrivals, should_stop=lambda: bool(stop), on_ready=ready,
                    requests_out=requests if a.requests else None)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.requests:
        write_json_atomic(a.requests, requests)
    if a.report:
        write_json_atomic(a.report, rep)
    print(STDOUT_MARKER + json.dumps(rep, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
