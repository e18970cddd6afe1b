"""`muxflow simulate`: the trace-driven simulator from the command line (docs/EVALUATION.md).

    muxflow simulate --trace T [--gpus 1000] [--hours 24] [--policy muxflow] [--calibration transfer] [--json]
    muxflow simulate compare --trace T [...] [--policies a,b,...] [--out DIR] [--json]
    muxflow simulate compare --trace T --sensitivity [--calibrations optimistic,transfer,pessimistic,k80,p100]
    muxflow simulate jct-bound --trace T [--gpus 1000] [--caps 0.1,0.15,0.2,inf] [--results results.json] [--json]

Every figure is SIMULATED. Progress goes to stderr; ``--json`` output to stdout.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from pipelines.cli.common import (
    BUDGET,
    HELP,
    NO_BUDGET,
    SEED,
    CliError,
    FiniteFloat,
    columns_table,
    parse_types,
    text_table,
    writable_dir,
)
from scheduler_core.online.dynamic_sm import SmPolicy

CACHE_DIR = Path(".muxflow") / "cache"
DEFAULT_OUT = Path(".muxflow") / "simulate"
MAX_HOURS = 24 * 366  # a year of simulated time


def _sim_options(fn):
    """Options shared by `simulate` and `simulate compare`."""
    opts = [
        click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path),
                     help="Philly-format offline trace (tab-separated, 7 columns)."),
        click.option("--gpus", type=click.IntRange(min=1), default=1000, show_default=True),
        click.option("--types", "types_text", default=None,
                     help="GPU types and counts adding up to --gpus, e.g. t4:500,a10:500 (default: all T4)."),
        click.option("--hours", type=click.FloatRange(min=0.25, max=MAX_HOURS), default=24.0, show_default=True),
        click.option("--jobs", type=click.IntRange(min=1, max=1_000_000), default=None,
                     help="Repeat/cut the trace to this many single-GPU jobs (paper: 1,410–7,287)."),
        click.option("--arrival-hours", type=click.FloatRange(min=0.25, max=MAX_HOURS), default=None,
                     help="Compress trace arrivals into this many hours [default: 2/3 of --hours, at most 16]."),
        click.option("--mean-job-hours", type=click.FloatRange(min=0.01), default=1.0, show_default=True,
                     help="Mean solo job duration after scaling."),
        click.option("--seed", type=SEED, default=0, show_default=True),
        click.option("--sm-fallback-levels", type=click.IntRange(min=0, max=8), default=None,
                     help="Smaller MPS shares a MuxFlow round may fall back to [default: the scheduler's, "
                          f"{SmPolicy().fallback_levels}]; 0 = the paper."),
        click.option("--migration-penalty", type=FiniteFloat(min=0.0), default=None,
                     help="Weight a MuxFlow round subtracts for moving a running job [default: restart cost "
                          "over one interval, 0.1]; 0 = the paper."),
        click.option("--slo-scale", type=click.FloatRange(min=0.0, min_open=True), default=None,
                     help="Give each online service a p99 SLO of this many times its p99 alone at its daily peak "
                          "(MuxFlow rounds then keep the predicted p99 within it; SLO violations per "
                          "service-minute are reported) [default: no SLOs, the paper's flat allowance]."),
        click.option("--slowdown-allowance", type=click.FloatRange(min=0.0, min_open=True), default=None,
                     help="Every online service's slowdown allowance: the online latency slowdown a MuxFlow pair may "
                          "be predicted to add in a minute (0.25 = +25 %), the cap under its budget [default: the "
                          "services' own, 0.25]."),
        click.option("--slowdown-budget", type=BUDGET, default=None,
                     help="Every online service's slowdown budget: the mean slowdown of its requests (weighted by "
                          "their latency alone) that MuxFlow rounds keep over the day, paced to what its requests "
                          "spent, sharing more in quiet minutes and less at the peak, each minute within the "
                          "allowance; 'none': the flat allowance on every minute (the paper's) [default: the "
                          "services' own, 0.1]."),
        click.option("--max-jobs-per-gpu", type=click.IntRange(min=1, max=8), default=1, show_default=True,
                     help="Offline jobs a MuxFlow round may put on one GPU, each with its own MPS share and memory "
                          "quota; 1 = the paper."),
        click.option("--round-minutes", type=click.IntRange(min=1, max=60), default=15, show_default=True,
                     help="Minutes between rounds, for every policy (the pipeline's round_period_s / 60)."),
        click.option("--between-rounds/--rounds-only", default=True, show_default=True,
                     help="Every policy also places waiting jobs between rounds, in the minute a job arrives or a "
                          "GPU frees (MuxFlow: waiting jobs onto free GPUs only, nothing moves), as the pipeline's "
                          "fills do on Slurm (docs/SLURM.md); --rounds-only places at rounds only (the paper)."),
        click.option("--burst-guard/--no-burst-guard", default=True, show_default=True,
                     help="MuxFlow's node agents hold a GPU's offline work at xCUDA's floor while its replica is in a "
                          "burst (its rate +20 % over its recent level) and over its SLO (without SLOs: its "
                          "allowance); --no-burst-guard: xCUDA's pacing alone (the paper)."),
        click.option("--calibration", default="transfer", show_default=True,
                     help="Interference calibration: transfer, optimistic, pessimistic, or a measured GPU type's "
                          "own fit (k80, p100, ...; docs/CALIBRATION.md)."),
        click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON."),
        click.option("--quiet", is_flag=True, help="No progress lines on stderr."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _config(gpus, types_text, hours, jobs, arrival_hours, mean_job_hours, seed, sm_fallback_levels=None,
            migration_penalty=None, slo_scale=None, max_jobs_per_gpu=1, between_rounds=True, round_minutes=15,
            slowdown_allowance=None, slowdown_budget=None, burst_guard=True):
    from scheduler_core.guard.burst import BurstParams
    from scheduler_core.simulator import SimConfig

    types = tuple(parse_types(types_text).items()) if types_text else None
    if arrival_hours is None:
        arrival_hours = min(16.0, hours * 2.0 / 3.0)
    elif arrival_hours > hours:
        raise CliError(f"arrival-hours: {arrival_hours:g} is past the end of the run (--hours {hours:g}): the jobs "
                       "arriving after it would never be simulated")
    try:
        return SimConfig(gpus=gpus, gpu_types=types, hours=hours, jobs=jobs, arrival_hours=arrival_hours,
                         mean_job_hours=mean_job_hours, max_job_hours=max(8.0, mean_job_hours), seed=seed,
                         sm_fallback_levels=sm_fallback_levels, migration_penalty=migration_penalty,
                         slo_scale=slo_scale, max_jobs_per_gpu=max_jobs_per_gpu, between_rounds=between_rounds,
                         round_minutes=round_minutes,
                         services=_services(slowdown_allowance, slowdown_budget),
                         burst_guard=BurstParams() if burst_guard else None)
    except ValueError as exc:
        raise CliError(str(exc)) from exc


def _services(slowdown_allowance, slowdown_budget):
    """The default services, with every one's allowance and budget where the command line sets them ('none': no
    budget)."""
    from scheduler_core.simulator.config import DEFAULT_SERVICES

    over = {k: v for k, v in (("slowdown_allowance", slowdown_allowance), ("slowdown_budget", slowdown_budget))
            if v is not None}
    if over.get("slowdown_budget") == NO_BUDGET:
        over["slowdown_budget"] = None
    return tuple(replace(sv, **over) for sv in DEFAULT_SERVICES)


def _guarded(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from scheduler_core.trace import TraceError

        try:
            return fn(*args, **kwargs)
        except TraceError as exc:
            raise CliError(f"{kwargs.get('trace_path')}: {exc}") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"trace: cannot read {kwargs.get('trace_path')}: {exc}") from exc
        except ValueError as exc:
            raise CliError(str(exc)) from exc

    return wrapper


def policy_list(ctx, param, value: str | None) -> list[str] | None:
    """``--policies``: comma-separated simulator policies, each a name ``get_policy`` knows (None: not given)."""
    if value is None:
        return None
    from scheduler_core.simulator import get_policy

    try:
        return [get_policy(n.strip()).name for n in value.split(",")]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _progress(policy: str, quiet: bool):
    started = time.perf_counter()

    def report(done: int, total: int, stats: dict) -> None:
        if quiet or (done % 8 and done != total):
            return
        click.echo(f"[{policy}] round {done}/{total} ({done * 100 // total}%): running {stats.get('running', 0)}, "
                   f"queued {stats.get('queued', 0)}, {time.perf_counter() - started:.1f}s", err=True)

    return report


def _load(trace_path):
    from executors.simulated.evaluation import load_trace

    if trace_path is None:
        raise CliError("--trace is required (a Philly-format trace, e.g. "
                       "executors/data/gavel/philly_vc_0e4a51.sample.trace)")
    return load_trace(trace_path)


def _inputs(cfg, calibration, quiet):
    from executors.simulated.evaluation import simulation_inputs

    if not quiet:
        click.echo(f"calibration {calibration}: preparing predictors (SIMULATED samples, cached in {CACHE_DIR})",
                   err=True)
    return simulation_inputs(cfg, CACHE_DIR, calibration.lower())


def _check_calibrations(names: list[str]) -> list[str]:
    from executors.data.calibration import calibrations

    known = calibrations()
    for n in names:
        if n.lower() not in known:
            raise CliError(f"calibration: unknown {n!r} (known: {', '.join(known)})")
    return [n.lower() for n in names]


def run_policies(trace, inputs, cfg, names: list[str], quiet: bool, label: str = "") -> dict:
    from scheduler_core.simulator import get_policy, run_simulation

    out = {}
    for name in names:
        res = run_simulation(trace, inputs, cfg, get_policy(name), _progress(label + name, quiet))
        bad = _violations(res)
        if bad:
            raise click.ClickException(f"{name}: simulator invariant broken: {'; '.join(bad)}")
        out[name] = res
    return out


def _violations(res) -> list[str]:
    inv, bad = res.invariants, []
    if inv["max_offline_jobs_per_gpu"] > inv["allowed_offline_jobs_per_gpu"]:
        bad.append(f"{inv['max_offline_jobs_per_gpu']} offline jobs on one GPU "
                   f"(at most {inv['allowed_offline_jobs_per_gpu']})")
    if inv["max_active_jobs_per_gpu"] > inv["allowed_active_jobs_per_gpu"]:
        bad.append(f"{inv['max_active_jobs_per_gpu']} offline jobs progressed on one GPU in one minute "
                   f"(at most {inv['allowed_active_jobs_per_gpu']})")
    if inv["gpus_over_100_pct_shares"]:
        bad.append(f"{inv['gpus_over_100_pct_shares']} GPU-rounds whose jobs' MPS shares add up to over 100 %")
    if inv["sm_pct_out_of_bounds"]:
        bad.append(f"{inv['sm_pct_out_of_bounds']} SM percentages out of bounds")
    if not inv["all_accounted"]:
        bad.append(f"jobs not accounted for: {inv['accounted']} of {inv['jobs']}")
    return bad


def _summary(name: str, m: dict) -> str:
    on, off, cl = m["online"], m["offline"], m["cluster"]
    jct = "-" if off["avg_jct_s"] is None else f"{off['avg_jct_s'] / 3600:.2f} h"
    return (f"{name} (SIMULATED, {m['timing']['wall_s']:.1f}s): online latency avg x{on['avg_latency_norm']:.3f} "
            f"p99 x{on['p99_latency_norm']:.3f} of Online-only; offline {off['finished']}/{off['jobs']} finished, "
            f"avg JCT {jct}, oversold GPU {off['oversold_gpu']:.3f}, evictions {off['evictions']}/"
            f"{off['executions']} executions; GPU util {cl['online_only_gpu_util_pct']:.1f}% -> "
            f"{cl['gpu_util_pct']:.1f}%, SM activity {cl['online_only_sm_activity_pct']:.1f}% -> "
            f"{cl['sm_activity_pct']:.1f}%, memory {cl['online_only_memory_pct']:.1f}% -> {cl['memory_pct']:.1f}%")


def _config_json(cfg) -> dict:
    return {"gpus": cfg.gpus, "gpu_types": dict(cfg.types()), "hours": cfg.hours, "jobs": cfg.jobs,
            "arrival_hours": cfg.arrival_hours, "mean_job_hours": cfg.mean_job_hours, "seed": cfg.seed,
            "round_minutes": cfg.round_minutes, "migration_penalty": cfg.round_migration_penalty(),
            "sm_fallback_levels": cfg.sm_fallback_levels if cfg.sm_fallback_levels is not None
            else SmPolicy().fallback_levels,
            "fixed_sm_pct": cfg.fixed_sm_pct, "slo_scale": cfg.slo_scale, "max_jobs_per_gpu": cfg.max_jobs_per_gpu,
            "between_rounds": cfg.between_rounds, "burst_guard": cfg.burst_guard is not None,
            "slowdown_allowances": {s.name: s.slowdown_allowance for s in cfg.services},
            "slowdown_budgets": {s.name: s.slowdown_budget for s in cfg.services},
            "service_slos_ms": dict(zip((s.name for s in cfg.services), cfg.service_slos_ms()))}


@click.group("simulate", invoke_without_command=True, context_settings=HELP)
@_sim_options
@click.option("--policy", default="muxflow", show_default=True, help="Policy name (see `simulate policies`).")
@click.pass_context
@_guarded
def simulate(ctx, trace_path, gpus, types_text, hours, jobs, arrival_hours, mean_job_hours, seed, sm_fallback_levels,
             migration_penalty, slo_scale, slowdown_allowance, slowdown_budget, max_jobs_per_gpu, round_minutes,
             between_rounds, burst_guard, calibration, as_json, quiet, policy) -> None:
    """Simulate one policy on a trace and print the paper's metrics (SIMULATED)."""
    if ctx.invoked_subcommand is not None:
        return
    from scheduler_core.simulator import get_policy

    get_policy(policy)
    cfg = _config(gpus, types_text, hours, jobs, arrival_hours, mean_job_hours, seed, sm_fallback_levels,
                  migration_penalty, slo_scale, max_jobs_per_gpu, between_rounds, round_minutes, slowdown_allowance,
                  slowdown_budget, burst_guard)
    [calibration] = _check_calibrations([calibration])
    trace = _load(trace_path)
    inputs, info = _inputs(cfg, calibration, quiet)
    res = run_policies(trace, inputs, cfg, [policy.lower()], quiet)[policy.lower()]
    m = {**res.metrics, "trace": str(trace_path), "config": _config_json(cfg), "inputs": info,
         "invariants": res.invariants}
    click.echo(json.dumps(m, indent=2, default=str) if as_json else _summary(res.policy, res.metrics))


