"""``muxflow slurm …``: the dev cluster (dev-up / dev-down / dev-status), REST checks, pick-up, dispatch, submit.

docs/SLURM.md describes the cluster's layout and how to point MuxFlow at a real one.
"""

from __future__ import annotations

import logging
import os
import sys

import click

from executors.dev.slurm.cluster import DevCluster, DevClusterError, DevStatus
from executors.dev.slurm.state import log_tail
from executors.text import printable
from pipelines.cli.common import HELP, CliError, CliFailure, db_option, open_store, slurm_config

log = logging.getLogger(__name__)
_state_dir = click.option("--state-dir", envvar="MUXFLOW_SLURM_DIR", default=None, type=click.Path(),
                          help="Where the dev cluster keeps everything (default /tmp/muxflow-slurm).")


def _err(msg: str) -> None:
    click.echo(msg, err=True)


def print_status(st: DevStatus) -> None:
    click.echo(f"dev Slurm cluster in {st.state_dir}")
    for p in st.procs:
        click.echo(f"  {p.name:<22} pid {p.pid if p.pid is not None else '-':>7}  "
                   f"{'running' if p.alive else 'NOT RUNNING'}")
    if st.nodes:
        click.echo("nodes:")
        for n in st.nodes:
            gres = ",".join(f"{g.name}:{g.type + ':' if g.type else ''}{g.count}" for g in n.gres)
            state = "+".join((n.state, *n.state_flags))
            click.echo(f"  {n.name:<10} {n.address:<15} {state:<10} {gres:<18} "
                       f"partitions={','.join(n.partitions)}")
    if st.partitions:
        click.echo("partitions: " + "  ".join(f"{p.name}({p.state}, {','.join(p.nodes)})" for p in st.partitions))
    if st.layout is not None:
        click.echo("REST:")
        for endpoint, error in st.rest.items():
            auth = "rest_auth/local" if endpoint.startswith("unix:") else "JWT"
            click.echo(f"  {endpoint} ({auth}, {st.layout.api_version}): {'ok' if error is None else error}")
        click.echo(f"SLURM_CONF={st.layout.slurm_conf}")
    for p in st.problems:
        _err(f"problem: {p}")


class _SlurmGroup(click.Group):
    """Slurm not answering, or refusing a request, is one line on stderr (exit 1), not a traceback."""

    def invoke(self, ctx: click.Context):
        from executors.slurm.errors import SlurmError
        from executors.slurm.retry import SlurmUnavailable

        try:
            return super().invoke(ctx)
        except (SlurmError, SlurmUnavailable) as exc:
            raise CliFailure(f"slurm: {exc}") from exc


@click.group("slurm", cls=_SlurmGroup, context_settings=HELP)
def slurm() -> None:
    """Slurm: the local dev cluster and the slurmrestd client."""


@slurm.command("dev-up", context_settings=HELP)
@_state_dir
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True,
              help="Seconds to wait for every daemon to be ready.")
@click.option("--subnet", envvar="MUXFLOW_SLURM_SUBNET", default=None,
              help="Private IPv4 subnet for the node namespaces (default: the first free of a few).")
@click.option("--bridge", envvar="MUXFLOW_SLURM_BRIDGE", default="mxslurm0", show_default=True,
              help="Name of the host bridge (and prefix of the node namespaces); another one for a second cluster.")
@click.option("--port-base", "port_base", envvar="MUXFLOW_SLURM_PORT_BASE", type=click.IntRange(1024, 65000),
              default=6917, show_default=True, help="slurmctld's port; slurmd uses +1, the JWT slurmrestd +3.")
@click.option("--no-install", is_flag=True, help="Do not apt-get install missing Slurm/munge packages.")
def dev_up(state_dir: str | None, timeout_s: float, subnet: str | None, bridge: str, port_base: int,
           no_install: bool) -> None:
    """Start (or confirm) the dev cluster: munged, slurmctld, 2 slurmd nodes, slurmrestd.

    A second cluster runs beside the first with its own --state-dir, --bridge and --port-base.
    """
    cluster = DevCluster(state_dir, subnet=subnet, bridge=bridge, port_base=port_base, echo=click.echo)
    try:
        st = cluster.up(timeout_s=timeout_s, install=not no_install)
    except (DevClusterError, RuntimeError, OSError) as exc:
        _err(f"error: dev-up failed: {exc}")
        for path in getattr(exc, "logs", []):
            _err(f"--- last lines of {path}:\n{log_tail(path)}")
        _err("the processes that did start are still running: `muxflow slurm dev-down` stops them")
        sys.exit(1)
    print_status(st)
    if not st.ok:
        sys.exit(1)


