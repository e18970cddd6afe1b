"""Read-outs of profiling and sampling runs for the CLI and the Dagster metadata."""

from __future__ import annotations

import datetime as dt

from executors.store import models as m
from executors.store import profiling as profstore
from executors.store.db import Session


def _seconds(a: dt.datetime | None, b: dt.datetime | None) -> float | None:
    return (b - a).total_seconds() if a is not None and b is not None else None


def recent_profiling_runs(s: Session, since_utc: dt.datetime | None = None, limit: int = 200) -> list[dict]:
    out = []
    for r in profstore.recent_runs(s, m.ProfilingRun, since_utc, limit):
        rep = r.report or {}
        out.append({"run": r.id, "what": f"job {r.job_id}", "gpu_type": r.gpu_type, "state": r.state,
                    "slurm_job": r.slurm_job_id, "node": r.node,
                    "seconds": rep.get("elapsed_s") or _seconds(r.started_utc, r.finished_utc),
                    "reason": r.reason or ""})
    return out


def recent_sampling_runs(s: Session, since_utc: dt.datetime | None = None, limit: int = 200) -> list[dict]:
    out = []
    for r in profstore.recent_runs(s, m.SamplingRun, since_utc, limit):
        out.append({"run": r.id, "what": f"{r.service_name} @ {r.qps:g} QPS + {r.job_type} at "
                                         f"{','.join(str(p) for p in r.sm_pcts)} %",
                    "gpu_type": r.gpu_type, "state": r.state, "slurm_job": r.slurm_job_id, "node": r.node,
                    "method": r.method, "samples": r.samples, "seconds": r.used_gpu_s, "reason": r.reason or ""})
    return out


def profile_methods(s: Session) -> dict[str, int]:
    """Stored profiles per ``method/source``."""
    return {f"{meth}/{src}": n for (meth, src), n in profstore.profile_counts(s).items()}


def runs_markdown(runs: list[dict], title: str) -> str:
    if not runs:
        return f"{title}: none."
    cols = [c for c in ("run", "what", "gpu_type", "state", "method", "samples", "slurm_job", "node", "seconds",
                        "reason") if any(c in r for r in runs)]
    lines = [f"{title}\n", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in runs:
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append(f"{v:.1f}" if isinstance(v, float) else ("" if v is None else str(v).replace("|", "/")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
