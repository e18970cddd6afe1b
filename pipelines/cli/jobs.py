"""``muxflow jobs``: offline jobs, where they are and, for those that do not run, why (executors.scheduler.job_status)."""

from __future__ import annotations

import click
import pandas as pd

from executors.store import inventory
from executors.store import jobs as jobstore
from pipelines.cli.common import CliError, cluster_backend, guard, store_of


@click.group()
def jobs() -> None:
    """Offline jobs."""

@jobs.command("list")
@click.option("--state", "states", multiple=True, help="Only jobs in this state (repeatable).")
@click.pass_context
def jobs_list(ctx, states: tuple[str, ...]) -> None:
    """Offline jobs with state, progress and, for those not running, why.

    On a Slurm cluster (settings: cluster "slurm") held submissions not imported yet are listed too.
    """
    from executors.scheduler.job_status import whereabouts
    from scheduler_core.domain import JobState

    bad = [x for x in states if x.upper() not in JobState.__members__]
    if bad:
        raise CliError(f"state: unknown state(s) {bad} (known: {', '.join(JobState.__members__)})")
    store = store_of(ctx)
    with store.session() as s:
        rows_ = inventory.listed_jobs(s, list(states))
        why = whereabouts(s, rows_)
        rows = [(j.id, j.name, j.job_type or "-", j.state, _progress(j), _checkpoints(j), why[j.id]) for j in rows_]
        known = inventory.imported_slurm_ids(s)
    if not states:
        rows += [("-", name, "-", "HELD", "0.0%", "?", reason) for _sid, name, reason in _held_for_pickup(known)]
    if not rows:
        click.echo("no jobs")
        return
    with pd.option_context("display.max_colwidth", None):
        click.echo(pd.DataFrame(rows, columns=["id", "name", "type", "state", "progress", "checkpoints", "why"])
                   .to_string(index=False, justify="left"))


@jobs.command("cancel")
@click.argument("job_ids", nargs=-1, required=True, type=click.IntRange(min=1))
@click.option("--reason", default="", help="Said in the job's reason (muxflow jobs list).")
@click.pass_context
@guard
def jobs_cancel(ctx, job_ids: tuple[int, ...], reason: str) -> None:
    """Cancel offline jobs of the simulated cluster (all or none): FAILED, and a running one stops.

    A job that came through Slurm is cancelled with `scancel` (Slurm checks who may); the
    job-state sync then ends it here.
    """
    from executors.simulated.backend import SimulatedBackend

    store = store_of(ctx)
    ids = list(dict.fromkeys(job_ids))
    with store.session() as s:
        slurm = {j: sid for j, (sid, _) in sorted(jobstore.slurm_ids_and_memory(s, ids).items()) if sid is not None}
    if slurm:
        job, sid = next(iter(slurm.items()))
        raise CliError(f"job {job} is Slurm job {sid}: cancel it with `scancel {sid}` (Slurm checks that you may); "
                       "the job-state sync then ends it here")
    why = "cancelled by the user (muxflow jobs cancel)" + (f": {reason.strip()}" if reason.strip() else "")
    before = SimulatedBackend().cancel_jobs(store, ids, why)
    for job_id, state in before.items():
        click.echo(f"cancelled job {job_id} ({state} -> FAILED)")


def _held_for_pickup(known: set[int]) -> list[tuple[int, str, str]]:
    """Slurm submissions the store has not imported yet, when the CLI is configured for Slurm (else none)."""
    from executors.scheduler.job_status import held_for_pickup
    from executors.slurm.errors import SlurmError
    from pipelines.cli.common import settings_flags
    from pipelines.settings import SettingsError, load_settings

    try:
        conf = load_settings(flags=settings_flags())
    except SettingsError:
        return []
    if conf.cluster != "slurm":
        return []
    try:
        client = cluster_backend(conf).client_factory()
        try:
            return held_for_pickup(client, known)
        finally:
            getattr(client, "close", lambda: None)()
    except (CliError, SlurmError) as exc:  # the store's jobs are still worth listing
        click.echo(f"note: cannot list Slurm's held submissions: {exc}", err=True)
        return []


def _progress(j) -> str:
    """Steps done of the total, or of an unknown total."""
    if not j.total_steps:
        return f"{j.steps_done:.0f} steps" if j.steps_done else "?"
    return f"{100 * j.steps_done / j.total_steps:.1f}%"


CHECKPOINTS = {"declared": "on signal (declared)", "detected": "on signal (detected)",
               "none": "no: never moved (declared)", "undetected": "no: never moved (none seen)", None: "?"}


def _checkpoints(j) -> str:
    """Whether the job checkpoints on MuxFlow's signals: a job that does not is never moved."""
    return CHECKPOINTS.get(j.checkpointing, j.checkpointing)
