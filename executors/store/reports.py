"""Runs the SQL reports shipped in ``sql/reports`` (docs/DESIGN.md §3, step 10).

Each report is one portable SELECT in a ``.sql`` file whose first comment lines
are ``-- title:`` and ``-- description:``. The same file runs unchanged on
PostgreSQL and SQLite.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import sql
from sqlalchemy import Connection, Engine, text

from executors.store.db import Store

log = logging.getLogger(__name__)

REPORTS_DIR = Path(sql.__file__).resolve().parent / "reports"
_HEADER = re.compile(r"^--\s*(title|description):\s*(.+?)\s*$")


@dataclass(frozen=True)
class ReportInfo:
    name: str
    title: str
    description: str
    path: Path


def _read_info(path: Path) -> ReportInfo:
    fields: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("--"):
            break
        match = _HEADER.match(line)
        if match:
            fields.setdefault(match.group(1), match.group(2))
    missing = [f"-- {key}:" for key in ("title", "description") if key not in fields]
    if missing:
        raise ValueError(f"report {path} lacks the header line(s) {', '.join(missing)}")
    return ReportInfo(path.stem, fields["title"], fields["description"], path)


def list_reports(reports_dir: Path = REPORTS_DIR) -> list[ReportInfo]:
    """Every report, sorted by name."""
    return [_read_info(p) for p in sorted(reports_dir.glob("*.sql"))]


def _find(name: str, reports_dir: Path) -> ReportInfo:
    reports = {r.name: r for r in list_reports(reports_dir)}
    if name not in reports:
        available = ", ".join(reports) or "none"
        raise KeyError(f"unknown report {name!r}; available: {available}")
    return reports[name]


def _pin_session(conn: Connection) -> None:
    # The reports bucket times by the text form of timestamps. SQLite stores
    # UTC text; PostgreSQL renders timestamptz in the session's TimeZone and
    # DateStyle, so pin both. SET LOCAL ends with this read-only transaction and
    # leaves the pooled connection as it was.
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL TimeZone = 'UTC'")
        conn.exec_driver_sql("SET LOCAL DateStyle = 'ISO, YMD'")


def run_report(
    store_or_engine: Store | Engine, name: str, *, reports_dir: Path = REPORTS_DIR
) -> pd.DataFrame:
    """Run report ``name`` and return its rows; ``KeyError`` names the available ones."""
    info = _find(name, reports_dir)
    engine = store_or_engine.engine if isinstance(store_or_engine, Store) else store_or_engine
    query = info.path.read_text(encoding="utf-8").strip().rstrip(";")
    # Escape every colon: the reports take no parameters, and text() would
    # otherwise read ':00' in a string literal as a bind parameter.
    statement = text(query.replace(":", r"\:"))
    with engine.connect() as conn:
        _pin_session(conn)
        result = conn.execute(statement)
        frame = pd.DataFrame(result.fetchall(), columns=list(result.keys()))
        conn.rollback()
    log.info("report %s: %d rows", name, len(frame))
    return frame


def write_csv(df: pd.DataFrame, path: str | Path) -> Path:
    """Write ``df`` as CSV (no index column), creating parent folders; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out, index=False)
    return out
