"""A Prometheus ``/metrics`` endpoint on a thread of its own, for one collector (the node agent's, the scheduler's)."""

from __future__ import annotations

import logging
import threading
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler

log = logging.getLogger(__name__)


class MetricsServer:
    """``GET /metrics`` of a registry on a thread of its own (``port`` 0: any free port, see ``.port``)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int):
        class Handler(MetricsHandler.factory(registry)):  # type: ignore[misc]
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- a scrape is no log line
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="metrics-http", daemon=True)

    def start(self) -> MetricsServer:
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics", self.httpd.server_address[0], self.port)
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)


def serve(collector: Any, host: str, port: int) -> MetricsServer:
    """A registry holding ``collector`` only, served on ``host:port``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return MetricsServer(registry, host, port).start()
