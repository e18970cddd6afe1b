"""A replica's metrics endpoint is its owner's: the root node agent's scrape of it must survive a hostile answer.

Each attack is a real local HTTP server: a body without end, a redirect (to a page that would be accepted), an
answer that trickles in forever, bytes that are not a metrics page, and pages with NaN, infinite, negative or
absurdly large counters, broken histograms and absurd label sets. Every one is a failed scrape — a labelled gap,
as an endpoint that is down — never a crash, a hang of the scrape thread past its timeout, a page held in memory
past the size bound, or a poisoned rate or latency.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from executors.job.workloads.endpoint import ServeMetrics, TargetQps
from executors.node.scrape import (MAX_BODY_BYTES, MAX_LINE_CHARS, MAX_SERIES_CHARS, ReplicaScraper, fetch_http,
                                   parse_exposition)

GOOD = ServeMetrics("cnn", "tiny", "cpu", TargetQps(10.0))
GOOD.on_batch([0.0, 0.0], 0.0, 0.004)
GOOD_PAGE = GOOD.exposition()


def page(requests: str = "3", count: str = "3", total: str = "0.2", buckets: tuple[tuple[str, str], ...] = (
        ("0.1", "2"), ("+Inf", "3")), labels: str = "", extra: str = "") -> bytes:
    lines = [f"muxflow_serve_requests_total{labels} {requests}"]
    lines += [f'muxflow_serve_latency_seconds_bucket{{le="{le}"{"," + labels[1:-1] if labels else ""}}} {c}'
              for le, c in buckets]
    lines += [f"muxflow_serve_latency_seconds_count{labels} {count}",
              f"muxflow_serve_latency_seconds_sum{labels} {total}"]
    return ("\n".join(lines) + "\n" + extra).encode()


class Hostile(BaseHTTPRequestHandler):
    """One answer per path."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *_a) -> None:  # quiet
        pass

    def _send(self, body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: C901 - one branch per attack
        path = self.path
        try:
            if path == "/metrics":
                self._send(GOOD_PAGE)
            elif path == "/huge":  # 16 MiB announced and sent
                body = b"# " + b"x" * (16 << 20) + b"\n"
                self._send(body)
            elif path == "/huge-chunked":  # no length: chunks until the client hangs up
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunk = b"#" + b"y" * 65535
                for _ in range(1024):  # 64 MiB at most
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.write(b"0\r\n\r\n")
            elif path == "/redirect":
                self._send(b"", 302, {"Location": "/metrics"})
            elif path == "/slow-body":  # headers at once, then a byte every 50 ms for 10 s
                self.send_response(200)
                self.send_header("Content-Length", "200")
                self.end_headers()
                for _ in range(200):
                    self.wfile.write(b"#")
                    self.wfile.flush()
                    time.sleep(0.05)
            elif path == "/slow-headers":  # a header line that never ends, a byte every 50 ms
                self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
                for _ in range(200):
                    self.wfile.write(b"z")
                    self.wfile.flush()
                    time.sleep(0.05)
            elif path == "/garbage":
                self._send(bytes(range(256)) * 64)
            elif path == "/error":
                self._send(b"no", 500)
            else:
                self._send({**PAGES, **IGNORED}[path])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the scraper hung up: as it should


PAGES = {
    "/nan": page(requests="NaN"),
    "/inf": page(total="+Inf"),
    "/negative": page(requests="-5"),
    "/huge-counter": page(requests="1e300"),
    "/bucket-nan": page(buckets=(("0.1", "NaN"), ("+Inf", "3"))),
    "/bucket-decreasing": page(buckets=(("0.1", "3"), ("0.2", "1"), ("+Inf", "3"))),
    "/bucket-no-inf": page(buckets=(("0.1", "2"), ("0.2", "3"))),
    "/bucket-bad-le": page(buckets=(("abc", "2"), ("+Inf", "3"))),
    "/bucket-negative-le": page(buckets=(("-1", "2"), ("+Inf", "3"))),
    "/bucket-duplicate-le": page(buckets=(("0.1", "2"), ("0.1", "2"), ("+Inf", "3"))),
    "/too-many-buckets": page(buckets=tuple((f"{k / 1000:.3f}", str(min(k, 3))) for k in range(1, 5000))
                                    + (("+Inf", "3"),)),
    "/two-series": page(extra=page(labels='{model="b"}').decode()),  # which one? neither: ambiguous
    "/many-label-sets": page(extra="".join(f'muxflow_serve_requests_total{{id="{k}"}} {k}\n' for k in range(20000))),
    "/malformed-line": page(extra="muxflow_serve_requests_total{le=\n"),
}
ONE_MIB_LINE = page(extra='muxflow_serve_requests_total{a="' + "\\\\" * (1 << 19) + '"} 1\n')
PAGES["/one-mib-line"] = ONE_MIB_LINE
IGNORED = {  # lines of other metrics are skipped unread, whatever they hold
    "/binary-in-page": page() + b"\xff\xfe\x00garbage\n",
    "/other-metrics": page(extra="up NaN\nsome_counter_total -1e308\nbroken{ 1\n" + "x" * 100_000 + "\n"),
}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def scrape(url: str, timeout_s: float = 1.0) -> tuple[ReplicaScraper, bool, float]:
    sc = ReplicaScraper(url, interval_s=1.0, timeout_s=timeout_s, clock=lambda: 1_000.0)
    t0 = time.monotonic()
    ok = sc.scrape_once()
    return sc, ok, time.monotonic() - t0


def test_a_well_behaved_endpoint_still_scrapes(server: str) -> None:
    sc, ok, _ = scrape(server + "/metrics")
    assert ok and sc.last_error is None and sc.snapshots()[-1].requests == 2


@pytest.mark.parametrize("path", ["/huge", "/huge-chunked"])
def test_attack_a_body_past_the_bound_is_a_failed_scrape(server: str, path: str) -> None:
    sc, ok, took = scrape(server + path, timeout_s=10.0)
    assert not ok and f"more than {MAX_BODY_BYTES} bytes" in sc.last_error and took < 10.0
    assert sc.window(990.0, 1_010.0).reason.startswith("qps, latency: no scrape of")


def test_attack_a_redirect_is_not_followed(server: str) -> None:
    sc, ok, _ = scrape(server + "/redirect")
    assert not ok and "HTTP 302" in sc.last_error and "redirect" in sc.last_error


@pytest.mark.parametrize("path", ["/slow-body", "/slow-headers"])
def test_attack_an_answer_that_trickles_in_is_cut_at_the_timeout(server: str, path: str) -> None:
    """Each byte comes well within the timeout, so a per-read timeout never fires: the whole fetch has one."""
    sc, ok, took = scrape(server + path, timeout_s=0.5)
    assert not ok and "0.5 s" in sc.last_error, sc.last_error
    assert took < 2.0


@pytest.mark.parametrize("path", ["/garbage", "/error", "/malformed-line"])
def test_attack_garbage_is_a_failed_scrape(server: str, path: str) -> None:
    sc, ok, _ = scrape(server + path)
    assert not ok and sc.last_error and sc.failures == 1 and sc.snapshots() == []


@pytest.mark.parametrize("path", sorted(set(PAGES) - {"/malformed-line"}))
def test_attack_poisoned_counters_and_histograms_are_failed_scrapes(server: str, path: str) -> None:
    sc, ok, _ = scrape(server + path)
    assert not ok and sc.snapshots() == [], (path, sc.snapshots()[-1:])
    assert sc.last_error.startswith("ValueError"), sc.last_error


@pytest.mark.parametrize("path", sorted(IGNORED))
def test_lines_of_other_metrics_are_ignored(server: str, path: str) -> None:
    sc, ok, _ = scrape(server + path)
    assert ok and sc.snapshots()[-1].requests == 3 and sc.snapshots()[-1].buckets == ((0.1, 2.0), (math.inf, 3.0))


def test_poisoned_pages_never_reach_the_numbers() -> None:
    """Straight through the parser: every page above is refused, with what is wrong, and the rates and latencies of
    an endpoint that answered a good page, then poison, then good again are finite and right."""
    for path, body in PAGES.items():
        with pytest.raises(ValueError):
            parse_exposition(body.decode(errors="replace"))
    pages = [page("10", "10", "0.1", (("0.1", "10"), ("+Inf", "10"))), page(requests="NaN"),
             page("30", "30", "0.3", (("0.1", "30"), ("+Inf", "30")))]
    t = [1_000.0]

    def fetch(_url: str, _timeout: float) -> str:
        return pages.pop(0).decode()

    sc = ReplicaScraper("http://replica:9100/metrics", interval_s=5.0, clock=lambda: t[0], fetch=fetch)
    for _ in range(3):
        sc.scrape_once()
        t[0] += 5.0
    st = sc.window(999.0, 1_011.0)
    assert st.requests == 20 and math.isfinite(st.qps) and st.latency_ms == pytest.approx(10.0)


@pytest.fixture()
def parser_input(monkeypatch) -> list[int]:
    """The characters prometheus_client's parser is handed, call by call: the work a page costs the agent (the
    parser is pure Python, about a CPU second per MiB of escaped label), counted rather than timed."""
    import prometheus_client.parser as pc_parser

    real = pc_parser.text_string_to_metric_families
    seen: list[int] = []

    def counting(text: str):
        seen.append(len(text))
        return real(text)

    monkeypatch.setattr(pc_parser, "text_string_to_metric_families", counting)
    return seen


def test_attack_a_one_mib_line_is_refused_before_the_parser(server: str, parser_input: list[int]) -> None:
    """One MuxFlow line of 1 MiB of escapes (most of a CPU second in the parser): refused, unparsed, by name."""
    with pytest.raises(ValueError, match=f"longer than {MAX_LINE_CHARS} characters"):
        parse_exposition(ONE_MIB_LINE.decode())
    assert parser_input == []
    sc, ok, _ = scrape(server + "/one-mib-line")
    assert not ok and f"longer than {MAX_LINE_CHARS} characters" in sc.last_error and parser_input == []
    assert sc.window(990.0, 1_010.0).reason.startswith("qps, latency: no scrape of")


ESCAPES = "\\\\" * 2000  # 4,000 characters of escaped backslashes: the parser's slowest label


@pytest.mark.parametrize("hostile", [
    # 4 MiB of MuxFlow lines, each under the line bound, full of escapes: too many characters of them in all
    "".join(f'muxflow_serve_requests_total{{k="{ESCAPES}"}} {k}\n' for k in range(1024)),
    # few lines, each just under the bound: the same
    "".join(f'muxflow_serve_latency_seconds_bucket{{le="{k}",p="{"x" * (MAX_LINE_CHARS - 80)}"}} 1\n'
            for k in range(40)),
])
def test_attack_megabytes_of_hostile_lines_cost_a_bounded_parse(hostile: str, parser_input: list[int]) -> None:
    with pytest.raises(ValueError, match=f"more than {MAX_SERIES_CHARS} characters"):
        parse_exposition(page().decode() + hostile)
    assert parser_input == []


def test_megabytes_of_other_lines_are_scanned_not_parsed(parser_input: list[int]) -> None:
    """4 MiB of other metrics' lines — long, blank, escaped, a line of spaces — beside a good page: the page is read,
    and what the parser gets is MuxFlow's lines alone."""
    good = page().decode()
    other = ("x" * (1 << 20) + "\n" + " " * (1 << 20) + "\n" + "\n" * (1 << 20)
             + 'other_total{a="' + "\\\\" * (1 << 19) + '"} 1\n')
    assert len(other) >= 4 << 20
    vals = parse_exposition(other + good)
    assert vals["requests"] == 3 and len(parser_input) == 1 and parser_input[0] <= len(good) + 1


def test_only_http_urls_are_fetched(tmp_path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("muxflow_serve_requests_total 1\n")
    for url in (f"file://{secret}", "ftp://127.0.0.1/metrics", "gopher://x/", "http:///metrics"):
        with pytest.raises(ValueError, match="http"):
            fetch_http(url, 1.0)


def test_a_scraper_thread_stops_within_its_timeout_whatever_the_endpoint(server: str) -> None:
    sc = ReplicaScraper(server + "/slow-headers", interval_s=0.2, timeout_s=0.5).start()
    time.sleep(0.3)
    t0 = time.monotonic()
    sc.close()
    assert time.monotonic() - t0 < 2.0 and sc.failures >= 1


