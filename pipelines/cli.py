"""The ``muxflow`` command line.

Every command validates its input before it writes, and writes in one
transaction: a bad call prints one line naming the field, exits non-zero and
leaves the store as it was.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click
import pandas as pd
from sqlalchemy import select

from executors.store import models as m
from executors.store.db import Store, resolve_url

EXIT_USAGE = 2


class CliError(click.ClickException):
    exit_code = EXIT_USAGE

    def show(self, file=None) -> None:  # one line on stderr
        click.echo(f"error: {self.message}", err=True)


def _store(ctx: click.Context) -> Store:
    from executors.store.migrate import current_revision, head_revision

    url = ctx.obj["db"]
    try:
        rev = current_revision(url)
    except Exception as exc:  # unreachable server, bad URL
        raise CliError(f"database: cannot open {url}: {exc.__class__.__name__}: {str(exc).splitlines()[0]}") from exc
    if rev != head_revision():
        raise CliError(f"database: schema is at {rev or 'nothing'}, expected {head_revision()}; run `muxflow db upgrade`")
    return Store(url)


def _guard(fn):
    """Turn validation errors from lower layers into one-line CLI errors."""
    import functools

    from executors.submission import SubmissionError
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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", "db_url", envvar="MUXFLOW_DATABASE_URL", default=None,
              help="SQLAlchemy URL of the feature store (default: SQLite under .muxflow/).")
@click.option("-v", "--verbose", is_flag=True, help="Log progress details.")
@click.pass_context
def main(ctx: click.Context, db_url: str | None, verbose: bool) -> None:
    """muxflow: space-share GPUs between online inference and offline training (MuxFlow)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ctx.ensure_object(dict)
    ctx.obj["db"] = resolve_url(db_url)


# -- db ----------------------------------------------------------------------
@main.group()
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


# -- cluster -----------------------------------------------------------------
def _parse_types(text: str) -> dict[str, int]:
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


@main.group()
def cluster() -> None:
    """Cluster inventory: nodes, GPUs, online services."""


