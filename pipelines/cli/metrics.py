"""``muxflow metrics``: the scheduler's Prometheus endpoint and a one-off look at it (docs/OBSERVABILITY.md)."""

from __future__ import annotations

import signal
import threading

import click

from pipelines.cli.common import HELP, CliError, settings, store_of


@click.group("metrics", context_settings=HELP)
def metrics() -> None:
    """Prometheus metrics of the scheduler: rounds, placements, pending jobs, dispatch."""


@metrics.command("serve")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Port of /metrics (default: the settings' scheduler_metrics_port, 9411; 0: any free port).")
@click.option("--host", default=None, help="Bind address (default: the settings' metrics_host, 0.0.0.0).")
@click.option("--web-config-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="TLS and basic auth: a web config file as Prometheus' exporters read (tls_server_config, "
                   "basic_auth_users with bcrypt hashes; docs/OBSERVABILITY.md).")
@click.option("--duration", type=click.FloatRange(min=0), default=None,
              help="Stop after this many seconds (default: until SIGTERM/SIGINT).")
@click.pass_context
def serve_cmd(ctx: click.Context, port: int | None, host: str | None, web_config_file: str | None,
              duration: float | None) -> None:
    """Serve the scheduler's metrics, read from the feature store (at most once a second), until SIGTERM/SIGINT."""
    from executors.metrics_http import WebConfigError, load_web_config, serve
    from executors.scheduler.metrics import SchedulerCollector

    try:
        web_config = load_web_config(web_config_file)
    except WebConfigError as exc:
        raise CliError(str(exc)) from exc
    s = settings()
    port = s.scheduler_metrics_port if port is None else port
    host = s.metrics_host if host is None else host
    store = store_of(ctx)
    try:
        server = serve(SchedulerCollector(store), host, port, web_config=web_config)
    except OSError as exc:
        store.dispose()
        raise CliError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from exc
    stop = threading.Event()
    old = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    click.echo(f"metrics: {server.scheme}://{host}:{server.port}/metrics (the scheduler, from the feature store)",
               err=True)
    try:
        stop.wait(duration)
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        server.close()
        store.dispose()


@metrics.command("show")
@click.pass_context
def show_cmd(ctx: click.Context) -> None:
    """Print the scheduler's metrics once, in Prometheus' text format."""
    from prometheus_client import CollectorRegistry, generate_latest

    from executors.scheduler.metrics import SchedulerCollector

    registry = CollectorRegistry(auto_describe=False)
    store = store_of(ctx)
    try:
        registry.register(SchedulerCollector(store))
        click.echo(generate_latest(registry).decode(), nl=False)
    finally:
        store.dispose()