@slurm.command("dev-down", context_settings=HELP)
@_state_dir
@click.option("--grace", "grace_s", type=float, default=10.0, show_default=True,
              help="Seconds between SIGTERM and SIGKILL.")
def dev_down(state_dir: str | None, grace_s: float) -> None:
    """Stop every dev-cluster process by PID and remove its network."""
    if os.geteuid() != 0:
        _err("error: dev-down needs root")
        sys.exit(1)
    problems = DevCluster(state_dir, echo=click.echo).down(grace_s=grace_s)
    for p in problems:
        _err(f"problem: {p}")
    if problems:
        sys.exit(1)
    click.echo("the dev Slurm cluster is down")


@slurm.command("dev-status", context_settings=HELP)
@_state_dir
def dev_status(state_dir: str | None) -> None:
    """Each process (pid, alive), node states, partitions and REST endpoints; non-zero if anything is down."""
    st = DevCluster(state_dir, echo=click.echo).status()
    print_status(st)
    if not st.ok:
        sys.exit(1)


@slurm.command("token", context_settings=HELP)
@_state_dir
@click.option("--user", default="root", show_default=True)
@click.option("--lifespan", "lifespan_s", type=int, default=3600, show_default=True)
def token(state_dir: str | None, user: str, lifespan_s: int) -> None:
    """Print SLURM_JWT=<token> for the dev cluster's TCP endpoint (needs its JWT key)."""
    cluster = DevCluster(state_dir, echo=click.echo)
    layout = cluster.load_layout()
    if layout is None:
        _err("error: no dev cluster here; run `muxflow slurm dev-up`")
        sys.exit(1)
    click.echo(f"SLURM_JWT={cluster.mint_token(layout, user, lifespan_s)}")


@slurm.command("plan-key", context_settings=HELP)
@click.option("--write", "path", required=True, type=click.Path(dir_okay=False),
              help="The key file to make (or check, where it exists).")
@click.option("--owner", default=None, help="Give it to this account (root only): MuxFlow's on the scheduler host; "
                                            "root's on the nodes (the default: whoever runs this).")
def plan_key(path: str, owner: str | None) -> None:
    """Make the key that signs MuxFlow's plans (32 random bytes, hex, mode 0600): the same key goes to the scheduler
    host (owned by MuxFlow's account) and to every GPU node (owned by root); docs/SECURITY.md. An existing file is
    checked, never replaced."""
    import pwd
    from pathlib import Path

    from executors.slurm.plan import KeyFileError, new_key, read_key, write_key

    uid = gid = None
    if owner is not None:
        try:
            pw = pwd.getpwnam(owner)
        except KeyError:
            raise CliError(f"owner: no account {owner!r}") from None
        uid, gid = pw.pw_uid, pw.pw_gid
        if uid != os.geteuid() and os.geteuid() != 0:
            raise CliError("owner: only root can give the key to another account")
    p = Path(path)
    if p.exists() or p.is_symlink():
        if owner is None or uid == os.geteuid():
            try:
                read_key(p)
            except KeyFileError as exc:
                raise CliError(str(exc)) from exc
        click.echo(f"{p}: exists, left as it is")
        return
    if not p.parent.is_dir():
        raise CliError(f"write: no directory {p.parent}")
    write_key(p, new_key(), uid=uid, gid=gid)
    click.echo(f"{p}: a new plan key (mode 0600{f', owned by {owner}' if owner else ''}); copy it to every GPU "
               "node's @PLAN_KEY@ path, owned by root, mode 0600")


