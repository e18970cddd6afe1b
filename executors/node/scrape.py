"""Each online replica's own load, scraped from its Prometheus endpoint (paper §7.1: request rate, avg and p99 latency).

One thread per replica fetches ``GET <metrics_url>`` every ``interval_s`` (timeout
``timeout_s``) and keeps the counters it finds (``executors.job.workloads.endpoint``):
requests served, the latency histogram (sum, count, cumulative buckets) and busy seconds,
stamped with the agent clock. The node agent's sampling thread never waits on it: it reads
the kept snapshots.

- **Request rate and latency of a window** (a minute, or the minute so far): deltas of the
  counters between the last scrape at or before the window's start and the last scrape
  inside it, summed scrape by scrape so that a restarted replica (counters back to zero)
  costs nothing; avg = Δsum / Δcount, p99 by linear interpolation inside the histogram
  bucket that holds the 99th percentile (as Prometheus' ``histogram_quantile``).
- **Solo latency**: the average latency over the scrape intervals with no offline job on the
  replica's GPU at either end, within the last ``solo_window_s`` — the service's own
  latency at its recent loads, measured, not modelled.
- **Current rate** (the simulated GPU's input): the rate over the latest scrape interval,
  while that scrape is fresh.

A failed or missing scrape is never a zero: the window has no value and says why.

**The endpoint is its owner's** (the root agent fetches what the replica's owner serves), so a scrape
trusts nothing of the answer (docs/NODE_AGENT.md "What the agent trusts"): only ``http``/``https``
URLs, no redirect followed, no proxy or credentials from the agent's environment, one deadline for
the whole fetch (``timeout_s``: connection, headers and body; an answer that trickles in is cut), at
most :data:`MAX_BODY_BYTES` read (more is a failed scrape), and a page whose MuxFlow series are not
plain counters — NaN, infinite, negative or beyond 2**53, a histogram whose buckets are not
cumulative or lack ``+Inf``, more than :data:`MAX_BUCKETS` buckets, several series (label sets) of
one name, a malformed line of those series — is a failed scrape too: a labelled gap, never a number.
Lines of other metrics are skipped unread.
"""

from __future__ import annotations

import logging
import math
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

REQUESTS = "muxflow_serve_requests"      # prometheus_client's family names (samples add _total, _sum …)
LATENCY = "muxflow_serve_latency_seconds"
BUSY = "muxflow_serve_busy_seconds"
_SERIES = (REQUESTS + "_total", BUSY + "_total", LATENCY + "_sum", LATENCY + "_count", LATENCY + "_bucket")
_PREFIXES = (REQUESTS + "_total", BUSY + "_total", LATENCY + "_")

MAX_BODY_BYTES = 4 << 20       # a metrics page larger than this is not one: the scrape fails, reading no more
MAX_BUCKETS = 64               # latency histogram buckets (the reference service has 29)
MAX_COUNTER = float(2 ** 53)   # a counter beyond this (exact doubles end here) is not a request count
MAX_LINE_CHARS = 4096          # one of MuxFlow's lines longer than this is not a counter (the reference's: < 100)
MAX_SERIES_LINES = 4 * MAX_BUCKETS + 16
MAX_SERIES_CHARS = 64 << 10    # MuxFlow's lines in all (the reference service's: about 3 KiB): what the parser gets
# A MuxFlow line from its start (leading blanks allowed, as prometheus_client's parser strips them) to at most
# MAX_LINE_CHARS: possessive repeats, so a long line or a long run of blanks is scanned once, never backtracked.
_LINES = re.compile(r"^[ \t]*+((?:%s)[^\n]{0,%d}+)" % ("|".join(re.escape(p) for p in _PREFIXES),
                                                       MAX_LINE_CHARS), re.MULTILINE)


