"""The dev cluster's accounting: slurmdbd's MariaDB database, and the accounts ``sacctmgr`` sets up.

slurmdbd is what gives Slurm admin levels: with it MuxFlow's account (``muxflow``) is an **Operator** — it may
hold, release, requeue and update other users' jobs, but not write admin comments, mint tokens for others or
drain nodes — instead of acting as SlurmUser or root (docs/SLURM.md "Accounts"). Each cluster has its own
database and database user in the host's MariaDB, named after its bridge, so clusters run side by side; a fresh
start creates them anew (with a new password) and ``dev-down`` drops them.

Setting up a new database the slow way costs 2–3 s (slurmdbd creates its schema, and every ``sacctmgr`` request
waits on a few 40 ms TCP round trips), so the first cluster keeps a copy of its freshly set-up database as a
**template** (``muxflow_tmpl_<hash>``: the hash of slurmdbd's version and of the accounts), and later fresh starts
copy it (~0.1 s) instead. A template is only taken once complete (a marker table), never changed afterwards, and
only root reads it.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Callable
from pathlib import Path

from executors.dev.slurm.install import JOB_USERS
from executors.dev.slurm.layout import MUXFLOW_USER, REFERENCE_USER, SLURM_ACCOUNT, DevClusterLayout

# The users the dev cluster's accounting knows, and their admin level ("None": a plain user). root is Slurm's
# administrator whatever the database says; it is only added where missing.
USERS: dict[str, str | None] = {"root": None, **{u: "None" for u in JOB_USERS}, MUXFLOW_USER: "Operator",
                                REFERENCE_USER: "None"}
TEMPLATE_MARK = "muxflow_template_complete"


class AccountingError(RuntimeError):
    pass


def _mysql(sql: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess:
    """``sql`` run by MariaDB's root on its unix socket (the statements on stdin: no password on a command line)."""
    try:
        return subprocess.run(["mysql", "-uroot", "--batch", "--skip-column-names"], input=sql, capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(["mysql"], 124, "", f"timed out after {timeout_s}s")
    except FileNotFoundError:
        return subprocess.CompletedProcess(["mysql"], 127, "", "no mysql client")


def _hosts() -> tuple[str, ...]:
    # slurmdbd connects over TCP (StorageHost=127.0.0.1); 'localhost' covers the unix socket too.
    return ("localhost", "127.0.0.1")


def _tables(db: str) -> list[str]:
    out = _mysql(f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{db}';\n")
    return out.stdout.split() if out.returncode == 0 else []


def _copy(src: str, dst: str, tables: list[str]) -> list[str]:
    return [stmt for t in tables for stmt in (f"CREATE TABLE `{dst}`.`{t}` LIKE `{src}`.`{t}`;",
                                               f"INSERT INTO `{dst}`.`{t}` SELECT * FROM `{src}`.`{t}`;")]


def template_name(version: str, users: dict[str, str | None] | None = None, cluster_name: str = "") -> str:
    """The template database for slurmdbd ``version`` with ``users`` set up on ``cluster_name``."""
    users = USERS if users is None else users
    text = "\n".join([version.strip(), cluster_name, SLURM_ACCOUNT, *(f"{u}={lv}" for u, lv in users.items())])
    return "muxflow_tmpl_" + hashlib.sha256(text.encode()).hexdigest()[:16]


def create_database(layout: DevClusterLayout, password: str, template: str | None = None) -> bool:
    """A new database for ``layout`` (any left by an earlier cluster of the same bridge is dropped) and its user
    with ``password``, which may do anything to that database and nothing else. The database is a copy of
    ``template`` where that is complete (True: set up already), else empty (False)."""
    db, user = layout.storage_loc, layout.storage_user
    if not password.isalnum():
        raise ValueError("the database password must be alphanumeric")
    tables = _tables(template) if template else []
    from_template = TEMPLATE_MARK in tables
    sql = [f"DROP DATABASE IF EXISTS `{db}`;", f"CREATE DATABASE `{db}`;"]
    if from_template:
        sql += _copy(template, db, [t for t in tables if t != TEMPLATE_MARK])  # type: ignore[arg-type]
    for host in _hosts():
        sql += [f"CREATE USER IF NOT EXISTS '{user}'@'{host}' IDENTIFIED BY '{password}';",
                f"ALTER USER '{user}'@'{host}' IDENTIFIED BY '{password}';",
                f"GRANT ALL PRIVILEGES ON `{db}`.* TO '{user}'@'{host}';"]
    out = _mysql("\n".join(sql) + "\n")
    if out.returncode != 0:
        raise AccountingError(f"creating MariaDB database {db}: {(out.stderr or out.stdout).strip()[-500:]}")
    return from_template


def save_template(layout: DevClusterLayout, template: str) -> None:
    """Keep a copy of the cluster's database, just set up, as ``template`` (best effort: a template another
    cluster is saving at the same moment, or an error, leaves things as they were)."""
    tables = _tables(template)
    if TEMPLATE_MARK in tables:
        return
    if tables:  # left incomplete (by a crash, or being written right now): drop it, a later start saves one
        _mysql(f"DROP DATABASE IF EXISTS `{template}`;\n")
        return
    src = _tables(layout.storage_loc)
    if not src:
        return
    sql = [f"CREATE DATABASE `{template}`;", *_copy(layout.storage_loc, template, src),
           f"CREATE TABLE `{template}`.`{TEMPLATE_MARK}` (done INT);"]
    _mysql("\n".join(sql) + "\n")


def drop_database(layout: DevClusterLayout) -> str | None:
    """Drop the cluster's database and its user; what went wrong, or None."""
    db, user = layout.storage_loc, layout.storage_user
    sql = [f"DROP DATABASE IF EXISTS `{db}`;", *[f"DROP USER IF EXISTS '{user}'@'{h}';" for h in _hosts()]]
    out = _mysql("\n".join(sql) + "\n")
    return None if out.returncode == 0 else f"dropping MariaDB database {db}: {(out.stderr or out.stdout).strip()}"


Run = Callable[..., subprocess.CompletedProcess]


def _rows(run: Run, *what: str) -> list[list[str]]:
    out = run("sacctmgr", "-n", "-P", "show", *what)
    if out.returncode != 0:
        raise AccountingError(f"sacctmgr show {' '.join(what)}: {(out.stderr or out.stdout).strip()}")
    return [line.split("|") for line in out.stdout.splitlines() if line.strip()]


def _do(run: Run, *args: str) -> None:
    out = run("sacctmgr", "-i", *args)
    if out.returncode != 0:
        raise AccountingError(f"sacctmgr {' '.join(args)}: {(out.stderr or out.stdout).strip()}")


def render_load_file(layout: DevClusterLayout, users: dict[str, str | None] | None = None) -> str:
    """The cluster, its account and ``users`` as ``sacctmgr load`` reads them (its "flat file" format)."""
    users = USERS if users is None else users
    lines = [f"Cluster - '{layout.cluster_name}'", "Parent - 'root'",
             "User - 'root':DefaultAccount='root':AdminLevel='Administrator'",
             f"Account - '{SLURM_ACCOUNT}':Description='muxflow dev cluster':Organization='muxflow'",
             f"Parent - '{SLURM_ACCOUNT}'"]
    for name, level in users.items():
        if name != "root":
            lines.append(f"User - '{name}':DefaultAccount='{SLURM_ACCOUNT}':AdminLevel='{level or 'None'}'")
    return "\n".join(lines) + "\n"


def bootstrap(run: Run, layout: DevClusterLayout, users: dict[str, str | None] | None = None, *,
              load_file: Path | None = None) -> list[str]:
    """The cluster, the account and ``users`` (name → admin level) in slurmdbd, each only where missing or
    different: a second call changes nothing. ``run(*argv)`` runs a client command of the cluster. What it did.

    ``load_file``: the database was created empty for this start, so there is nothing to look up: one ``sacctmgr
    load`` of that file (written here) adds everything at once (each ``sacctmgr`` request costs 0.2–0.6 s, the load
    about as much as two); should it fail, it looks and adds what is missing."""
    users = USERS if users is None else users
    if load_file is not None:
        load_file.write_text(render_load_file(layout, users))
        out = run("sacctmgr", "-i", "load", f"file={load_file}")
        if out.returncode == 0:
            return [f"cluster {layout.cluster_name}", f"account {SLURM_ACCOUNT}",
                    *[f"user {n} ({level or 'None'})" for n, level in users.items() if n != "root"]]
    done: list[str] = []
    if layout.cluster_name not in {r[0] for r in _rows(run, "cluster", "format=cluster")}:
        _do(run, "add", "cluster", layout.cluster_name)
        done.append(f"cluster {layout.cluster_name}")
    if SLURM_ACCOUNT not in {r[0] for r in _rows(run, "account", "format=account")}:
        _do(run, "add", "account", SLURM_ACCOUNT, f"cluster={layout.cluster_name}",
            "description=muxflow dev cluster", "organization=muxflow")
        done.append(f"account {SLURM_ACCOUNT}")
    have = {r[0]: (r[1] if len(r) > 1 else "") for r in _rows(run, "user", "format=user,adminlevel")}
    # One sacctmgr call per admin level for the users that are missing, one per user whose level is wrong.
    new: dict[str, list[str]] = {}
    for name, level in users.items():
        if name not in have:
            new.setdefault(level or "None", []).append(name)
        elif level is not None and have[name] != level:
            _do(run, "modify", "user", "where", f"name={name}", "set", f"adminlevel={level}")
            done.append(f"user {name}: adminlevel {have[name]} -> {level}")
    for level, names in new.items():
        _do(run, "add", "user", ",".join(names), f"account={SLURM_ACCOUNT}", f"cluster={layout.cluster_name}",
            f"adminlevel={level}")
        done += [f"user {n} ({level})" for n in names]
    return done
