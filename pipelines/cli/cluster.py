"""``muxflow cluster``: the inventory of nodes, GPUs and their online services."""

from __future__ import annotations

import click
import pandas as pd

from executors.store import inventory
from pipelines.cli.common import SEED, CliError, guard, parse_types, store_of


@click.group()
def cluster() -> None:
    """Cluster inventory: nodes, GPUs, online services."""


@cluster.command("init")
@click.option("--simulated", is_flag=True, required=True, help="Create a simulated cluster (the only kind `init` makes).")
@click.option("--gpus", type=int, required=True, help="Total number of GPUs.")
@click.option("--types", "types_text", required=True, help="GPU types and counts, e.g. t4:32,a10:32 (must add up to --gpus).")
@click.option("--services", type=int, default=5, show_default=True, help="Online inference services.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.pass_context
@guard
def cluster_init(ctx, simulated: bool, gpus: int, types_text: str, services: int, seed: int) -> None:
    """Create a simulated cluster in the store."""
    from executors.simulated.setup import init_simulated_cluster

    types = parse_types(types_text)
    if gpus <= 0:
        raise CliError("gpus: must be positive")
    if sum(types.values()) != gpus:
        raise CliError(f"types: counts add up to {sum(types.values())}, but --gpus is {gpus}")
    store = store_of(ctx)
    with store.session() as s:
        info = init_simulated_cluster(s, types, services, seed=seed)
    click.echo(f"simulated cluster: {info['gpus']} GPUs on {info['nodes']} nodes, {info['services']} services")


@cluster.command("show")
@click.pass_context
def cluster_show(ctx) -> None:
    """GPUs per node with their type, SysMonitor state and online service."""
    store = store_of(ctx)
    with store.session() as s:
        rows = inventory.gpu_inventory(s)
    if not rows:
        click.echo("no cluster yet: run `muxflow cluster init --simulated ...`")
        return
    df = pd.DataFrame(rows, columns=["node", "simulated", "gpu", "type", "health", "online_service"])
    click.echo(df.to_string(index=False))
    summary = df.groupby(["type", "health"]).size().to_string()
    click.echo(f"\n{len(df)} GPUs{' (SIMULATED)' if df['simulated'].all() else ''}\n{summary}")
