"""``muxflow jobs``: offline jobs, where they are and, for those that do not run, why (executors.scheduler.job_status);
one job's life (``show``)."""

from __future__ import annotations

import click
import pandas as pd

from executors.store import inventory
from executors.store import jobs as jobstore
from executors.text import printable
from pipelines.cli.common import CliError, cluster_backend, guard, store_of, text_table


@click.group()
def jobs() -> None:
    """Offline jobs."""

@jobs.command("list")
@click.option("--state", "states", multiple=True, help="Only jobs in this state (repeatable).")
@click.pass_context
def jobs_list(ctx, states: tuple[str, ...]) -> None:
    """Offline jobs with state, progress and, for those not running, why.

    On a Slurm cluster (settings: cluster "slurm") held submissions not imported yet are listed too.
    """
    from executors.scheduler.job_status import whereabouts
    from scheduler_core.domain import JobState

    bad = [x for x in states if x.upper() not in JobState.__members__]
    if bad:
        raise CliError(f"state: unknown state(s) {bad} (known: {', '.join(JobState.__members__)})")
    store = store_of(ctx)
    with store.session() as s:
        rows_ = inventory.listed_jobs(s, list(states))
        why = whereabouts(s, rows_)
        rows = [(j.id, printable(j.name), printable(j.job_type or "-"), j.state, _progress(j), _checkpoints(j),
                 printable(why[j.id])) for j in rows_]
        known = inventory.imported_slurm_ids(s)
    if not states:
        rows += [("-", printable(name), "-", "HELD", "0.0%", "?", printable(reason))
                 for _sid, name, reason in _held_for_pickup(known)]
    if not rows:
        click.echo("no jobs")
        return
    with pd.option_context("display.max_colwidth", None):
        click.echo(pd.DataFrame(rows, columns=["id", "name", "type", "state", "progress", "checkpoints", "why"])
                   .to_string(index=False, justify="left"))


@jobs.command("show")
@click.argument("job", type=click.IntRange(min=1))
@click.option("--slurm", "by_slurm", is_flag=True, help="JOB is a Slurm job id, not MuxFlow's.")
@click.pass_context
def jobs_show(ctx, job: int, by_slurm: bool) -> None:
    """One offline job's life: where the rounds put it (start, move, new share), its state changes, evictions and
    executions, so that its owner can see why it was moved or restarted."""
    store = store_of(ctx)
    with store.session() as s:
        h = inventory.job_history(s, slurm_job_id=job) if by_slurm else inventory.job_history(s, job_id=job)
        if h is None:
            raise CliError(f"job: no {'Slurm job' if by_slurm else 'job'} {job} in the store "
                           "(muxflow jobs list shows them)")
        click.echo("\n".join(render_history(h)))


def _when(t) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S") if t is not None else "-"


def placement_actions(h: inventory.JobHistory) -> list[tuple[str, object, str, int, int, object]]:
    """Each placement that changed where or how the job runs, in order: (what, round window, node, GPU index,
    share, the placement row); ``what`` is start, move (another GPU) or resize (its GPU, a new share: a restart
    too), as the SQL report ``restarts_per_day`` counts them. Keeps are left out."""
    out, last = [], None
    for p, at, node, index in h.placements:
        if p.action == "keep":
            last = p.gpu_id
            continue
        what = "start" if p.action == "start" else ("resize" if p.gpu_id == last else "move")
        out.append((what, at, node, index, p.sm_pct, p))
        last = p.gpu_id
    return out


