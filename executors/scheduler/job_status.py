"""Where is my job: why each offline job is where it is, from the store (``muxflow jobs list``).

A job that does not run is, in its life's order (docs/DESIGN.md §3):

- waiting for profiling (SUBMITTED), or profiling: which runs, on which GPU type, since when;
- failed profiling, or rejected at submission (FAILED, with the reason);
- waiting for the next round (on a real cluster: for a GPU to free up — a fill — or the next round):
  it became PENDING after the latest plan (the latest round, or a fill after it) was made;
- not placed by the latest plan, and why: no feasible GPU and which constraint, or lost in
  the matching to other jobs (the plan's ``stats["unplaced"]``, :mod:`scheduler_core.jobs.unplaced`);
- planned but not yet on the cluster (the dispatch's state), or placed and waiting for the
  cluster to start it (PLACED).

Slurm submissions not imported yet (held for pick-up) are not in the store; the CLI lists
them from Slurm (:func:`held_for_pickup`).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from executors.scheduler.slurm.pickup import is_candidate
from executors.store import dispatch as dispatch_log
from executors.store import inventory
from executors.store import jobs as jobstore
from executors.store import models as m
from executors.store import profiling as profstore
from executors.store import rounds as rounds_db
from executors.store.db import Session
from scheduler_core.domain import JobState
from scheduler_core.jobs import unplaced as u

NO_FEASIBLE = "no feasible GPU: "
REASON_TEXT = {
    u.NO_GPU_OF_ALLOWED_TYPE: NO_FEASIBLE + "no GPU of an allowed type in the round",
    u.NO_PREDICTOR: NO_FEASIBLE + "no speed predictor for its GPU types",
    u.NO_PROFILE: NO_FEASIBLE + "no profile on its GPU types",
    u.GPU_NOT_HEALTHY: NO_FEASIBLE + "GPU not Healthy",
    u.RUN_AS_USER: NO_FEASIBLE + "every candidate GPU's online replica runs as another user",
    u.MEMORY: NO_FEASIBLE + "memory above every candidate GPU's free memory quota",
    u.OUT_OF_PREDICTOR_RANGE: NO_FEASIBLE + "outside the speed predictor's range",
    u.SLOWDOWN: NO_FEASIBLE + "predicted online slowdown over the allowance",
    u.NO_THROUGHPUT: NO_FEASIBLE + "no predicted throughput",
    u.ONE_USER_PER_GPU: "waiting: its GPU went to another user's jobs (MPS serves one user per GPU)",
    u.NOT_MATCHED: "lost in the matching to other jobs",
    u.DEFERRED_SRPT: "waiting: the cluster is full and jobs with less work left go first",
}


def _t(at: dt.datetime | None) -> str:
    if at is None:
        return "?"
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


def whereabouts(s: Session, jobs: list[m.OfflineJob]) -> dict[int, str]:
    """One line per job: where it is and, when it does not run, why."""
    ids = [j.id for j in jobs]
    if not ids:
        return {}
    since = jobstore.last_transition_utc(s, ids)
    runs: dict[int, list[m.ProfilingRun]] = defaultdict(list)
    for r in profstore.open_profiling_runs(s, ids):
        runs[r.job_id].append(r)
    latest = rounds_db.latest_round(s)
    if latest is not None:  # the newest plan: the latest round, or the latest fill after it
        latest = ([latest] + rounds_db.fills_of_window(s, latest.window_start_utc))[-1]
    in_round, why_left, planned, dispatch = set(), {}, {}, {}
    if latest is not None:
        in_round = {d["job_id"] for d in (latest.snapshot or {}).get("jobs", [])}
        for reason, detail, job_ids in u.groups((latest.stats or {}).get("unplaced")):
            for job_id in job_ids:
                why_left[job_id] = (reason, detail)
        planned = {p.job_id: p for p in rounds_db.round_placements(s, latest.id)}
        dispatch = {d.job_id: d for d in dispatch_log.round_log(s, latest.id)}
    where = {}
    gpu_ids = {p.gpu_id for p in planned.values()}
    placed_jobs = [j.id for j in jobs if j.state in (JobState.PLACED.value, JobState.RUNNING.value)]
    # the latest placement of each running or placed job
    placed_now = rounds_db.latest_placements(s, placed_jobs) if placed_jobs else {}
    gpu_ids |= {p.gpu_id for p in placed_now.values()}
    if gpu_ids:
        where = {g.id: f"{g.node.name} GPU {g.gpu_index}" for g in inventory.gpus_by_id(s, gpu_ids)}
    out = {}
    for j in jobs:
        state = j.state
        if state == JobState.SUBMITTED.value:
            out[j.id] = f"waiting for profiling (submitted {_t(j.submitted_utc)})"
        elif state == JobState.PROFILING.value:
            out[j.id] = _profiling(runs.get(j.id, []), since.get(j.id))
        elif state in (JobState.PENDING.value, JobState.EVICTED.value):
            out[j.id] = _waiting(j, since.get(j.id), latest, in_round, why_left, planned, dispatch, where)
        elif state == JobState.PLACED.value and j.id in placed_now:
            p = placed_now[j.id]
            out[j.id] = (f"placed by {plan_name(s.get(m.SchedulingRound, p.round_id))} on "
                         f"{where.get(p.gpu_id, f'GPU {p.gpu_id}')} at {p.sm_pct} %: "
                         "waiting for the cluster to start it")
        elif state == JobState.RUNNING.value and j.id in placed_now:
            p = placed_now[j.id]
            out[j.id] = f"running on {where.get(p.gpu_id, f'GPU {p.gpu_id}')} at {p.sm_pct} %"
        else:  # FAILED (profiling, rejected), DONE, MIGRATING: the state's own reason says it
            out[j.id] = j.state_reason or ""
    return out


def _profiling(runs: list[m.ProfilingRun], since: dt.datetime | None) -> str:
    if not runs:
        return f"profiling: no run started yet (profiling since {_t(since)})"
    parts = []
    for r in runs:
        if r.state == "running":
            parts.append(f"on {r.gpu_type} since {_t(r.started_utc)}" + (f" on {r.node}" if r.node else "")
                         + (f" (Slurm job {r.slurm_job_id})" if r.slurm_job_id else ""))
        else:
            parts.append(f"on {r.gpu_type} queued since {_t(r.submitted_utc)}"
                         + (f" (Slurm job {r.slurm_job_id})" if r.slurm_job_id else ""))
    return "profiling: " + "; ".join(parts)


def plan_name(rnd: m.SchedulingRound) -> str:
    """``round 7``, or ``round 7's fill 2`` for a fill (placements between rounds)."""
    if not rnd.seq:
        return f"round {rnd.id}"
    return f"round {(rnd.snapshot or {}).get('fill_of_round', '?')}'s fill {rnd.seq}"


