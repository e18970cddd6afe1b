"""``muxflow simulate users``: what one user per GPU costs MuxFlow, on a trace (docs/EVALUATION.md).

    muxflow simulate users --trace T [--gpus 200] [--hours 24] [--users-list 0,4,16] [--zipf 1.0] [--json]

MPS serves one user per GPU, so a round pairs a job only with a GPU whose online replica runs as
the job's user (``scheduler_core.jobs.run_as``). This runs the MuxFlow policy once per team count of
``--users-list`` (0: no user declared, the rule off: the reference), users drawn as
``scheduler_core.simulator.users`` documents, and prints JCT, finished jobs, oversold GPU and
placements per round against the reference. Every figure is SIMULATED.
"""

from __future__ import annotations

import json
from dataclasses import replace

import click

from pipelines.cli.common import HELP, columns_table, int_list
from pipelines.cli.simulate import (
    _check_calibrations,
    _config,
    _config_json,
    _guarded,
    _inputs,
    _load,
    _sim_options,
    run_policies,
)


def _counts(text: str) -> list[int]:
    counts = int_list(text, "users-list", 0)
    return ([0] if 0 not in counts else []) + counts  # the reference first


@click.command("users", context_settings=HELP)
@_sim_options
@click.option("--users-list", "users_text", default="0,2,4,8,16", show_default=True,
              help="Team counts to simulate (0: no user declared, the reference; always run).")
@click.option("--zipf", "zipf_s", type=click.FloatRange(min=0.0), default=1.0, show_default=True,
              help="Zipf exponent of the teams' sizes (0: equal teams).")
@_guarded
def users(trace_path, gpus, types_text, hours, jobs, arrival_hours, mean_job_hours, seed, sm_fallback_levels,
          migration_penalty, slo_scale, slowdown_allowance, slowdown_budget, max_jobs_per_gpu, round_minutes,
          between_rounds, burst_guard, calibration, as_json, quiet, users_text, zipf_s) -> None:
    """MuxFlow with one user per GPU against no user constraint (SIMULATED)."""
    counts = _counts(users_text)
    base = _config(gpus, types_text, hours, jobs, arrival_hours, mean_job_hours, seed, sm_fallback_levels,
                   migration_penalty, slo_scale, max_jobs_per_gpu, between_rounds, round_minutes, slowdown_allowance,
                   slowdown_budget, burst_guard)
    [calibration] = _check_calibrations([calibration])
    trace = _load(trace_path)
    inputs, info = _inputs(base, calibration, quiet)
    rows, metrics = [], {}
    for k in dict.fromkeys(counts):
        cfg = replace(base, users=k, users_zipf_s=zipf_s)
        res = run_policies(trace, inputs, cfg, ["muxflow"], quiet, f"users={k}/")["muxflow"]
        if res.invariants["jobs_next_to_another_user"]:
            raise click.ClickException(f"users={k}: {res.invariants['jobs_next_to_another_user']} job-rounds next "
                                       "to a replica of another user: the round broke its own rule")
        metrics[k] = res.metrics
        rows.append(_row(k, res.metrics, metrics[0]))
    doc = {"simulated": True, "trace": str(trace_path), "config": _config_json(base), "zipf_s": zipf_s,
           "calibration": calibration, "inputs": info, "table": rows, "metrics": {str(k): m for k, m in metrics.items()}}
    click.echo(json.dumps(doc, indent=2, default=str) if as_json else format_users_table(rows, zipf_s))


def _row(users: int, m: dict, ref: dict) -> dict:
    off, ro = m["offline"], m["rounds"]
    # JCT over every arrived job, an unfinished one counted to the end: finished-only JCT would favour a rule that
    # leaves the hard jobs unfinished.
    jct, ref_jct = off["jct_censored_s"], ref["offline"]["jct_censored_s"]
    return {
        "users": users, "finished": off["finished"], "arrived": off["arrived"],
        "avg_jct_h": None if off["avg_jct_s"] is None else round(off["avg_jct_s"] / 3600.0, 3),
        "jct_all_h": None if jct is None else round(jct / 3600.0, 3),
        "jct_vs_none": None if not (jct and ref_jct) else round(jct / ref_jct, 3),
        "oversold_gpu": off["oversold_gpu"],
        "oversold_vs_none": round(off["oversold_gpu"] / ref["offline"]["oversold_gpu"], 3)
        if ref["offline"]["oversold_gpu"] else None,
        "norm_tput": off["norm_tput"], "placements_per_round": ro["placements_mean"],
        "p99_latency_vs_online_only": m["online"]["p99_latency_norm"], "evictions": off["evictions"],
        "plan_s_mean": ro["plan_s_mean"],
    }


def format_users_table(rows: list[dict], zipf_s: float) -> str:
    cols = [("users", "teams", "{}"), ("finished", "finished", "{}"), ("jct_all_h", "JCT h", "{:.2f}"),
            ("jct_vs_none", "JCT/none", "{:.3f}"), ("avg_jct_h", "JCT finished h", "{:.2f}"),
            ("oversold_gpu", "oversold", "{:.3f}"),
            ("oversold_vs_none", "oversold/none", "{:.3f}"), ("placements_per_round", "placed/round", "{:.1f}"),
            ("norm_tput", "norm tput", "{:.4f}"), ("p99_latency_vs_online_only", "p99 lat", "{:.3f}"),
            ("plan_s_mean", "round s", "{:.3f}")]
    lines = columns_table(rows, cols)
    return (f"SIMULATED — MuxFlow with one user per GPU (teams with Zipf({zipf_s:g}) sizes; 0 = no user declared), "
            "JCT (every arrived job, unfinished ones counted to the end) and oversold GPU against no constraint\n"
            + "\n".join(lines))