@simulate.command("policies", context_settings=HELP)
def list_policies() -> None:
    """List the policies."""
    from scheduler_core.simulator import POLICIES

    for p in POLICIES.values():
        click.echo(f"{p.name:16s} {p.description}")


@simulate.command("composition", context_settings=HELP)
@click.option("--gpu-type", default="t4", show_default=True, help="GPU type of the simulated GPUs.")
@click.option("--calibration", default="transfer", show_default=True,
              help="Interference calibration of the workloads (as for `simulate`).")
@click.option("--corunner-efficiency", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=None,
              help="The round's throughput factor per co-runner [default: the round's].")
@click.option("--json", "as_json", is_flag=True, help="Print the errors as JSON.")
@_guarded
def composition(gpu_type, calibration, corunner_efficiency, as_json) -> None:
    """How far the round's rule for several jobs per GPU is from the simulated GPU running them (SIMULATED)."""
    from executors.simulated.evaluation import simulation_catalog
    from scheduler_core.interference.composition import LOADS, OFFLINE_SHARES, composition_errors
    from scheduler_core.round.plan import RoundConfig
    from scheduler_core.simulator import SimConfig

    [calibration] = _check_calibrations([calibration])
    eff = corunner_efficiency if corunner_efficiency is not None else RoundConfig().corunner_efficiency
    cfg = SimConfig(gpus=1, gpu_types=((gpu_type.lower(), 1),))
    rows = composition_errors(simulation_catalog(cfg, calibration), gpu_type.lower(), corunner_efficiency=eff)
    doc = {"simulated": True, "gpu_type": gpu_type.lower(), "calibration": calibration, "corunner_efficiency": eff,
           "online_loads": list(LOADS), "offline_shares_pct": list(OFFLINE_SHARES),
           "errors": [r.as_dict() for r in rows]}
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"SIMULATED ({gpu_type.lower()}, calibration {calibration}): the round's rule (pair prediction at "
               f"the slot share x {eff:g} per co-runner; slowdown at the whole share, budget / b) against the "
               "jobs running together")
    click.echo(f"{'jobs/GPU':>8}  {'cases':>7}  {'tput MAE':>8}  {'tput bias':>9}  {'tput MAPE':>9}  "
               f"{'implied eff':>11}  {'slowdown under':>14}  {'worst excess':>12}")
    for r in rows:
        click.echo(f"{r.slots:>8}  {r.cases:>7}  {r.tput_mae:>8.3f}  {r.tput_bias:>+9.3f}  {r.tput_mape:>9.1%}  "
                   f"{r.implied_efficiency:>11.3f}  {r.slowdown_under_frac:>14.1%}  {r.slowdown_worst_excess:>12.3f}")


