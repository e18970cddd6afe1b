"""CLI commands that run the scheduler: ``round``, ``report`` and ``run`` (the main job)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import click
import pandas as pd
from sqlalchemy import func, select

from executors.store import models as m

ROUND = dt.timedelta(minutes=15)


def _next_window(store) -> dt.datetime:
    """The window after the latest round, else the one after the simulated cluster's last report, else the default start."""
    from executors import round_runner
    from executors.simulated.setup import observed_until
    from pipelines.settings import DEFAULT_ROUNDS_START

    with store.session() as s:
        latest = round_runner.latest_round_window(s)
        until = observed_until(s)
    if latest is not None:
        nxt = latest + ROUND
        return max(nxt, until) if until is not None and until > nxt else nxt
    if until is not None:
        over = (until.minute % 15) * 60 + until.second
        return until + dt.timedelta(seconds=(900 - over) % 900)
    return DEFAULT_ROUNDS_START + dt.timedelta(hours=1)


def register(main: click.Group, open_store, CliError) -> None:  # noqa: N803 - a class passed in
    @main.command("round")
    @click.option("--once", is_flag=True, required=True, help="Plan, dispatch and run exactly one round.")
    @click.option("--migration-penalty", type=click.FloatRange(min=0), default=0.0, show_default=True)
    @click.option("--seed", type=int, default=0, show_default=True)
    @click.pass_context
    def round_cmd(ctx, once: bool, migration_penalty: float, seed: int) -> None:
        """Run one scheduling round against the store and print the plan.

        On a simulated cluster the round's 15 minutes are then simulated and booked
        (and, before the first round, an hour of online-only load is recorded).
        """
        from executors import round_runner
        from executors.simulated.backend import SimulatedBackend
        from executors.simulated.cluster import SimSettings
        from scheduler_core.round import RoundConfig

        store = open_store(ctx)
        with store.session() as s:
            if not s.scalar(select(func.count()).select_from(m.Node)):
                raise CliError("cluster: no cluster in the store; run `muxflow cluster init --simulated ...`")
            if not s.scalar(select(func.bool_and(m.Node.simulated)) if store.dialect == "postgresql"
                            else select(func.min(m.Node.simulated))):
                raise CliError("cluster: real clusters are dispatched through Slurm (not available in this build)")
        backend = SimulatedBackend(SimSettings(seed=seed))
        backend.profile_new_jobs(store, seed)
        round_runner.requeue_evicted(store)
        window = _next_window(store)
        backend.ensure_history(store, window)
        try:
            round_id, result = round_runner.plan_and_record(store, backend.cluster(store), window,
                                                            RoundConfig(migration_penalty=migration_penalty))
        except (round_runner.NoPredictorError, round_runner.RoundOrderError) as exc:
            raise CliError(f"round: {exc}") from exc
        ok, failed = backend.dispatch(store, round_id, result, window)
        backend.observe(store, window, 15, round_id)
        counts = result.action_counts()
        click.echo(f"round {round_id} window {window:%Y-%m-%d %H:%M} UTC (SIMULATED cluster): "
                   f"{result.gpus_considered} GPUs, {result.jobs_considered} jobs, {result.feasible_pairs} feasible pairs")
        if result.actions:
            rows = [(a.action.value, a.job_id, a.gpu_id if a.gpu_id is not None else "-", a.from_gpu_id or "-",
                     a.sm_pct if a.sm_pct is not None else "-") for a in result.actions]
            click.echo(pd.DataFrame(rows, columns=["action", "job", "gpu", "from_gpu", "sm_pct"]).to_string(index=False))
        click.echo(f"placements {len(result.placements)}  objective {result.objective:.3f}  "
                   f"actions {counts}  dispatched ok {ok} failed {failed}  "
                   f"matching {1000 * result.timings_s['matching']:.1f} ms")

    @main.command("report")
    @click.argument("name", required=False)
    @click.option("--list", "list_", is_flag=True, help="List the available reports.")
    @click.option("--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path), help="Also write the table as CSV.")
    @click.pass_context
    def report_cmd(ctx, name: str | None, list_: bool, csv_path: Path | None) -> None:
        """Run a SQL report from sql/reports/ and print it as a table."""
        from executors.store.reports import list_reports, run_report, write_csv

        if list_ or not name:
            for r in list_reports():
                click.echo(f"{r.name:24s} {r.title}")
            if not name:
                return
        try:
            df = run_report(open_store(ctx).engine, name)
        except KeyError as exc:
            raise CliError(f"report: {exc.args[0]}") from exc
        with pd.option_context("display.max_rows", 500, "display.width", 200):
            click.echo(df.to_string(index=False) if len(df) else "(no rows)")
        if csv_path:
            write_csv(df, csv_path)
            click.echo(f"wrote {csv_path}")

    @main.command("run")
    @click.option("--gpus", "types_text", default="t4:32,a10:32", show_default=True, help="GPU types and counts.")
    @click.option("--services", type=click.IntRange(min=1), default=5, show_default=True)
    @click.option("--hours", type=click.FloatRange(min=0.25), default=8.0, show_default=True, help="Simulated hours of rounds.")
    @click.option("--jobs", type=click.IntRange(min=1), default=120, show_default=True)
    @click.option("--samples", type=click.IntRange(min=10), default=2000, show_default=True, help="Co-location samples per GPU type.")
    @click.option("--epochs", type=click.IntRange(min=1), default=250, show_default=True)
    @click.option("--trace", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
    @click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".muxflow/report"), show_default=True)
    @click.option("--seed", type=int, default=0, show_default=True)
    @click.option("--dagster-home", type=click.Path(file_okay=False, path_type=Path), envvar="DAGSTER_HOME",
                  default=Path(".dagster_home"), show_default=True,
                  help="Dagster instance the runs are recorded in (what `make ui` shows). Env: DAGSTER_HOME.")
    @click.option("--fresh", is_flag=True,
                  help="Start over: delete the SQLite store and the Dagster instance's run history first.")
    @click.pass_context
    def run_cmd(ctx, types_text, services, hours, jobs, samples, epochs, trace, report_dir, seed, dagster_home,
                fresh) -> None:
        """The main job: a full scheduling run on a simulated cluster, executed through Dagster in process.

        Afterwards `make ui` shows every run, the round partitions and their metadata.
        """
        from executors.simulated.calibration import SAMPLE_TRACE
        from pipelines.cli import _parse_types
        from pipelines.main_job import MainJobConfig, reset_dagster_home, run_main_job
        from scheduler_core.predictor import PredictorConfig

        url = ctx.obj["db"]
        types = _parse_types(types_text)
        if fresh and url.startswith("sqlite:///"):
            path = Path(url.split("///", 1)[1])
            for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                p.unlink(missing_ok=True)
        if fresh:
            reset_dagster_home(dagster_home)
        cfg = MainJobConfig(db_url=url, report_dir=report_dir, types=types, services=services, hours=hours, jobs=jobs,
                            trace=trace or SAMPLE_TRACE, samples_per_type=samples, seed=seed,
                            predictor=PredictorConfig(epochs=epochs, seed=seed), dagster_home=dagster_home)
        try:
            summary = run_main_job(cfg, progress=lambda msg: click.echo(msg))
        except ValueError as exc:
            raise CliError(str(exc)) from exc
        click.echo("\n=== summary (SIMULATED cluster) ===")
        click.echo(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=2, default=str))
