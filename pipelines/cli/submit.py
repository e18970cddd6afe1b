"""``muxflow submit``: an offline job (or a trace of them), on the simulated cluster or through Slurm."""

from __future__ import annotations

from pathlib import Path

import click

from executors.scheduler.profiling.runs import command_script
from executors.store import repo
from pipelines.cli.common import CliError, CliFailure, cluster_backend, guard, settings, store_of


@click.command()
@click.option("--name", help="Job name.")
@click.option("--command", "command_", help="Command the job runs (on Slurm: in the current directory).")
@click.option("--script", "script_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Slurm only: batch script to submit instead of --command (must start with #!).")
@click.option("--job-type", help="Workload type: on the simulated cluster one it models, e.g. 'ResNet-50 (batch "
              "size 64)'; on Slurm a free label (optional).")
@click.option("--mem", "mem_text", help="GPU memory the job needs, e.g. 4GiB.")
@click.option("--gpu-types", help="Allowed GPU types, comma-separated.")
@click.option("--checkpoint-dir", help="Absolute directory for checkpoints.")
@click.option("--steps", type=int, help="Total training steps.")
@click.option("--priority", type=int, default=0, show_default=True)
@click.option("--mps", "mps_pct", type=int, default=None,
              help="Slurm only: the MPS share asked for (--gres=mps:N, 1..100; default 30).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Submit every job of a Philly-format trace instead (simulated cluster).")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="With --trace: at most this many jobs.")
@click.pass_context
@guard
def submit(ctx, name, command_, script_path, job_type, mem_text, gpu_types, checkpoint_dir, steps, priority, mps_pct,
           trace_path, limit) -> None:
    """Submit an offline job (or a whole trace). All or nothing.

    On a Slurm cluster (settings: cluster "slurm", see pipelines/settings.py) the job goes
    through Slurm as `muxflow slurm submit` sends it: your own `sbatch` submits it held to the
    offline partition with its spec in the comment (the job is yours and runs as you), then it
    is picked up into the store. There the job type is an optional free label. A job needing
    more memory than every allowed GPU type has is refused.
    """
    from executors.data.calibration import default_catalog
    from executors.scheduler.submission import JobSpec, parse_size_bytes, spec_from_trace
    from executors.scheduler.submission import submit as submit_job
    from executors.simulated.evaluation import load_trace
    from scheduler_core.trace import TraceError

    conf = settings()
    on_slurm = conf.cluster == "slurm"
    if not on_slurm:
        for field, value in [("script", script_path), ("mps", mps_pct)]:
            if value is not None:
                raise CliError(f"{field}: only for a Slurm cluster (settings: cluster 'slurm')")
    catalog = default_catalog()
    known = set(catalog.offline)
    store = store_of(ctx)
    if trace_path is None and limit is not None:
        raise CliError("limit: only with --trace")
    if trace_path is not None:
        if on_slurm:
            raise CliError("trace: trace jobs run on the simulated cluster; on Slurm submit each job's script")
        one_job = [("name", name), ("command", command_), ("job-type", job_type), ("mem", mem_text),
                   ("gpu-types", gpu_types), ("checkpoint-dir", checkpoint_dir), ("steps", steps)]
        given = [f for f, v in one_job if v is not None] + (["priority"] if priority else [])
        if given:
            raise CliError(f"{given[0]}: not with --trace (each trace line is one job, with its own type, steps "
                           "and name; the GPU types are the cluster's)")
        try:
            trace = load_trace(trace_path)
        except FileNotFoundError as exc:
            raise CliError(f"trace: no such file {trace_path}") from exc
        except OSError as exc:
            raise CliError(f"trace: cannot read {trace_path}: {exc.strerror}") from exc
        except TraceError as exc:
            raise CliError(f"{trace_path}: {exc}") from exc
        with store.session() as s:
            types = tuple(sorted(repo.gpu_type_names(s)))
            chosen = [t for t in trace if t.scale_factor == 1][:limit]
            for t in chosen:
                try:
                    submit_job(s, spec_from_trace(t, catalog.offline_workload(t.job_type).mem_bytes, types), known)
                except Exception as exc:
                    raise CliError(f"{trace_path}: trace line {t.line_no}: {exc}") from exc
        click.echo(f"submitted {len(chosen)} jobs from {trace_path} "
                   f"({sum(1 for t in trace if t.scale_factor != 1)} multi-GPU lines skipped)")
        return
    if on_slurm and command_ is not None and script_path is not None:
        raise CliError("command: give --command or --script, not both")
    if on_slurm and job_type is None:
        job_type = ""  # a free, optional label on a real cluster: profiling measures the job
    for field, value in [("name", name), ("command", command_ if script_path is None else str(script_path)),
                         ("job-type", job_type), ("mem", mem_text), ("gpu-types", gpu_types),
                         ("checkpoint-dir", checkpoint_dir), ("steps", steps)]:
        if value is None:
            raise CliError(f"{field}: required (or use --trace)")
    spec = JobSpec(name=name, command=command_ if script_path is None else str(script_path), job_type=job_type,
                   mem_bytes=parse_size_bytes(mem_text),
                   allowed_gpu_types=tuple(t.strip().lower() for t in gpu_types.split(",") if t.strip()),
                   checkpoint_dir=checkpoint_dir, total_steps=steps, priority=priority)
    if not on_slurm:
        with store.session() as s:
            job = submit_job(s, spec, known)
            job_id = job.id
        click.echo(f"submitted job {job_id} ({name})")
        return

    from executors.slurm.scontrol import ScontrolError
    from pipelines.cli.common import slurm_config
    from pipelines.cli.slurm import submit_to_slurm

    if script_path is not None:
        try:
            script = script_path.read_text()
        except OSError as exc:
            raise CliError(f"script: cannot read {script_path}: {exc.strerror}") from exc
        workdir = script_path.resolve().parent
    else:
        script, workdir = command_script(command_), Path.cwd()
    cluster_backend(conf)  # the settings name a usable Slurm
    try:
        sid, rep = submit_to_slurm(store, slurm_config(), spec, script, mps_pct=30 if mps_pct is None else mps_pct,
                                   working_dir=str(workdir))
    except ScontrolError as exc:
        # sbatch refused it, or Slurm does not answer: nothing was submitted
        raise CliFailure(f"slurm: {exc}") from exc
    if rep is None:
        click.echo(f"submitted {name} as Slurm job {sid}, held for placement; MuxFlow's pick-up imports it")
        return
    if rep.rejected:
        raise CliError(f"Slurm job {sid}: {rep.rejected[0][1]}")
    if not rep.imported:
        raise CliError(f"Slurm job {sid} was submitted held but not picked up; `muxflow slurm pickup` imports it")
    click.echo(f"submitted job {rep.imported[0]} ({name}) as Slurm job {sid}, held for placement")