def _caps(ctx, param, value: str) -> list[float]:
    """``--caps``: comma-separated slowdown caps (0.1 = +10 %), each > 0, or ``inf`` for none."""
    out = []
    for part in value.split(","):
        try:
            cap = float(part.strip())
        except ValueError:
            raise click.BadParameter(f"{part.strip()!r} is not a number (a slowdown cap such as 0.1, or inf)") from None
        if not cap > 0.0:  # NaN fails too
            raise click.BadParameter(f"{part.strip()}: a cap must be > 0 (or inf for none)")
        out.append(cap)
    return sorted(set(out))


# Settings a results.json must share with the bound for its JCTs to be comparable.
_BOUND_KEYS = ("gpus", "gpu_types", "hours", "jobs", "arrival_hours", "mean_job_hours", "seed")


@simulate.command("jct-bound", context_settings=HELP)
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Philly-format offline trace (tab-separated, 7 columns).")
@click.option("--gpus", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--types", "types_text", default=None,
              help="GPU types and counts adding up to --gpus, e.g. t4:500,a10:500 (default: all T4).")
@click.option("--hours", type=click.FloatRange(min=0.25, max=MAX_HOURS), default=24.0, show_default=True)
@click.option("--jobs", type=click.IntRange(min=1, max=1_000_000), default=None,
              help="Repeat/cut the trace to this many single-GPU jobs, as `simulate compare`.")
