"""Scraping a replica's Prometheus endpoint: rates and latencies from counter deltas, gaps with their reasons."""

from __future__ import annotations

import random

import httpx
import pytest

from executors.job.workloads.endpoint import LATENCY_BUCKETS_S, Endpoint, ServeMetrics, TargetQps
from executors.node.scrape import (
    ReplicaScraper,
    check_metrics_url,
    parse_endpoint_options,
    parse_exposition,
    quantile_from_buckets,
)


class Replica:
    """A real metrics registry (the reference service's) fed by hand, served by a fake fetch or real HTTP."""

    def __init__(self, qps: float = 10.0):
        self.target = TargetQps(qps)
        self.metrics = ServeMetrics("cnn", "tiny", "cpu", self.target)
        self.down = False

    def serve(self, latencies_s: list[float]) -> None:
        for lat in latencies_s:  # one request per batch, served at once: busy for its latency
            self.metrics.on_batch([0.0], 0.0, lat)

    def fetch(self, url: str, timeout_s: float) -> str:
        if self.down:
            raise httpx.ConnectError("connection refused")
        return self.metrics.exposition().decode()


class Clock:
    def __init__(self, t: float = 1_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def scraper(rep: Replica, clock: Clock, solo=lambda: True) -> ReplicaScraper:
    return ReplicaScraper("http://replica:9100/metrics", interval_s=5.0, clock=clock, solo=solo, fetch=rep.fetch)


def test_the_reference_service_page_parses_into_counters() -> None:
    rep = Replica()
    rep.serve([0.004, 0.006, 0.2])
    vals = parse_exposition(rep.fetch("", 1.0))
    assert vals["requests"] == 3 and vals["count"] == 3 and vals["sum"] == pytest.approx(0.21)
    assert vals["busy_s"] == pytest.approx(0.21)
    assert [le for le, _ in vals["buckets"]] == [*LATENCY_BUCKETS_S, float("inf")]
    assert vals["buckets"][-1][1] == 3
    with pytest.raises(ValueError, match="muxflow_serve_requests_total"):
        parse_exposition("# a page of something else\nup 1\n")


def test_window_rate_and_latency_come_from_counter_deltas() -> None:
    rep, clock = Replica(), Clock()
    sc = scraper(rep, clock)
    rep.serve([0.5] * 7)            # before the window: not counted
    assert sc.scrape_once()
    for k in range(12):             # one minute: 12 scrapes, 20 requests of 10 ms each between two
        clock.t += 5.0
        rep.serve([0.010] * 20)
        assert sc.scrape_once()
    st = sc.window(1_000.0, 1_060.0)
    assert st.reason is None and st.requests == 240
    assert st.qps == pytest.approx(4.0) and st.latency_ms == pytest.approx(10.0)
    # every latency is 10 ms: the p99 lies inside the (7.5, 10] ms bucket
    assert 7.5 <= st.latency_p99_ms <= 10.0


def test_p99_interpolates_inside_its_bucket_like_histogram_quantile() -> None:
    rng = random.Random(3)
    lat = sorted(rng.uniform(0.001, 0.1) for _ in range(20_000))
    rep = Replica()
    rep.serve(lat)
    buckets = list(parse_exposition(rep.fetch("", 1.0))["buckets"])
    p99 = quantile_from_buckets(0.99, buckets)
    assert p99 == pytest.approx(lat[int(0.99 * len(lat))], rel=0.05)
    assert quantile_from_buckets(0.99, [(1.0, 0.0), (float("inf"), 0.0)]) is None
    assert quantile_from_buckets(0.5, [(1.0, 0.0), (float("inf"), 4.0)]) == 1.0  # all beyond the last bound


def test_a_restarted_replica_costs_nothing_and_a_down_one_is_a_labelled_gap() -> None:
    rep, clock = Replica(), Clock()
    sc = scraper(rep, clock)
    sc.scrape_once()
    clock.t += 5.0
    rep.serve([0.02] * 50)
    sc.scrape_once()
    rep.metrics = Replica().metrics  # restarted: counters from zero
    clock.t += 5.0
    rep.serve([0.02] * 30)
    sc.scrape_once()
    st = sc.window(1_000.0, 1_010.0)
    assert st.requests == 80 and st.qps == pytest.approx(8.0) and st.latency_ms == pytest.approx(20.0)
    # the endpoint goes away: the next minute has no value, and says why
    rep.down = True
    for _ in range(12):
        clock.t += 5.0
        assert not sc.scrape_once()
    gap = sc.window(1_060.0, 1_120.0)
    assert gap.qps is None and gap.latency_ms is None
    assert "no scrape of http://replica:9100/metrics" in gap.reason and "ConnectError" in gap.reason
    assert sc.current_qps(clock.t) is None  # stale: the simulated GPU falls back, it never reads a zero


def test_no_request_in_the_window_is_a_measured_zero_rate_without_a_latency() -> None:
    rep, clock = Replica(), Clock()
    sc = scraper(rep, clock)
    for _ in range(3):
        sc.scrape_once()
        clock.t += 5.0
    st = sc.window(1_000.0, 1_010.0)
    assert st.qps == 0.0 and st.latency_ms is None and "no request served" in st.reason


def test_current_rate_is_the_latest_interval_while_fresh() -> None:
    rep, clock = Replica(), Clock()
    sc = scraper(rep, clock)
    sc.scrape_once()
    clock.t += 5.0
    rep.serve([0.001] * 1000)
    sc.scrape_once()
    assert sc.current_qps(clock.t + 1.0) == pytest.approx(200.0)
    assert sc.current_qps(clock.t + 16.0) is None  # three intervals without a scrape


def test_solo_latency_counts_only_intervals_without_offline_work() -> None:
    rep, clock, busy = Replica(), Clock(), [False]
    sc = scraper(rep, clock, solo=lambda: not busy[0])
    sc.scrape_once()
    for k in range(6):
        clock.t += 5.0
        busy[0] = k >= 3                       # an offline job arrives after three intervals
        rep.serve([0.030 if busy[0] else 0.010] * 10)
        sc.scrape_once()
    assert sc.solo_latency_ms(clock.t, 3600.0) == pytest.approx(10.0)
    assert sc.solo_latency_ms(clock.t, 12.0) is None  # the recent intervals all had the job


def test_real_http_against_the_reference_endpoint() -> None:
    target = TargetQps(20.0)
    metrics = ServeMetrics("cnn", "tiny", "cpu", target)
    ep = Endpoint(metrics, target).start()
    try:
        clock = Clock()
        sc = ReplicaScraper(ep.url, interval_s=1.0, clock=clock)
        assert sc.scrape_once()
        metrics.on_batch([0.0, 0.001], 0.001, 0.011)
        clock.t += 1.0
        assert sc.scrape_once()
        st = sc.window(999.0, 1_001.0)
        assert st.requests == 2 and st.latency_ms == pytest.approx(10.5)
        r = httpx.post(ep.url.replace("/metrics", "/load"), json={"qps": 250})
        assert r.status_code == 200 and target() == 250.0
        assert "muxflow_serve_target_qps 250.0" in httpx.get(ep.url).text
    finally:
        ep.close()
    clock.t += 1.0
    assert not sc.scrape_once() and "ConnectError" in sc.last_error


@pytest.mark.parametrize("url,out", [
    ("http://127.0.0.1:9100/metrics", "http://127.0.0.1:9100/metrics"),
    ("http://node-7:9100", "http://node-7:9100/metrics"),
    ("https://svc.example/", "https://svc.example/metrics"),
])
def test_endpoint_urls_are_checked(url, out) -> None:
    assert check_metrics_url(url) == out


@pytest.mark.parametrize("url", ["ftp://x/metrics", "http:///metrics", "127.0.0.1:9100", "http://h:99999/m",
                                 "http://h:port/m"])
def test_bad_endpoint_urls_name_the_field(url) -> None:
    with pytest.raises(ValueError, match="^endpoint: "):
        check_metrics_url(url)


def test_endpoint_options_map_urls_to_gpus() -> None:
    assert parse_endpoint_options(["http://a:1/metrics"], [7]) == {7: "http://a:1/metrics"}
    assert parse_endpoint_options(["3=http://a:1", "4=http://b:2/m"], [3, 4]) == {3: "http://a:1/metrics",
                                                                                 4: "http://b:2/m"}
    for opts, ids, msg in ((["http://a:1"], [3, 4], "name the GPU"), (["5=http://a:1"], [3, 4], "GPU 5"),
                           (["3=http://a:1", "3=http://b:1"], [3], "two endpoints"), (["x=http://a"], [3], "GPU_ID")):
        with pytest.raises(ValueError, match=msg):
            parse_endpoint_options(opts, ids)
