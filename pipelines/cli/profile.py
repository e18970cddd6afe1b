"""``muxflow profile``, ``muxflow sample`` and ``muxflow train``: the predictor's inputs (paper §6; docs/PROFILING.md).

Both commands keep their simulated behaviour by default and gain:

    muxflow profile --real [--wait S] [--bound S] [--iterations N] [--reuse]   # dry runs on the profile partition
    muxflow profile --local ...                                                # the same, as processes on this machine
    muxflow profile --runs                                                     # the latest profiling runs
    muxflow sample --plan [--budget GPU_MIN]                                   # what would be measured next
    muxflow sample --real [--budget GPU_MIN] [--window S] [--size tiny|small|gpu]
    muxflow sample --local --gpu-type t4 ...                                   # the harness here (no Slurm)
    muxflow sample --runs

``--real`` reaches Slurm as ``muxflow slurm`` does (``MUXFLOW_SLURM_*``, else the dev
cluster's unix socket). ``muxflow train`` trains and promotes the speed predictors.
"""

from __future__ import annotations

from dataclasses import replace

import click
import pandas as pd

from pipelines.cli.common import SEED, CliError, slurm_config, store_of
from pipelines.cli.common import settings as deployment


def _table(rows: list[dict], cols: list[str]) -> str:
    return pd.DataFrame(rows, columns=cols).to_string(index=False) if rows else "none"


def _print_runs(rows: list[dict]) -> None:
    cols = [c for c in ("run", "what", "gpu_type", "state", "method", "samples", "slurm_job", "node", "seconds",
                        "reason") if any(c in r for r in rows)]
    click.echo(_table([{**r, "seconds": None if r.get("seconds") is None else round(r["seconds"], 1),
                        "reason": (r.get("reason") or "")[:100]} for r in rows], cols))


def _where(real: bool, local: bool) -> str | None:
    if real and local:
        raise CliError("real: give --real or --local, not both")
    return "slurm" if real else "local" if local else None


@click.command("profile")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--real", is_flag=True, help="Dry runs of each new job on the Slurm profile partition.")
@click.option("--local", is_flag=True, help="Dry runs as processes on this machine (jobs with a command).")
@click.option("--runs", "show_runs", is_flag=True, help="List the latest profiling runs and exit.")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=None,
              help="Seconds to wait for runs (default: the bound + 60; unfinished jobs stay PROFILING).")
@click.option("--bound", "bound_s", type=click.FloatRange(min=1), default=None,
              help="Fail a run that has not ended this long after it started (default 600).")
@click.option("--iterations", type=click.IntRange(min=1), default=None, help="Measured iterations (default 20).")
@click.option("--seconds", "profile_seconds", type=click.FloatRange(min=0.1), default=None,
              help="The job stops after this even without all iterations (default 120).")
