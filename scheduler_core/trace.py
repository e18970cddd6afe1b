"""Philly-format offline job traces (Gavel's split by virtual cluster).

Tab-separated, 7 columns, no header: job type, command template, steps
argument, needs data dir (0/1), total steps, arrival time (s), scale factor.
A malformed line raises :class:`TraceError` naming its line number.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


# Sanity bounds, far beyond any real job: a row past them is a corrupt line, not a workload (a scale
# factor of 10^10 workers would be expanded into memory; 10^400 steps overflow every duration).
MAX_TOTAL_STEPS = 10**12
MAX_SCALE_FACTOR = 65_536


class TraceError(ValueError):
    def __init__(self, line_no: int, message: str):
        super().__init__(f"trace line {line_no}: {message}")
        self.line_no = line_no


@dataclass(frozen=True)
class TraceJob:
    line_no: int
    job_type: str
    command: str
    steps_arg: str
    needs_data_dir: bool
    total_steps: int
    arrival_s: float
    scale_factor: int


def _short(text: str, n: int = 24) -> str:
    return text if len(text) <= n else f"{text[:n]}… ({len(text)} characters)"


def parse_trace(lines: Iterable[str]) -> list[TraceJob]:
    jobs = []
    for line_no, raw in enumerate(lines, start=1):
        line = raw.rstrip("\n").rstrip("\r")
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != 7:
            raise TraceError(line_no, f"expected 7 tab-separated columns, found {len(cols)}")
        job_type, command, steps_arg, needs_data, steps, arrival, scale = (c.strip() for c in cols)
        if not job_type:
            raise TraceError(line_no, "empty job type")
        if needs_data not in ("0", "1"):
            raise TraceError(line_no, f"needs-data column must be 0 or 1, got {needs_data!r}")
        try:
            total_steps = int(steps)
        except ValueError:
            raise TraceError(line_no, f"total steps is not an integer: {steps!r}") from None
        if not 0 < total_steps <= MAX_TOTAL_STEPS:
            raise TraceError(line_no, f"total steps must be within 1..{MAX_TOTAL_STEPS:.0e}, got {_short(steps)}")
        try:
            arrival_s = float(arrival)
        except ValueError:
            raise TraceError(line_no, f"arrival time is not a number: {arrival!r}") from None
        if not arrival_s >= 0 or arrival_s == float("inf"):
            raise TraceError(line_no, f"arrival time must be a finite number >= 0, got {arrival!r}")
        try:
            scale_factor = int(scale)
        except ValueError:
            raise TraceError(line_no, f"scale factor is not an integer: {scale!r}") from None
        if not 1 <= scale_factor <= MAX_SCALE_FACTOR:
            raise TraceError(line_no, f"scale factor (GPUs) must be within 1..{MAX_SCALE_FACTOR:,}, got {_short(scale)}")
        jobs.append(
            TraceJob(line_no, job_type, command, steps_arg, needs_data == "1", total_steps, arrival_s, scale_factor)
        )
    return jobs
