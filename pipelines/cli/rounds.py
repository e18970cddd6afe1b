"""``muxflow round --once``, ``muxflow report`` and ``muxflow run`` (the main job)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import click
import pandas as pd

from executors.store import inventory
from pipelines.cli.common import (
    SEED,
    CliError,
    CliFailure,
    FiniteFloat,
    cluster_backend,
    parse_types,
    settings,
    store_of,
    writable_dir,
)


def _next_simulated_window(store, clock) -> dt.datetime:
    """The window after the latest round, else the one after the simulated cluster's last report, else the default
    start: simulated time runs ahead of the wall clock."""
    from executors.simulated.setup import observed_until
    from executors.store.rounds import latest_round_window
    from pipelines.settings import DEFAULT_ROUNDS_START

    with store.session() as s:
        latest = latest_round_window(s)
        until = observed_until(s)
    if latest is not None:
        nxt = latest + clock.period
        return max(nxt, clock.next_window(until - dt.timedelta(microseconds=1))) if until is not None else nxt
    if until is not None:
        return clock.next_window(until - dt.timedelta(microseconds=1))
    return DEFAULT_ROUNDS_START + dt.timedelta(hours=1)


@click.command("round")
@click.option("--once", is_flag=True, help="Plan, dispatch and book exactly one round.")
@click.option("--fill", is_flag=True,
              help="Slurm: a fill after the latest round instead — the waiting jobs start on the GPUs that hold "
                   "no offline job now (nothing running moves); what the fill sensor runs between rounds.")
@click.option("--migration-penalty", type=FiniteFloat(min=0), default=None,
              help="Weight a move must gain to be made. Default: 0 on the simulated cluster (the paper's "
                   "round), the settings' migration_penalty (MUXFLOW_MIGRATION_PENALTY) on Slurm.")
@click.option("--max-jobs-per-gpu", type=click.IntRange(1, 8), default=None,
              help="Offline jobs the round may put on one GPU, each with its own MPS share. Default: the "
                   "settings' max_jobs_per_gpu (MUXFLOW_MAX_JOBS_PER_GPU, 1: the paper).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Simulated cluster only.")
@click.pass_context
def round_cmd(ctx, once: bool, fill: bool, migration_penalty: float | None, max_jobs_per_gpu: int | None,
              seed: int) -> None:
    """Run one scheduling round against the store and print the plan.

    The cluster is the store's: a simulated one (its next 15 minutes are then simulated
    and booked; before the first round an hour of online-only load is recorded), or Slurm
    (settings: MUXFLOW_CLUSTER=slurm, MUXFLOW_SLURM_URL=…): job states follow Slurm, the
    round plans the window that has begun now, its plan is dispatched through slurmrestd
    and the job states follow Slurm again.
    """
    from executors.scheduler.round_service import RoundError, RoundService
    from executors.simulated.backend import SimulatedBackend
    from executors.simulated.cluster import SimSettings
    from executors.slurm.retry import SlurmUnavailable
    from scheduler_core.round.plan import RoundConfig

    if once == fill:
        raise CliError("round: give --once (a round) or --fill (a fill after the latest round)")
    store = store_of(ctx)
    with store.session() as s:
        kinds = inventory.node_kinds(s)
    if not kinds:
        raise CliError("cluster: no cluster in the store; run `muxflow cluster init --simulated …` or "
                       "`muxflow slurm register-nodes`")
    if kinds == {True, False}:
        raise CliError("cluster: the store mixes simulated and Slurm nodes; use one store per cluster")
    conf = settings()
    simulated = kinds == {True}
    if simulated:
        backend = SimulatedBackend(SimSettings(seed=seed))
    elif conf.cluster != "slurm":
        raise CliError("cluster: the store's nodes are Slurm nodes; set MUXFLOW_CLUSTER=slurm and "
                       "MUXFLOW_SLURM_URL (unix:/path/slurmrestd.sock or http(s)://host:port)")
    else:
        backend = cluster_backend(conf)
    penalty = conf.migration_penalty if migration_penalty is None else migration_penalty
    if simulated and migration_penalty is None:
        penalty = 0.0  # the paper's round, as this command always planned on the simulated cluster
    try:
        k = conf.max_jobs_per_gpu if max_jobs_per_gpu is None else max_jobs_per_gpu
        svc = RoundService(store, backend, RoundConfig(migration_penalty=penalty, max_jobs_per_gpu=k),
                           conf.round_clock)
    except RoundError as exc:
        raise CliError(f"round: {exc}") from exc
    now = dt.datetime.now(dt.timezone.utc)
    if fill:
        _fill(svc, now)
        return
    try:
        svc.require_predictor()  # before the simulated cluster profiles jobs or records its warm-up hour
    except RoundError as exc:
        raise CliError(f"round: {exc}") from exc
    if simulated:
        backend.profile_new_jobs(store, seed)
        window = _next_simulated_window(store, svc.clock)
    else:
        window = svc.next_window(now)
    try:
        out = svc.run_once(window, now)
    except RoundError as exc:
        raise CliError(f"round: {exc}" + "".join(f"\n  {d}" for d in exc.details[:20])) from exc
    except SlurmUnavailable as exc:
        raise CliFailure(f"slurm: {exc} (the round's plan is stored; `muxflow slurm dispatch --round ID` "
                       "finishes it)") from exc
    result = out.planned.result
    counts = result.action_counts()
    label = "SIMULATED cluster" if simulated else "Slurm cluster"
    click.echo(f"round {out.planned.round_id} window {window:%Y-%m-%d %H:%M:%S} UTC ({label}): "
               f"{result.gpus_considered} GPUs, {result.jobs_considered} jobs, {result.feasible_pairs} feasible pairs")
    if out.planned.sync is not None and out.planned.sync.changed:
        click.echo(f"job states followed the cluster first: {out.planned.sync.transitions}")
    if result.actions:
        rows = [(a.action.value, a.job_id, a.gpu_id if a.gpu_id is not None else "-", a.from_gpu_id or "-",
                 a.sm_pct if a.sm_pct is not None else "-") for a in result.actions]
        click.echo(pd.DataFrame(rows, columns=["action", "job", "gpu", "from_gpu", "sm_pct"]).to_string(index=False))
    click.echo(f"placements {len(result.placements)}  objective {result.objective:.3f}  "
               f"actions {counts}  dispatched ok {out.dispatched.sent_ok} failed {out.dispatched.sent_failed}  "
               f"matching {1000 * result.timings_s.get('matching', 0.0):.1f} ms")

def _fill(svc, now: dt.datetime) -> None:
    from executors.scheduler.round_service import RoundError
    from executors.slurm.retry import SlurmUnavailable

    try:
        out = svc.fill(now)
    except RoundError as exc:
        raise CliError(f"round: {exc}") from exc
    except SlurmUnavailable as exc:
        raise CliFailure(f"slurm: {exc} (a stored fill is dispatched again by the next `muxflow round --fill`)") \
            from exc
    f = out.fill
    if out.sync.changed:
        click.echo(f"job states followed the cluster first: {out.sync.transitions}")
    if f.round_id is None:
        click.echo(f"no fill: {f.free_gpus} free GPU(s), {f.waiting_jobs} waiting job(s)")
        return
    click.echo(f"fill {f.seq} (round row {f.round_id}): {f.free_gpus} free GPU(s), {f.waiting_jobs} waiting job(s), "
               f"{len(f.result.placements)} placed")
    for a in f.result.actions:
        click.echo(f"  start job {a.job_id} on GPU {a.gpu_id} at {a.sm_pct}% SM")
    click.echo(f"dispatched ok {out.sent_ok} failed {out.sent_failed}")


@click.command("report")
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
        df = run_report(store_of(ctx).engine, name)
    except KeyError as exc:
        raise CliError(f"report: {exc.args[0]}") from exc
    with pd.option_context("display.max_rows", 500, "display.width", 200):
        click.echo(df.to_string(index=False) if len(df) else "(no rows)")
    if csv_path:
        write_csv(df, csv_path)
        click.echo(f"wrote {csv_path}")

@click.command("run")
@click.option("--gpus", "types_text", default="t4:32,a10:32", show_default=True, help="GPU types and counts.")
@click.option("--services", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--hours", type=click.FloatRange(min=0.25), default=8.0, show_default=True, help="Simulated hours of rounds.")
@click.option("--jobs", type=click.IntRange(min=1), default=120, show_default=True)
@click.option("--samples", type=click.IntRange(min=10), default=2000, show_default=True, help="Co-location samples per GPU type.")
@click.option("--epochs", type=click.IntRange(min=1), default=None,
              help="Predictor training epochs [default: the network's: 400 for the MLP, 250 for the factorized one].")
@click.option("--trace", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".muxflow/report"), show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--max-jobs-per-gpu", type=click.IntRange(1, 8), default=1, show_default=True,
              help="Offline jobs a round may put on one GPU, each with its own MPS share (1: the paper).")
@click.option("--dagster-home", type=click.Path(file_okay=False, path_type=Path), envvar="DAGSTER_HOME",
              default=Path(".dagster_home"), show_default=True,
              help="Dagster instance the runs are recorded in (what `make ui` shows). Env: DAGSTER_HOME.")
@click.option("--fresh", is_flag=True,
              help="Start over: delete the SQLite store and the Dagster instance's run history first.")
@click.pass_context
def run_cmd(ctx, types_text, services, hours, jobs, samples, epochs, trace, report_dir, seed, max_jobs_per_gpu,
            dagster_home, fresh) -> None:
    """The main job: a full scheduling run on a simulated cluster, executed through Dagster in process.

    Afterwards `make ui` shows every run, the round partitions and their metadata.
    """
    from executors.data.calibration import SAMPLE_TRACE
    from pipelines.main_job import MainJobConfig, reset_dagster_home, run_main_job
    from scheduler_core.prediction.predictor import PredictorConfig

    url = ctx.obj["db"]
    types = parse_types(types_text)
    if fresh and url.startswith("sqlite:///"):
        path = Path(url.split("///", 1)[1])
        for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            p.unlink(missing_ok=True)
    if fresh:
        reset_dagster_home(dagster_home)
    writable_dir(report_dir, "report-dir")  # before the run, not after its last round
    cfg = MainJobConfig(db_url=url, report_dir=report_dir, types=types, services=services, hours=hours, jobs=jobs,
                        trace=trace or SAMPLE_TRACE, samples_per_type=samples, seed=seed,
                        max_jobs_per_gpu=max_jobs_per_gpu, predictor=PredictorConfig(epochs=epochs, seed=seed), dagster_home=dagster_home)
    try:
        summary = run_main_job(cfg, progress=lambda msg: click.echo(msg))
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    except RuntimeError as exc:  # a Dagster run failed (e.g. a predictor that fails its held-out check)
        raise CliFailure(str(exc).splitlines()[0]) from exc
    click.echo("\n=== summary (SIMULATED cluster) ===")
    click.echo(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=2, default=str))
    click.echo("\nonline services (SIMULATED): slowdown of their requests against alone, over all of them (the run, its "
               "warm-up included) against the budget, over those of shared minutes against the allowance")
    for sv in summary["services_on_shared_gpus"]:
        verdict = "within its allowance" if sv["p99_within_allowance"] else f"NOT within: {sv['why']}"
        every = sv.get("all_requests_avg")
        budget = "" if every is None else f"all requests avg +{100 * every:.1f} %" + (
            "" if sv.get("budget") is None else f" against its +{100 * sv['budget']:.0f} % budget: "
            + ("within" if sv.get("all_requests_within_budget") else "NOT within")) + "; "
        click.echo(f"  {sv['service']}: {budget}shared minutes avg +{100 * sv['avg']:.1f} %, p99 "
                   f"+{100 * sv['p99']:.1f} % over {sv['shared_minutes']}, allowance +{100 * sv['allowance']:.0f} %: "
                   f"{verdict}")