def check_metrics_url(url: str, field: str = "endpoint") -> str:
    """An http(s) URL with a host (and a valid port); a bare host:port path gets ``/metrics``."""
    text = url.strip()
    try:
        parts = urlsplit(text)
        port = parts.port  # raises on a malformed port
    except ValueError as exc:
        raise ValueError(f"{field}: {text!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{field}: expected http(s)://host[:port]/path, got {text!r}")
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"{field}: port must be within [1, 65535], got {port}")
    if parts.path in ("", "/"):
        text = text.rstrip("/") + "/metrics"
    return text


def parse_endpoint_options(options: Iterable[str], gpu_ids: list[int]) -> dict[int, str]:
    """``--endpoint [GPU_ID=]URL`` values → {GPU id: URL}; a bare URL only for a one-GPU service."""
    out: dict[int, str] = {}
    for opt in options:
        head, sep, tail = opt.partition("=")
        if sep and "://" not in head:
            try:
                gid = int(head.strip())
            except ValueError:
                raise ValueError(f"endpoint: expected GPU_ID=URL, got {opt!r}") from None
            url = tail
        elif len(gpu_ids) == 1:
            gid, url = gpu_ids[0], opt
        else:
            raise ValueError(f"endpoint: name the GPU of {opt!r} as GPU_ID=URL (the service has {len(gpu_ids)} GPUs)")
        if gid not in gpu_ids:
            raise ValueError(f"endpoint: GPU {gid} is not one of --gpu-ids {gpu_ids}")
        if gid in out:
            raise ValueError(f"endpoint: GPU {gid} has two endpoints")
        out[gid] = check_metrics_url(url)
    return out


@dataclass(frozen=True)
class Snapshot:
    """The replica's counters at one scrape (agent clock seconds)."""

    t_s: float
    requests: float
    latency_sum_s: float
    latency_count: float
    buckets: tuple[tuple[float, float], ...]   # (upper bound s, cumulative count), +Inf last
    busy_s: float | None
    solo: bool                                 # no offline job on the replica's GPU at this scrape


def _counter(name: str, value: float) -> float:
    if not (math.isfinite(value) and 0.0 <= value <= MAX_COUNTER):
        raise ValueError(f"{name} is {value!r}: not a counter (finite, 0 … 2**53)")
    return value