@slurm.command("ping", context_settings=HELP)
@_state_dir
def ping(state_dir: str | None) -> None:
    """Ask slurmrestd who answers: the settings' Slurm (MUXFLOW_SLURM_URL, SLURM_JWT or MUXFLOW_SLURM_JWT_FILE,
    MUXFLOW_SLURM_API_VERSION; docs/CONFIGURATION.md), else the dev cluster's unix socket."""
    from executors.slurm.errors import SlurmError

    conf = slurm_config(state_dir)
    try:
        with conf.client() as client:
            version = client.version()
            pings = client.ping()
    except (SlurmError, ValueError, OSError) as exc:
        _err(f"error: {exc}")
        sys.exit(1)
    click.echo(f"{conf.url}: {version.plugin}, Slurm {version.release}")
    for p in pings:
        click.echo(f"  controller {p.hostname} ({p.mode}): {'UP' if p.up else 'DOWN'}")


# -- the dispatcher (docs/SLURM.md "Offline pick-up", "Dispatcher") -------------------------------


@slurm.command("register-nodes", context_settings=HELP)
@_state_dir
@db_option
def register_nodes(state_dir: str | None, db_url: str | None) -> None:
    """Record Slurm's GPU nodes (gpu:<type>:<n>) as the store's nodes and GPUs."""
    from executors.scheduler.slurm.backend import register_slurm_nodes

    n = register_slurm_nodes(open_store(db_url), slurm_config(state_dir).client())
    click.echo(f"registered {n} new GPU(s)")


@slurm.command("pickup", context_settings=HELP)
@_state_dir
@db_option
def pickup(state_dir: str | None, db_url: str | None) -> None:
    """Import held offline-partition Slurm jobs into the store; reject (and cancel) bad submissions."""
    from executors.scheduler.slurm.pickup import import_submissions

    rep = import_submissions(open_store(db_url), slurm_config(state_dir).client())
    click.echo(f"imported {len(rep.imported)} job(s), rejected {len(rep.rejected)}")
    for sid, reason in rep.rejected:
        click.echo(f"  slurm job {sid}: {printable(reason)}")  # it may quote the user's comment


@slurm.command("dispatch", context_settings=HELP)
@_state_dir
@db_option
@click.option("--round", "round_id", type=int, required=True, help="Scheduling round whose plan to carry out.")
@click.option("--retry-deadline", "retry_deadline_s", type=float, default=None,
              help="Seconds to keep retrying while Slurm does not answer [default: the settings' "
                   "slurm_retry_deadline_s, 60].")
@click.option("--kp", type=float, default=None, help="xCUDA PID gain kp sent with each placement [default: the "
              "settings' xcuda_gains, 1].")
@click.option("--ki", type=float, default=None, help="xCUDA PID gain ki (1/s) [default: the settings', 20].")
@click.option("--kd", type=float, default=None, help="xCUDA PID gain kd (s) [default: the settings', 0].")
@click.option("--name-gpus/--no-name-gpus", default=None, help="Name the planned GPU in each share "
              "(mps:<type>:<pct>) on nodes with one gres Type per GPU; a job placed so moves to no other GPU on "
              "Slurm 22.05 (docs/SLURM.md) [default: the settings' slurm_name_gpus, off].")
def dispatch(state_dir: str | None, db_url: str | None, round_id: int, retry_deadline_s: float | None,
             kp: float | None, ki: float | None, kd: float | None, name_gpus: bool | None) -> None:
    """Carry out a stored round's plan on Slurm (idempotent: re-run after a crash to finish it)."""
    import datetime as dt
    from dataclasses import replace

    from executors.scheduler import round_runner
    from executors.scheduler.slurm.backend import dispatch_status
    from executors.slurm.retry import SlurmUnavailable
    from executors.store import models as m

    conf = slurm_config(state_dir, retry_deadline_s=retry_deadline_s, name_gpus=name_gpus)
    try:
        gains = replace(conf.gains, **{k: v for k, v in dict(kp=kp, ki=ki, kd=kd).items() if v is not None})
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    store = open_store(db_url)
    with store.session() as s:
        rnd = s.get(m.SchedulingRound, round_id)
        if rnd is None:
            raise CliFailure(f"no round {round_id}")
        result = round_runner.stored_result(s, rnd)
    backend = replace(conf, gains=gains).backend()
    try:
        ok, failed = backend.dispatch(store, round_id, result, dt.datetime.now(dt.UTC))
    except SlurmUnavailable as exc:
        _err(f"plan of round {round_id} PENDING: {exc}; run this again when Slurm answers "
             f"({dispatch_status(store, round_id)})")
        sys.exit(75)
    click.echo(f"round {round_id}: {ok} action(s) done, {failed} failed ({dispatch_status(store, round_id)})")
    if failed:
        sys.exit(1)


