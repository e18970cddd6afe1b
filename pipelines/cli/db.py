"""``muxflow db``: the feature store's schema."""

from __future__ import annotations

import click

from pipelines.cli.common import CliError


@click.group()
def db() -> None:
    """Feature-store schema."""


@db.command("upgrade")
@click.pass_context
def db_upgrade(ctx: click.Context) -> None:
    """Migrate the feature store to the latest schema."""
    from executors.store.migrate import upgrade

    try:
        rev = upgrade(ctx.obj["db"])
    except Exception as exc:
        raise CliError(f"database: {exc.__class__.__name__}: {str(exc).splitlines()[0]}") from exc
    click.echo(f"schema at revision {rev}")
