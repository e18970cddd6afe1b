"""Project-wide test fixtures: database URLs for SQLite and PostgreSQL.

PostgreSQL is found in this order: ``MUXFLOW_TEST_PG_URL``, the local server at
127.0.0.1:5432, then (outside CI) a throwaway cluster started from the
binaries in ``/usr/lib/postgresql/*/bin``. Without any, Postgres tests are
skipped with a notice, or fail under ``CI=true`` where a server is required.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.exc import OperationalError

if TYPE_CHECKING:
    from executors.store.db import Store

log = logging.getLogger(__name__)

PG_URL_ENV = "MUXFLOW_TEST_PG_URL"
DEFAULT_PG_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"


# Tests that drive live daemons (the dev Slurm cluster, Dagster's webserver and a browser) wait on them more than they
# compute, and share their state (one cluster): under `make test`'s pytest-xdist workers they run in order in one
# worker while the others take the rest of the suite, test by test. (pytest-xdist's own `--dist loadgroup` cannot
# group them on pytest 9: it renames test ids through an attribute pytest no longer reads.)
DAEMON_TESTS = ("tests/live/", "tests/ui/")

try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pragma: no cover - pytest-xdist is a dev dependency; without it the suite runs in one process
    LoadScopeScheduling = None

if LoadScopeScheduling is not None:
    class _DaemonTestsInOneWorker(LoadScopeScheduling):
        """Every daemon test in one unit of work (one worker, in collection order); every other test its own."""

        def _split_scope(self, nodeid: str) -> str:
            return "daemons" if nodeid.startswith(DAEMON_TESTS) else nodeid

    def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadScopeScheduling:
        return _DaemonTestsInOneWorker(config, log)


def pytest_configure(config: pytest.Config) -> None:
    # One Dagster home per worker: two workers never share an instance's SQLite files.
    worker, home = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("DAGSTER_HOME")
    if worker and home and Path(home).is_dir():
        own = Path(home) / worker
        own.mkdir(exist_ok=True)
        os.environ["DAGSTER_HOME"] = str(own)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _reachable(url: str) -> str | None:
    """None when a server answers at ``url``, else why not."""
    engine = create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return None
    except OperationalError as exc:
        return str(exc.orig).strip().splitlines()[0]
    finally:
        engine.dispose()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _ThrowawayCluster:
    """A private PostgreSQL cluster in a temp folder, for machines without a server."""

    def __init__(self, bin_dir: Path):
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="muxflow-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.run_as: str | None = None
        if os.geteuid() == 0:
            # initdb and postgres refuse to run as root.
            for user in ("postgres", "nobody"):
                try:
                    entry = pwd.getpwnam(user)
                except KeyError:
                    continue
                os.chown(self.root, entry.pw_uid, entry.pw_gid)
                self.run_as = user
                break

    def _cmd(self, *args: str) -> list[str]:
        prefix = ["runuser", "-u", self.run_as, "--"] if self.run_as else []
        return prefix + list(args)

    def start(self) -> str:
        subprocess.run(
            self._cmd(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres",
                      "--auth=trust", "-E", "UTF8", "--no-sync"),
            check=True, capture_output=True, timeout=120,
        )
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -F"
        subprocess.run(
            self._cmd(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-o", options,
                      "-l", str(self.root / "server.log"), "-w", "-t", "60", "start"),
            check=True, capture_output=True, timeout=120,
        )
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        subprocess.run(
            self._cmd(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"),
            capture_output=True, timeout=60,
        )
        shutil.rmtree(self.root, ignore_errors=True)


def _newest_pg_bin() -> Path | None:
    candidates = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")]
    if not candidates:
        return None
    return max(candidates, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """URL of a PostgreSQL server's maintenance database (for CREATE DATABASE)."""
    url = os.environ.get(PG_URL_ENV) or DEFAULT_PG_URL
    why = _reachable(url)
    if why is None:
        yield url
        return
    shown = make_url(url).render_as_string(hide_password=True)
    if _in_ci():
        pytest.fail(f"CI=true but no PostgreSQL at {shown} ({why}); set {PG_URL_ENV}")
    bin_dir = _newest_pg_bin()
    cluster: _ThrowawayCluster | None = None
    if bin_dir is not None:
        cluster = _ThrowawayCluster(bin_dir)
        try:
            url = cluster.start()
            why = _reachable(url)
        except (subprocess.SubprocessError, OSError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            why = f"throwaway cluster failed: {exc} {detail.decode(errors='replace')[-500:]}"
            cluster.stop()
            cluster = None
    if cluster is not None and why is not None:
        cluster.stop()
        cluster = None
    if cluster is None:
        pytest.skip(
            f"PostgreSQL tests SKIPPED: no server at {shown} and none could be started "
            f"({why}); set {PG_URL_ENV} to run them"
        )
    log.warning("using a throwaway PostgreSQL cluster at %s", url)
    try:
        yield url
    finally:
        cluster.stop()


def _drop_database(server_url: str, name: str) -> None:
    engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            if conn.dialect.server_version_info >= (13,):
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            else:  # pragma: no cover - old servers
                conn.execute(
                    text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
                    {"n": name},
                )
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"')
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def make_postgres_database(postgres_server_url: str) -> Iterator[Callable[[], str]]:
    """Factory of fresh, empty databases on the server; all dropped at session end."""
    server_url = postgres_server_url
    created: list[str] = []

    def make() -> str:
        name = f"muxflow_test_{uuid.uuid4().hex[:12]}"
        engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        finally:
            engine.dispose()
        created.append(name)
        return make_url(server_url).set(database=name).render_as_string(hide_password=False)

    yield make
    for name in created:
        _drop_database(server_url, name)


@pytest.fixture(scope="session")
def postgres_url(make_postgres_database: Callable[[], str]) -> str:
    """One fresh database for the whole session, dropped at its end."""
    return make_postgres_database()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh SQLite file database (not created until first use)."""
    return f"sqlite:///{tmp_path / 'muxflow.db'}"


BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=BACKENDS)
def empty_db_url(request: pytest.FixtureRequest) -> str:
    """An empty, unmigrated database of each backend, private to the test."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return request.getfixturevalue("make_postgres_database")()


@pytest.fixture(scope="session")
def _migrated_postgres_url(postgres_url: str) -> str:
    from executors.store.migrate import upgrade

    upgrade(postgres_url)
    return postgres_url


def _truncate_all(url: str) -> None:
    from executors.store.models import Base

    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
    finally:
        engine.dispose()


@pytest.fixture
def postgres_store_url(_migrated_postgres_url: str) -> str:
    """The session's migrated Postgres database, emptied for this test.

    Tables are truncated rather than a database created per test: that would
    cost far more than the tests themselves.
    """
    _truncate_all(_migrated_postgres_url)
    return _migrated_postgres_url


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest) -> str:
    """A migrated, empty feature store of each backend (SQLite: a new file per test)."""
    if request.param == "sqlite":
        from executors.store.migrate import upgrade

        url = str(request.getfixturevalue("sqlite_url"))
        upgrade(url)
        return url
    return str(request.getfixturevalue("postgres_store_url"))


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """A ``Store`` on ``store_url``, disposed after the test."""
    from executors.store.db import Store

    handle = Store(store_url)
    try:
        yield handle
    finally:
        handle.dispose()


