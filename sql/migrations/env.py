"""Alembic environment for the feature store (docs/DESIGN.md §3, step 3).

The connection comes from, in order: ``config.attributes["connection"]`` (set by
``executors.store.migrate``), ``-x url=...`` on the command line, the
``sqlalchemy.url`` main option, then ``executors.store.db.resolve_url()``.
"""

from __future__ import annotations

import logging
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from executors.store.db import make_engine, resolve_url
from executors.store.models import Base

config = context.config
log = logging.getLogger("alembic.env")

# Only the command line wants alembic.ini's logging; called programmatically,
# fileConfig would replace the host application's (or pytest's) handlers.
if config.config_file_name and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    return (
        context.get_x_argument(as_dictionary=True).get("url")
        or config.get_main_option("sqlalchemy.url")
        or resolve_url()
    )


def _configure(connection: Connection) -> None:
    is_sqlite = connection.dialect.name == "sqlite"
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode recreates the table instead.
        render_as_batch=is_sqlite,
        compare_type=True,
    )


def _run_on(connection: Connection) -> None:
    # make_engine turns SQLite foreign keys on. Batch mode recreates a table by
    # copy + DROP, and with foreign keys on that DROP fires ON DELETE CASCADE on
    # every referencing table: a later migration would silently delete data.
    # The pragma only works outside a transaction, so it is skipped (with a
    # warning) when the caller already holds one.
    toggle_fk = connection.dialect.name == "sqlite" and not connection.in_transaction()
    if connection.dialect.name == "sqlite" and not toggle_fk:
        log.warning("SQLite connection already in a transaction: foreign keys left as they are")
    if toggle_fk:
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        connection.commit()
    try:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
    finally:
        if toggle_fk:
            # The connection goes back to a pool whose connect hook will not run again.
            connection.exec_driver_sql("PRAGMA foreign_keys=ON")
            connection.commit()


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    given = config.attributes.get("connection")
    if given is not None:
        _run_on(given)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            _run_on(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
