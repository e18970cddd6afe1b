"""``muxflow node-agent``: GPU monitor + SysMonitor + error detector for the GPUs of one node.

SIGTERM/SIGINT stop sampling, flush the current minute to the store, close NVML and exit 0.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
from pathlib import Path

import click

log = logging.getLogger(__name__)


@click.command("node-agent", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--node", "node", default=None, help="Node name as stored in the feature store (default: hostname).")
@click.option("--simulated", is_flag=True, help="Simulated GPUs (no NVML): for machines without GPUs. Rows are labelled 'simulated'.")
@click.option("--db", "db_url", default=None, help="Feature store URL (default: muxflow --db / MUXFLOW_DATABASE_URL).")
@click.option("--interval-ms", type=click.FloatRange(0.5, 10_000), default=10.0, show_default=True,
              help="Sampling period.")
@click.option("--duration", type=click.FloatRange(min=0), default=None,
              help="Stop after this many seconds (tests); default: until SIGTERM/SIGINT.")
@click.option("--shm-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("/dev/shm"), show_default=True,
              help="Where the xCUDA records muxflow-gpu-<index> are written.")
@click.option("--no-shm", is_flag=True, help="Do not write xCUDA records.")
@click.option("--evict", "evict_mode", type=click.Choice(["auto", "record", "scontrol"]), default="auto", show_default=True,
              help="How offline work is evicted: 'scontrol' requeues (held) the GPU's Slurm jobs; 'record' only records "
                   "the eviction (simulated cluster); auto = record with --simulated, else scontrol.")
@click.option("--mps-pipe-dir", default=None, help="CUDA_MPS_PIPE_DIRECTORY of the node's MPS control daemon.")
@click.option("--ring-seconds", type=click.FloatRange(1, 3600), default=300.0, show_default=True,
              help="Raw samples kept in memory per GPU.")
@click.option("--sysmonitor-config", "sm_config", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help="SysMonitor thresholds and back-off (TOML or .json; see docs/NODE_AGENT.md).")
@click.option("--time-scale", type=click.FloatRange(min=1e-3), default=1.0, hidden=True,
              help="Agent seconds per real second (tests: 60 makes a minute pass in one second).")
@click.option("--seed", type=int, default=0, hidden=True)
@click.pass_context
def node_agent(ctx: click.Context, node: str | None, simulated: bool, db_url: str | None, interval_ms: float,
               duration: float | None, shm_dir: Path, no_shm: bool, evict_mode: str, mps_pipe_dir: str | None,
               ring_seconds: float, sm_config: Path | None, time_scale: float, seed: int) -> None:
    """Run the node agent for the GPUs of one node until SIGTERM/SIGINT."""
    from executors.node.agent import AgentConfig
    from executors.node.wiring import build_agent
    from executors.store.db import Store, resolve_url

    url = db_url or (ctx.obj or {}).get("db") or resolve_url(None)
    node = node or socket.gethostname()
    from executors.node.config import ConfigError, load_sysmonitor_config

    cfg = AgentConfig(interval_s=interval_ms / 1000.0, ring_window_s=ring_seconds, time_scale=time_scale)
    if sm_config is not None:
        try:
            smc, idle = load_sysmonitor_config(sm_config)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from exc
        cfg = AgentConfig(interval_s=cfg.interval_s, ring_window_s=cfg.ring_window_s, time_scale=time_scale,
                          sysmonitor=smc, idle_util_pct=idle)
    requeue = None
    if evict_mode == "scontrol" or (evict_mode == "auto" and not simulated):
        from executors.slurm.scontrol import ScontrolRequeue

        rq = ScontrolRequeue()

        def requeue(slurm_job_id: int) -> None:
            rq(slurm_job_id, True)

    if not no_shm:
        shm_dir.mkdir(parents=True, exist_ok=True)
    store = Store(url)
    try:
        agent = build_agent(store, node, simulated=simulated, cfg=cfg, shm_dir=None if no_shm else shm_dir,
                            requeue=requeue, mps_pipe_dir=mps_pipe_dir, seed=seed)
    except Exception as exc:
        store.dispose()
        raise click.ClickException(str(exc)) from exc

    def on_signal(signum, _frame) -> None:
        log.info("signal %d: stopping", signum)
        agent.stop()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    label = "simulated" if simulated else "NVML"
    click.echo(f"node-agent: node {node}, {len(agent.loops)} {label} GPU(s), every {interval_ms:g} ms", err=True)
    sys.stderr.flush()
    try:
        agent.run(duration)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        store.dispose()
    n = sum(loop.samples for loop in agent.loops.values())
    click.echo(f"node-agent: stopped after {agent.ticks} ticks ({n} samples, {agent.overruns} late ticks skipped)",
               err=True)
