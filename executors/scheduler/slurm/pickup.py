"""Offline pick-up: plain ``sbatch -p offline --gres=mps:N`` submissions become store jobs.

Slurm is the queue of record (docs/DESIGN.md §3 step 1). ``job_submit.lua`` holds every
offline-partition job at submission, so Slurm's scheduler never starts one;
:func:`import_submissions` reads those held jobs and imports each one exactly
once (``offline_jobs.slurm_job_id`` is unique).

Any script is a job: a submission needs no comment. Its ``--comment`` may carry MuxFlow fields::

    sbatch -p offline --gres=mps:30 \\
      --comment="muxflow: type='ResNet-50 (batch size 64)' mem=4GiB gpu-types=t4,a10 ckpt=/ckpt/r50 steps=10000" job.sh

Fields (``key=value``, values with spaces in single or double quotes), all optional: ``mem`` (GPU memory, e.g.
``4GiB``; else its profiled peak), ``gpu-types`` (comma-separated; else every type of the cluster), ``ckpt``
(absolute checkpoint directory), ``checkpoint`` (``signal`` or ``none``; else detected in its profiling window),
``steps`` (else unknown), ``type`` (a free label: what the predictor sees comes from profiling the job),
``priority`` and ``name`` (default: the Slurm job name). A comment that does not start with ``muxflow:`` is the
user's own and is ignored. The job
must ask for exactly one untyped MPS share of one GPU (``--gres=mps:N``, 1 ≤ N ≤ 100)
and nothing else, on one node, and be requeueable; job arrays and heterogeneous
jobs are refused (``job_submit.lua`` refuses all of these at submission already).
A submission that breaks the contract is recorded as a FAILED job whose reason starts with ``rejected:``
(``muxflow jobs list`` shows it) and is cancelled in Slurm; the reason is put in its comment first.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Collection
from dataclasses import dataclass

from executors.scheduler.submission import JobSpec, SubmissionError, parse_size_bytes, validate
from executors.slurm.errors import SlurmError
from executors.slurm.hostlist import gres_count, parse_gres
from executors.slurm.models import Job
from executors.slurm.spec import BatchJob, JobUpdate
from executors.store import inventory
from executors.store import jobs as jobstore
from executors.store import models as m
from executors.store.inventory import gpu_type_memory
from scheduler_core.domain import JobState

log = logging.getLogger(__name__)

COMMENT_PREFIX = "muxflow:"
REJECTED_PREFIX = "rejected: "
OFFLINE_PARTITION = "offline"
_KNOWN_KEYS = {"type", "mem", "gpu-types", "ckpt", "steps", "priority", "name", "checkpoint"}


@dataclass(frozen=True)
class PickupReport:
    imported: list[int]  # store job ids
    rejected: list[tuple[int, str]]  # (slurm job id, reason)


def _fields(comment: str) -> dict[str, str]:
    """The ``muxflow:`` fields of a comment; {} for a comment that is not MuxFlow's (the user's own words, or none):
    every field is optional."""
    text = comment.strip()
    if not text.startswith(COMMENT_PREFIX):
        return {}
    try:
        words = shlex.split(text[len(COMMENT_PREFIX):])
    except ValueError as exc:
        raise SubmissionError("comment", f"cannot parse: {exc}") from None
    out: dict[str, str] = {}
    for w in words:
        key, sep, value = w.partition("=")
        if not sep:
            raise SubmissionError("comment", f"expected key=value, got {w!r}")
        if key not in _KNOWN_KEYS:
            raise SubmissionError("comment", f"unknown field {key!r} (known: {', '.join(sorted(_KNOWN_KEYS))})")
        if key in out and out[key] != value:
            raise SubmissionError(key, f"given twice with different values ({out[key]!r}, {value!r})")
        out[key] = value
    return out


def submission_comment(spec: JobSpec) -> str:
    """The ``--comment`` that :func:`spec_from_job` reads back as ``spec`` (what ``muxflow submit`` sends)."""
    q = shlex.quote
    words = [f"type={q(spec.job_type)}"] if spec.job_type else []
    if spec.mem_bytes is not None:
        words.append(f"mem={spec.mem_bytes}")
    words.append(f"gpu-types={','.join(spec.allowed_gpu_types)}")
    if spec.checkpoint_dir:
        words.append(f"ckpt={q(spec.checkpoint_dir)}")
    if spec.checkpointing is not None:
        words.append(f"checkpoint={'signal' if spec.checkpointing == 'declared' else 'none'}")
    if spec.total_steps is not None:
        words.append(f"steps={spec.total_steps}")
    words += [f"priority={spec.priority}", f"name={q(spec.name)}"]
    return f"{COMMENT_PREFIX} " + " ".join(words)


def _check_shape(job: Job) -> None:
    """One job on one node that can be requeued: MuxFlow gives each job its own share of one
    GPU, so arrays, heterogeneous jobs and multi-node jobs are refused (each would run several
    processes on one planned share, or on nodes the plan never saw), and it evicts and
    migrates by requeue, which Slurm refuses for a job that may not be requeued."""
    if job.array_job_id:
        raise SubmissionError("array", f"job arrays are not supported (array {job.array_job_id}, tasks "
                              f"{job.array_tasks or '?'}): MuxFlow plans each job's own GPU share; submit "
                              "each task as its own sbatch job")
    if job.het_job_id:
        raise SubmissionError("hetjob", f"heterogeneous jobs are not supported (het job {job.het_job_id}): "
                              "submit each component as its own sbatch job")
    if job.node_count is not None and job.node_count > 1:
        raise SubmissionError("nodes", f"asks for {job.node_count} nodes; MuxFlow places a job on one GPU of "
                              "one node (-N 1)")
    if not job.requeue:
        raise SubmissionError("requeue", "cannot be requeued (--no-requeue, or the site's JobRequeue=0 without "
                              "--requeue): MuxFlow evicts and migrates jobs by checkpoint and requeue")


def spec_from_job(job: Job, cluster_gpu_types: Collection[str] = ()) -> JobSpec:
    """The submission's spec; :class:`SubmissionError` for malformed or contradictory options.

    Every comment field is optional: ``sbatch -p offline --gres=mps:30 train.sbatch`` alone is a job. Defaults: GPU
    memory from its profile (the measured peak), any GPU type of the cluster (``cluster_gpu_types``), unknown steps,
    no checkpoint directory, and whether it checkpoints on MuxFlow's signals detected in its profiling window
    (``checkpoint=signal`` or ``ckpt=<dir>`` declares that it does; ``checkpoint=none`` that it does not)."""
    _check_shape(job)
    f = _fields(job.comment or "")
    for key in ("mem", "gpu-types", "ckpt", "steps", "type", "name", "priority", "checkpoint"):
        if key in f and not f[key].strip() and key not in ("type", "ckpt"):
            raise SubmissionError(key, "given without a value")
    gres = (job.gres_per_node or "").strip()
    try:
        mps = gres_count(gres, "mps") if gres else 0
    except ValueError as exc:
        raise SubmissionError("gres", str(exc)) from None
    if not gres or mps <= 0:
        raise SubmissionError("gres", f"ask for an MPS share of one GPU with --gres=mps:<1..100>, got {gres!r}")
    others = [g for g in gres.replace("gres/", "").replace("gres:", "").split(",") if not g.startswith("mps")]
    if others:
        raise SubmissionError("gres", f"--gres=mps:N contradicts {','.join(others)}: MuxFlow places the job "
                              "on one shared GPU")
    if mps > 100:
        raise SubmissionError("gres", f"mps:{mps} is more than one GPU (at most mps:100)")
    typed = sorted({g.type for g in parse_gres(gres) if g.name == "mps" and g.type})
    if typed:
        raise SubmissionError("gres", f"ask for an untyped share --gres=mps:{mps}, not one of Type {typed[0]}: "
                              "MuxFlow chooses the GPU (Slurm cannot move a typed share to another GPU)")
    try:
        steps = int(f["steps"]) if "steps" in f else None
    except ValueError as exc:
        raise SubmissionError("steps", f"not an integer: {exc}") from None
    try:
        priority = int(f.get("priority", "0"))
    except ValueError as exc:
        raise SubmissionError("priority", f"not an integer: {exc}") from None
    declared = {"signal": "declared", "none": "none"}
    if "checkpoint" in f and f["checkpoint"] not in declared:
        raise SubmissionError("checkpoint", f"expected signal or none, got {f['checkpoint']!r}")
    checkpointing = declared.get(f.get("checkpoint", ""), "declared" if f.get("ckpt") else None)
    types = (tuple(t.strip().lower() for t in f["gpu-types"].split(",") if t.strip()) if "gpu-types" in f
             else tuple(sorted(cluster_gpu_types)))
    return JobSpec(
        name=f.get("name") or job.name or f"slurm-{job.job_id}",
        command=f"sbatch job {job.job_id} ({job.name}) in {job.working_dir or '?'}",
        job_type=f.get("type", ""), mem_bytes=parse_size_bytes(f["mem"]) if "mem" in f else None,
        allowed_gpu_types=types, checkpoint_dir=f.get("ckpt", ""), total_steps=steps, priority=priority,
        checkpointing=checkpointing,
    )


def is_candidate(job: Job) -> bool:
    """A held job of the offline partition (the job_submit.lua hold, or ``--hold``)."""
    return OFFLINE_PARTITION in job.partition.split(",") and job.held


def import_submissions(store, client, known_job_types: set[str] | None = None, *,
                       only: Collection[int] | None = None) -> PickupReport:
    """Import held offline-partition jobs not yet in the store; reject and cancel bad ones. Idempotent.

    ``known_job_types``: None on a real cluster (a job type is a free label); a set only
    restricts labels to what a simulation models. ``only`` restricts the pick-up to these
    Slurm job ids: a benchmark or a test that shares a cluster with other users must not
    import (or reject and cancel) theirs.
    """
    wanted = None if only is None else {int(i) for i in only}
    jobs = [j for j in client.list_jobs() if is_candidate(j) and (wanted is None or j.job_id in wanted)]
    with store.session() as s:
        seen = inventory.imported_slurm_ids(s)
        gpu_types = gpu_type_memory(s)
    imported: list[int] = []
    rejected: list[tuple[int, str]] = []
    cancelled: set[int] = set()  # Slurm ids cancelled in this pass (a heterogeneous job's leader takes all)
    for job in sorted(jobs, key=lambda j: j.job_id):
        if job.job_id in seen:
            continue
        try:
            spec = spec_from_job(job, gpu_types)
            validate(spec, gpu_types, known_job_types)
        except SubmissionError as exc:
            reason = f"{REJECTED_PREFIX}{exc}"
            if _insert_once(store, m.OfflineJob(
                    name=(job.name or f"slurm-{job.job_id}")[:128], job_type="(rejected)",
                    command=f"sbatch job {job.job_id}", mem_bytes=1, allowed_gpu_types=[], checkpoint_dir="",
                    total_steps=1, state=JobState.FAILED.value, state_reason=reason, slurm_job_id=job.job_id,
                    run_as_user=job.user_name or None)) is None:
                continue
            _cancel_rejected(client, job, reason, cancelled)
            rejected.append((job.job_id, reason))
            log.warning("slurm job %s rejected: %s", job.job_id, exc)
            continue
        row_id = _insert_once(store, m.OfflineJob(
            name=spec.name, job_type=spec.job_type, command=spec.command, mem_bytes=spec.mem_bytes,
            allowed_gpu_types=sorted(set(spec.allowed_gpu_types)), checkpoint_dir=spec.checkpoint_dir,
            priority=spec.priority, total_steps=spec.total_steps, slurm_job_id=job.job_id,
            checkpointing=spec.checkpointing,
            # Slurm runs the job as its submitter: MPS lets it share only a GPU of that user (scheduler_core.jobs.run_as).
            run_as_user=job.user_name or None,
            state_reason=f"imported from Slurm job {job.job_id}",
        ))
        if row_id is None:
            continue
        imported.append(row_id)
        log.info("imported slurm job %s as store job %s", job.job_id, row_id)
    # A crash between the store insert and the cancel leaves a rejected job pending in Slurm: finish it.
    with store.session() as s:
        stale = {j.job_id for j in jobs} & jobstore.rejected_slurm_ids(s, REJECTED_PREFIX)
        reasons = {j.slurm_job_id: j.state_reason for j in jobstore.jobs_of_slurm_ids(s, stale)} if stale else {}
    by_id = {j.job_id: j for j in jobs}
    for sid in sorted(stale - {r[0] for r in rejected}):
        _cancel_rejected(client, by_id[sid], reasons.get(sid) or "rejected", cancelled)
    return PickupReport(imported, rejected)


def _insert_once(store, row: m.OfflineJob) -> int | None:
    """Store the job's row; None when another pick-up (the sensor, ``muxflow submit``) stored it meanwhile."""
    row_id = jobstore.add_imported(store, row)
    if row_id is None:
        log.info("slurm job %s: imported meanwhile by another pick-up", row.slurm_job_id)
    return row_id


