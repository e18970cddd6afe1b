"""An online inference service of a reference family at a given QPS, recording per-request latency.

    python -m executors.job.workloads.serve --family cnn --size tiny --qps 20 --duration 10 --report lat.json
    python -m executors.job.workloads.serve --family cnn --qps 20 --metrics-port 9100     # a replica, until SIGTERM

Requests arrive open-loop (``executors.job.workloads.latency``) for ``--duration``
seconds, or until SIGTERM/SIGINT without it (a long-running replica); every
request is served (latency = finish − arrival, queueing included) and the
report (avg/p50/p95/p99 ms, achieved QPS, the server's busy fraction, the
wall-clock window) is written as JSON to ``--report`` and printed on stdout
after ``MUXFLOW-LATENCY-REPORT``. ``--requests`` also writes every request's
wall-clock arrival and latency (for measuring a sub-window, as the
co-location harness does); ``--ready`` names a file created once the model is
warm and arrivals begin (with the endpoint's URL). ``--metrics-port`` serves
Prometheus ``/metrics`` and the ``/load`` control (``executors.job.workloads.endpoint``):
``POST /load {"qps": 200}`` changes the offered load while it runs. Usable as a
Slurm job script (``-p online``). SIGTERM/SIGINT end it after the batch in
progress, reporting what was served.
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

from executors.job.runtime.timing import write_json_atomic
from executors.job.workloads.device import describe, resolve_device, set_threads, synchronize
from executors.job.workloads.endpoint import Endpoint, ServeMetrics, TargetQps
from executors.job.workloads.latency import REPORT_FORMAT, LatencyRecorder, arrival_stream, arrival_times, run_open_loop
from executors.job.workloads.models import (
    SERVICE_FAMILIES,
    SIZES,
    batch_pool,
    build_model,
    parameter_count,
    workload_size,
)

log = logging.getLogger(__name__)
STDOUT_MARKER = "MUXFLOW-LATENCY-REPORT "
POOL = 8  # distinct request payloads cycled through
KEEP_REQUESTS = 200_000  # requests kept for the final report's percentiles (a replica may run for days)


def serve(family: str, size: str, qps: float | TargetQps, duration_s: float | None, *, seed: int = 0,
          device: str = "auto", max_batch: int = 1, threads: int | None = 1, warmup_requests: int = 5,
          arrivals: str = "poisson", clock: Callable[[], float] = time.perf_counter,
          sleep: Callable[[float], None] = time.sleep, should_stop: Callable[[], bool] = lambda: False,
          on_ready: Callable[[], None] = lambda: None, requests_out: list | None = None,
          metrics: ServeMetrics | None = None) -> dict[str, Any]:
    """Serve for ``duration_s`` of arrivals (None: until ``should_stop``); the report.

    ``qps`` is a fixed rate or a :class:`TargetQps` that may change while serving;
    ``metrics`` receives every served batch; ``requests_out`` receives (arrival_unix, latency_s).
    """
    if family not in SERVICE_FAMILIES:
        raise ValueError(f"family: {family!r} is not an online service family ({', '.join(SERVICE_FAMILIES)})")
    w = workload_size(family, size)
    dev = resolve_device(device)
    set_threads(dev, threads)
    if isinstance(qps, TargetQps) or duration_s is None:
        # a live rate (or no end): arrivals drawn as they come, at the rate of the moment
        target = qps if isinstance(qps, TargetQps) else TargetQps(qps)
        if duration_s is not None and not (duration_s > 0):
            raise ValueError(f"duration: must be a positive number of seconds, got {duration_s}")
        schedule = arrival_stream(target, seed, arrivals, duration_s)
        scheduled = None
    else:
        schedule = arrival_times(qps, duration_s, seed, arrivals)
        scheduled = len(schedule)
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
    rec = run_open_loop(schedule, handle, clock, sleep, max_batch, should_stop,
                        on_batch=None if metrics is None else metrics.on_batch,
                        recorder=LatencyRecorder(None if requests_out is not None else KEEP_REQUESTS))
    end_wall = time.time()
    if requests_out is not None:
        requests_out.extend((start_wall + a, f - a) for a, f in zip(rec.arrival_s, rec.finish_s))
    return {
        "format": REPORT_FORMAT, "family": family, "size": size, "job_type": w.job_type,
        "qps_target": qps() if isinstance(qps, TargetQps) else qps, "duration_s": duration_s, "arrivals": arrivals,
        "max_batch": max_batch, "scheduled_requests": scheduled,
        "stopped_early": should_stop() if scheduled is None else rec.count < scheduled,
        "device": describe(dev), "device_type": dev.type, "parameters": parameter_count(model),
        "window_start_unix": start_wall, "window_end_unix": end_wall, **rec.summary(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m executors.job.workloads.serve", description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=SERVICE_FAMILIES, required=True, help="cnn is ResNet-18 (docs/WORKLOADS.md)")
    ap.add_argument("--size", choices=SIZES, default="tiny")
    ap.add_argument("--qps", type=float, required=True)
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds of arrivals (default: serve until SIGTERM/SIGINT, a long-running replica)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    ap.add_argument("--max-batch", type=int, default=1, help="dynamic batching of queued requests (1 = none)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads for torch")
    ap.add_argument("--arrivals", choices=("poisson", "uniform"), default="poisson")
    ap.add_argument("--report", help="write the JSON report here")
    ap.add_argument("--requests", help="write every request's [arrival_unix, latency_s] here (JSON)")
    ap.add_argument("--ready", help="create this file once warm, when arrivals begin (JSON: ready_unix, metrics_url)")
    ap.add_argument("--metrics-port", type=int, default=None,
                    help="serve Prometheus /metrics and the /load control on this port (0: any free port)")
    ap.add_argument("--metrics-host", default="127.0.0.1", help="address the endpoint listens on")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _f: stop.append(signum))
    requests: list = []
    endpoint = None
    try:
        target = TargetQps(a.qps)
        if a.metrics_port is not None:
            if not 0 <= a.metrics_port <= 65535:
                raise ValueError(f"metrics-port: must be within [0, 65535], got {a.metrics_port}")
            metrics = ServeMetrics(a.family, a.size, a.device, target)
            endpoint = Endpoint(metrics, target, a.metrics_host, a.metrics_port).start()
            log.info("metrics and load control at %s", endpoint.url)
        else:
            metrics = None
        url = endpoint.url if endpoint is not None else None
        ready = ((lambda: write_json_atomic(a.ready, {"ready_unix": time.time(), "metrics_url": url}))
                 if a.ready else (lambda: None))
        rep = serve(a.family, a.size, target if endpoint is not None else a.qps, a.duration, seed=a.seed,
                    device=a.device, max_batch=a.max_batch, threads=a.threads, arrivals=a.arrivals,
                    should_stop=lambda: bool(stop), on_ready=ready, requests_out=requests if a.requests else None,
                    metrics=metrics)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if endpoint is not None:
            endpoint.close()
    if a.requests:
        write_json_atomic(a.requests, requests)
    if a.report:
        write_json_atomic(a.report, rep)
    print(STDOUT_MARKER + json.dumps(rep, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
