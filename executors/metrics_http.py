"""A Prometheus ``/metrics`` endpoint on a thread of its own, for one collector (the node agent's, the scheduler's).

Anyone who can reach the port can connect, and the node agent runs as root: what a connection can cost is bounded
here, whatever it sends (docs/SECURITY.md, "Metrics endpoints").

- **Connections**: at most ``max_connections`` at once, each on a thread of its own; one beyond is accepted and
  closed at once, with no thread, so idle sockets cannot take the process's file descriptors (the root agent needs
  them to evict, requeue and check). The listen backlog is the kernel's, not ours.
- **Time**: one deadline per connection (``timeout_s`` from its accept) for the TLS handshake, the request line
  and headers, and the answer; each read and write waits at most what is left of it, so a client that sends or
  reads a byte at a time is cut at the deadline, not once per byte. One request per connection.
- **Size**: the request line and headers in at most :data:`MAX_HEAD_BYTES` (else 431); no body is read.
- **Work**: the registry is collected at most once per ``refresh_s`` (under a lock: concurrent scrapes wait for
  the one collection and share it), so a flood of scrapes costs no more walks of ``/proc`` or queries of the
  store than one scraper; each encoding (text, OpenMetrics, gzip) of a collection is made once.
- **Who**: an optional web config file in the format Prometheus' own exporters read (exporter-toolkit's
  ``web-config.yml``): TLS (``tls_server_config``) and basic auth (``basic_auth_users``: bcrypt hashes).
  bcrypt is slow by design, so at most :data:`AUTH_VERIFY_BURST` verifications at once and
  :data:`AUTH_VERIFY_PER_S` a second are made (beyond: 429), and a verified password is remembered (its SHA-256,
  compared in constant time) while it keeps being used, so the scraper's requests cost no bcrypt at all.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import hmac
import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0              # a connection's whole exchange: Prometheus' default scrape timeout
MAX_CONNECTIONS = 64          # Prometheus holds one per target; the rest is curl and a spare
REFRESH_S = 1.0               # the fastest a collection is redone (Prometheus scrapes every 15 s by default)
MAX_HEAD_BYTES = 16 << 10     # request line and headers (Prometheus' are about 300 bytes)
LISTEN_BACKLOG = 1024          # the kernel holds these, not the process: a burst of connects is not dropped
AUTH_VERIFY_PER_S = 2.0       # bcrypt verifications a second (each about 50-100 ms of CPU at cost 10)
AUTH_VERIFY_BURST = 4
AUTH_REMEMBER_S = 300.0       # a verified password stays verified while it is used at least this often
_RECV_BYTES = 4096
_SEND_BYTES = 16 << 10


class WebConfigError(ValueError):
    """The web config file is not one this endpoint can serve by (one line: which key, what is wrong)."""


# exporter-toolkit's names (crypto/tls's); the ones Python's ssl cannot honour are refused, not approximated
_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
                 "TLS13": ssl.TLSVersion.TLSv1_3}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}
_TOP_KEYS = {"tls_server_config", "basic_auth_users"}
_BCRYPT = re.compile(r"\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}")


@dataclass(frozen=True)
class WebConfig:
    """What a web config file says: a TLS context (None: plain HTTP) and basic auth users (empty: none)."""

    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)   # name → bcrypt hash
    path: str | None = None


def load_web_config(path: str | Path | None) -> WebConfig:
    """A web config file (exporter-toolkit's format; relative paths are the file's directory's); None: none.

    Raises :class:`WebConfigError` with one line naming the key and what is wrong: an endpoint that was asked for
    TLS or auth never starts without them."""
    if path is None:
        return WebConfig()
    import yaml

    p = Path(path)

    def bad(msg: str) -> WebConfigError:
        return WebConfigError(f"web config {p}: {msg}")

    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise bad(f"cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise bad(f"not YAML ({' '.join(str(exc).split())})") from None
    if data is None:
        return WebConfig(path=str(p))
    if not isinstance(data, dict):
        raise bad("expected a mapping of tls_server_config, basic_auth_users")
    unknown = sorted(set(map(str, data)) - _TOP_KEYS)
    if unknown:
        raise bad(f"unknown key {unknown[0]!r} (this endpoint reads {', '.join(sorted(_TOP_KEYS))})")
    ctx = _tls_context(data.get("tls_server_config"), p.parent, bad)
    users_in = data.get("basic_auth_users") or {}
    if not isinstance(users_in, dict):
        raise bad("basic_auth_users: expected a mapping of user name to bcrypt hash")
    users: dict[str, bytes] = {}
    for name, hashed in users_in.items():
        if not isinstance(name, str) or not name or ":" in name:
            raise bad(f"basic_auth_users: {name!r} is not a user name")
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise bad(f"basic_auth_users: {name}: not a bcrypt hash ($2y$…, as htpasswd -B makes)")
        users[name] = hashed.encode()
    if users:
        import bcrypt  # noqa: F401 -- missing: said at start-up, not at the first scrape
    return WebConfig(ctx, users, str(p))


def _tls_context(cfg: Any, base: Path, bad: Callable[[str], WebConfigError]) -> ssl.SSLContext | None:
    if cfg is None:
        return None
    if not isinstance(cfg, dict):
        raise bad("tls_server_config: expected a mapping")
    unknown = sorted(set(map(str, cfg)) - _TLS_KEYS)
    if unknown:
        raise bad(f"tls_server_config: unknown or unsupported key {unknown[0]!r} "
                  f"(this endpoint reads {', '.join(sorted(_TLS_KEYS))})")

    def file_of(key: str) -> str:
        value = cfg.get(key)
        if not isinstance(value, str) or not value:
            raise bad(f"tls_server_config: {key} is required")
        return str(base / value)

    cert, key = file_of("cert_file"), file_of("key_file")
    from executors.slurm.plan import read_private_file

    try:  # the private key is a secret as MuxFlow's others are: only its owner (this user, or root) reads it
        read_private_file(key, "key_file", WebConfigError)
    except WebConfigError as exc:
        raise bad(f"tls_server_config: {exc}") from None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.minimum_version = _TLS_VERSIONS[cfg.get("min_version", "TLS12")]
        ctx.maximum_version = _TLS_VERSIONS[cfg.get("max_version", "TLS13")]
    except KeyError as exc:
        raise bad(f"tls_server_config: TLS version {exc.args[0]!r} is not one of {', '.join(_TLS_VERSIONS)}") from None
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise bad(f"tls_server_config: cannot load cert_file {cert} with key_file {key} ({exc})") from None
    auth = cfg.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise bad(f"tls_server_config: client_auth_type {auth!r} is not one of {', '.join(_CLIENT_AUTH)}")
    ctx.verify_mode = _CLIENT_AUTH[auth]
    if auth != "NoClientCert":
        ca = file_of("client_ca_file")
        try:
            ctx.load_verify_locations(ca)
        except (OSError, ssl.SSLError) as exc:
            raise bad(f"tls_server_config: cannot load client_ca_file {ca} ({exc})") from None
    elif "client_ca_file" in cfg:
        raise bad("tls_server_config: client_ca_file without a client_auth_type that verifies client certificates")
    return ctx


class BasicAuth:
    """``Authorization: Basic`` against bcrypt hashes, at a bounded cost per second whatever is sent."""

    _DUMMY = b"$2b$10$" + b"." * 53   # an unknown user costs one verification too: a name's existence does not show

    def __init__(self, users: dict[str, bytes], *, verify_per_s: float = AUTH_VERIFY_PER_S,
                 verify_burst: int = AUTH_VERIFY_BURST, remember_s: float = AUTH_REMEMBER_S,
                 clock: Callable[[], float] = time.monotonic, checkpw: Callable[[bytes, bytes], bool] | None = None):
        import bcrypt

        self.users = dict(users)
        self._checkpw = checkpw or bcrypt.checkpw
        self._rate = verify_per_s
        self._burst = float(verify_burst)
        self._tokens = float(verify_burst)
        self._remember_s = remember_s
        self._clock = clock
        self._at = clock()
        self._verified: dict[str, tuple[bytes, float]] = {}   # user → (SHA-256 of their password, last used)
        self._lock = threading.Lock()
        self.verifications = 0

    def check(self, header: str | None) -> str:
        """``"ok"``, ``"denied"`` (no, or wrong, credentials) or ``"busy"`` (no verification left this second)."""
        user, password = _basic_credentials(header)
        if user is None:
            return "denied"
        digest = hashlib.sha256(password).digest()
        now = self._clock()
        with self._lock:
            known = self._verified.get(user)
            if known is not None and now - known[1] <= self._remember_s and hmac.compare_digest(known[0], digest):
                self._verified[user] = (known[0], now)
                return "ok"
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
            self._at = now
            if self._tokens < 1.0:
                return "busy"
            self._tokens -= 1.0
            self.verifications += 1
        hashed = self.users.get(user)
        try:
            good = self._checkpw(password, hashed if hashed is not None else self._DUMMY) and hashed is not None
        except ValueError:  # a hash bcrypt cannot read
            good = False
        if good:
            with self._lock:
                self._verified[user] = (digest, now)  # one entry per configured user at most
        return "ok" if good else "denied"


def _basic_credentials(header: str | None) -> tuple[str | None, bytes]:
    if not header:
        return None, b""
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None, b""
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None, b""
    user, sep, password = raw.partition(b":")
    if not sep:
        return None, b""
    return user.decode("utf-8", errors="replace"), password


class _Snapshot:
    """The registry's families, collected at most once per ``refresh_s``, and each encoding of them made once."""

    def __init__(self, registry: CollectorRegistry, refresh_s: float, clock: Callable[[], float]):
        self.registry = registry
        self.refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        self._done_at: float | None = None
        self._families: list[Any] | None = None
        self._error: str | None = None
        self._encoded: dict[tuple[str, bool], tuple[bytes, str]] = {}
        self.collections = 0

    def collect(self) -> list[Any]:  # what an encoder reads: the snapshot, not the registry
        return self._families or []

    def get(self, accept: str, gzipped: bool) -> tuple[bytes, str] | str:
        """(body, content type) of the current snapshot, or the collection's error."""
        with self._lock:  # one collection at a time; whoever waited shares it
            if self._done_at is None or self._clock() - self._done_at >= self.refresh_s:
                self.collections += 1
                try:
                    self._families, self._error = list(self.registry.collect()), None
                except Exception as exc:  # a collector that fails: the same for the interval, not retried per scrape
                    log.warning("metrics: collection failed: %s", exc)
                    self._families, self._error = None, f"{exc.__class__.__name__}: {exc}"
                self._encoded = {}
                self._done_at = self._clock()  # from its end: a slow collection still leaves refresh_s between two
            if self._error is not None:
                return self._error
            encoder, content_type = choose_encoder(accept)
            key = (content_type, gzipped)
            if key not in self._encoded:
                body = encoder(self)  # type: ignore[arg-type]
                self._encoded[key] = (gzip.compress(body) if gzipped else body, content_type)
            return self._encoded[key]


class _Deadline:
    def __init__(self, timeout_s: float):
        self.end = time.monotonic() + timeout_s

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("connection deadline")
        return left


class _Request:
    def __init__(self, method: str, path: str, headers: dict[str, str]):
        self.method, self.path, self.headers = method, path, headers


class _Refused(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


class MetricsServer:
    """``GET /metrics`` of a registry on a thread of its own (``port`` 0: any free port, see ``.port``)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, *, web_config: WebConfig | None = None,
                 timeout_s: float = TIMEOUT_S, max_connections: int = MAX_CONNECTIONS, refresh_s: float = REFRESH_S,
                 auth: BasicAuth | None = None, clock: Callable[[], float] = time.monotonic):
        self.web_config = web_config or WebConfig()
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.snapshot = _Snapshot(registry, refresh_s, clock)
        self.auth = auth or (BasicAuth(self.web_config.users, clock=clock) if self.web_config.users else None)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._count_lock = threading.Lock()
        self.active = 0          # connections being served now
        self.refused = 0         # connections closed at once: all slots taken
        self._said_at: dict[str, float] = {}
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(LISTEN_BACKLOG)
            self._listener.setblocking(False)
        except OSError:
            self._listener.close()
            raise
        self.address = self._listener.getsockname()
        self.port = int(self.address[1])
        self.scheme = "https" if self.web_config.ssl_context is not None else "http"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="metrics-http", daemon=True)

    def start(self) -> MetricsServer:
        self._thread.start()
        log.info("metrics on %s://%s:%d/metrics", self.scheme, self.address[0], self.port)
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()

    def _accept_loop(self) -> None:
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            while not self._stop.is_set():
                if not sel.select(timeout=0.2):  # the stop flag's latency; an idle endpoint costs 5 wakeups a second
                    continue
                while True:  # the whole queue at each wakeup: a flood is closed as fast as it comes
                    try:
                        sock, _ = self._listener.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError as exc:  # out of descriptors (another part of the process): the next wakeup
                        self._say("accept", "metrics: accept failed: %s", exc)
                        self._stop.wait(0.1)
                        break
                    self._admit(sock)

    # the accept loop's thread: never blocks on a client
    def _admit(self, sock: socket.socket) -> None:
        if not self._slots.acquire(blocking=False):
            with self._count_lock:
                self.refused += 1
            self._say("cap", "metrics: %d connections open (the most), closing new ones (%d so far)",
                      self.max_connections, self.refused)
            _close(sock)
            return
        with self._count_lock:
            self.active += 1
        try:
            threading.Thread(target=self._serve, args=(sock,), name="metrics-conn", daemon=True).start()
        except RuntimeError:  # no thread to be had: this connection goes, the endpoint stays
            self._release()
            _close(sock)

    def _say(self, what: str, msg: str, *args: Any) -> None:
        """A warning once a minute at most: a flood must not flood the log too."""
        now = time.monotonic()
        with self._count_lock:
            if now - self._said_at.get(what, -1e18) < 60.0:
                return
            self._said_at[what] = now
        log.warning(msg, *args)

    def _release(self) -> None:
        with self._count_lock:
            self.active -= 1
        self._slots.release()

    def _serve(self, sock: socket.socket) -> None:
        deadline = _Deadline(self.timeout_s)
        conn: socket.socket = sock
        try:
            sock.settimeout(deadline.left())
            if self.web_config.ssl_context is not None:
                conn = self.web_config.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                _handshake(conn, deadline)
            try:
                req = _read_request(conn, deadline)
                status, headers, body = self._answer(req)
            except _Refused as exc:
                req = None
                status, headers, body = exc.status, {"Content-Type": "text/plain; charset=utf-8"}, \
                    (exc.reason + "\n").encode()
            _send(conn, status, headers, b"" if req is not None and req.method == "HEAD" else body, len(body),
                  deadline)
        except (OSError, ssl.SSLError, ValueError):  # cut at the deadline, a reset, a failed handshake: the client's
            pass
        finally:
            _close(conn)
            self._release()

    def _answer(self, req: _Request) -> tuple[int, dict[str, str], bytes]:
        text = {"Content-Type": "text/plain; charset=utf-8"}
        if self.auth is not None:
            verdict = self.auth.check(req.headers.get("authorization"))
            if verdict == "busy":
                return 429, {**text, "Retry-After": "1"}, b"too many password checks: try again\n"
            if verdict != "ok":
                return 401, {**text, "WWW-Authenticate": 'Basic realm="muxflow metrics", charset="UTF-8"'}, \
                    b"unauthorized\n"
        if req.method not in ("GET", "HEAD"):
            return 405, {**text, "Allow": "GET, HEAD"}, b"only GET\n"
        path = req.path.split("?", 1)[0]
        if path == "/":
            return 200, text, b"Prometheus metrics: /metrics\n"
        if path != "/metrics":
            return 404, text, b"not found: /metrics\n"
        got = self.snapshot.get(req.headers.get("accept", ""), gzip_accepted(req.headers.get("accept-encoding", "")))
        if isinstance(got, str):
            return 500, text, f"collection failed: {got}\n".encode()
        body, content_type = got
        headers = {"Content-Type": content_type}
        if gzip_accepted(req.headers.get("accept-encoding", "")):
            headers["Content-Encoding"] = "gzip"
        return 200, headers, body


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def _handshake(conn: ssl.SSLSocket, deadline: _Deadline) -> None:
    """The TLS handshake within the deadline (a blocking handshake waits the socket timeout per read)."""
    import select

    conn.setblocking(False)
    while True:
        try:
            conn.do_handshake()
            break
        except ssl.SSLWantReadError:
            ready = select.select([conn], [], [], deadline.left())[0]
        except ssl.SSLWantWriteError:
            ready = select.select([], [conn], [], deadline.left())[1]
        if not ready:
            raise TimeoutError("TLS handshake")
    conn.setblocking(True)


def _read_request(conn: socket.socket, deadline: _Deadline) -> _Request:
    buf = bytearray()
    while True:
        end = buf.find(b"\r\n\r\n", max(0, len(buf) - _RECV_BYTES - 3))
        if end >= 0:
            break
        if len(buf) > MAX_HEAD_BYTES:
            raise _Refused(431, f"request line and headers over {MAX_HEAD_BYTES} bytes")
        conn.settimeout(deadline.left())  # what is left, not a fresh timeout per read
        chunk = conn.recv(_RECV_BYTES)
        if not chunk:
            raise ConnectionResetError("closed before the headers ended")
        buf += chunk
    if end > MAX_HEAD_BYTES:
        raise _Refused(431, f"request line and headers over {MAX_HEAD_BYTES} bytes")
    lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _Refused(400, "not an HTTP/1.x request line")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _Refused(400, "malformed header line")
        headers[name.lower()] = value.strip()
    return _Request(parts[0], parts[1], headers)


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            429: "Too Many Requests", 431: "Request Header Fields Too Large", 500: "Internal Server Error"}


def _send(conn: socket.socket, status: int, headers: dict[str, str], body: bytes, length: int,
          deadline: _Deadline) -> None:
    head = f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in {**headers, "Content-Length": str(length), "Connection": "close"}.items())
    data = memoryview(head.encode("latin-1") + b"\r\n" + body)
    while data:
        conn.settimeout(deadline.left())
        n = conn.send(data[:_SEND_BYTES])
        data = data[n:]


def serve(collector: Any, host: str, port: int, **options: Any) -> MetricsServer:
    """A registry holding ``collector`` only, served on ``host:port`` (``options``: :class:`MetricsServer`'s)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return MetricsServer(registry, host, port, **options).start()
