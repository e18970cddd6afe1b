"""``muxflow bench xcuda``: xCUDA's added latency per intercepted call (fake driver, no GPU).

Registered in the ``bench`` group of :mod:`pipelines.bench`.
"""

from __future__ import annotations

import json

import click


@click.command("xcuda", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--calls", type=click.IntRange(min=1000), default=1_000_000, show_default=True,
              help="Timed calls of each entry point per run.")
@click.option("--rounds", type=click.IntRange(1, 21), default=3, show_default=True,
              help="Plain/preloaded run pairs; the median is reported.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def bench_xcuda(calls: int, rounds: int, as_json: bool) -> None:
    """Added latency per intercepted cuLaunchKernel and cuMemAlloc versus the driver called directly.

    Both on the fake libcuda of xCUDA's tests, median and p99 over CALLS timed calls;
    pacing reads a low-load GPU record so the launch gate is open. Target: at most
    100 ns median added per launch.
    """
    from executors.xcuda.bench import run_overhead_bench

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
    verdict = "meets" if result["meets_target"] else "MISSES"
    click.echo(f"  {verdict} the target of <= {result['target_added_launch_median_ns']:.0f} ns added per launch")
