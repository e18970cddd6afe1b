"""The metrics endpoints under what anyone on the network can send them (the node agent's runs as root).

Every attack runs against a real server on 127.0.0.1, bounded in count and time: idle sockets by the thousand,
a request that trickles in a byte at a time, a flood of scrapes, wrong passwords by the dozen, plain HTTP to a TLS
port. The server must hold at most its connection cap (file descriptors and threads), drop what is slow at its own
deadline, collect at most once per refresh interval, verify a bounded number of passwords, and still answer a
legitimate scrape.
"""

from __future__ import annotations

import base64
import http.client
import os
import selectors
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from click.testing import CliRunner
from prometheus_client.core import GaugeMetricFamily

from executors.metrics_http import (AUTH_VERIFY_BURST, MAX_HEAD_BYTES, BasicAuth, MetricsServer, WebConfigError,
                                    load_web_config, serve)

HOST = "127.0.0.1"


class Counting:
    """A collector that counts its collections (the node agent's walks /proc for each) and publishes the count."""

    def __init__(self, gate: threading.Event | None = None):
        self.calls = 0
        self.gate = gate

    def collect(self):
        self.calls += 1
        if self.gate is not None:
            assert self.gate.wait(30), "the test never opened the gate"
        g = GaugeMetricFamily("test_collections", "Collections so far.")
        g.add_metric([], self.calls)
        yield g


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture()
def servers() -> Iterator[list[MetricsServer]]:
    started: list[MetricsServer] = []
    yield started
    for s in started:
        s.close()


def start(servers: list[MetricsServer], collector=None, **options) -> MetricsServer:
    srv = serve(collector or Counting(), HOST, 0, **options)
    servers.append(srv)
    return srv