def parse_exposition(text: str) -> dict:
    """The counters of a ``/metrics`` page; ValueError naming what is missing or wrong.

    Only the lines of MuxFlow's series are parsed (others are skipped unread); each must be one series of plain
    counters (see the module's docstring), else the whole page is refused."""
    from prometheus_client.parser import text_string_to_metric_families

    lines: list[str] = []
    chars = 0
    for match in _LINES.finditer(text):  # stops at the first bound crossed: the rest of the page is never read
        line = match.group(1)
        if len(line) > MAX_LINE_CHARS or (match.end() < len(text) and text[match.end()] != "\n"):
            raise ValueError(f"a line of {line[:40]}… is longer than {MAX_LINE_CHARS} characters: not a counter")
        lines.append(line.strip())
        chars += len(line)
        if len(lines) > MAX_SERIES_LINES:
            raise ValueError(f"more than {MAX_SERIES_LINES} lines of {REQUESTS}/{LATENCY} series: not one "
                             "replica's counters")
        if chars > MAX_SERIES_CHARS:
            raise ValueError(f"more than {MAX_SERIES_CHARS} characters of {REQUESTS}/{LATENCY} lines: not one "
                             "replica's counters")
    seen: dict[str, set[tuple]] = {}
    vals: dict = {}
    buckets: dict[float, float] = {}
    try:
        samples = [smp for fam in text_string_to_metric_families("\n".join(lines) + "\n") for smp in fam.samples]
    except Exception as exc:  # the parser's own errors: ValueError, IndexError, KeyError…
        raise ValueError(f"malformed {REQUESTS}/{LATENCY} line ({exc.__class__.__name__}: {exc})") from None
    for smp in samples:
        if smp.name not in _SERIES:
            continue
        labels = dict(smp.labels)
        le_text = labels.pop("le", None) if smp.name == LATENCY + "_bucket" else None
        seen.setdefault(smp.name, set()).add(tuple(sorted(labels.items())))
        if len(seen[smp.name]) > 1:
            raise ValueError(f"several series of {smp.name} (label sets {sorted(seen[smp.name])[:3]}…): which is "
                             "the replica's is ambiguous")
        value = _counter(smp.name, float(smp.value))
        if smp.name == LATENCY + "_bucket":
            try:
                le = float(le_text) if le_text is not None else math.nan
            except ValueError:
                le = math.nan
            if math.isnan(le) or le < 0:
                raise ValueError(f"{smp.name} with le={le_text!r}: not a bucket bound")
            if le in buckets:
                raise ValueError(f"{smp.name} has two buckets le={le_text!r}")
            if len(buckets) >= MAX_BUCKETS:
                raise ValueError(f"{smp.name} has more than {MAX_BUCKETS} buckets")
            buckets[le] = value
            continue
        key = {REQUESTS + "_total": "requests", BUSY + "_total": "busy_s", LATENCY + "_sum": "sum",
               LATENCY + "_count": "count"}[smp.name]
        if key in vals:
            raise ValueError(f"{smp.name} appears twice")
        vals[key] = value
    missing = [k for k in ("requests", "sum", "count") if k not in vals]
    if missing or not buckets:
        raise ValueError(f"no {', '.join(missing) or 'latency buckets'} in the page "
                         f"(expected {REQUESTS}_total and the {LATENCY} histogram)")
    ordered = tuple(sorted(buckets.items()))
    if not math.isinf(ordered[-1][0]):
        raise ValueError(f"{LATENCY}_bucket has no le=\"+Inf\" bucket")
    if any(b[1] < a[1] for a, b in zip(ordered, ordered[1:])):
        raise ValueError(f"{LATENCY}_bucket counts are not cumulative")
    vals["buckets"] = ordered
    return vals


def _delta(cur: float, prev: float) -> float:
    return cur - prev if cur >= prev else cur  # a counter that went back: the replica restarted