@click.option("--arrival-hours", type=click.FloatRange(min=0.25, max=MAX_HOURS), default=None,
              help="Compress trace arrivals into this many hours [default: 2/3 of --hours, at most 16].")
@click.option("--mean-job-hours", type=click.FloatRange(min=0.01), default=1.0, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--calibration", default="transfer", show_default=True,
              help="Interference calibration (as for `simulate`).")
@click.option("--caps", "caps", default="0.1,0.15,0.2,inf", show_default=True, callback=_caps,
              help="Per-minute online slowdown caps to bound JCT at (0.1 = +10 %; inf = no cap).")
@click.option("--results", "results_path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help="A `simulate compare` results.json of the same settings: its policies' JCTs "
                                 "are printed beside the bound.")
@click.option("--json", "as_json", is_flag=True, help="Print the bounds as JSON.")
@_guarded
def jct_bound(trace_path, gpus, types_text, hours, jobs, arrival_hours, mean_job_hours, seed, calibration, caps,
              results_path, as_json) -> None:
    """The best mean JCT any planner could reach if no minute may slow the online service more than a cap (SIMULATED).

    Every job starts on arrival on the GPU, replica and MPS share where it runs fastest within the cap
    (the replica idle), never waits and never moves: no MPS planner that keeps the cap in every minute
    does better (scheduler_core/simulator/bounds.py).
    """
    from executors.simulated.evaluation import jct_bound_report

    cfg = _config(gpus, types_text, hours, jobs, arrival_hours, mean_job_hours, seed)
    [calibration] = _check_calibrations([calibration])
    policies = _bound_results(results_path, cfg, calibration) if results_path else {}
    doc = {**jct_bound_report(_load(trace_path), cfg, caps, calibration), "trace": str(trace_path),
           "config": {k: _config_json(cfg)[k] for k in _BOUND_KEYS}, "policies_jct_censored_s": policies}
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"SIMULATED lower bound on the mean JCT (censored at the end of the run) of any MPS planner keeping "
               f"every minute's online slowdown within the cap: {Path(trace_path).name}, {cfg.gpus} GPUs, "
               f"{cfg.hours:g} h, {doc['bounds'][0]['arrived']} jobs arrived, calibration {calibration}")
    # The baselines: every policy that is not MuxFlow or one of its ablations.
    best = min(((v, k) for k, v in policies.items() if not k.startswith("muxflow")), default=None)
    head = f"{'cap':>6}  {'bound (s)':>10}  {'jobs finishing':>14}"
    ratio = f"bound / {best[1]}" if best else ""
    if best:
        head += f"  {ratio}"
    click.echo(head)
    for r in doc["bounds"]:
        cap = "none" if r["cap"] is None else f"{r['cap']:g}"
        line = f"{cap:>6}  {r['jct_censored_s']:>10.0f}  {r['finished']:>14}"
        if best:
            line += f"  {r['jct_censored_s'] / best[0]:>{len(ratio)}.3f}"
        click.echo(line)
    if policies:
        click.echo("simulated JCT (censored): " + ", ".join(f"{k} {v:.0f} s" for k, v in sorted(policies.items())))
        click.echo(f"a bound over {best[1] if best else 'a baseline'}'s JCT (ratio > 1): no planner keeping that cap "
                   "in every minute finishes jobs sooner on average")


