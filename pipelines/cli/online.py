"""``muxflow online``: online inference services and their replicas' endpoints."""

from __future__ import annotations

import click

from executors.store import inventory
from pipelines.cli.common import BUDGET, NO_BUDGET, CliError, FiniteFloat, guard, store_of
from scheduler_core.online.latency_budget import DEFAULT_SLOWDOWN_ALLOWANCE, DEFAULT_SLOWDOWN_BUDGET


@click.group()
def online() -> None:
    """Online inference services."""


@online.command("register")
@click.option("--name", required=True)
@click.option("--family", required=True, type=click.Choice(["cnn", "transformer", "recommender", "lm"]))
@click.option("--qps-min", type=FiniteFloat(), required=True)
@click.option("--qps-max", type=FiniteFloat(), required=True)
@click.option("--peak-hour", type=FiniteFloat(), default=20.0, show_default=True, help="Hour of day (UTC) of peak load.")
@click.option("--slo-ms", type=FiniteFloat(), default=100.0, show_default=True)
@click.option("--allowance", type=FiniteFloat(), default=DEFAULT_SLOWDOWN_ALLOWANCE, show_default=True,
              help="The latency slowdown a minute may be predicted to take (0.25 = +25%): the cap under the budget.")
@click.option("--slowdown-budget", "budget", type=BUDGET, default=DEFAULT_SLOWDOWN_BUDGET, show_default=True,
              help="The mean slowdown of the service's requests (weighted by their latency alone) to keep over the "
                   "day: rounds pace it to what the requests spent, sharing its GPUs more in quiet minutes and less "
                   "at its peak, every minute within --allowance; 'none': --allowance on every minute (the flat "
                   "rule).")
@click.option("--mem", "mem_text", required=True, help="GPU memory of one replica, e.g. 4GiB.")
@click.option("--gpu-ids", required=True, help="Comma-separated GPU ids that host a replica.")
@click.option("--endpoint", "endpoints", multiple=True, metavar="[GPU_ID=]URL",
              help="A replica's Prometheus endpoint (http://host:port/metrics), scraped by the node agent; "
                   "repeat as GPU_ID=URL, one per replica (a bare URL when the service has one GPU).")
@click.option("--run-as", "run_as", default=None, metavar="USER",
              help="The user the replicas run as. MPS serves one user per GPU, so only offline jobs of this user "
                   "are placed on these GPUs [default: not declared, any user's jobs].")
@click.pass_context
@guard
def online_register(ctx, name, family, qps_min, qps_max, peak_hour, slo_ms, allowance, budget, mem_text, gpu_ids,
                    endpoints, run_as) -> None:
    """Register an online service and the GPUs its replicas run on (one replica per GPU)."""
    from executors.node.scrape import parse_endpoint_options
    from executors.scheduler.submission import parse_size_bytes

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
    budget = None if budget == NO_BUDGET else budget
    mem = parse_size_bytes(mem_text, "mem")
    try:
        ids = sorted({int(x) for x in gpu_ids.split(",") if x.strip()})
    except ValueError:
        raise CliError(f"gpu-ids: expected comma-separated integers, got {gpu_ids!r}") from None
    if not ids:
        raise CliError("gpu-ids: name at least one GPU")
    urls = parse_endpoint_options(endpoints, ids)
    spec = inventory.ServiceRegistration(name, family, qps_min, qps_max, peak_hour, slo_ms, allowance, mem, budget)
    with store_of(ctx).session() as s:  # an InventoryError (a ValueError) is one line, nothing written
        inventory.register_online_service(s, spec, ids, urls, run_as)
    with_url = f", {len(urls)} with a metrics endpoint" if urls else ""
    as_user = f", running as {run_as}" if run_as else ""
    budgeted = f", slowdown budget {budget:g} (each minute within {allowance:g})" if budget is not None else ""
    click.echo(f"registered online service {name} on {len(ids)} GPU(s){with_url}{as_user}{budgeted}")
    if budget is not None and budget >= allowance:
        click.echo(f"note: the slowdown budget {budget:g} is not below the allowance {allowance:g}, so every minute "
                   "gets the allowance (the flat rule); a budget below it shifts sharing to quiet minutes", err=True)
