"""``muxflow node-agent``: GPU monitor + SysMonitor + error detector for the GPUs of one node.

SIGTERM/SIGINT stop sampling, flush the current minute to the store, close NVML and exit 0.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
from dataclasses import replace
from pathlib import Path

import click
from pipelines.cli.common import SEED, open_store, slurm_config

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
@click.option("--mps-pipe-root", default="/run/muxflow/mps", show_default=True,
              help="The node scripts' @MPS_PIPE_ROOT@: GPU i's MPS control daemon has its pipes in <root>/gpu<i> and "
                   "its log in <root>/gpu<i>.log. Root's alone (never under /tmp): the agent refuses to start "
                   "otherwise, and uses no GPU's directory that someone else made.")
@click.option("--ring-seconds", type=click.FloatRange(1, 3600), default=300.0, show_default=True,
              help="Raw samples kept in memory per GPU.")
@click.option("--sysmonitor-config", "sm_config", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help="SysMonitor thresholds and back-off (TOML or .json; see docs/NODE_AGENT.md).")
@click.option("--placements", "placements_from", type=click.Choice(["auto", "slurm", "store", "none"]), default="auto",
              show_default=True,
              help="Where the agent learns which offline job runs on which GPU at which share: 'slurm' (the node's "
                   "running jobs and the plan in their comment; the settings' MUXFLOW_SLURM_URL, else the dev cluster), "
                   "'store' (the latest dispatched round: the simulated cluster); auto = slurm when evicting with "
                   "scontrol, else store.")
@click.option("--placement-poll", "poll_s", type=click.FloatRange(0.1, 600), default=5.0, show_default=True,
              help="Seconds between two reads of the placements.")
@click.option("--scrape-interval", "scrape_s", type=click.FloatRange(0.1, 600), default=5.0, show_default=True,
              help="Seconds between two scrapes of each replica's metrics endpoint.")
@click.option("--scrape-timeout", "scrape_timeout_s", type=click.FloatRange(0.05, 60), default=2.0, show_default=True,
              help="Timeout of one scrape (s).")
@click.option("--solo-window", "solo_window_s", type=click.FloatRange(60, 7 * 86400), default=3600.0,
              show_default=True, help="Seconds of a replica's recent latency without offline work on its GPU that "
                                      "make its solo latency.")
@click.option("--partial-every", "partial_every_s", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Also write the minute in progress every this many seconds, replacing the agent's own earlier "
                   "version of it (0: only whole minutes).")
@click.option("--burst-margin", "burst_margin", type=click.FloatRange(min=0), default=0.2, show_default=True,
              help="Burst guard: a replica whose request rate is this much over its recent level (the 0.9-quantile "
                   "of its last 30 minutes) has its GPU's offline work held at xCUDA's floor until the rate falls "
                   "back under half the margin; 0: no guard.")
@click.option("--sim-noise-pct", type=click.FloatRange(0, 20), default=1.0, show_default=True,
              help="Simulated GPUs: measurement noise on SM activity and utilization (percentage points).")
@click.option("--sim-xcuda-target", "sim_xcuda_target", type=click.FloatRange(0, 2), default=0.9, show_default=True,
              help="Simulated GPUs: the GPU load each offline job's xCUDA paces it to (the library's default "
                   "XCUDA_TARGET_UTIL); 0: jobs xCUDA does not pace.")
@click.option("--sim-mps-split-gaps", "sim_mps_split_gaps", is_flag=True,
              help="Simulated GPUs: report no online split (utilization, SM activity, memory bandwidth) while an "
                   "offline job shares the GPU, as NVML does under MPS on a real GPU (the round then estimates it "
                   "from the replica's request rate).")
@click.option("--xcuda-check", "xcuda_check_s", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Seconds between two checks that every process of the node's offline Slurm jobs has xCUDA "
                   "loaded (a job that unset LD_PRELOAD is evicted; docs/NODE_AGENT.md); 0: off.")
@click.option("--xcuda-lib", "xcuda_lib", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The installed libxcuda.so the TaskProlog preloads (the node scripts' @XCUDA_LIB@): a process "
                   "counts as paced only when it maps this very file (its device and inode), whatever its name "
                   "(default: this tree's build).")
@click.option("--notice-dir", "notice_dir", type=click.Path(file_okay=False), default=None,
              help="Where the xCUDA check tells a user why a process of theirs was stopped (<dir>/<uid>, readable "
                   "by that user alone; a directory of root's alone, e.g. /run/muxflow/notices); default: the log.")
@click.option("--prolog", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The node's Slurm Prolog: run it for a job whose TaskProlog waits for a plan file slurmd's "
                   "skipped Prolog did not write (a requeued job restarted on this node; docs/SLURM.md). "
                   "Needs --plan-dir.")
@click.option("--plan-dir", type=click.Path(file_okay=False), default=None,
              help="Where the Prolog writes the per-job plan files (the node scripts' @PLAN_DIR@).")
@click.option("--task-prolog", type=click.Path(dir_okay=False), default=None,
              help="The TaskProlog script Slurm runs (slurm.conf's TaskProlog=): only a process running it under its "
                   "job's slurmstepd counts as a job's TaskProlog, for --prolog and the xCUDA check (default: "
                   "TaskProlog= of $SLURM_CONF or /etc/slurm/slurm.conf, else task_prolog.sh beside --prolog).")
@click.option("--job-dir", type=click.Path(file_okay=False), default=None,
              help="Measure the node's profiling windows, reading each job's iteration report in its directory "
                   "under this one (the node scripts' @JOB_DIR@; with --placements slurm).")
@click.option("--metrics-port", "metrics_port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics (per GPU, job and replica; docs/OBSERVABILITY.md) on this port; 0: off "
                   "(default: the settings' node_metrics_port, 9410).")
@click.option("--metrics-host", "metrics_host", default=None,
              help="The address the metrics endpoint binds (default: the settings' metrics_host, 0.0.0.0: every "
                   "interface, as Prometheus scrapes it over the network; name the interface Prometheus reaches).")
@click.option("--web-config-file", "web_config_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="TLS and basic auth for the metrics endpoint: a web config file as Prometheus' exporters read "
                   "(tls_server_config, basic_auth_users with bcrypt hashes; docs/OBSERVABILITY.md).")
@click.option("--time-scale", type=click.FloatRange(min=1e-3), default=1.0, hidden=True,
              help="Agent seconds per real second (tests: 60 makes a minute pass in one second).")
@click.option("--seed", type=SEED, default=0, hidden=True)
def node_agent(node: str | None, simulated: bool, db_url: str | None, interval_ms: float,
               duration: float | None, shm_dir: Path, no_shm: bool, evict_mode: str, mps_pipe_root: str,
               ring_seconds: float, sm_config: Path | None, placements_from: str, poll_s: float, scrape_s: float,
               scrape_timeout_s: float, solo_window_s: float, partial_every_s: float, burst_margin: float,
               sim_noise_pct: float,
               sim_xcuda_target: float, sim_mps_split_gaps: bool, xcuda_check_s: float, xcuda_lib: str | None,
               notice_dir: str | None, prolog: str | None,
               plan_dir: str | None, task_prolog: str | None, job_dir: str | None, metrics_port: int | None,
               metrics_host: str | None, web_config_file: str | None, time_scale: float, seed: int) -> None:
    """Run the node agent for the GPUs of one node until SIGTERM/SIGINT."""
    from executors.node.agent import AgentConfig
    from scheduler_core.guard.burst import BurstParams
    from executors.node.wiring import SourceConfig, build_agent
    node = node or socket.gethostname()
    from executors.node.config import ConfigError, load_sysmonitor_config

    if (prolog is None) != (plan_dir is None):
        raise click.UsageError("--prolog and --plan-dir go together")
    from executors.metrics_http import WebConfigError, load_web_config

    try:  # before anything starts: an endpoint asked for TLS or auth never serves without them
        web_config = load_web_config(web_config_file)
    except WebConfigError as exc:
        raise click.ClickException(str(exc)) from exc

    cfg = AgentConfig(interval_s=interval_ms / 1000.0, ring_window_s=ring_seconds, time_scale=time_scale,
                      partial_every_s=partial_every_s or None,
                      burst=BurstParams(margin=burst_margin) if burst_margin > 0 else None)
    if sm_config is not None:
        try:
            smc, idle = load_sysmonitor_config(sm_config)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from exc
        cfg = replace(cfg, sysmonitor=smc, idle_util_pct=idle)
    requeue = None
    scontrol = evict_mode == "scontrol" or (evict_mode == "auto" and not simulated)
    if scontrol:
        from executors.slurm.scontrol import ScontrolRequeue

        rq = ScontrolRequeue()

        def requeue(slurm_job_id: int) -> None:
            rq(slurm_job_id, True)

    if placements_from == "auto":
        placements_from = "slurm" if scontrol else "store"
    slurm, plan_key = None, b""
    if placements_from == "slurm":
        conf = slurm_config()
        try:
            conf.check_secrets()  # its token and key files are root's alone, or it does not start
            slurm, plan_key = conf.client, conf.plan_key()
        except ValueError as exc:  # SlurmConfigError: no plan key, or a key file open to others
            raise click.ClickException(str(exc)) from exc
    sources = SourceConfig(placements=placements_from, slurm_client=slurm, plan_key=plan_key,
                           poll_s=poll_s, scrape_s=scrape_s, scrape_timeout_s=scrape_timeout_s,
                           solo_window_s=solo_window_s, noise_pct=sim_noise_pct, xcuda_check_s=xcuda_check_s,
                           xcuda_lib=xcuda_lib, notice_dir=notice_dir,
                           prolog=prolog, plan_dir=plan_dir, task_prolog=task_prolog, job_dir=job_dir,
                           sim_xcuda_target_util=sim_xcuda_target if sim_xcuda_target > 0 else None,
                           sim_mps_split_gaps=sim_mps_split_gaps)

    if not no_shm:
        shm_dir.mkdir(parents=True, exist_ok=True)
    store = open_store(db_url)
    try:
        agent = build_agent(store, node, simulated=simulated, cfg=cfg, shm_dir=None if no_shm else shm_dir,
                            requeue=requeue, mps_pipe_root=mps_pipe_root, seed=seed, sources=sources)
    except Exception as exc:
        store.dispose()
        raise click.ClickException(str(exc)) from exc

    server = _metrics_server(store, node, agent, metrics_port, metrics_host, job_dir, sources.proc_root, web_config)

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
        if server is not None:
            server.close()
        store.dispose()
    n = sum(loop.samples for loop in agent.loops.values())
    click.echo(f"node-agent: stopped after {agent.ticks} ticks ({n} samples, {agent.overruns} late ticks skipped)",
               err=True)


def _metrics_server(store, node: str, agent, port: int | None, host: str | None, job_dir: str | None,
                    proc_root: str, web_config=None):
    """The agent's metrics endpoint, or None (port 0). A port that cannot be bound is reported and the agent runs
    without it: protecting the online services never waits on observability (Prometheus sees the target down)."""
    from executors.metrics_http import serve
    from executors.node.wiring import node_metrics
    from pipelines.cli.common import settings

    if port is None or host is None:
        s = settings()
        port = s.node_metrics_port if port is None else port
        host = s.metrics_host if host is None else host
    if port == 0:
        return None
    try:
        server = serve(node_metrics(store, node, agent, job_dir, proc_root), host, port, web_config=web_config)
    except OSError as exc:
        click.echo(f"node-agent: metrics endpoint not started on {host}:{port}: {exc.strerror or exc}", err=True)
        return None
    click.echo(f"node-agent: metrics on {server.scheme}://{host}:{server.port}/metrics", err=True)
    return server