def render_history(h: inventory.JobHistory) -> list[str]:
    j = h.job
    acts = placement_actions(h)
    count = {w: sum(1 for a in acts if a[0] == w) for w in ("start", "move", "resize")}
    keeps = sum(1 for p, *_ in h.placements if p.action == "keep")
    wall = sum(e.wall_s for e in h.executions)
    mem = f"{j.mem_bytes / 1024**3:.1f} GiB" if j.mem_bytes else "not known yet"
    lines = [
        f"job {j.id} {j.name!r} (type {j.job_type or '-'}, user {j.run_as_user or '-'}, "
        f"Slurm job {j.slurm_job_id if j.slurm_job_id is not None else '-'})",
        f"  state        {j.state}" + (f": {j.state_reason}" if j.state_reason else ""),
        f"  progress     {_progress(j)}" + (f" of {j.total_steps:,} steps" if j.total_steps else ""),
        f"  checkpoints  {_checkpoints(j)}",
        f"  GPU types    {', '.join(sorted(j.allowed_gpu_types)) or '-'}; memory {mem}",
        "  profiles     " + (", ".join(f"{p.gpu_type} {p.iter_time_s:.4g} s/iteration ({p.source})" for p in h.profiles)
                             or "none yet"),
        f"  by rounds    started {count['start']}x, moved {count['move']}x to another GPU, restarted "
        f"{count['resize']}x at a new share on its GPU, kept {keeps}x; evicted {len(h.evictions)}x",
        f"  on GPUs      {len(h.executions)} execution(s), {wall / 3600:.2f} h, "
        f"{sum(e.steps for e in h.executions):,.0f} steps",
    ]
    lines = [printable(line) for line in lines]  # the name, type, user and reason are the user's words
    if acts:
        lines += ["", "placements (starts, moves and new shares; each but a start restarts it from its checkpoint):"]
        rows = [(_when(at), what, f"{node} GPU {index} (id {p.gpu_id})", f"{pct} %",
                 f"{p.predicted_norm_tput:.2f}", f"{100 * (p.predicted_online_slowdown - 1):+.1f} %")
                for what, at, node, index, pct, p in acts]
        lines += _table(rows, ["round window (UTC)", "action", "GPU", "share", "predicted speed",
                               "predicted service slowdown"])
    if h.evictions:
        lines += ["", "evictions (the node's SysMonitor, protecting the online service):"]
        lines += _table([(_when(e.at_utc), f"{node} GPU {index}", e.health, e.reason)
                         for e, node, index in h.evictions], ["time (UTC)", "GPU", "health", "reason"])
    if h.transitions:
        lines += ["", "state changes:"]
        lines += _table([(_when(t.at_utc), f"{t.from_state} -> {t.to_state}", t.reason or "") for t in h.transitions],
                        ["time (UTC)", "change", "reason"])
    return lines


def _table(rows: list[tuple], columns: list[str]) -> list[str]:
    """Rows under their column names, indented; every cell printable (reasons quote users' programs)."""
    return ["  " + line.rstrip() for line in text_table([list(columns)] + [[printable(c) for c in r] for r in rows])]


@jobs.command("cancel")
@click.argument("job_ids", nargs=-1, required=True, type=click.IntRange(min=1))
@click.option("--reason", default="", help="Said in the job's reason (muxflow jobs list).")
@click.pass_context
@guard
def jobs_cancel(ctx, job_ids: tuple[int, ...], reason: str) -> None:
    """Cancel offline jobs of the simulated cluster (all or none): FAILED, and a running one stops.

    A job that came through Slurm is cancelled with `scancel` (Slurm checks who may); the
    job-state sync then ends it here.
    """
    from executors.simulated.backend import SimulatedBackend

    store = store_of(ctx)
    ids = list(dict.fromkeys(job_ids))
    with store.session() as s:
        slurm = {j: sid for j, (sid, _) in sorted(jobstore.slurm_ids_and_memory(s, ids).items()) if sid is not None}
    if slurm:
        job, sid = next(iter(slurm.items()))
        raise CliError(f"job {job} is Slurm job {sid}: cancel it with `scancel {sid}` (Slurm checks that you may); "
                       "the job-state sync then ends it here")
    why = "cancelled by the user (muxflow jobs cancel)" + (f": {reason.strip()}" if reason.strip() else "")
    before = SimulatedBackend().cancel_jobs(store, ids, why)
    for job_id, state in before.items():
        click.echo(f"cancelled job {job_id} ({state} -> FAILED)")


def _held_for_pickup(known: set[int]) -> list[tuple[int, str, str]]:
    """Slurm submissions the store has not imported yet, when the CLI is configured for Slurm (else none)."""
    from executors.scheduler.job_status import held_for_pickup
    from executors.slurm.errors import SlurmError
    from pipelines.cli.common import settings_flags
    from pipelines.settings import SettingsError, load_settings

    try:
        conf = load_settings(flags=settings_flags())
    except SettingsError:
        return []
    if conf.cluster != "slurm":
        return []
    try:
        client = cluster_backend(conf).client_factory()
        try:
            return held_for_pickup(client, known)
        finally:
            getattr(client, "close", lambda: None)()
    except (CliError, SlurmError) as exc:  # the store's jobs are still worth listing
        click.echo(f"note: cannot list Slurm's held submissions: {exc}", err=True)
        return []


def _progress(j) -> str:
    """Steps done of the total, or of an unknown total."""
    if not j.total_steps:
        return f"{j.steps_done:.0f} steps" if j.steps_done else "?"
    return f"{100 * j.steps_done / j.total_steps:.1f}%"


CHECKPOINTS = {"declared": "on signal (declared)", "detected": "on signal (detected)",
               "none": "no: never moved (declared)", "undetected": "no: never moved (none seen)", None: "?"}


def _checkpoints(j) -> str:
    """Whether the job checkpoints on MuxFlow's signals: a job that does not is never moved."""
    return CHECKPOINTS.get(j.checkpointing, j.checkpointing)