def submit_held(store, client, spec: JobSpec, script: str, *, mps_pct: int, working_dir: str,
                environment: dict[str, str], known_job_types: set[str] | None,
                sbatch=None) -> tuple[int, PickupReport | None]:
    """``muxflow submit`` on Slurm: what ``sbatch -p offline --gres=mps:N --comment="muxflow: …"`` does.

    The spec is validated first (nothing is sent when it is bad: :class:`SubmissionError`),
    then the script is submitted held with the spec in its comment and, with a ``client`` to read Slurm, picked
    up at once, like any other submission. ``sbatch`` (:class:`executors.slurm.scontrol.SbatchAsCaller`) submits it
    as the caller, with the caller's environment: the job is the caller's, never MuxFlow's; without one the client
    submits it (MuxFlow's own jobs: benchmarks, tests). A failure after the submission loses nothing: the job waits
    held in Slurm and the next pick-up imports it.
    """
    with store.session() as s:
        validate(spec, gpu_type_memory(s), known_job_types)
    if not 1 <= mps_pct <= 100:
        raise SubmissionError("mps", f"must be within 1..100, got {mps_pct}")
    if not script.startswith("#!"):
        raise SubmissionError("script", "must start with an interpreter line such as #!/bin/sh")
    job = BatchJob(name=spec.name, script=script, partition=OFFLINE_PARTITION, hold=True,
                       gres_per_node=f"mps:{mps_pct}", comment=submission_comment(spec), working_dir=working_dir,
                       environment=environment)
    sid = int(sbatch(job)) if sbatch is not None else client.submit(job).job_id
    return sid, (import_submissions(store, client, known_job_types, only=[sid]) if client is not None else None)


def _cancel_rejected(client, job: Job, reason: str, cancelled: set[int]) -> None:
    """Put the reason in the job's comment, then cancel it in Slurm.

    A heterogeneous job is cancelled through its leader (Slurm refuses to cancel one
    component), an array through its id (all its tasks). A cancel Slurm refuses is
    logged, not raised: the job is recorded as rejected, so the next pick-up tries
    the cancel again, and the other submissions of this pass are still imported.
    """
    target = job.het_job_id or job.job_id
    if target in cancelled:
        return
    try:
        client.update_job(job.job_id, JobUpdate(comment=f"muxflow {reason}"[:250]))
    except Exception as exc:  # the cancel matters more than the comment
        log.warning("slurm job %s: could not record the rejection in its comment: %s", job.job_id, exc)
    try:
        client.cancel(target)
    except SlurmError as exc:
        log.warning("slurm job %s: rejected, but cancelling %s failed (the next pick-up tries again): %s",
                    job.job_id, target, exc)
        return
    cancelled.add(target)
