"""What every ``muxflow`` command shares: the one-line error, the store, the settings, the cluster, GPU types.

Every command validates its input before it writes, and writes in one transaction: a
bad call prints one line naming the field (``error: mem: must be positive``), exits 2
and leaves the store as it was.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

import click

from executors.store.db import Store, cannot_open, resolve_url

EXIT_USAGE = 2
HELP = {"help_option_names": ["-h", "--help"]}


class CliError(click.ClickException):
    """Bad input: one line on stderr, exit status 2, nothing written."""

    exit_code = EXIT_USAGE

    def show(self, file=None) -> None:
        click.echo(f"error: {self.message}", err=True)


class CliFailure(CliError):
    """Not the input's fault (a cluster that does not answer): the same one line, exit status 1."""

    exit_code = 1


SEED = click.IntRange(0, 2**32 - 1)  # what numpy's and torch's generators take


class FiniteFloat(click.FloatRange):
    """A float range that also refuses NaN (which compares false with both bounds) and infinities."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


db_option = click.option("--db", "db_url", default=None,
                         help="Feature store URL (default: `muxflow --db`, else MUXFLOW_DATABASE_URL, else the "
                              "SQLite default).")


def open_store(db: str | None) -> Store:
    """The feature store at ``db`` (a URL, or None for the default), refused unless it exists and is migrated.

    A SQLite path that does not exist is never created here (only ``muxflow db upgrade``
    creates a store): a command pointed at a store that vanished says so instead of carrying
    on with an empty new one.
    """
    from executors.store.migrate import current_revision, head_revision

    ctx = click.get_current_context(silent=True)
    if db is None and ctx is not None:  # no --db of the command's own: the group's (which folds in the environment)
        db = (ctx.find_root().obj or {}).get("db")
    if db is None:  # the deployment's: MUXFLOW_DATABASE_URL over the settings file's db_url over the default
        db = settings().db_url
    url = resolve_url(db)
    path = url.split("///", 1)[-1] if url.startswith("sqlite") else ""
    if path and path != ":memory:" and not Path(path).is_file():
        raise CliError(f"database: no store at {path} (`muxflow db upgrade` creates one)")
    try:
        rev = current_revision(url)
    except Exception as exc:  # unreachable server, bad URL
        raise CliError(cannot_open(url, exc)) from exc
    if rev != head_revision():
        raise CliError(f"database: schema is at {rev or 'nothing'}, expected {head_revision()}; "
                       "run `muxflow db upgrade`")
    return Store(url)


def writable_dir(path: Path, option: str) -> Path:
    """``path`` created if missing and checked writable, before any long work writes there."""
    import tempfile

    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".muxflow-write-check-"):
            pass
    except OSError as exc:
        raise CliError(f"{option}: cannot write to {path}: {exc.strerror or exc}") from exc
    return path


def store_of(ctx: click.Context) -> Store:
    """The store named by ``muxflow --db`` (or MUXFLOW_DATABASE_URL)."""
    return open_store(ctx.obj["db"] if ctx.obj else None)


def guard(fn):
    """Turn validation errors from lower layers into one-line CLI errors."""
    from executors.scheduler.submission import SubmissionError
    from scheduler_core.domain import IllegalTransition
    from scheduler_core.trace import TraceError

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (SubmissionError, TraceError, IllegalTransition, KeyError, ValueError) as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            raise CliError(str(msg)) from exc

    return wrapper


def settings_flags() -> dict:
    """The settings given on the command line (``muxflow --db``): over the environment and the settings file."""
    ctx = click.get_current_context(silent=True)
    return dict((ctx.find_root().obj or {}).get("settings_flags", {})) if ctx is not None else {}


def settings():
    """The deployment's settings (pipelines.settings): the command line's flags over the MUXFLOW_* variables over the
    settings file (MUXFLOW_SETTINGS, else $DAGSTER_HOME/muxflow.json) over the defaults."""
    from pipelines.settings import SettingsError, load_settings

    try:
        return load_settings(flags=settings_flags())
    except SettingsError as exc:
        raise CliError(f"settings: {exc}") from exc


def cluster_backend(s=None):
    """The cluster backend the settings describe: the one factory Dagster's cluster resource uses too."""
    from dagster import Failure

    s = s or settings()
    try:
        return s.cluster_resource().backend()
    except Failure as exc:
        raise CliError(f"settings: {exc.description}") from exc