def get(port: int, path: str = "/metrics", headers: dict[str, str] | None = None, *,
        context: ssl.SSLContext | None = None, timeout_s: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    conn = (http.client.HTTPSConnection(HOST, port, timeout=timeout_s, context=context) if context is not None
            else http.client.HTTPConnection(HOST, port, timeout=timeout_s))
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except BlockingIOError:
        return False


def test_attack_1200_idle_sockets_hold_at_most_the_cap_and_a_scrape_still_answers(servers) -> None:
    """1,200 connections that send nothing (about what exhausts a root agent under systemd's 1,024 descriptors):
    the server holds at most its cap of them, each until its deadline, and closes the rest at once; its
    descriptors and threads stay bounded; a scrape is answered within three of its timeouts; and every idle
    connection is closed by the server within that time."""
    timeout_s, cap, n = 1.0, 64, 1200
    fds0, threads0 = open_fds(), threading.active_count()
    srv = start(servers, timeout_s=timeout_s, max_connections=cap)
    attackers: list[socket.socket] = []
    peak_active = peak_fds = peak_threads = 0

    def sample() -> None:
        nonlocal peak_active, peak_fds, peak_threads
        peak_active = max(peak_active, srv.active)
        peak_fds = max(peak_fds, open_fds() - len(attackers))   # the server's share: all but the attack's own
        peak_threads = max(peak_threads, threading.active_count())

    try:
        for _ in range(n):  # each connect waits for the server's accept queue: all 1,200 reach the server
            s = socket.create_connection((HOST, srv.port), timeout=10)
            s.setblocking(False)
            attackers.append(s)
        sample()
        sel = selectors.DefaultSelector()  # epoll: 1,200 descriptors are past select()'s FD_SETSIZE
        for s in attackers:
            sel.register(s, selectors.EVENT_READ)
        t0 = time.monotonic()
        answered_s = None
        open_ = set(attackers)
        while time.monotonic() - t0 < 3 * timeout_s and (answered_s is None or open_):
            if answered_s is None:
                try:
                    status, _, body = get(srv.port, timeout_s=timeout_s)
                    assert status == 200 and b"test_collections" in body
                    answered_s = time.monotonic() - t0
                except (ConnectionError, http.client.RemoteDisconnected, TimeoutError):
                    pass  # refused at the cap: a scraper retries at its next interval; here, at once
            for key, _ in sel.select(timeout=0.05):
                if closed_by_server(key.fileobj):
                    open_.discard(key.fileobj)
                    sel.unregister(key.fileobj)
            sample()
        sel.close()
        assert answered_s is not None, f"no scrape answered within {3 * timeout_s:g} s"
        assert not open_, f"{len(open_)} idle connections still open after {3 * timeout_s:g} s"
        assert peak_active <= cap
        assert peak_fds - fds0 <= cap + 8, (peak_fds, fds0)
        assert peak_threads - threads0 <= cap + 4
        assert srv.refused > 0  # (not n - cap: the kernel queues some until a slot frees, then they get one)
    finally:
        for s in attackers:
            s.close()


def test_attack_a_request_that_trickles_in_is_dropped_at_the_deadline(servers) -> None:
    """Slowloris: a header byte every quarter of the timeout, so a timeout per read would never fire. The server
    drops the connection at its deadline (well within three timeouts), answering nothing."""
    timeout_s = 1.0
    srv = start(servers, timeout_s=timeout_s)
    s = socket.create_connection((HOST, srv.port))
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Drip: ")
        t0 = time.monotonic()
        dropped_s, got = None, b""
        while time.monotonic() - t0 < 3 * timeout_s:
            try:
                s.send(b"z")
            except (BrokenPipeError, ConnectionResetError):
                dropped_s = time.monotonic() - t0
                break
            s.settimeout(timeout_s / 4)
            try:
                chunk = s.recv(4096)
            except TimeoutError:
                continue
            except ConnectionResetError:
                chunk = b""
            got += chunk
            if not chunk:
                dropped_s = time.monotonic() - t0
                break
        assert dropped_s is not None, f"a trickling request was still open after {3 * timeout_s:g} s"
        assert got == b"" and srv.snapshot.collections == 0
        assert get(srv.port)[0] == 200   # and the endpoint serves on
    finally:
        s.close()


def test_attack_a_flood_of_scrapes_collects_once_per_refresh_interval(servers) -> None:
    clock = FakeClock()
    collector = Counting()
    srv = start(servers, collector, refresh_s=1.0, clock=clock)
    bodies = set()

    def flood(k: int) -> None:
        for _ in range(k):
            status, _, body = get(srv.port)
            assert status == 200
            bodies.add(body)

    threads = [threading.Thread(target=flood, args=(25,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert collector.calls == 1 and len(bodies) == 1 and b"test_collections 1.0" in bodies.pop()
    for accept in ("application/openmetrics-text; version=1.0.0", "text/plain"):  # another encoding: no collection
        assert get(srv.port, headers={"Accept": accept, "Accept-Encoding": "gzip"})[0] == 200
    assert collector.calls == 1
    clock.t += 0.999
    get(srv.port)
    assert collector.calls == 1
    clock.t += 0.001
    status, _, body = get(srv.port)
    assert collector.calls == 2 and b"test_collections 2.0" in body


def test_concurrent_scrapes_share_one_slow_collection(servers) -> None:
    """Eight scrapes arrive while one collection is in progress: they wait for it, and none starts another."""
    gate = threading.Event()
    collector = Counting(gate)
    srv = start(servers, collector, clock=FakeClock())
    answers: list[int] = []
    threads = [threading.Thread(target=lambda: answers.append(get(srv.port)[0])) for _ in range(8)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    while (srv.active < 8 or collector.calls < 1) and time.monotonic() - t0 < 30:
        time.sleep(0.01)  # waiting for a state, not for a race to settle: the gate holds the collection
    gate.set()
    for t in threads:
        t.join(30)
    assert answers == [200] * 8 and collector.calls == 1


def test_attack_an_oversized_request_head_is_refused(servers) -> None:
    srv = start(servers)
    status, _, _ = get(srv.port, headers={"X-Pad": "a" * (MAX_HEAD_BYTES + 1)})
    assert status == 431 and srv.snapshot.collections == 0
    assert get(srv.port, "/nowhere")[0] == 404 and srv.snapshot.collections == 0


def write_users(tmp_path: Path, **passwords: str) -> Path:
    cfg = tmp_path / "web.yml"
    cfg.write_text("basic_auth_users:\n" + "".join(
        f"  {u}: '{bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=4)).decode().replace('$2b$', '$2y$')}'\n"
        for u, p in passwords.items()))
    return cfg


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_attack_no_or_wrong_credentials_get_401(servers, tmp_path) -> None:
    srv = start(servers, web_config=load_web_config(write_users(tmp_path, prometheus="s3cret")))
    for headers in ({}, basic("prometheus", "wrong"), basic("root", "s3cret"), {"Authorization": "Bearer x"},
                    {"Authorization": "Basic !!!"}):
        status, h, _ = get(srv.port, headers=headers)
        assert status == 401 and h["www-authenticate"].startswith("Basic realm="), headers
    assert srv.snapshot.collections == 0
    status, _, body = get(srv.port, headers=basic("prometheus", "s3cret"))
    assert status == 200 and b"test_collections" in body


def test_attack_a_flood_of_wrong_passwords_costs_a_bounded_number_of_bcrypt_checks(servers, tmp_path) -> None:
    """bcrypt is slow by design: wrong passwords get at most the bucket's verifications (then 429), and the
    scraper's own password, verified once, is never verified again while it keeps scraping."""
    clock = FakeClock()
    checks: list[bytes] = []
    users = load_web_config(write_users(tmp_path, prometheus="s3cret")).users

    def checkpw(password: bytes, hashed: bytes) -> bool:
        checks.append(password)
        return bcrypt.checkpw(password, hashed)

    auth = BasicAuth(users, clock=clock, checkpw=checkpw)
    srv = start(servers, auth=auth, clock=clock)
    assert get(srv.port, headers=basic("prometheus", "s3cret"))[0] == 200 and len(checks) == 1
    statuses = [get(srv.port, headers=basic("prometheus", f"guess{k}"))[0] for k in range(50)]
    assert statuses.count(401) == AUTH_VERIFY_BURST - 1 and statuses.count(429) == 50 - (AUTH_VERIFY_BURST - 1)
    assert len(checks) == AUTH_VERIFY_BURST
    assert [get(srv.port, headers=basic("prometheus", "s3cret"))[0] for _ in range(10)] == [200] * 10
    assert len(checks) == AUTH_VERIFY_BURST   # remembered: no bcrypt for the scraper, even with the bucket empty
    clock.t += 1.0  # a second: two more verifications
    statuses = [get(srv.port, headers=basic("nobody", f"guess{k}"))[0] for k in range(5)]
    assert statuses == [401, 401, 429, 429, 429] and len(checks) == AUTH_VERIFY_BURST + 2


def self_signed(tmp_path: Path, name: str = "server") -> tuple[Path, Path]:
    cert, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    try:
        import datetime as dt
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}",
                        "-addext", f"subjectAltName=IP:{HOST}"], check=True, capture_output=True)
        key.chmod(0o600)
        return cert, key
    k = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.timezone.utc)
    c = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(k.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
         .not_valid_after(now + dt.timedelta(days=1))
         .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
         .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
         .sign(k, hashes.SHA256()))
    cert.write_bytes(c.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    key.chmod(0o600)
    return cert, key


def test_tls_serves_https_and_plain_http_to_its_port_fails(servers, tmp_path) -> None:
    cert, key = self_signed(tmp_path)
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"tls_server_config:\n  cert_file: {cert.name}\n  key_file: {key.name}\n")  # the file's directory
    timeout_s = 1.0
    srv = start(servers, web_config=load_web_config(cfg), timeout_s=timeout_s)
    assert srv.scheme == "https"
    client = ssl.create_default_context(cafile=str(cert))
    status, _, body = get(srv.port, context=client)
    assert status == 200 and b"test_collections" in body
    with pytest.raises((http.client.HTTPException, OSError)):
        get(srv.port, timeout_s=3 * timeout_s)
    with pytest.raises(ssl.SSLError):  # a client that does not trust the certificate
        get(srv.port, context=ssl.create_default_context(), timeout_s=3 * timeout_s)
    idle = socket.create_connection((HOST, srv.port))  # a handshake that never starts: cut at the deadline
    try:
        idle.settimeout(3 * timeout_s)
        assert idle.recv(1) == b""
    finally:
        idle.close()
    assert get(srv.port, context=client)[0] == 200


def test_tls_with_client_certificates_required(servers, tmp_path) -> None:
    cert, key = self_signed(tmp_path)
    ccert, ckey = self_signed(tmp_path, "prometheus")
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
                   f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {ccert}\n  min_version: TLS13\n")
    srv = start(servers, web_config=load_web_config(cfg), timeout_s=1.0)
    client = ssl.create_default_context(cafile=str(cert))
    with pytest.raises((ssl.SSLError, http.client.HTTPException, OSError)):
        get(srv.port, context=client, timeout_s=3.0)
    client.load_cert_chain(ccert, ckey)
    assert get(srv.port, context=client)[0] == 200


@pytest.mark.parametrize("text, says", [
    ("tls_server_config: {cert_file: a}\nbasic_auth_user: {}\n", "unknown key 'basic_auth_user'"),
    ("http_server_config: {http2: true}\n", "unknown key 'http_server_config'"),
    ("tls_server_config: {cert_file: a, key_file: b, cipher_suites: [x]}\n", "unsupported key 'cipher_suites'"),
    ("tls_server_config: {key_file: b}\n", "cert_file is required"),
    ("tls_server_config: {cert_file: nope.crt, key_file: nope.key}\n", "nope.key: no such file"),
    ("basic_auth_users: {prometheus: s3cret}\n", "prometheus: not a bcrypt hash"),
    ("basic_auth_users: [prometheus]\n", "expected a mapping"),
    ("- a\n", "expected a mapping"),
    ("tls_server_config: [\n", "not YAML"),
])
def test_a_web_config_the_endpoint_cannot_honour_is_one_line_at_start_up(tmp_path, text: str, says: str) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text(text)
    with pytest.raises(WebConfigError) as err:
        load_web_config(cfg)
    assert says in str(err.value) and "\n" not in str(err.value) and str(cfg) in str(err.value)


def test_a_tls_key_others_can_read_is_refused(tmp_path) -> None:
    cert, key = self_signed(tmp_path)
    key.chmod(0o644)
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"tls_server_config: {{cert_file: {cert}, key_file: {key}}}\n")
    with pytest.raises(WebConfigError, match="lets others read or change it; chmod 600"):
        load_web_config(cfg)


def test_unsupported_client_auth_types_are_refused_not_approximated(tmp_path) -> None:
    cert, key = self_signed(tmp_path)
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
                   f"  client_auth_type: RequireAnyClientCert\n  client_ca_file: {cert}\n")
    with pytest.raises(WebConfigError, match="client_auth_type 'RequireAnyClientCert' is not one of"):
        load_web_config(cfg)


@pytest.mark.parametrize("argv", [["metrics", "serve", "--port", "0"],
                                  ["node-agent", "--simulated", "--metrics-port", "0", "--duration", "0"]])
def test_both_commands_refuse_a_bad_web_config_before_starting(tmp_path, argv: list[str]) -> None:
    from pipelines.cli.main import main

    cfg = tmp_path / "web.yml"
    cfg.write_text("basic_auth_users: {prometheus: plain}\n")
    res = CliRunner().invoke(main, argv + ["--web-config-file", str(cfg)])
    assert res.exit_code != 0 and "not a bcrypt hash" in res.output, res.output