def quantile_from_buckets(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile of a cumulative histogram (Prometheus' ``histogram_quantile``); None when empty."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_le, lower_cum = 0.0, 0.0
    for le, cum in buckets:
        if cum >= rank:
            if math.isinf(le):
                return lower_le  # beyond the last finite bound: the bound is all we know
            if cum == lower_cum:
                return le
            return lower_le + (le - lower_le) * (rank - lower_cum) / (cum - lower_cum)
        lower_le, lower_cum = le, cum
    return lower_le


@dataclass(frozen=True)
class WindowStats:
    qps: float | None
    latency_ms: float | None
    latency_p99_ms: float | None
    requests: float
    reason: str | None = None   # why qps or the latencies are None


def window_stats(snaps: list[Snapshot], start_s: float, end_s: float) -> WindowStats | None:
    """Rate and latency over [start_s, end_s] from the snapshots; None when no two scrapes bracket it."""
    inside = [s for s in snaps if start_s < s.t_s <= end_s]
    if not inside:
        return None
    before = [s for s in snaps if s.t_s <= start_s]
    chain = ([before[-1]] if before else []) + inside
    if len(chain) < 2:
        return None
    reqs = lsum = lcount = 0.0
    bucket_d = [0.0] * len(chain[-1].buckets)
    for prev, cur in zip(chain, chain[1:]):
        reqs += _delta(cur.requests, prev.requests)
        lsum += _delta(cur.latency_sum_s, prev.latency_sum_s)
        d = _delta(cur.latency_count, prev.latency_count)
        lcount += d
        same = len(prev.buckets) == len(cur.buckets) and cur.latency_count >= prev.latency_count
        for k, (_, c) in enumerate(cur.buckets[: len(bucket_d)]):
            bucket_d[k] += c - prev.buckets[k][1] if same else c
    span = chain[-1].t_s - chain[0].t_s
    qps = reqs / span if span > 0 else None
    if lcount <= 0:
        return WindowStats(qps, None, None, reqs, "latency: no request served in this window")
    p99 = quantile_from_buckets(0.99, [(le, c) for (le, _), c in zip(chain[-1].buckets, bucket_d)])
    return WindowStats(qps, 1000.0 * lsum / lcount, None if p99 is None else 1000.0 * p99, reqs)


class ScrapeError(Exception):
    """The endpoint answered, but not a page to read (a status other than 200, a redirect, too large a body)."""


class ConnectError(OSError):
    """The endpoint could not be reached."""


def fetch_http(url: str, timeout_s: float, max_bytes: int = MAX_BODY_BYTES) -> str:
    """``GET url``, the answer's body as text: http(s) only, no redirect followed, no proxy or credentials from the
    environment, ``timeout_s`` for the whole exchange (a watchdog shuts the socket down at the deadline, so an
    answer that trickles in a byte at a time is cut too), at most ``max_bytes`` read (ScrapeError beyond)."""
    import http.client
    import ssl

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"only http(s)://host URLs are scraped, not {url!r}")
    port = parts.port  # ValueError on a malformed port
    if parts.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname, port, timeout=timeout_s, context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parts.hostname, port, timeout=timeout_s)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    cut = threading.Event()

    def deadline() -> None:
        cut.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked in another thread
            except OSError:
                pass

    watchdog = threading.Timer(timeout_s, deadline)
    watchdog.daemon = True
    watchdog.start()
    body = bytearray()
    try:
        try:
            conn.connect()
        except OSError as exc:
            if cut.is_set() or isinstance(exc, TimeoutError):
                raise
            raise ConnectError(f"{parts.hostname}:{port or conn.default_port}: {exc.strerror or exc}") from exc
        conn.request("GET", target, headers={"Accept": "text/plain", "Accept-Encoding": "identity",
                                             "Connection": "close", "User-Agent": "muxflow-node-agent"})
        resp = conn.getresponse()
        if resp.status != 200:
            redirect = ": a redirect, not followed" if 300 <= resp.status < 400 else ""
            raise ScrapeError(f"HTTP {resp.status} {resp.reason}{redirect}")
        length = resp.getheader("Content-Length") or ""
        if length.strip().isdigit() and int(length) > max_bytes:
            raise ScrapeError(f"the answer has more than {max_bytes} bytes ({int(length)}): not a metrics page")
        while True:
            chunk = resp.read(min(1 << 16, max_bytes + 1 - len(body)))
            if not chunk:
                break
            body += chunk
            if len(body) > max_bytes:
                raise ScrapeError(f"the answer has more than {max_bytes} bytes: not a metrics page")
    except Exception as exc:
        if cut.is_set():
            raise TimeoutError(f"no complete answer within {timeout_s:g} s") from exc
        if isinstance(exc, TimeoutError):
            raise TimeoutError(f"no answer within {timeout_s:g} s") from exc
        raise
    finally:
        watchdog.cancel()
        conn.close()
    if cut.is_set():
        raise TimeoutError(f"no complete answer within {timeout_s:g} s")
    return body.decode("utf-8", errors="replace")