# -- a small simulated cluster for Dagster tests ------------------------------------------------

JOB_TYPES = ("ResNet-50 (batch size 64)", "Transformer (batch size 32)", "Recommendation (batch size 512)")


def _submit_jobs(store: Store, n: int, prefix: str = "job", steps: int = 5_000_000) -> list[int]:
    from executors.scheduler.submission import JobSpec, submit

    ids = []
    with store.session() as s:
        for k in range(n):
            spec = JobSpec(name=f"{prefix}-{k}", command="python train.py", job_type=JOB_TYPES[k % len(JOB_TYPES)],
                           mem_bytes=2 * 1024**3, allowed_gpu_types=("a10", "t4"), checkpoint_dir=f"/ckpt/{prefix}-{k}",
                           total_steps=steps)
            ids.append(submit(s, spec, None).id)
    return ids


@pytest.fixture
def cluster_store(store: Store) -> Iterator[Store]:
    """16 simulated GPUs (a10:8, t4:8), 3 services, 6 submitted long jobs; nothing profiled or trained."""
    from executors.simulated.setup import init_simulated_cluster

    with store.session() as s:
        init_simulated_cluster(s, {"a10": 8, "t4": 8}, 3, seed=0)
    _submit_jobs(store, 6)
    yield store


@pytest.fixture
def dagster_instance():
    """An ephemeral (in-memory) Dagster instance."""
    from dagster import DagsterInstance

    with DagsterInstance.ephemeral() as inst:
        yield inst


@pytest.fixture
def submit_more() -> Callable[[Store, int], list[int]]:
    """Submit ``n`` more long jobs (names continue the numbering)."""
    counter = iter(range(1000))

    def _more(store: Store, n: int) -> list[int]:
        return _submit_jobs(store, n, prefix=f"more{next(counter)}")

    return _more