@click.option("--reuse/--no-reuse", default=None, help="Reuse a job type's profile on a GPU type (default off).")
@click.option("--metrics", type=click.Choice(["auto", "nvml", "simulated"]), default=None)
@click.option("--profile-dir", default=None, help="Run directories, shared with the profile nodes.")
@click.pass_context
def profile(ctx, seed, real, local, show_runs, wait_s, bound_s, iterations, profile_seconds, reuse, metrics,
            profile_dir) -> None:
    """Profile newly submitted jobs: simulated (default), or real dry runs (--real / --local)."""
    from executors.scheduler.profiling.report import recent_profiling_runs
    from executors.scheduler.profiling.settings import SettingsError

    if show_runs:
        with store_of(ctx).session() as s:
            _print_runs(recent_profiling_runs(s, limit=50))
        return
    mode = _where(real, local)
    if mode is None:
        from executors.data.calibration import default_catalog
        from executors.simulated.profiler import profile_new_jobs

        click.echo(f"profiled {profile_new_jobs(store_of(ctx), default_catalog(), seed)} job(s) (simulated)")
        return
    over = {k: v for k, v in dict(wait_s=wait_s, bound_s=bound_s, iterations=iterations,
                                  profile_seconds=profile_seconds, reuse_profiles=reuse, metrics=metrics,
                                  profile_dir=profile_dir).items() if v is not None}
    try:
        settings = replace(deployment().slurm_config().profiling, **over)
    except (SettingsError, TypeError) as exc:
        raise CliError(f"profiling: {exc}") from exc
    store = store_of(ctx)
    if mode == "slurm":
        from executors.scheduler.profiling.backend import SlurmProfiler, profile_on_slurm

        summary = profile_on_slurm(SlurmProfiler.from_config(slurm_config()), store, seed, settings)
    else:
        from executors.scheduler.profiling.backend import profile_with
        from executors.scheduler.profiling.local import LocalProfileExecutor

        ex = LocalProfileExecutor()
        try:
            summary = profile_with(ex, store, seed, settings)
        finally:
            ex.close()
    _print_runs([{"run": r["run"], "what": f"job {r['job']}", "gpu_type": r["gpu_type"],
                  "state": "done" if r["ok"] else "failed", "seconds": r["seconds"], "reason": r["reason"]}
                 for r in summary.runs])
    click.echo(f"profiled {len(summary.profiled)} job(s) ({len(summary.reused)} by reuse), "
               f"{len(summary.failed)} failed, {len(summary.in_progress)} still profiling "
               f"[{'Slurm profile partition' if mode == 'slurm' else 'this machine'}; GPU metrics: "
               f"{settings.metrics}, SIMULATED where no GPU]")

