"""The reference online service as a long-running replica: Prometheus /metrics, the /load control, SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from executors.job.workloads.endpoint import Endpoint, ServeMetrics, TargetQps
from executors.job.workloads.latency import arrival_stream, run_open_loop
from executors.job.workloads.serve import STDOUT_MARKER
from executors.node.scrape import parse_exposition

REPO = Path(__file__).resolve().parents[4]


def test_arrivals_follow_a_rate_changed_while_serving() -> None:
    rate = [10.0]
    stream = arrival_stream(lambda: rate[0], seed=1, process="uniform")
    first = [next(stream) for _ in range(10)]
    rate[0] = 100.0
    later = [next(stream) for _ in range(10)]
    assert first == pytest.approx([0.1 * (k + 1) for k in range(10)])
    assert later == pytest.approx([1.0 + 0.01 * (k + 1) for k in range(10)])
    assert list(arrival_stream(lambda: 4.0, process="uniform", duration_s=1.0)) == pytest.approx([0.25, 0.5, 0.75])
    with pytest.raises(ValueError, match="qps"):
        next(arrival_stream(lambda: 0.0))


def test_every_served_batch_reaches_the_metrics() -> None:
    t = [0.0]
    target = TargetQps(5.0)
    metrics = ServeMetrics("cnn", "tiny", "cpu", target)

    def handle(n: int) -> None:
        t[0] += 0.02

    def sleep(s: float) -> None:
        t[0] += s

    rec = run_open_loop([0.0, 0.0, 0.5], handle, lambda: t[0], sleep, on_batch=metrics.on_batch)
    vals = parse_exposition(metrics.exposition().decode())
    assert rec.count == vals["requests"] == vals["count"] == 3
    assert vals["sum"] == pytest.approx(sum(rec.latencies_s()))  # the second request waited for the first
    assert vals["busy_s"] == pytest.approx(0.06)


def test_load_control_validates_its_input() -> None:
    target = TargetQps(5.0)
    ep = Endpoint(ServeMetrics("cnn", "tiny", "cpu", target), target).start()
    base = ep.url.rsplit("/", 1)[0]
    try:
        assert httpx.get(base + "/load").json() == {"qps": 5.0}
        for body, field in (({"qps": -1}, "qps"), ({"qps": "fast"}, "qps"), ({"rate": 3}, "qps"), ([], "qps")):
            r = httpx.post(base + "/load", json=body)
            assert r.status_code == 400 and r.json()["error"].startswith(field + ":"), r.text
        assert httpx.post(base + "/load", content=b"{not json").status_code == 400
        assert httpx.get(base + "/nope").status_code == 404
        assert target() == 5.0  # nothing changed by the bad requests
    finally:
        ep.close()


def test_replica_runs_until_sigterm_and_a_burst_shows_in_its_counters(tmp_path) -> None:
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "executors.job.workloads.serve", "--family", "cnn", "--qps", "20",
                             "--metrics-port", "0", "--ready", str(ready), "--report", str(tmp_path / "rep.json")],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the replica never became ready"
            time.sleep(0.1)  # polling for the ready file
        url = json.loads(ready.read_text())["metrics_url"]

        def served() -> float:
            return parse_exposition(httpx.get(url, timeout=5).text)["requests"]

        def rate_over(seconds: float) -> float:
            a, t0 = served(), time.monotonic()
            end = t0 + seconds
            while time.monotonic() < end:  # counting requests over a wall-clock window is the measurement
                time.sleep(0.05)
            return (served() - a) / (time.monotonic() - t0)

        calm = rate_over(1.5)
        assert httpx.post(url.replace("/metrics", "/load"), json={"qps": 300}).json() == {"qps": 300.0}
        burst = rate_over(1.5)
        assert calm < 60.0 and burst > 3 * calm, (calm, burst)
        assert "muxflow_serve_target_qps 300.0" in httpx.get(url).text
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    rep = json.loads(out.split(STDOUT_MARKER, 1)[1])
    assert rep["duration_s"] is None and rep["stopped_early"] and rep["qps_target"] == 300.0
    assert rep["requests"] > 0 and rep["p99_ms"] > 0
