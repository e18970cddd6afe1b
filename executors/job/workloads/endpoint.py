"""The reference online service's HTTP endpoint: Prometheus ``/metrics`` and the ``/load`` control.

``GET /metrics`` (Prometheus text format, ``prometheus_client``):

| metric | type | what |
|---|---|---|
| ``muxflow_serve_requests_total`` | counter | requests served |
| ``muxflow_serve_latency_seconds`` | histogram | request latency, queueing included (finish − arrival); buckets from 0.5 ms to 10 s, fine enough for a p99 in ms |
| ``muxflow_serve_busy_seconds_total`` | counter | time spent computing batches (busy fraction = its rate) |
| ``muxflow_serve_target_qps`` | gauge | the offered load the open loop generates now |
| ``muxflow_serve_info`` | info | family, size, device |

``GET /load`` answers ``{"qps": <target>}``; ``POST /load`` with ``{"qps": <positive number>}``
changes the offered load from the next request on (a scripted burst). A bad body gets status
400 and a one-line error naming the field.

The node agent scrapes ``/metrics`` (``executors.node.scrape``) and turns counter and
histogram deltas into the minute's request rate and latency (paper §7.1).
"""

from __future__ import annotations

import json
import logging
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

log = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03,
                     0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)
REQUESTS = "muxflow_serve_requests"          # exposed as muxflow_serve_requests_total
LATENCY = "muxflow_serve_latency_seconds"
BUSY = "muxflow_serve_busy_seconds"          # exposed as muxflow_serve_busy_seconds_total
TARGET_QPS = "muxflow_serve_target_qps"


class TargetQps:
    """The offered load, read by the arrival stream and set by ``POST /load`` (thread-safe)."""

    def __init__(self, qps: float):
        self._lock = threading.Lock()
        self._qps = check_qps(qps)
        self.on_change = lambda qps: None

    def __call__(self) -> float:
        with self._lock:
            return self._qps

    def set(self, qps: float) -> None:
        qps = check_qps(qps)
        with self._lock:
            self._qps = qps
        self.on_change(qps)


def check_qps(qps: object) -> float:
    if isinstance(qps, bool) or not isinstance(qps, int | float) or not math.isfinite(qps) or qps <= 0:
        raise ValueError(f"qps: must be a positive number, got {qps!r}")
    return float(qps)


class ServeMetrics:
    """The service's own counters, in a registry of their own (several replicas may share a process in tests)."""

    def __init__(self, family: str, size: str, device: str, target: TargetQps):
        self.registry = CollectorRegistry()
        self.requests = Counter(REQUESTS, "Requests served", registry=self.registry)
        self.latency = Histogram(LATENCY, "Request latency, queueing included", buckets=LATENCY_BUCKETS_S,
                                 registry=self.registry)
        self.busy = Counter(BUSY, "Seconds spent computing batches", registry=self.registry)
        self.target = Gauge(TARGET_QPS, "Offered load (requests/s)", registry=self.registry)
        Info("muxflow_serve", "The reference online service", registry=self.registry).info(
            {"family": family, "size": size, "device": device})
        self.target.set(target())
        target.on_change = self.target.set

    def on_batch(self, arrivals_s: list[float], start_s: float, finish_s: float) -> None:
        for a in arrivals_s:
            self.latency.observe(finish_s - a)
        self.requests.inc(len(arrivals_s))
        self.busy.inc(finish_s - start_s)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class Endpoint:
    """``/metrics`` and ``/load`` on ``host:port`` (port 0: any free one) from a thread of its own."""

    def __init__(self, metrics: ServeMetrics, target: TargetQps, host: str = "127.0.0.1", port: int = 0):
        handler = _handler(metrics, target)
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="serve-endpoint", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/metrics"

    def start(self) -> Endpoint:
        self._thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(metrics: ServeMetrics, target: TargetQps) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args) -> None:  # scrapes every few seconds: not worth a log line each
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, obj: dict) -> None:
            self._send(status, (json.dumps(obj) + "\n").encode())

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, metrics.exposition(), CONTENT_TYPE_LATEST)
            elif path == "/load":
                self._json(200, {"qps": target()})
            else:
                self._json(404, {"error": f"path: {path} not found (/metrics, /load)"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path.split("?", 1)[0] != "/load":
                self._json(404, {"error": f"path: {self.path} not found (POST /load)"})
                return
            try:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"null")
                if not isinstance(body, dict) or "qps" not in body:
                    raise ValueError('qps: send a JSON object {"qps": <requests per second>}')
                target.set(body["qps"])
            except (ValueError, json.JSONDecodeError) as exc:
                self._json(400, {"error": str(exc).splitlines()[0]})
                return
            log.info("offered load set to %g QPS", target())
            self._json(200, {"qps": target()})

    return Handler