@cluster.command("init")
@click.option("--simulated", is_flag=True, required=True, help="Create a simulated cluster (the only kind `init` makes).")
@click.option("--gpus", type=int, required=True, help="Total number of GPUs.")
@click.option("--types", "types_text", required=True, help="GPU types and counts, e.g. t4:32,a10:32 (must add up to --gpus).")
@click.option("--services", type=int, default=5, show_default=True, help="Online inference services.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.pass_context
@_guard
def cluster_init(ctx, simulated: bool, gpus: int, types_text: str, services: int, seed: int) -> None:
    """Create a simulated cluster in the store."""
    from executors.simulated.setup import init_simulated_cluster

    types = _parse_types(types_text)
    if gpus <= 0:
        raise CliError("gpus: must be positive")
    if sum(types.values()) != gpus:
        raise CliError(f"types: counts add up to {sum(types.values())}, but --gpus is {gpus}")
    store = _store(ctx)
    with store.session() as s:
        info = init_simulated_cluster(s, types, services, seed=seed)
    click.echo(f"simulated cluster: {info['gpus']} GPUs on {info['nodes']} nodes, {info['services']} services")


@cluster.command("show")
@click.pass_context
def cluster_show(ctx) -> None:
    """GPUs per node with their type, SysMonitor state and online service."""
    store = _store(ctx)
    with store.session() as s:
        rows = s.execute(
            select(m.Node.name, m.Node.simulated, m.Gpu.gpu_index, m.Gpu.gpu_type, m.Gpu.health, m.OnlineService.name)
            .join(m.Gpu, m.Gpu.node_id == m.Node.id)
            .outerjoin(m.ServiceInstance, m.ServiceInstance.gpu_id == m.Gpu.id)
            .outerjoin(m.OnlineService, m.OnlineService.id == m.ServiceInstance.service_id)
            .order_by(m.Node.name, m.Gpu.gpu_index)
        ).all()
    if not rows:
        click.echo("no cluster yet: run `muxflow cluster init --simulated ...`")
        return
    df = pd.DataFrame(rows, columns=["node", "simulated", "gpu", "type", "health", "online_service"])
    click.echo(df.to_string(index=False))
    summary = df.groupby(["type", "health"]).size().to_string()
    click.echo(f"\n{len(df)} GPUs{' (SIMULATED)' if df['simulated'].all() else ''}\n{summary}")


# -- online services -----------------------------------------------------------
@main.group()
def online() -> None:
    """Online inference services."""


@online.command("register")
@click.option("--name", required=True)
@click.option("--family", required=True, type=click.Choice(["cnn", "transformer", "recommender", "lm"]))
@click.option("--qps-min", type=float, required=True)
@click.option("--qps-max", type=float, required=True)
@click.option("--peak-hour", type=float, default=20.0, show_default=True, help="Hour of day (UTC) of peak load.")
@click.option("--slo-ms", type=float, default=100.0, show_default=True)
@click.option("--allowance", type=float, default=0.2, show_default=True, help="Tolerated latency slowdown (0.2 = +20%).")
@click.option("--mem", "mem_text", required=True, help="GPU memory of one replica, e.g. 4GiB.")
@click.option("--gpu-ids", required=True, help="Comma-separated GPU ids that host a replica.")
@click.pass_context
@_guard
def online_register(ctx, name, family, qps_min, qps_max, peak_hour, slo_ms, allowance, mem_text, gpu_ids) -> None:
    """Register an online service and the GPUs its replicas run on (one replica per GPU)."""
    from executors.submission import parse_size_bytes

    if not name.strip():
        raise CliError("name: must not be empty")
    if qps_min < 0 or qps_max < qps_min:
        raise CliError("qps: need 0 <= --qps-min <= --qps-max")
    if not 0 <= peak_hour < 24:
        raise CliError("peak-hour: must be within [0, 24)")
    if slo_ms <= 0:
        raise CliError("slo-ms: must be positive")
    if allowance < 0:
        raise CliError("allowance: must be >= 0")
    mem = parse_size_bytes(mem_text, "mem")
    try:
        ids = sorted({int(x) for x in gpu_ids.split(",") if x.strip()})
    except ValueError:
        raise CliError(f"gpu-ids: expected comma-separated integers, got {gpu_ids!r}") from None
    if not ids:
        raise CliError("gpu-ids: name at least one GPU")
    store = _store(ctx)
    with store.session() as s:
        if s.scalar(select(m.OnlineService).where(m.OnlineService.name == name)):
            raise CliError(f"name: service {name!r} already exists")
        found = {g.id: g for g in s.scalars(select(m.Gpu).where(m.Gpu.id.in_(ids)))}
        missing = [i for i in ids if i not in found]
        if missing:
            raise CliError(f"gpu-ids: unknown GPU id(s) {missing}")
        taken = list(s.scalars(select(m.ServiceInstance.gpu_id).where(m.ServiceInstance.gpu_id.in_(ids))))
        if taken:
            raise CliError(f"gpu-ids: GPU(s) {taken} already host an online service")
        svc = m.OnlineService(name=name, model_family=family, qps_min=qps_min, qps_max=qps_max, peak_hour_utc=peak_hour,
                              latency_slo_ms=slo_ms, slowdown_allowance=allowance, mem_bytes=mem)
        s.add(svc)
        s.flush()
        for i in ids:
            s.add(m.ServiceInstance(service_id=svc.id, gpu_id=i))
    click.echo(f"registered online service {name} on {len(ids)} GPU(s)")


# -- offline jobs ----------------------------------------------------------------
@main.command()
@click.option("--name", help="Job name.")
@click.option("--command", "command_", help="Command the job runs (on Slurm: in the current directory).")
@click.option("--script", "script_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Slurm only: batch script to submit instead of --command (must start with #!).")
@click.option("--job-type", help="Workload type, e.g. 'ResNet-50 (batch size 64)'.")
@click.option("--mem", "mem_text", help="GPU memory the job needs, e.g. 4GiB.")
@click.option("--gpu-types", help="Allowed GPU types, comma-separated.")
@click.option("--checkpoint-dir", help="Absolute directory for checkpoints.")
@click.option("--steps", type=int, help="Total training steps.")
@click.option("--priority", type=int, default=0, show_default=True)
@click.option("--mps", "mps_pct", type=int, default=None,
              help="Slurm only: the MPS share asked for (--gres=mps:N, 1..100; default 30).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Submit every job of a Philly-format trace instead (simulated cluster).")
@click.option("--limit", type=int, default=None, help="With --trace: at most this many jobs.")
@click.pass_context
@_guard
def submit(ctx, name, command_, script_path, job_type, mem_text, gpu_types, checkpoint_dir, steps, priority, mps_pct,
           trace_path, limit) -> None:
    """Submit an offline job (or a whole trace). All or nothing.

    On a Slurm cluster (settings: cluster "slurm", see pipelines/settings.py) the job goes
    through Slurm as `muxflow slurm submit` sends it: submitted held to the offline
    partition with its spec in the comment, then picked up into the store.
    """
    from executors.simulated.calibration import default_catalog
    from executors.submission import JobSpec, parse_size_bytes, spec_from_trace
    from executors.submission import submit as submit_job
    from pipelines.settings import SettingsError, load_settings
    from scheduler_core.trace import parse_trace

    try:
        settings = load_settings()
    except SettingsError as exc:
        raise CliError(f"settings: {exc}") from exc
    on_slurm = settings.cluster == "slurm"
    if not on_slurm:
        for field, value in [("script", script_path), ("mps", mps_pct)]:
            if value is not None:
                raise CliError(f"{field}: only for a Slurm cluster (settings: cluster 'slurm')")
    catalog = default_catalog()
    known = set(catalog.offline)
    store = _store(ctx)
    if trace_path is not None:
        if on_slurm:
            raise CliError("trace: trace jobs run on the simulated cluster; on Slurm submit each job's script")
        if not trace_path.exists():
            raise CliError(f"trace: no such file {trace_path}")
        with open(trace_path) as fh:
            trace = parse_trace(fh)
        with store.session() as s:
            types = tuple(sorted(s.scalars(select(m.GpuType.name))))
            chosen = [t for t in trace if t.scale_factor == 1][:limit]
            for t in chosen:
                try:
                    submit_job(s, spec_from_trace(t, catalog.offline_workload(t.job_type).mem_bytes, types), known)
                except Exception as exc:
                    raise CliError(f"trace line {t.line_no}: {exc}") from exc
        click.echo(f"submitted {len(chosen)} jobs from {trace_path} "
                   f"({sum(1 for t in trace if t.scale_factor != 1)} multi-GPU lines skipped)")
        return
    if on_slurm and command_ is not None and script_path is not None:
        raise CliError("command: give --command or --script, not both")
    for field, value in [("name", name), ("command", command_ if script_path is None else str(script_path)),
                         ("job-type", job_type), ("mem", mem_text), ("gpu-types", gpu_types),
                         ("checkpoint-dir", checkpoint_dir), ("steps", steps)]:
        if value is None:
            raise CliError(f"{field}: required (or use --trace)")
    spec = JobSpec(name=name, command=command_ if script_path is None else str(script_path), job_type=job_type,
                   mem_bytes=parse_size_bytes(mem_text),
                   allowed_gpu_types=tuple(t.strip().lower() for t in gpu_types.split(",") if t.strip()),
                   checkpoint_dir=checkpoint_dir, total_steps=steps, priority=priority)
    if not on_slurm:
        with store.session() as s:
            job = submit_job(s, spec, known)
            job_id = job.id
        click.echo(f"submitted job {job_id} ({name})")
        return

    from dagster import Failure

    from assets.resources import ClusterResource
    from executors.slurm.errors import SlurmError
    from pipelines.cli_slurm import submit_to_slurm

    if script_path is not None:
        try:
            script = script_path.read_text()
        except OSError as exc:
            raise CliError(f"script: cannot read {script_path}: {exc.strerror}") from exc
        workdir = script_path.resolve().parent
    else:
        script, workdir = f"#!/bin/sh\n{command_}\n", Path.cwd()
    try:
        client = ClusterResource(kind="slurm", slurm_url=settings.slurm_url).backend().client_factory()
    except Failure as exc:
        raise CliError(f"settings: {exc.description}") from exc
    try:
        sid, rep = submit_to_slurm(store, client, spec, script, mps_pct=30 if mps_pct is None else mps_pct,
                                   working_dir=str(workdir))
    except SlurmError as exc:
        unreachable = CliError(f"slurm: {exc}")
        unreachable.exit_code = 1  # not the input's fault; a job submitted before the error waits held for pick-up
        raise unreachable from exc
    if rep.rejected:
        raise CliError(f"Slurm job {sid}: {rep.rejected[0][1]}")
    if not rep.imported:
        raise CliError(f"Slurm job {sid} was submitted held but not picked up; `muxflow slurm pickup` imports it")
    click.echo(f"submitted job {rep.imported[0]} ({name}) as Slurm job {sid}, held for placement")


@main.group()
def jobs() -> None:
    """Offline jobs."""


@jobs.command("list")
@click.option("--state", "states", multiple=True, help="Only jobs in this state (repeatable).")
@click.pass_context
def jobs_list(ctx, states: tuple[str, ...]) -> None:
    """Offline jobs with state, reason and progress."""
    from scheduler_core.domain import JobState

    bad = [x for x in states if x.upper() not in JobState.__members__]
    if bad:
        raise CliError(f"state: unknown state(s) {bad} (known: {', '.join(JobState.__members__)})")
    store = _store(ctx)
    with store.session() as s:
        q = select(m.OfflineJob).order_by(m.OfflineJob.id)
        if states:
            q = q.where(m.OfflineJob.state.in_([x.upper() for x in states]))
        rows = [(j.id, j.name, j.job_type, j.state, f"{100 * j.steps_done / j.total_steps:.1f}%", j.state_reason or "")
                for j in s.scalars(q)]
    if not rows:
        click.echo("no jobs")
        return
    click.echo(pd.DataFrame(rows, columns=["id", "name", "type", "state", "progress", "reason"]).to_string(index=False))


# -- pipeline steps ----------------------------------------------------------------
@main.command()
@click.option("--seed", type=int, default=0, show_default=True)
@click.pass_context
def profile(ctx, seed: int) -> None:
    """Profile newly submitted jobs (simulated profiler)."""
    from executors.simulated.calibration import default_catalog
    from executors.steps import profile_new_jobs

    click.echo(f"profiled {profile_new_jobs(_store(ctx), default_catalog(), seed)} job(s) (simulated)")


@main.command()
@click.option("--per-type", type=click.IntRange(min=10), default=2000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.pass_context
def sample(ctx, per_type: int, seed: int) -> None:
    """Collect co-location samples per GPU type (simulated)."""
    from executors.simulated.calibration import default_catalog
    from executors.steps import collect_samples

    click.echo(f"co-location samples (simulated): {collect_samples(_store(ctx), default_catalog(), per_type, seed)}")


@main.command()
@click.option("--epochs", type=click.IntRange(min=1), default=250, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.pass_context
def train(ctx, epochs: int, seed: int) -> None:
    """Train one speed predictor per GPU type; promote it if no worse than the current one."""
    from executors.steps import train_predictors
    from scheduler_core.predictor import PredictorConfig

    outcomes = train_predictors(_store(ctx), PredictorConfig(epochs=epochs, seed=seed))
    if not outcomes:
        raise CliError("samples: no GPU type has co-location samples; run `muxflow sample` first")
    for o in outcomes:
        click.echo(f"{o.gpu_type} v{o.version}: held-out MAE tput {o.holdout_mae_tput:.3f}, slowdown "
                   f"{o.holdout_mae_slowdown:.3f} ({o.trained_on}) {'promoted' if o.promoted else 'kept previous'}")


from pipelines.cli_round import register as _register_round  # noqa: E402

_register_round(main, _store, CliError)

from pipelines.bench import bench as _bench  # noqa: E402

main.add_command(_bench)
from pipelines.cli_slurm import slurm as _slurm  # noqa: E402
main.add_command(_slurm)
from pipelines.cli_node import node_agent as _node_agent  # noqa: E402
main.add_command(_node_agent)
from pipelines.cli_simulate import simulate as _simulate  # noqa: E402
main.add_command(_simulate)
from pipelines.cli_profile import register as _register_profile  # noqa: E402
_register_profile(main, _store, CliError)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