def _waiting(j: m.OfflineJob, since: dt.datetime | None, latest, in_round: set[int], why_left: dict,
             planned: dict, dispatch: dict, where: dict) -> str:
    waiting = f"since {_t(since)}" if since is not None else f"submitted {_t(j.submitted_utc)}"
    if latest is None:
        return f"waiting for the first round ({waiting})"
    name = plan_name(latest)
    # On a real cluster a fill starts waiting jobs as soon as a GPU frees up; the simulated one books whole windows.
    nxt = "the next round" if latest.simulated else "a GPU to free up or the next round"
    if j.id not in in_round or (since is not None and since > latest.started_utc):
        return (f"waiting for {nxt} ({j.state.lower()} {waiting}, after {name} was planned at "
                f"{_t(latest.started_utc)})")
    if j.id in why_left:
        reason, detail = why_left[j.id]
        return f"{name}: {REASON_TEXT.get(reason, reason)} ({detail})"
    if j.id in planned:
        p = planned[j.id]
        d = dispatch.get(j.id)
        state = "not sent yet" if d is None else d.status + (f": {d.error}" if d.error else "")
        return (f"planned by {name} on {where.get(p.gpu_id, f'GPU {p.gpu_id}')} at {p.sm_pct} %; "
                f"dispatch {state}")
    return f"waiting for {nxt} ({name} left it out)"


def held_for_pickup(client, known_slurm_ids: set[int]) -> list[tuple[int, str, str]]:
    """Slurm's held offline-partition submissions not in the store yet: (Slurm job id, name, why)."""
    return [(j.job_id, j.name, f"held for pick-up: Slurm job {j.job_id}, submitted {_t(j.submit_time_utc)}, not "
                               "imported yet (the pick-up sensor or `muxflow slurm pickup` imports it)")
            for j in sorted(client.list_jobs(), key=lambda j: j.job_id)
            if is_candidate(j) and j.job_id not in known_slurm_ids]
