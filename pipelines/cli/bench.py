"""``muxflow bench …``: benchmarks that print their figures (docs/BENCHMARKS.md, with the machine they ran on).

- ``bench round``: one scheduling round on a seeded synthetic cluster, optionally against the dense
  baseline (instances and harness: ``executors/simulated/bench.py``);
- ``bench predictor``: held-out error per GPU type and the paper's Figure 12 sweep;
- ``bench forecast``: the online-load forecaster against last-value on simulated diurnal traces;
- ``bench simulate``: simulation time per policy at the paper's largest scale;
- ``bench xcuda``: xCUDA's added latency per intercepted call (``executors/node/xcuda/bench.py``);
- ``bench dispatch``: the Slurm dispatcher's cost per placement on the dev cluster
  (``executors/dev/bench_dispatch.py``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from executors.data.calibration import SAMPLE_TRACE
from executors.machine import describe as machine
from executors.machine import rss_peak_mb
from executors.simulated.bench import (
    BENCH_GPU_TYPES,
    FIG12_HIDDEN,
    FIG12_LAYERS,
    PAPER_EPOCHS,
    PAPER_HIDDEN,
    bench_predictors,
    compare,
    forecast_traces,
    make_instance,
    report_row,
    run_fast,
    set_threads,
)
from pipelines.cli.common import HELP, SEED
from pipelines.cli.simulate import _guarded, policy_list
from scheduler_core.prediction.config import PredictorConfig


class SizeList(click.ParamType):
    """Comma-separated instance sizes ``<GPUs>x<jobs>`` (``1000x500``): at least one GPU, any number of jobs."""

    name = "GPUSxJOBS[,...]"

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        sizes = []
        for part in value.split(","):
            n, sep, m = part.strip().lower().partition("x")
            if not (sep and n.isdigit() and m.isdigit() and int(n) >= 1):
                self.fail(f"{part.strip()!r} is not <GPUs>x<jobs> with whole numbers and at least one GPU "
                          f"(e.g. 1000x500)", param, ctx)
            sizes.append((int(n), int(m)))
        return sizes


class PositiveIntList(click.ParamType):
    """Comma-separated whole numbers of at least 1 (``64,128``); empty means none."""

    name = "N[,...]"

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if not all(p.isdigit() and int(p) >= 1 for p in parts):
            self.fail(f"{value!r} is not a comma-separated list of whole numbers of at least 1", param, ctx)
        return [int(p) for p in parts]


# Explicit, not inherited from ``muxflow``: Click caches a command's help option on
# first use, and the benchmarks are also invoked on their own (tests, scripts).


@click.group(context_settings=HELP)
def bench() -> None:
    """Benchmarks that print their figures."""


@bench.command("round", context_settings=HELP)
@click.option("--gpus", "n_gpus", type=click.IntRange(min=1), default=None, help="Online GPUs (one size).")
@click.option("--jobs", "n_jobs", type=click.IntRange(min=0), default=None, help="Pending offline jobs (one size).")
@click.option("--sizes", type=SizeList(), default="100x50,500x250,1000x500,5000x2500", show_default=True,
              help="GPUSxJOBS list, used when --gpus/--jobs are not given.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--baseline", type=click.Choice(["none", "dense"]), default="none", show_default=True,
              help="Also run the dense approach (every pair through the MLP, then linear_sum_assignment).")
@click.option("--baseline-sizes", type=SizeList(), default="2000x2000,5000x5000", show_default=True,
              help="Sizes where both run side by side when the main size is too large for the dense baseline.")
@click.option("--dense-max-pairs", type=click.IntRange(min=0), default=30_000_000, show_default=True,
              help="Largest GPUs×jobs the dense baseline is run on.")
@click.option("--running-frac", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Share of the jobs already running (one per GPU).")
@click.option("--migration-penalty", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option("--profiles", "profiles", type=click.Choice(["shared", "distinct", "both"]), default=None,
              help="Jobs share their job type's profile (shared), each job is profiled separately (distinct: "
                   "nothing groups), or both instance kinds side by side.  [default: shared]")
@click.option("--distinct-profiles", is_flag=True, help="The same as --profiles distinct.")
@click.option("--epochs", type=click.IntRange(min=1), default=None,
              help="Predictor training epochs [default: the network's: 400 for the MLP, 250 for the factorized one].")
@click.option("--samples", "samples_per_type", type=click.IntRange(min=20), default=2000, show_default=True,
              help="Simulated co-location samples per GPU type for the predictors.")
@click.option("--arch", type=click.Choice(["mlp", "factorized"]), default="mlp", show_default=True,
              help="Predictor network: the paper's MLP, or GPU and job towers meeting in dot products.")
@click.option("--hidden", type=click.IntRange(min=1), default=None,
              help="Hidden units per layer [default: the network's: 32 for the MLP; the paper's is 64].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def bench_round(n_gpus, n_jobs, sizes, seed, baseline, baseline_sizes, dense_max_pairs, running_frac,
                migration_penalty, profiles, distinct_profiles, epochs, samples_per_type, arch, hidden,
                as_json) -> None:
    """Time one scheduling round end to end: features → predictions → matching (certified) → plan.

    GPUs carry simulated online services, jobs simulated profiles; the
    predictors are real MLPs (4×32, 400 epochs) trained on 2,000 simulated samples per GPU type.
    """
    from scheduler_core.round.plan import RoundConfig

    if distinct_profiles and profiles not in (None, "distinct"):
        raise click.UsageError("--distinct-profiles is --profiles distinct; give one of them")
    profiles = "distinct" if distinct_profiles else (profiles or "shared")
    kinds = ["shared", "distinct"] if profiles == "both" else [profiles]
    threads = set_threads()
    t0 = time.perf_counter()
    models, _, _ = bench_predictors(seed, samples_per_type, epochs, cfg_overrides={"arch": arch, "hidden": hidden})
    train_s = time.perf_counter() - t0
    cfg = RoundConfig(migration_penalty=migration_penalty)
    single = n_gpus is not None or n_jobs is not None
    todo = [(n_gpus or 1000, n_jobs if n_jobs is not None else 500)] if single else sizes
    by_kind = {kind: _round_kind(todo, kind == "distinct", single, seed, running_frac, baseline, baseline_sizes,
                                 dense_max_pairs, models, cfg) for kind in kinds}
    meta = {"benchmark": "round", "simulated": True, "machine": machine(), "torch_threads": threads, "seed": seed,
            "train_predictors_s": round(train_s, 2), "running_frac": running_frac,
            "migration_penalty": migration_penalty, "predictor_arch": arch,
            "predictor_hidden": PredictorConfig(arch=arch, hidden=hidden).hidden,
            "predictor_epochs": PredictorConfig(arch=arch, epochs=epochs).epochs}

    def one(kind: str) -> dict:
        results, side = by_kind[kind]
        if single:
            return {"profile_per_job": kind == "distinct", **results[0], "baseline_sizes": side}
        return {"profile_per_job": kind == "distinct", "results": results}

    if len(kinds) == 1:
        out = {**meta, **one(kinds[0])}
    else:
        out = {**meta, "profiles": {kind: one(kind) for kind in kinds}}
    out["peak_rss_mb_process"] = round(rss_peak_mb(), 1)
    if not as_json:
        click.echo("SIMULATED online services and job profiles; real predictors, matching and plan, timed here")
        for kind in kinds:
            results, side = by_kind[kind]
            click.echo(f"-- job profiles: {kind} ({'every job profiled separately' if kind == 'distinct' else 'one per job type'})")
            for r in results:
                click.echo(f"{r['gpus']:>6} GPUs x {r['jobs']:>6} jobs: total {r['total_s']:.3f} s (predict "
                           f"{r['predict_s']:.3f}, match {r['match_s']:.3f}, plan {r['plan_s']:.3f}) placements "
                           f"{r['placements']} objective {r['objective']:.4f} certified {r['certified_optimal']} gap "
                           f"{r['optimality_gap_bound']:.3g} peak RSS {r['peak_rss_mb']} MB")
            for r in side:
                click.echo(f"{r['gpus']:>6} GPUs x {r['jobs']:>6} jobs, dense baseline: {r['dense_total_s']:.3f} s "
                           f"(fast {r['fast_total_s']:.3f} s, x{r['speedup']:.1f}); objectives equal "
                           f"{r['objectives_equal']}, dense within the fast plan's gap bound "
                           f"({r['fast_gap_bound']:.3g}) {r['dense_within_fast_bound']}")
    click.echo(json.dumps(out))


def _round_kind(todo, distinct: bool, single: bool, seed: int, running_frac: float, baseline: str, baseline_sizes,
                dense_max_pairs: int, models, cfg) -> tuple[list[dict], list[dict]]:
    """One instance kind of ``bench round``: a row per size, and the dense baseline side by side where it fits."""
    results = []
    for n, m in todo:
        t = time.perf_counter()
        gpus, jobs = make_instance(n, m, seed, running_frac, distinct_profiles=distinct)
        gen_s = time.perf_counter() - t
        rss_before = rss_peak_mb()
        fast, fast_res = run_fast(gpus, jobs, models, cfg)
        row = {"gpus": n, "jobs": m, "pairs": n * m, **fast, "peak_rss_mb": round(rss_peak_mb(), 1),
               "rss_before_round_mb": round(rss_before, 1), "generate_s": round(gen_s, 3)}
        if baseline == "dense":
            if n * m <= dense_max_pairs:
                row["dense"] = compare(gpus, jobs, models, cfg, fast, fast_res)
            else:
                row["dense"] = {"skipped": f"{n}x{m} = {n * m:,} pairs > --dense-max-pairs {dense_max_pairs:,}"}
        results.append(row)
    side = []
    if baseline == "dense" and single and "skipped" in results[0].get("dense", {}):
        for n, m in baseline_sizes:
            gpus, jobs = make_instance(n, m, seed, running_frac, distinct_profiles=distinct)
            fast, fast_res = run_fast(gpus, jobs, models, cfg)
            cmp_ = compare(gpus, jobs, models, cfg, fast, fast_res)
            side.append({"gpus": n, "jobs": m, "fast_total_s": fast["total_s"], "dense_total_s": cmp_["total_s"],
                         "dense_predict_s": cmp_["predict_s"], "dense_match_s": cmp_["match_s"],
                         "speedup": cmp_["speedup"], "fast_objective": fast["objective"],
                         "dense_objective": cmp_["objective"], "objectives_equal": cmp_["objectives_equal"],
                         "fast_certified_optimal": fast["certified_optimal"],
                         "fast_gap_bound": fast["optimality_gap_bound"],
                         # the dense optimum is within the fast plan's certified bound of it
                         "dense_within_fast_bound": bool(cmp_["matching_objective"] - fast["matching_objective"]
                                                         <= fast["optimality_gap_bound"] + 1e-6)})
    return results, side


@bench.command("predictor", context_settings=HELP)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--samples", "samples_per_type", type=click.IntRange(min=20), default=2000, show_default=True,
              help="Simulated co-location samples per GPU type (paper: about 2,000).")
@click.option("--epochs", type=click.IntRange(min=1), default=None,
              help="Predictor training epochs [default: the network's: 400 for the MLP, 250 for the factorized one].")
@click.option("--sweep/--no-sweep", default=True, show_default=True, help="Run the Figure 12 sweep.")
@click.option("--sweep-type", type=click.Choice(BENCH_GPU_TYPES), default="t4", show_default=True,
              help="GPU type of the Figure 12 sweep.")
@click.option("--hidden", "hidden_sizes", type=PositiveIntList(), default=",".join(map(str, FIG12_HIDDEN)),
              show_default=True)
@click.option("--layers", "layer_counts", type=PositiveIntList(), default=",".join(map(str, FIG12_LAYERS)),
              show_default=True)
@click.option("--arch", type=click.Choice(["mlp", "factorized"]), default="mlp", show_default=True,
              help="Predictor network: the paper's MLP, or GPU and job towers meeting in dot products.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def bench_predictor(seed, samples_per_type, epochs, sweep, sweep_type, hidden_sizes, layer_counts, arch,
                    as_json) -> None:
    """Held-out error of the speed predictor per GPU type, and the paper's Figure 12 architecture sweep.

    Samples are simulated co-locations (interference model + measurement
    noise); 20 % of them, drawn from the seed, are held out.
    """
    set_threads()
    _, reports, _ = bench_predictors(seed, samples_per_type, epochs, cfg_overrides={"eval_every": 25, "arch": arch})
    per_type = {t: {**report_row(r, s), "curve_mae_tput": [[e, round(v, 4)] for e, v in r.curve]}
                for t, (r, s) in reports.items()}
    # The paper's network (4 x 64, 250 epochs) on the same samples and split, beside the default.
    paper = {}
    if arch == "mlp":
        _, paper_reports, _ = bench_predictors(seed, samples_per_type, PAPER_EPOCHS,
                                               cfg_overrides={"hidden": PAPER_HIDDEN, "arch": arch})
        paper = {t: report_row(r, s) for t, (r, s) in paper_reports.items()}
    sweep_rows = []
    if sweep:
        configs = [(4, h) for h in hidden_sizes] + [(n, 64) for n in layer_counts if (n, 64) != (4, 64)]
        for layers, hidden in configs:
            _, rep, _ = bench_predictors(seed, samples_per_type, epochs, (sweep_type,),
                                         cfg_overrides={"layers": layers, "hidden": hidden, "eval_every": 25,
                                                        "arch": arch})
            r, s = rep[sweep_type]
            sweep_rows.append({"layers": layers, "hidden": hidden, **report_row(r, s),
                               "curve_mae_tput": [[e, round(v, 4)] for e, v in r.curve]})
        sweep_rows.sort(key=lambda row: (row["layers"] != 4, row["layers"], row["hidden"]))
    out = {"benchmark": "predictor", "simulated": True, "machine": machine(), "seed": seed,
           "samples_per_type": samples_per_type,
           "epochs": PredictorConfig(arch=arch, epochs=epochs).epochs, "hidden": PredictorConfig(arch=arch).hidden,
           "arch": arch, "per_gpu_type": per_type, "paper_network_per_gpu_type": paper,
           "figure12_gpu_type": sweep_type, "figure12": sweep_rows}
    if not as_json:
        click.echo("SIMULATED co-location samples (interference model + measurement noise); real MLP training")
        click.echo("GPU type  MAE tput  MAPE tput  MAE slowdown  MAPE slowdown  train s")
        for t, r in per_type.items():
            click.echo(f"{t:8s}  {r['mae_tput']:8.4f}  {r['mape_tput_pct']:8.2f}%  {r['mae_slowdown']:12.4f}  "
                       f"{r['mape_slowdown_pct']:12.2f}%  {r['train_s']:7.2f}")
        for t, r in paper.items():
            click.echo(f"{t:8s}  {r['mae_tput']:8.4f}  {r['mape_tput_pct']:8.2f}%  {r['mae_slowdown']:12.4f}  "
                       f"{r['mape_slowdown_pct']:12.2f}%  {r['train_s']:7.2f}  (the paper's 4 x 64, 250 epochs)")
        for r in sweep_rows:
            click.echo(f"{r['layers']} layers x {r['hidden']:>4}: MAE tput {r['mae_tput']:.4f}  "
                       f"MAPE {r['mape_tput_pct']:.2f}%  train {r['train_s']:.1f} s")
    click.echo(json.dumps(out))


# -- bench forecast -----------------------------------------------------------------------


@bench.command("forecast", context_settings=HELP)
@click.option("--gpus", "n_gpus", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--days", type=click.IntRange(min=2), default=5, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def bench_forecast(n_gpus, days, seed, as_json) -> None:
    """Online-load forecaster vs last-value on simulated diurnal SM traces (every 15-minute interval after day 1)."""
    from scheduler_core.online.dynamic_sm import SmPolicy
    from scheduler_core.online.forecast import ForecastPolicy, backtest

    traces = forecast_traces(n_gpus, days, seed)
    headroom = SmPolicy().headroom_pct
    t0 = time.perf_counter()
    current = backtest(traces, ForecastPolicy(), headroom_pct=headroom)
    previous = backtest(traces, ForecastPolicy(days=1, level_shift=False), headroom_pct=headroom)["forecaster"]
    recent = backtest(traces, ForecastPolicy(period_minutes=10**9), headroom_pct=headroom)["forecaster"]
    rows = {"forecaster": current["forecaster"].as_dict(), "last_value": current["last_value"].as_dict(),
            "yesterday_only_previous_version": previous.as_dict(), "recent_quantile_only": recent.as_dict()}
    out = {"benchmark": "forecast", "simulated": True, "machine": machine(), "seed": seed, "gpus": n_gpus,
           "days": days,
           "headroom_pct": headroom, "target": "SM activity % over the next 15 minutes", "methods": rows,
           "wall_s": round(time.perf_counter() - t0, 2)}
    if not as_json:
        click.echo("SIMULATED diurnal SM-activity traces; real forecaster")
        click.echo("method                           MAE vs mean  MAE vs peak  below peak  shortfall  mean reserve")
        for name, r in rows.items():
            click.echo(f"{name:32s} {r['mae_vs_mean']:11.3f}  {r['mae_vs_peak']:11.3f}  "
                       f"{100 * r['under_peak_rate']:9.1f}%  {100 * r['shortfall_rate']:8.2f}%  {r['mean_reserve']:12.3f}")
    click.echo(json.dumps(out))


@bench.command("xcuda", context_settings=HELP)
@click.option("--calls", type=click.IntRange(min=1000), default=1_000_000, show_default=True,
              help="Timed calls of each entry point per run.")
@click.option("--rounds", type=click.IntRange(1, 21), default=3, show_default=True,
              help="Plain / preloaded / preloaded-and-publishing run triples; the median is reported.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def bench_xcuda(calls: int, rounds: int, as_json: bool) -> None:
    """Added latency per intercepted cuLaunchKernel and cuMemAlloc versus the driver called directly.

    Both on the fake libcuda of xCUDA's tests, median and p99 over CALLS timed calls;
    pacing reads a low-load GPU record so the launch gate is open. Target: at most
    100 ns median added per launch.
    """
    from executors.node.xcuda.bench import run_overhead_bench

    result = run_overhead_bench(calls=calls, rounds=rounds)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"xCUDA overhead on {result['machine']} ({result['driver']})")
    click.echo(f"{calls:,} calls per run, {rounds} round(s), timer {result['timer_median_ns']} ns")
    for call in ("cuLaunchKernel", "cuMemAlloc_v2"):
        r = result[call]
        click.echo(f"  {call:16s} direct {r['direct_median_ns']:8.1f} ns (p99 {r['direct_p99_ns']:8.1f})  "
                   f"xcuda {r['xcuda_median_ns']:8.1f} ns (p99 {r['xcuda_p99_ns']:8.1f})  "
                   f"added {r['added_median_ns']:+7.1f} ns (p99 {r['added_p99_ns']:+7.1f})")
    r = result["cuLaunchKernel"]
    click.echo(f"  {'publishing':16s} counters for the node agent (XCUDA_STATS_DIR): launch "
               f"{r['published_median_ns']:8.1f} ns (p99 {r['published_p99_ns']:8.1f}), added by publishing "
               f"{r['added_by_publishing_median_ns']:+7.1f} ns (p99 {r['added_by_publishing_p99_ns']:+7.1f})")
    verdict = "meets" if result["meets_target"] else "MISSES"
    click.echo(f"  {verdict} the target of <= {result['target_added_launch_median_ns']:.0f} ns added per launch")


SIMULATE_TARGET_S = 60.0


@bench.command("node-metrics", context_settings=HELP)
@click.option("--gpus", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--jobs-per-gpu", type=click.IntRange(1, 16), default=4, show_default=True)
@click.option("--processes-per-job", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--scrapes", type=click.IntRange(10, 100_000), default=200, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def bench_node_metrics(gpus: int, jobs_per_gpu: int, processes_per_job: int, scrapes: int, as_json: bool) -> None:
    """Latency of one Prometheus scrape of a node agent: GPUS simulated GPUs with JOBS_PER_GPU placed jobs each,
    every job's processes publishing xCUDA counters (read from /proc and the jobs' directories), and without them."""
    from executors.dev.bench_node_metrics import run_node_metrics_bench

    r = run_node_metrics_bench(gpus, jobs_per_gpu, processes_per_job, scrapes)
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    click.echo(f"node agent /metrics on {r['machine']}: {gpus} GPUs x {jobs_per_gpu} jobs x {processes_per_job} "
               f"processes, {scrapes} scrapes ({r['gpu_metrics']})")
    for label in ("with_xcuda_counters", "without_xcuda_counters"):
        x = r[label]
        click.echo(f"  {label.replace('_', ' '):24s} median {x['median_ms']:7.2f} ms  p99 {x['p99_ms']:7.2f} ms  "
                   f"{x['series']} series, {x['bytes']:,} bytes")


@bench.command("simulate", context_settings=HELP)
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path), default=SAMPLE_TRACE,
              show_default=True)
@click.option("--gpus", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--hours", type=click.FloatRange(min=0.25), default=24.0, show_default=True)
@click.option("--jobs", type=click.IntRange(min=1), default=7287, show_default=True)
@click.option("--policies", "policy_names", default=None, callback=policy_list,
              help="Comma-separated policies [default: all].")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@_guarded
def bench_simulate(trace_path, gpus, hours, jobs, policy_names, seed, as_json) -> None:
    """Wall time of one simulation per policy at the paper's largest scale (1,000 GPUs, 24 h, 7,287 jobs), against
    the 60 s target; predictor training is reported separately (cached, shared by the policies)."""
    from executors.simulated.evaluation import load_trace, simulation_inputs
    from pipelines.cli.simulate import CACHE_DIR, _config, run_policies
    from scheduler_core.simulator import POLICIES

    names = list(policy_names or POLICIES)
    cfg = _config(gpus, None, hours, jobs, None, 1.0, seed)
    trace = load_trace(trace_path)
    t0 = time.perf_counter()
    inputs, info = simulation_inputs(cfg, CACHE_DIR)
    prep_s = time.perf_counter() - t0
    rows = []
    for name in names:
        res = run_policies(trace, inputs, cfg, [name], quiet=True)[name]
        m = res.metrics
        rows.append({"policy": name, "wall_s": round(res.wall_s, 2), "within_target": res.wall_s <= SIMULATE_TARGET_S,
                     "rounds": m["rounds"]["count"], "round_s_mean": m["timing"]["round_s_mean"],
                     "round_s_max": m["timing"]["round_s_max"], "jobs": m["offline"]["jobs"],
                     "finished": m["offline"]["finished"]})
        if not as_json:
            r = rows[-1]
            click.echo(f"{name:16s} {r['wall_s']:7.2f} s  {'ok ' if r['within_target'] else 'SLOW'}  rounds "
                       f"{r['rounds']} (mean {r['round_s_mean']:.3f} s, max {r['round_s_max']:.3f} s)  finished "
                       f"{r['finished']}/{r['jobs']}")
    out = {"simulated": True, "trace": str(trace_path), "gpus": gpus, "hours": hours, "jobs": jobs, "seed": seed,
           "target_s": SIMULATE_TARGET_S, "predictor_prep_s": round(prep_s, 2), "inputs": info, "policies": rows,
           "machine": machine()}
    click.echo(json.dumps(out, indent=2 if as_json else None, default=str))


@bench.command("dispatch", context_settings=HELP)
@click.option("--placements", type=click.IntRange(min=1, max=20000), default=1000, show_default=True,
              help="START actions in the plan (one held job each).")
@click.option("--db", "db_url", default=None,
              help="Store to use (it gets the jobs, the round and the dev cluster's nodes); default: a temporary "
                   "SQLite file, removed afterwards.")
@click.option("--state-dir", envvar="MUXFLOW_SLURM_DIR", default=None, type=click.Path(),
              help="The dev cluster's directory (default /tmp/muxflow-slurm).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def bench_dispatch(placements: int, db_url: str | None, state_dir: str | None, as_json: bool) -> None:
    """The Slurm dispatcher placing and releasing PLACEMENTS held jobs on the dev cluster.

    Total time, placements/s, REST requests per placement and intent/result writes of
    one real dispatch (round_runner.dispatch_round through the Slurm dispatcher), then
    an idempotent re-dispatch; every job is checked and cancelled afterwards. Released
    jobs wait on a held gate job, so none starts: starting jobs is not measured.
    """
    from executors.dev.bench_dispatch import BenchError, run_dispatch_bench

    say = (lambda _m: None) if as_json else (lambda msg: click.echo(msg, err=True))
    try:
        r = run_dispatch_bench(placements, db_url=db_url, state_dir=state_dir, say=say)
    except BenchError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    ok = r["verified"]["wrong_count"] == 0 and r["dispatch"]["failed"] == 0
    if as_json:
        click.echo(json.dumps(r, indent=2))
    else:
        d, v, red = r["dispatch"], r["verified"], r["redispatch"]
        by = ", ".join(f"{k} {n}" for k, n in sorted(d["rest_requests_by_method"].items()))
        click.echo(f"Slurm dispatch on the dev cluster ({r['cluster']['nodes']} nodes, {r['cluster']['gpus']} GPUs, "
                   f"slurmrestd {r['cluster']['slurm_api']}, {r['cluster']['transport']}); {r['machine']}")
        click.echo(f"  measured: {r['measured']}")
        click.echo(f"  placements         {placements}: {d['done']} done, {d['failed']} failed")
        click.echo(f"  dispatch           {d['wall_s']:.2f} s   {d['placements_per_s']:.1f} placements/s   "
                   f"{d['ms_per_placement']:.2f} ms per placement")
        click.echo(f"  REST requests      {d['rest_requests']} ({by}) = {d['rest_requests_per_placement']:.2f} "
                   "per placement")
        click.echo(f"  store writes       intents {d['intent_writes']}, results {d['result_writes']} "
                   f"(dispatch_log); {d['store_transactions']} transactions; "
                   + ", ".join(f"{k} {n}" for k, n in d["store_write_statements"].items()))
        click.echo(f"  re-dispatch        {red['wall_s']:.2f} s, {red['actions_sent']} actions sent, "
                   f"{red['rest_requests']} REST request(s)")
        click.echo(f"  verified           {v['placed_as_planned']}/{placements} released once on the planned node "
                   f"with the planned share and comment; dispatch log {v['dispatch_log']}; pending because "
                   f"{v['pending_reasons']}")
        for w in v["wrong"]:
            click.echo(f"  WRONG: {w}")
        click.echo(f"  setup (not timed)  submit {r['setup']['submit_s']:.1f} s, "
                   f"pick-up {r['setup']['pickup_s']:.1f} s; cleanup {r['cleanup_s']:.1f} s")
        click.echo(f"  not measured: {r['not_measured']}")
    if not ok:
        sys.exit(1)
