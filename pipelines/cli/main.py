"""The ``muxflow`` group: global options, and every command, one module per concern.

Commands import what they run inside their function bodies, so ``muxflow --help`` and
a one-line error stay fast (no PyTorch or Dagster import before it is needed).
"""

from __future__ import annotations

import logging

import click

from executors.store.db import resolve_url
from executors.text import configure_logging
from pipelines.cli import (
    bench,
    calibrate,
    cluster,
    db,
    jobs,
    metrics,
    node,
    online,
    profile,
    rounds,
    simulate,
    simulate_evaluation,
    simulate_users,
    slurm,
    submit,
)
from pipelines.cli.common import HELP, CliError


class _MainGroup(click.Group):
    """A bad measurement file (bundled with a deployment, or named in ``MUXFLOW_MEASUREMENTS``) is one line
    naming the file and the field, from whichever command first fits the calibrations on it."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ValueError as exc:
            from executors.data.measurements import ENV_VAR, MeasurementError

            if isinstance(exc, MeasurementError):
                raise CliError(f"measurements ({ENV_VAR}): {exc}") from exc
            raise


@click.group(cls=_MainGroup, context_settings=HELP)
@click.option("--db", "db_url", envvar="MUXFLOW_DATABASE_URL", default=None,
              help="SQLAlchemy URL of the feature store (default: SQLite under .muxflow/).")
@click.option("-v", "--verbose", is_flag=True, help="Log progress details.")
@click.pass_context
def main(ctx: click.Context, db_url: str | None, verbose: bool) -> None:
    """muxflow: space-share GPUs between online inference and offline training (MuxFlow)."""
    # every privileged command (the node agent, the sensor's pick-up, the dispatcher) logs users' text: one line
    # per record, control characters escaped
    configure_logging(logging.INFO if verbose else logging.WARNING, "%(levelname)s %(name)s: %(message)s")
    ctx.ensure_object(dict)
    ctx.obj["db"] = resolve_url(db_url)
    # The command line's settings, over the environment's and the settings file's (pipelines.settings).
    given = ctx.get_parameter_source("db_url") is click.core.ParameterSource.COMMANDLINE
    ctx.obj["settings_flags"] = {"db_url": db_url} if given else {}


for command in (
    db.db, cluster.cluster, online.online, submit.submit, jobs.jobs,          # the store and the queue
    profile.profile, profile.sample, profile.train,                          # the predictor's inputs
    rounds.round_cmd, rounds.report_cmd, rounds.run_cmd,                     # rounds, reports, the main job
    simulate.simulate, calibrate.calibrate, bench.bench,                     # evaluation
    slurm.slurm, node.node_agent, metrics.metrics,                           # the cluster, what it shows
):
    main.add_command(command)
simulate.simulate.add_command(simulate_users.users)
simulate.simulate.add_command(simulate_evaluation.evaluation)