def _bound_results(path: Path, cfg, calibration: str) -> dict[str, float]:
    """Each policy's censored JCT from a `simulate compare` results.json of the same settings."""
    try:
        doc = json.loads(path.read_text())
        got, metrics = doc["config"], doc["metrics"]
        jct = {k: float(m["offline"]["jct_censored_s"]) for k, m in metrics.items() if k != "online-only"}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise CliError(f"results: {path} is not a `simulate compare` results.json ({exc})") from exc
    want = _config_json(cfg)
    diff = [f"{k} {got.get(k)!r} (here {want[k]!r})" for k in _BOUND_KEYS if got.get(k) != want[k]]
    if doc.get("calibration") != calibration:
        diff.append(f"calibration {doc.get('calibration')!r} (here {calibration!r})")
    if diff:
        raise CliError(f"results: {path} was run with other settings: {'; '.join(diff)}")
    return jct


@simulate.command("compare", context_settings=HELP)
@_sim_options
@click.option("--policies", "policy_names", default=None, callback=policy_list,
              help="Comma-separated policies [default: all].")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help=f"Where the plots and results.json go [default: {DEFAULT_OUT}/<trace name>].")
@click.option("--sensitivity", is_flag=True,
              help="Rerun under each calibration of --calibrations; report which conclusions hold under all "
                   "(sensitivity.json beside results.json).")
