"""The machine a benchmark ran on, as docs/BENCHMARKS.md states it, and the process's peak memory."""

from __future__ import annotations

import os
import platform
import resource


def describe() -> str:
    """``x86_64, 2 cores, CPU only`` (no GPU is used by the benchmarks that say so)."""
    return f"{platform.machine()}, {os.cpu_count()} cores, CPU only"


def rss_peak_mb() -> float:
    """Peak resident memory of this process so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