class ReplicaScraper:
    """One replica's endpoint, scraped from a thread of its own (``start``) or by hand (``scrape_once``)."""

    def __init__(self, url: str, *, interval_s: float = 5.0, timeout_s: float = 2.0, keep_s: float = 3900.0,
                 clock: Callable[[], float] = time.time, solo: Callable[[], bool] = lambda: True,
                 fetch: Callable[[str, float], str] = fetch_http):
        self.url = url
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._solo = solo
        self._fetch = fetch
        self._snaps: deque[Snapshot] = deque(maxlen=max(16, int(keep_s / interval_s) + 4))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        self.last_error_s: float | None = None
        self.scrapes = 0
        self.failures = 0

    def start(self) -> ReplicaScraper:
        self._thread = threading.Thread(target=self._run, name=f"scrape {self.url}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.scrape_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def stop(self) -> None:
        """Ask the thread to end after the scrape in progress (``close`` waits for it)."""
        self._stop.set()

    def close(self) -> None:
        self.stop()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + self.interval_s + 5.0)

    def scrape_once(self) -> bool:
        solo = self._solo()
        try:
            vals = parse_exposition(self._fetch(self.url, self.timeout_s))
        except Exception as exc:  # refused, timed out, not a metrics page: a gap, with its reason
            msg = f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".strip()
            if msg != self.last_error:
                log.warning("scrape of %s failed: %s", self.url, msg)
            self.last_error, self.last_error_s = msg, self._clock()
            self.failures += 1
            return False
        snap = Snapshot(self._clock(), vals["requests"], vals["sum"], vals["count"], vals["buckets"],
                        vals.get("busy_s"), solo and self._solo())
        with self._lock:
            self._snaps.append(snap)
        if self.last_error is not None:
            log.info("scrape of %s works again", self.url)
        self.last_error = None
        self.scrapes += 1
        return True

    def snapshots(self) -> list[Snapshot]:
        with self._lock:
            return list(self._snaps)

    def _why_none(self) -> str:
        err = f" (last error: {self.last_error})" if self.last_error else ""
        return f"qps, latency: no scrape of {self.url} in this window{err}"

    def window(self, start_s: float, end_s: float) -> WindowStats:
        st = window_stats(self.snapshots(), start_s, end_s)
        return st if st is not None else WindowStats(None, None, None, 0.0, self._why_none())

    def current_qps(self, now_s: float, stale_s: float | None = None) -> float | None:
        """Requests/s over the latest scrape interval; None when the latest scrape is older than ``stale_s``."""
        snaps = self.snapshots()[-2:]
        stale = 3.0 * self.interval_s if stale_s is None else stale_s
        if len(snaps) < 2 or now_s - snaps[-1].t_s > stale or snaps[-1].t_s <= snaps[0].t_s:
            return None
        return _delta(snaps[-1].requests, snaps[0].requests) / (snaps[-1].t_s - snaps[0].t_s)

    def current(self, now_s: float, stale_s: float | None = None) -> tuple[float | None, float | None]:
        """(requests/s, p99 latency in ms) over the latest scrape interval; None for what it cannot tell (a stale
        scrape: both; no request served in it: the p99)."""
        snaps = self.snapshots()[-2:]
        stale = 3.0 * self.interval_s if stale_s is None else stale_s
        if len(snaps) < 2 or now_s - snaps[-1].t_s > stale or snaps[-1].t_s <= snaps[0].t_s:
            return None, None
        st = window_stats(snaps, snaps[0].t_s, snaps[-1].t_s)
        return (None, None) if st is None else (st.qps, st.latency_p99_ms)

    def solo_latency_ms(self, now_s: float, window_s: float) -> float | None:
        snaps = [s for s in self.snapshots() if s.t_s >= now_s - window_s - self.interval_s]
        lsum = lcount = 0.0
        for prev, cur in zip(snaps, snaps[1:]):
            if prev.solo and cur.solo and cur.t_s >= now_s - window_s:
                lsum += _delta(cur.latency_sum_s, prev.latency_sum_s)
                lcount += _delta(cur.latency_count, prev.latency_count)
        return 1000.0 * lsum / lcount if lcount > 0 else None


class Scrapers:
    """The node's replicas by GPU index."""

    def __init__(self, by_gpu: Mapping[int, ReplicaScraper]):
        self.by_gpu = dict(by_gpu)

    def start(self) -> Scrapers:
        for s in self.by_gpu.values():
            s.start()
        return self

    def close(self) -> None:
        for s in self.by_gpu.values():  # all at once: each may be waiting out a scrape timeout
            s.stop()
        for s in self.by_gpu.values():
            s.close()

    def get(self, gpu_index: int) -> ReplicaScraper | None:
        return self.by_gpu.get(gpu_index)