@click.option("--calibrations", "calibrations_text", default=None,
              help="Comma-separated calibrations for --sensitivity [default: optimistic, transfer, pessimistic: "
                   "the low end, the centre and the high end of the interference model's 80% interval; a measured "
                   "type's own fit, e.g. p100, may be added].")
@_guarded
def compare(trace_path, gpus, types_text, hours, jobs, arrival_hours, mean_job_hours, seed, sm_fallback_levels,
            migration_penalty, slo_scale, slowdown_allowance, slowdown_budget, max_jobs_per_gpu, round_minutes,
            between_rounds, burst_guard, calibration, as_json, quiet, policy_names, out_dir, sensitivity,
            calibrations_text) -> None:
    """Run every policy on the same trace; print the table normalized like the paper's Figures 11 and 13."""
    from executors.data.calibration import INTERVAL_CALIBRATIONS
    from executors.simulated.evaluation import plot_comparison, plot_utilization
    from scheduler_core.simulator import POLICIES
    from scheduler_core.simulator.metrics import compare_table

    names = list(policy_names or POLICIES)
    if "online-only" not in names:
        names.insert(0, "online-only")
    if "muxflow" not in names:
        raise CliError("policies: the comparison is normalized to muxflow; include it")
    cfg = _config(gpus, types_text, hours, jobs, arrival_hours, mean_job_hours, seed, sm_fallback_levels,
                  migration_penalty, slo_scale, max_jobs_per_gpu, between_rounds, round_minutes, slowdown_allowance,
                  slowdown_budget, burst_guard)
    [calibration] = _check_calibrations([calibration])
    others = []
    if sensitivity:
        others = _check_calibrations(calibrations_text.split(",") if calibrations_text else list(INTERVAL_CALIBRATIONS))
        others = [c for c in others if c != calibration]
    elif calibrations_text:
        raise CliError("calibrations: only with --sensitivity")
    trace = _load(trace_path)
    out = writable_dir(out_dir or DEFAULT_OUT / Path(trace_path).stem, "out")  # before hours of simulation
    inputs, info = _inputs(cfg, calibration, quiet)
    results = run_policies(trace, inputs, cfg, names, quiet, f"{calibration}/" if sensitivity else "")
    metrics = {n: r.metrics for n, r in results.items()}
    rows = compare_table(metrics)
    title = f"{Path(trace_path).name}, {cfg.gpus} GPUs, {cfg.hours:g} h, {results['muxflow'].invariants['jobs']} jobs"
    plots = {
        "utilization": str(plot_utilization({n: r.series for n, r in results.items()}, out / "utilization.png",
                                            title)),
        "comparison": str(plot_comparison(rows, out / "comparison.png", title)),
    }
    doc = {"simulated": True, "trace": str(trace_path), "config": _config_json(cfg), "calibration": calibration,
           "inputs": info, "table": rows, "metrics": metrics,
           "invariants": {n: r.invariants for n, r in results.items()}, "plots": plots}
    (out / "results.json").write_text(json.dumps(doc, indent=2, default=str))
    if sensitivity:
        doc["sensitivity"] = _sensitivity(trace, cfg, names, quiet, calibration, rows, others)
        (out / "sensitivity.json").write_text(json.dumps(
            {"simulated": True, "trace": str(trace_path), "config": _config_json(cfg), **doc["sensitivity"]},
            indent=2, default=str))
    if as_json:
        click.echo(json.dumps(doc, indent=2, default=str))
        return
    click.echo(format_table(rows, calibration))
    click.echo("")
    click.echo(format_services(metrics))
    if sensitivity:
        for cal, part in doc["sensitivity"]["calibrations"].items():
            if cal != calibration:
                click.echo("")
                click.echo(format_table(part["table"], cal))
        click.echo("")
        click.echo(format_conclusions(doc["sensitivity"]["matrix"]))
    click.echo(f"plots: {plots['utilization']}, {plots['comparison']}; results: {out / 'results.json'}"
               + (f", {out / 'sensitivity.json'}" if sensitivity else ""))


