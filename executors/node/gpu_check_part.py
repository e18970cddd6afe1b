"""The file each part of the GPU check writes (``muxflow.gpu-check.part/1``), shared by the parts and the summary.

A part rewrites its ``DIR/<part>.json`` atomically whenever it measured something, so a part killed at its deadline
still leaves what it had. Every part's file starts from :func:`part_document`; the summary
(:mod:`executors.dev.gpu_check`) reads them back by :data:`PART_FORMAT`. Node-side: no database libraries.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

PART_FORMAT = "muxflow.gpu-check.part/1"


def now_iso() -> str:
    """Now, UTC, to the second (the parts' ``started``/``ended`` and the summary's dates)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def part_document(part: str, method: str, *, gpu: dict[str, Any] | None = None,
                  results: dict[str, Any] | None = None, why_incomplete: str | None = "running",
                  **extra: Any) -> dict[str, Any]:
    """A part's file as it starts: not complete, no errors yet; ``results`` filled as the part measures."""
    return {"format": PART_FORMAT, "part": part, "method": method, "gpu": gpu, "started": now_iso(), "ended": None,
            "complete": False, "why_incomplete": why_incomplete, **extra, "results": dict(results or {}),
            "errors": []}
