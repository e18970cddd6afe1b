"""Schema migrations of the feature store, run programmatically through Alembic.

The migration scripts live in the ``sql`` package (``sql/migrations``) and are
found relative to it, so this works from any working directory and from an
installed wheel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import sql
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from executors.store.db import make_engine

log = logging.getLogger(__name__)

SQL_DIR = Path(sql.__file__).resolve().parent
ALEMBIC_INI = SQL_DIR / "alembic.ini"
MIGRATIONS_DIR = SQL_DIR / "migrations"


def alembic_config() -> Config:
    """The project's Alembic config, with script_location pinned to the package."""
    cfg = Config(str(ALEMBIC_INI))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # Keep the host application's logging untouched (see env.py).
    cfg.attributes["configure_logger"] = False
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # pragma: no cover - the package always ships 0001
        raise RuntimeError(f"no migrations found under {MIGRATIONS_DIR}")
    return head


def current_revision(url: str) -> str | None:
    """The revision stamped in the database, or None for an unmigrated one."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def _run(url: str, fn: Callable[[Config, str], None], revision: str) -> str | None:
    # The connection is handed over in attributes rather than as sqlalchemy.url
    # because Config goes through ConfigParser, which chokes on the '%' of
    # URL-encoded passwords.
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            fn(cfg, revision)
            conn.commit()
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> str:
    """Bring the database at ``url`` up to ``revision``; returns the revision now current."""
    now = _run(url, command.upgrade, revision)
    if now is None:  # pragma: no cover - upgrade always stamps
        raise RuntimeError(f"upgrade to {revision} left the database unstamped")
    log.info("feature store at revision %s", now)
    return now


def downgrade(url: str, revision: str = "base") -> str | None:
    """Take the database back to ``revision`` (default: empty); returns the revision now current."""
    now = _run(url, command.downgrade, revision)
    log.info("feature store downgraded to revision %s", now)
    return now