@slurm.command("submit", context_settings=HELP)
@_state_dir
@db_option
@click.option("--script", "script_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Batch script (must start with #!).")
@click.option("--name", required=True)
@click.option("--job-type", default="", help="A free label for the job (optional); profiling measures the job itself.")
@click.option("--mem", "mem_text", required=True, help="GPU memory, e.g. 4GiB.")
@click.option("--gpu-types", required=True, help="Allowed GPU types, comma-separated.")
@click.option("--checkpoint-dir", required=True)
@click.option("--steps", type=int, required=True)
@click.option("--mps", "mps_pct", type=int, default=30, show_default=True, help="Requested MPS share (1..100).")
@click.option("--priority", type=int, default=0, show_default=True)
def submit(state_dir, db_url, script_path, name, job_type, mem_text, gpu_types, checkpoint_dir, steps, mps_pct,
           priority) -> None:
    """The same as `sbatch -p offline --gres=mps:N --comment="muxflow: …"`, validated first, then picked up."""
    from pathlib import Path

    from executors.scheduler.submission import JobSpec, SubmissionError, parse_size_bytes
    from executors.slurm.scontrol import ScontrolError

    store = open_store(db_url)
    script = Path(script_path)
    try:
        spec = JobSpec(name=name, command=str(script), job_type=job_type, mem_bytes=parse_size_bytes(mem_text),
                       allowed_gpu_types=tuple(t.strip().lower() for t in gpu_types.split(",") if t.strip()),
                       checkpoint_dir=checkpoint_dir, total_steps=steps, priority=priority)
        sid, rep = submit_to_slurm(store, slurm_config(state_dir), spec, script.read_text(),
                                   mps_pct=mps_pct, working_dir=str(script.resolve().parent))
    except SubmissionError as exc:
        raise CliError(str(exc)) from exc
    except ScontrolError as exc:
        raise CliFailure(f"slurm: {exc}") from exc
    if rep is not None and rep.rejected:
        raise CliError(f"Slurm job {sid}: {rep.rejected[0][1]}")
    click.echo(f"submitted Slurm job {sid} (held for placement); "
               + (f"imported {len(rep.imported)} job(s)" if rep is not None else "the pick-up sensor imports it"))


def submit_to_slurm(store, conf, spec, script: str, *, mps_pct: int, working_dir: str):
    """Submit ``spec`` held with the caller's own ``sbatch`` (the job is the caller's, and runs as the caller), then
    pick it up with MuxFlow's client where this process has one (``muxflow submit`` and ``muxflow slurm submit``).

    Any job type label goes (or none): on a real cluster profiling measures the job itself. Returns the Slurm job
    id and the pick-up's report (None when this process cannot read Slurm as MuxFlow: the pick-up sensor imports
    the job). :class:`CliError` when the caller is MuxFlow's own Slurm account."""
    import getpass

    from executors.scheduler.slurm.pickup import import_submissions, submit_held
    from executors.slurm.errors import SlurmError
    from executors.slurm.scontrol import SbatchAsCaller

    account = service_account(conf)
    if account is not None and account == getpass.getuser():
        raise CliError(f"submit: this runs sbatch as you, and you are MuxFlow's own Slurm account ({account}): the "
                       "job would run with its rights; submit it as the user who owns it (docs/SECURITY.md)")
    sid, _ = submit_held(store, None, spec, script, mps_pct=mps_pct, working_dir=working_dir, environment={},
                         known_job_types=None, sbatch=SbatchAsCaller(conf.conf_path))
    try:
        with conf.client() as client:
            return sid, import_submissions(store, client, None, only=[sid])
    except (SlurmError, OSError, ValueError) as exc:
        log.info("Slurm job %s: not picked up from here (%s); the pick-up sensor imports it", sid, exc)
        return sid, None


def service_account(conf) -> str | None:
    """The Slurm account MuxFlow acts as (its settings' user, else its token's), where this process can tell."""
    from executors.slurm.jwt import unverified_claims

    if conf.user:
        return conf.user
    try:
        token = conf.rest_settings().current_token() if conf.url and not conf.socket else None
        return str(unverified_claims(token).get("sun") or "") or None if token else None
    except (OSError, ValueError):
        return None
