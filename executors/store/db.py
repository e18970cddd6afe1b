"""Engines and sessions for the feature store.

SQLite under ``.muxflow/`` is the embedded default; ``MUXFLOW_DATABASE_URL``
(e.g. ``postgresql+psycopg2://user@host/db``) selects Postgres. The URL is
resolved by callers (CLI, Dagster resources) and passed in explicitly.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

ENV_URL = "MUXFLOW_DATABASE_URL"
DEFAULT_STATE_DIR = Path(".muxflow")


def default_url(state_dir: Path = DEFAULT_STATE_DIR) -> str:
    return f"sqlite:///{state_dir / 'muxflow.db'}"


def resolve_url(explicit: str | None = None, environ: dict[str, str] | None = None) -> str:
    """Explicit URL, else ``MUXFLOW_DATABASE_URL``, else the SQLite default."""
    env = os.environ if environ is None else environ
    return explicit or env.get(ENV_URL) or default_url()


def cannot_open(url: str, exc: BaseException) -> str:
    """One line saying why the store at ``url`` could not be opened (an unreachable server, a bad URL)."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"database: cannot open {url}: {exc.__class__.__name__}: {first}"


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, future=True)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # pragma: no cover - trivial
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=5000")
            cur.close()

        return engine
    return create_engine(url, future=True, pool_pre_ping=True)


class Store:
    """A feature store handle: an engine plus a session factory."""

    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any error."""
        with self._sessions() as s, s.begin():
            yield s

    def dispose(self) -> None:
        self.engine.dispose()
