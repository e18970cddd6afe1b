"""`muxflow bench simulate`: simulation time per policy at the paper's largest scale (issue target ≤ 60 s/policy).

1,000 GPUs, 24 simulated hours, the trace repeated to 7,287 offline jobs (the
paper's largest trace size). Predictor training is reported separately (it is
cached between runs and shared by the policies).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import click

from executors.simulated.calibration import SAMPLE_TRACE

TARGET_S = 60.0


@click.command("simulate", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path), default=SAMPLE_TRACE,
              show_default=True)
@click.option("--gpus", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--hours", type=click.FloatRange(min=0.25), default=24.0, show_default=True)
@click.option("--jobs", type=click.IntRange(min=1), default=7287, show_default=True)
@click.option("--policies", "policy_text", default=None, help="Comma-separated policies [default: all].")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def bench_simulate(trace_path, gpus, hours, jobs, policy_text, seed, as_json) -> None:
    """Wall time of one simulation per policy; compares against the 60 s target."""
    from executors.simulated.evaluation import load_trace, simulation_inputs
    from pipelines.cli_simulate import CACHE_DIR, _config, run_policies
    from scheduler_core.simulator import POLICIES, get_policy

    names = [get_policy(n).name for n in policy_text.split(",")] if policy_text else list(POLICIES)
    cfg = _config(gpus, None, hours, jobs, None, 1.0, seed)
    trace = load_trace(trace_path)
    t0 = time.perf_counter()
    inputs, info = simulation_inputs(cfg, CACHE_DIR)
    prep_s = time.perf_counter() - t0
    rows = []
    for name in names:
        res = run_policies(trace, inputs, cfg, [name], quiet=True)[name]
        m = res.metrics
        rows.append({"policy": name, "wall_s": round(res.wall_s, 2), "within_target": res.wall_s <= TARGET_S,
                     "rounds": m["rounds"]["count"], "round_s_mean": m["timing"]["round_s_mean"],
                     "round_s_max": m["timing"]["round_s_max"], "jobs": m["offline"]["jobs"],
                     "finished": m["offline"]["finished"]})
        if not as_json:
            r = rows[-1]
            click.echo(f"{name:16s} {r['wall_s']:7.2f} s  {'ok ' if r['within_target'] else 'SLOW'}  rounds "
                       f"{r['rounds']} (mean {r['round_s_mean']:.3f} s, max {r['round_s_max']:.3f} s)  finished "
                       f"{r['finished']}/{r['jobs']}")
    out = {"simulated": True, "trace": str(trace_path), "gpus": gpus, "hours": hours, "jobs": jobs, "seed": seed,
           "target_s": TARGET_S, "predictor_prep_s": round(prep_s, 2), "inputs": info, "policies": rows,
           "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    click.echo(json.dumps(out, indent=2 if as_json else None, default=str))