@click.command("sample")
@click.option("--per-type", type=click.IntRange(min=10), default=2000, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--real", is_flag=True, help="Measure on the Slurm profile partition within the budget.")
@click.option("--local", is_flag=True, help="Measure with the harness on this machine.")
@click.option("--plan", "show_plan", is_flag=True, help="Print what would be measured next, run nothing.")
@click.option("--runs", "show_runs", is_flag=True, help="List the latest sampling runs and exit.")
@click.option("--budget", "budget_min", type=click.FloatRange(min=0), default=None,
              help="GPU minutes to spend (default 30).")
@click.option("--window", "window_s", type=click.FloatRange(min=1), default=None,
              help="Seconds of each measurement (default 30).")
@click.option("--size", type=click.Choice(["tiny", "small", "gpu"]), default=None,
              help="Reference workload size (default gpu).")
@click.option("--gpu-type", "gpu_types", multiple=True,
              help="GPU types to sample (--local/--plan; default: the store's, or the partition's with --real).")
@click.option("--no-bootstrap", is_flag=True, help="--real: no simulated top-up of GPU types below --per-type.")
@click.pass_context
def sample(ctx, per_type, seed, real, local, show_plan, show_runs, budget_min, window_s, size, gpu_types,
           no_bootstrap) -> None:
    """Co-location samples: simulated (default), planned (--plan) or measured (--real / --local)."""
    from executors.scheduler.profiling.report import recent_sampling_runs
    from executors.scheduler.profiling.sampling import ColocationSampler, plan_table
    from executors.scheduler.profiling.settings import SettingsError
    from executors.store import repo

    if show_runs:
        with store_of(ctx).session() as s:
            _print_runs(recent_sampling_runs(s, limit=50))
        return
    mode = _where(real, local)
    if mode is None and not show_plan:
        from executors.data.calibration import default_catalog
        from executors.simulated.profiler import collect_samples

        added = collect_samples(store_of(ctx), default_catalog(), per_type, seed)
        click.echo(f"co-location samples (simulated): {added}")
        return
    over = {k: v for k, v in dict(window_s=window_s, size=size).items() if v is not None}
    if budget_min is not None:
        over["budget_gpu_s"] = budget_min * 60.0
    if no_bootstrap:
        over["bootstrap_simulated"] = False
    try:
        settings = replace(deployment().slurm_config().sampling, **over)
    except (SettingsError, TypeError) as exc:
        raise CliError(f"sampling: {exc}") from exc
    store = store_of(ctx)
    with store.session() as s:
        known = repo.gpu_type_names(s)
    bad = sorted(set(gpu_types) - known)
    if bad:
        raise CliError(f"gpu-type: unknown {', '.join(bad)} (store has: {', '.join(sorted(known)) or 'none'})")
    if show_plan:
        types = list(gpu_types) or sorted(known)
        plan, skipped = ColocationSampler(store, None, settings, seed).plan(types)
        click.echo(_table(plan_table(plan), ["gpu_type", "service", "job_type", "qps", "sm_pcts", "gpu_min",
                                             "new_job_type"]))
        click.echo(f"{len(plan.runs)} run(s), {plan.points} point(s), {plan.cost_s / 60:.1f} of "
                   f"{settings.budget_gpu_s / 60:.1f} GPU minutes"
                   + (f"; services without a reference workload: {', '.join(skipped)}" if skipped else ""))
        return
    if mode == "slurm":
        from executors.scheduler.profiling.backend import SlurmProfiler, sample_on_slurm

        added, summary = sample_on_slurm(SlurmProfiler.from_config(slurm_config()), store, per_type, seed, settings)
    else:
        from executors.scheduler.profiling.backend import sample_with
        from executors.scheduler.profiling.local import LocalProfileExecutor

        ex = LocalProfileExecutor()
        try:
            added, summary = sample_with(ex, list(gpu_types) or sorted(known), store, per_type, seed,
                                         replace(settings, bootstrap_simulated=False))
        finally:
            ex.close()
    with store.session() as s:
        _print_runs(recent_sampling_runs(s, limit=max(1, len(summary.done) + len(summary.failed))))
    measured = ", ".join(f"{n} {meth}" + (" (CPU: not training data)" if meth == "cpu" else "")
                         for meth, n in sorted(summary.samples.items())) or "none"
    click.echo(f"measured samples: {measured}; {summary.gpu_s_used / 60:.1f} minutes of profile-node time; "
               f"{len(summary.failed)} run(s) failed"
               + (f"; training samples added per GPU type (incl. SIMULATED bootstrap): {added}" if added else ""))


@click.command()
@click.option("--epochs", type=click.IntRange(min=1), default=None,
              help="Predictor training epochs [default: the network's: 400 for the MLP, 250 for the factorized one].")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--arch", type=click.Choice(["mlp", "factorized"]), default="mlp", show_default=True,
              help="The paper's MLP, or GPU and job towers meeting in dot products (faster on rounds with a profile "
                   "per job; generalizes worse to profiles unlike the training data's).")
@click.option("--hidden", type=click.IntRange(min=1), default=None,
              help="Hidden units per layer [default: the network's: 32 for the MLP (the paper's is 64), 64 for the "
                   "factorized one's towers].")
@click.pass_context
def train(ctx, epochs: int, seed: int, arch: str, hidden: int | None) -> None:
    """Train one speed predictor per GPU type; promote it if no worse than the current one."""
    from executors.scheduler.predictors import train_predictors
    from scheduler_core.prediction.predictor import PredictorConfig

    cfg = PredictorConfig(arch=arch, epochs=epochs, hidden=hidden, seed=seed)
    outcomes = train_predictors(store_of(ctx), cfg)
    if not outcomes:
        raise CliError("samples: no GPU type has co-location samples; run `muxflow sample` first")
    for o in outcomes:
        click.echo(f"{o.gpu_type} v{o.version} ({cfg.arch} {cfg.layers} x {cfg.hidden}, {cfg.epochs} epochs): "
                   f"held-out MAE tput {o.holdout_mae_tput:.3f}, slowdown "
                   f"{o.holdout_mae_slowdown:.3f} ({o.trained_on}) {'promoted' if o.promoted else 'kept previous'}")
