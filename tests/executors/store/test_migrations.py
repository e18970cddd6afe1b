"""The Alembic migrations build exactly the schema of executors/store/models.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import CheckConstraint, inspect, text
from sqlalchemy.exc import IntegrityError

from executors.store.db import make_engine
from executors.store.migrate import (
    alembic_config,
    current_revision,
    downgrade,
    head_revision,
    upgrade,
)
from executors.store.models import Base


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _diff(url: str) -> list[object]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(ctx, Base.metadata))
    finally:
        engine.dispose()


def test_upgrade_creates_every_table(empty_db_url: str) -> None:
    assert current_revision(empty_db_url) is None
    assert upgrade(empty_db_url) == head_revision()
    assert current_revision(empty_db_url) == head_revision()
    assert _tables(empty_db_url) == set(Base.metadata.tables) | {"alembic_version"}


def test_upgrade_twice_is_harmless(empty_db_url: str) -> None:
    upgrade(empty_db_url)
    engine = make_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO gpu_types (name, sm_count, memory_bytes, max_sm_clock_mhz) "
                     "VALUES ('T4', 40, 16000000000, 1590)")
            )
        assert upgrade(empty_db_url) == head_revision()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT name FROM gpu_types")).scalars().all() == ["T4"]
    finally:
        engine.dispose()


def test_migrated_schema_matches_models(empty_db_url: str) -> None:
    upgrade(empty_db_url)
    assert _diff(empty_db_url) == []


def test_check_constraints_and_cascades_are_created(empty_db_url: str) -> None:
    # Autogenerate compares neither CHECK constraints nor ON DELETE rules.
    upgrade(empty_db_url)
    engine = make_engine(empty_db_url)
    try:
        insp = inspect(engine)
        for table in Base.metadata.sorted_tables:
            want_ck = {
                c.name for c in table.constraints if isinstance(c, CheckConstraint)
            }
            got_ck = {c["name"] for c in insp.get_check_constraints(table.name)}
            assert got_ck == want_ck, table.name
            want_fk = {
                (fk.parent.name, fk.column.table.name, fk.ondelete) for fk in table.foreign_keys
            }
            got_fk = {
                (fk["constrained_columns"][0], fk["referred_table"], fk["options"].get("ondelete"))
                for fk in insp.get_foreign_keys(table.name)
            }
            assert got_fk == want_fk, table.name
    finally:
        engine.dispose()


def test_sqlite_foreign_keys_stay_on_after_migrating(sqlite_url: str) -> None:
    # env.py turns them off while migrating; a pooled connection must not keep that.
    engine = make_engine(sqlite_url)
    try:
        with engine.connect() as conn:
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()


def test_downgrade_to_base_then_upgrade_again(empty_db_url: str) -> None:
    upgrade(empty_db_url)
    assert downgrade(empty_db_url, "base") is None
    assert _tables(empty_db_url) <= {"alembic_version"}
    assert current_revision(empty_db_url) is None
    assert upgrade(empty_db_url) == head_revision()
    assert _diff(empty_db_url) == []


def test_upgrade_works_from_any_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The scripts are found relative to the sql package, not the working directory.
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'state' / 'muxflow.db'}"
    assert upgrade(url) == head_revision()
    assert (tmp_path / "state" / "muxflow.db").exists()



_ROUND_COLUMNS = ("window_start_utc, period_s, started_utc, status, gpus_considered, jobs_pending, feasible_pairs, "
                  "placements, objective, action_counts, timings_s, snapshot, simulated, plan_actions, "
                  "certified_optimal, stats")


def _copy_as_fill(conn, seq: int) -> None:
    """Another row of the stored round's window, numbered ``seq``."""
    conn.execute(text(f"INSERT INTO scheduling_rounds (seq, {_ROUND_COLUMNS}) SELECT {seq}, {_ROUND_COLUMNS} "
                      "FROM scheduling_rounds WHERE seq = 0"))


def test_rounds_stored_before_fills_existed_become_their_windows_rounds_and_fills_go_on_downgrade(
        empty_db_url: str) -> None:
    upgrade(empty_db_url, "0008")
    engine = make_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"INSERT INTO scheduling_rounds ({_ROUND_COLUMNS}) VALUES ('2026-03-02 12:00:00', 900, "
                              "'2026-03-02 12:00:00', 'dispatched', 0, 0, 0, 0, 0.0, '{}', '{}', '{}', false, '[]', "
                              "false, '{}')"))
        upgrade(empty_db_url)
        with engine.begin() as conn:
            assert conn.execute(text("SELECT seq FROM scheduling_rounds")).scalars().all() == [0]
            _copy_as_fill(conn, 1)
            with pytest.raises(IntegrityError), conn.begin_nested():  # one fill 1 per window
                _copy_as_fill(conn, 1)
        downgrade(empty_db_url, "0008")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM scheduling_rounds")).scalar() == 1
    finally:
        engine.dispose()