def slurm_config(state_dir: str | None = None, **given):
    """The deployment's Slurm configuration (the settings' ``slurm_*``, ``xcuda_gains``, profiling and sampling:
    executors.scheduler.slurm.config.SlurmConfig, the object Dagster's cluster resource and the node agent use too); where
    the settings name no Slurm, the dev cluster's unix socket and slurm.conf under ``state_dir``. ``given``:
    the command-line options the user gave (None: not given), over the settings."""
    from dataclasses import replace

    from executors.dev.slurm.cluster import DevCluster
    from executors.scheduler.slurm.config import SlurmConfigError

    layout = DevCluster(state_dir).load_layout()
    try:
        s = settings()
        conf = s.slurm_config(default_url=f"unix:{layout.rest_socket}" if layout else None,
                              default_conf=str(layout.slurm_conf) if layout else None)
        dev_urls = (None, f"unix:{layout.rest_socket}", layout.rest_url) if layout is not None else ()
        if layout is not None and s.slurm_url in dev_urls and conf.plan_key_file is None:
            # the dev cluster's plan key: the nodes' copy for root (the node agent), MuxFlow's for its account
            key = layout.node_plan_key_file if os.geteuid() == 0 else layout.plan_key_file
            conf = replace(conf, plan_key_file=str(key))
        conf = replace(conf, **{k: v for k, v in given.items() if v is not None})
        conf.rest_settings(token="")  # a URL is set and valid
        return conf
    except SlurmConfigError as exc:
        raise CliError(f"slurm: {exc}") from exc


def parse_types(text: str) -> dict[str, int]:
    """``t4:32,a10:32`` → {"t4": 32, "a10": 32}, known GPU types with positive counts."""
    from scheduler_core.gpu_specs import get_spec

    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, count = part.partition(":")
        if not sep or not count.strip().isdigit():
            raise CliError(f"types: expected TYPE:COUNT[,TYPE:COUNT], got {part!r}")
        try:
            spec = get_spec(name.strip())
        except KeyError as exc:
            raise CliError(f"types: {exc.args[0]}") from exc
        if int(count) <= 0:
            raise CliError(f"types: count for {name} must be positive")
        out[spec.name] = out.get(spec.name, 0) + int(count)
    if not out:
        raise CliError("types: name at least one GPU type")
    return out


def int_list(text: str, what: str, minimum: int) -> list[int]:
    """Comma-separated integers of at least ``minimum`` (at least one), or a :class:`CliError` naming ``what``."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not values or any(v < minimum for v in values):
        raise CliError(f"{what}: expected integers >= {minimum}, got {text!r}")
    return values


def text_table(cells: list[list[str]]) -> list[str]:
    """Left-aligned columns, the first row a header underlined with dashes."""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def columns_table(rows: list[dict], cols: list[tuple[str, str, str]]) -> list[str]:
    """One line per row: ``cols`` are (key, header, format); a missing or None value prints as '-'."""
    cells = [[h for _, h, _ in cols]]
    cells += [["-" if r.get(k) is None else f.format(r[k]) for k, _, f in cols] for r in rows]
    return text_table(cells)


def parse_budget(value: object) -> float | str:
    """A slowdown budget from the command line: a finite number > 0, or ``NO_BUDGET`` for 'none' (also 'off',
    'flat': no budget, the flat allowance on every minute); ValueError otherwise."""
    if isinstance(value, float) and value > 0 and math.isfinite(value):
        return value
    if str(value).strip().lower() in ("none", "off", "flat"):
        return NO_BUDGET
    try:
        v = float(str(value))
    except ValueError:
        v = math.nan
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{value!r} is not a number > 0 or 'none'")
    return v


class _Budget(click.ParamType):
    """A slowdown budget option (:func:`parse_budget`); a bad one is refused with a one-line error naming it."""

    name = "budget"

    def convert(self, value, param, ctx):
        if value == NO_BUDGET:
            return value
        try:
            return parse_budget(value)
        except ValueError as exc:  # named by the option's flag, whatever the parameter is called
            flag = param.opts[0].lstrip("-") if param is not None and param.opts else "slowdown-budget"
            raise CliError(f"{flag}: {exc}") from None


NO_BUDGET = "none"
BUDGET = _Budget()