def _sensitivity(trace, cfg, names, quiet, primary: str, primary_rows: list[dict], others: list[str]) -> dict:
    """The comparison under each further calibration, and which conclusions hold under all of them."""
    from scheduler_core.simulator.conclusions import conclusion_matrix, conclusions
    from scheduler_core.simulator.metrics import compare_table

    tables = {primary: primary_rows}
    for cal in others:
        inputs, _ = _inputs(cfg, cal, quiet)
        res = run_policies(trace, inputs, cfg, names, quiet, f"{cal}/")
        tables[cal] = compare_table({n: r.metrics for n, r in res.items()})
    found = {cal: conclusions(rows) for cal, rows in tables.items()}
    return {"calibrations": {cal: {"table": rows, "conclusions": [c.as_dict() for c in found[cal]]}
                             for cal, rows in tables.items()},
            "matrix": conclusion_matrix(found)}


def format_conclusions(matrix: list[dict]) -> str:
    """Conclusions x calibrations: yes / NO / n/a per cell, the deciding figures below."""
    cals = list(matrix[0]["by_calibration"]) if matrix else []
    word = {True: "yes", False: "NO", None: "n/a"}
    cells = [["conclusion", *cals, "all"]]
    for row in matrix:
        cells.append([row["name"], *(word[row["by_calibration"][c]["holds"]] for c in cals),
                      word[row["holds_under_all"]]])
    lines = text_table(cells)
    for row in matrix:
        lines.append(f"{row['name']}: {row['claim']}")
        lines.extend(f"  {c}: {row['by_calibration'][c]['value']}" for c in cals)
    return "SIMULATED — which conclusions hold under each interference calibration\n" + "\n".join(lines)


