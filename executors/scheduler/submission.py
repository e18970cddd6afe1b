"""Offline job submission: validation at the edge, then one transactional insert.

A job's type is a label. On the simulated cluster it names the catalog workload the
simulator models (``known_job_types``); on a real cluster it is free and optional (``""``:
none): what the predictor sees comes from profiling the job itself (docs/PROFILING.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from executors.slurm import plan as plans
from executors.store import models as m
from executors.store.db import Session
from executors.store.inventory import gpu_type_memory
from scheduler_core.trace import MAX_TOTAL_STEPS, TraceJob

MIN_MEM_BYTES = plans.MIN_MEM_BYTES  # the least memory need a job may declare (and a placement carry)
MAX_PATH_CHARS = 1024  # a checkpoint directory's path (Linux's PATH_MAX is 4096; no real one is that long)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "KIB": 1024, "M": 1e6, "MB": 1e6, "MIB": 1024**2,
          "G": 1e9, "GB": 1e9, "GIB": 1024**3, "T": 1e12, "TB": 1e12, "TIB": 1024**4}


class SubmissionError(ValueError):
    """A submission that cannot be accepted; ``field`` names what is wrong."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def format_bytes(n: float) -> str:
    """``17179869184`` → ``16 GiB``: sizes in messages, in the units users write."""
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            v = n / size
            return f"{v:,.0f} {unit}" if v >= 100 else f"{v:.3g} {unit}"
    return f"{int(n)} B"


def parse_size_bytes(text: str, field: str = "mem") -> int:
    match = _SIZE.match(str(text))
    if not match:
        raise SubmissionError(field, f"not a size: {text!r} (examples: 4GiB, 512MiB, 2000000000)")
    value = float(match.group(1)) * _UNITS[(match.group(2) or "").upper()]
    if value <= 0:
        raise SubmissionError(field, f"must be positive, got {text!r}")
    return int(value)


@dataclass(frozen=True)
class JobSpec:
    name: str
    command: str
    job_type: str
    mem_bytes: int | None          # None: not declared (a plain sbatch): the profile's measured peak decides
    allowed_gpu_types: tuple[str, ...]
    checkpoint_dir: str            # "": none declared
    total_steps: int | None        # None: unknown (the planner works without the remaining time)
    priority: int = 0
    gpus: int = 1
    checkpointing: str | None = None  # 'declared' | 'none' (the comment's word); None: detected when profiled


def validate(spec: JobSpec, known_gpu_types: Mapping[str, int], known_job_types: set[str] | None) -> None:
    """Refuse a spec that cannot run, naming the field. ``known_gpu_types``: GPU type → memory of one GPU;
    ``known_job_types``: the labels a simulated cluster models, None where any label (or none) goes."""
    if not spec.name.strip():
        raise SubmissionError("name", "must not be empty")
    if len(spec.name) > 128:
        raise SubmissionError("name", "at most 128 characters")
    if not spec.command.strip():
        raise SubmissionError("command", "must not be empty")
    if len(spec.job_type) > 64:
        raise SubmissionError("job_type", "at most 64 characters")
    if known_job_types is not None and spec.job_type not in known_job_types:
        raise SubmissionError(
            "job_type", f"unknown job type {spec.job_type!r} (the simulated cluster models: "
            f"{', '.join(sorted(known_job_types))})"
        )
    if spec.mem_bytes is not None and spec.mem_bytes < MIN_MEM_BYTES:
        # A need below any real model's (a CUDA context alone takes more) would be planned as fitting anywhere, and
        # its quota would round to the node's "no limit".
        raise SubmissionError("mem", f"{format_bytes(spec.mem_bytes)} is below {format_bytes(MIN_MEM_BYTES)}, the "
                              "least a GPU job is planned with (mem= takes 64MiB up to the largest allowed GPU's "
                              "memory)")
    if not spec.allowed_gpu_types:
        raise SubmissionError("gpu_types", "name at least one GPU type")
    unknown = sorted(set(spec.allowed_gpu_types) - set(known_gpu_types))
    if unknown:
        raise SubmissionError(
            "gpu_types",
            f"unknown GPU type(s) {', '.join(unknown)} (cluster has: {', '.join(sorted(known_gpu_types)) or 'none'})"
        )
    allowed = sorted(set(spec.allowed_gpu_types))
    if spec.mem_bytes is not None and spec.mem_bytes > max(known_gpu_types[t] for t in allowed):
        # No GPU it may run on has that much memory: it would wait forever.
        raise SubmissionError("mem", f"{format_bytes(spec.mem_bytes)} is more than any allowed GPU type has ("
                              + ", ".join(f"{t} {format_bytes(known_gpu_types[t])}" for t in allowed) + ")")
    if len(spec.checkpoint_dir) > MAX_PATH_CHARS:
        raise SubmissionError("checkpoint_dir", f"at most {MAX_PATH_CHARS} characters")
    if any(c in spec.checkpoint_dir for c in "\0\n\r"):
        raise SubmissionError("checkpoint_dir", "must not hold a NUL or a line break")
    if spec.checkpoint_dir and not spec.checkpoint_dir.startswith("/"):
        raise SubmissionError("checkpoint_dir", f"must be an absolute path, got {spec.checkpoint_dir!r}")
    if spec.checkpointing not in (None, "declared", "none"):
        raise SubmissionError("checkpoint", f"expected signal or none, got {spec.checkpointing!r}")
    if spec.total_steps is not None and not 0 < spec.total_steps <= MAX_TOTAL_STEPS:
        raise SubmissionError("steps", f"must be within 1..{MAX_TOTAL_STEPS:.0e}")
    if spec.gpus != 1:
        raise SubmissionError(
            "gpus", "MuxFlow shares one offline job per GPU; multi-GPU offline jobs are not supported (paper §8)"
        )
    if not -1000 <= spec.priority <= 1000:
        raise SubmissionError("priority", "must be within -1000..1000")


def submit(s: Session, spec: JobSpec, known_job_types: set[str] | None) -> m.OfflineJob:
    validate(spec, gpu_type_memory(s), known_job_types)
    job = m.OfflineJob(
        name=spec.name, job_type=spec.job_type, command=spec.command, mem_bytes=spec.mem_bytes,
        allowed_gpu_types=sorted(set(spec.allowed_gpu_types)), checkpoint_dir=spec.checkpoint_dir,
        priority=spec.priority, total_steps=spec.total_steps, checkpointing=spec.checkpointing,
    )
    s.add(job)
    s.flush()
    return job


def spec_from_trace(t: TraceJob, mem_bytes: int, gpu_types: tuple[str, ...], root: str = "/data") -> JobSpec:
    return JobSpec(
        name=f"philly-l{t.line_no}-{t.job_type.split(' (')[0].lower()}",
        command=t.command.replace("%s", root) + f" {t.steps_arg} {t.total_steps}",
        job_type=t.job_type, mem_bytes=mem_bytes, allowed_gpu_types=gpu_types,
        checkpoint_dir=f"/checkpoints/philly-l{t.line_no}", total_steps=t.total_steps, gpus=t.scale_factor,
    )