def format_table(rows: list[dict], calibration: str = "transfer") -> str:
    cols = [("policy", "policy", "{}"), ("avg_latency_vs_online_only", "avg lat", "{:.3f}"),
            ("p99_latency_vs_online_only", "p99 lat", "{:.3f}"),
            ("shared_avg_latency_vs_online_only", "shared avg", "{:.3f}"),
            ("shared_p99_latency_vs_online_only", "shared p99", "{:.3f}"), ("avg_jct_h", "JCT h", "{:.2f}"),
            ("jct_vs_muxflow", "JCT/MuxFlow", "{:.3f}"), ("oversold_gpu", "oversold", "{:.3f}"),
            ("oversold_vs_muxflow", "oversold/MuxFlow", "{:.3f}"), ("gpu_util_pct", "GPU util %", "{:.1f}"),
            ("sm_activity_pct", "SM act %", "{:.1f}"), ("eviction_rate", "evict rate", "{:.4f}"),
            ("slo_violation_frac", "SLO viol/svc-min", "{:.4f}")]
    lines = columns_table(rows, cols)
    return (f"SIMULATED (calibration {calibration}) — latency normalized to Online-only, JCT and oversold GPU to "
            "MuxFlow\n" + "\n".join(lines))


def format_services(metrics: dict[str, dict]) -> str:
    """Per policy and service, what the service's users see (``services`` of each policy's metrics)."""
    rows = [{"policy": name, **s} for name, m in metrics.items() for s in m.get("services", [])]
    cols = [("policy", "policy", "{}"), ("name", "service", "{}"), ("all_avg_norm", "all avg", "{:.3f}"),
            ("all_p99_norm", "all p99", "{:.3f}"), ("shared_avg_norm", "shared avg", "{:.3f}"),
            ("shared_p99_norm", "shared p99", "{:.3f}"), ("worst_minute_norm", "worst minute", "{:.3f}"),
            ("minutes_over_cap", "min over cap", "{}"), ("slo_attainment", "SLO attainment", "{:.4f}"),
            ("slo_attainment_alone", "alone", "{:.4f}")]
    cap = next((r["cap"] for r in rows), None)
    return (f"SIMULATED — per service, latency against the same requests alone; a minute over the cap is slower "
            f"than +{100 * (cap or 0):.0f} % on average\n" + "\n".join(columns_table(rows, cols)))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(simulate())
