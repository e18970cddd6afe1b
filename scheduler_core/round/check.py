"""Independent feasibility check of a round's plan against the round's own inputs.

Used by the Dagster asset check on every placement plan (and by tests): it
re-derives each constraint from the snapshot rather than trusting the planner.

* each offline job is placed at most once, each GPU hosts at most ``max_jobs_per_gpu`` jobs (one by
  default, the paper), each in its own slot;
* on a GPU with several jobs (scheduler_core.round.slots) they are of one user (MPS serves one user per GPU), their
  MPS shares together stay within the GPU's
  offline share (dynamic SM, re-derived from the forecast) and their memory quotas together within the
  memory the online service is forecast to leave free;
* SM percentages lie within the policy's bounds (a kept job keeps the share it
  was started with, which lay within the bounds of its own round);
* the memory quota handed to xCUDA fits in the memory the online service is
  forecast to leave free, and the job's need fits in the quota;
* new work (start, migrate) only goes to Healthy GPUs; a kept job may stay on
  an Unhealthy GPU (paper §4.1: only Overlimit evicts), never on any other state;
* the job may run on that GPU type, and next to that GPU's online replica (its user, scheduler_core.jobs.run_as).
"""

from __future__ import annotations

from collections import Counter

from scheduler_core.domain import Action, GpuCandidate, GpuHealth, JobCandidate, PlanAction, PlannedPlacement
from scheduler_core.online.dynamic_sm import SmPolicy, offline_sm_pct
from scheduler_core.jobs.run_as import may_share


def plan_violations(
    gpus: list[GpuCandidate],
    jobs: list[JobCandidate],
    placements: list[PlannedPlacement],
    actions: list[PlanAction],
    sm: SmPolicy,
    max_jobs_per_gpu: int = 1,
) -> list[str]:
    """Every constraint the plan breaks, one line each (empty = feasible)."""
    out: list[str] = []
    gpu_by_id = {g.gpu_id: g for g in gpus}
    job_by_id = {j.job_id: j for j in jobs}
    action_of = {a.job_id: a.action for a in actions if a.action != Action.EVICT}
    for job_id, n in Counter(p.job_id for p in placements).items():
        if n > 1:
            out.append(f"job {job_id} placed {n} times")
    by_gpu: dict[int, list[PlannedPlacement]] = {}
    for p in placements:
        by_gpu.setdefault(p.gpu_id, []).append(p)
    for gpu_id, ps in by_gpu.items():
        if len(ps) > max_jobs_per_gpu:
            out.append(f"GPU {gpu_id} hosts {len(ps)} offline jobs (at most {max_jobs_per_gpu})")
        slots = Counter(p.slot for p in ps)
        for slot, n in slots.items():
            if n > 1:
                out.append(f"GPU {gpu_id}: {n} jobs in slot {slot}")
        users = sorted({u for u in (getattr(job_by_id.get(p.job_id), "run_as_user", None) for p in ps)
                        if u is not None})
        if len(users) > 1:
            out.append(f"GPU {gpu_id} hosts jobs of {len(users)} users ({', '.join(users)}): MPS serves one")
        g = gpu_by_id.get(gpu_id)
        if len(ps) > 1 and g is not None:
            whole = int(offline_sm_pct(g.forecast_sm_pct, sm))
            total = sum(p.sm_pct for p in ps)
            if total > whole:
                out.append(f"GPU {gpu_id}: its {len(ps)} jobs' shares add up to {total}% over its offline share {whole}%")
            quota = sum(p.mem_quota_bytes for p in ps)
            free = g.memory_bytes - g.forecast_mem_bytes
            if quota > free:
                out.append(f"GPU {gpu_id}: its {len(ps)} jobs' memory quotas add up to {quota} B over the "
                           f"{int(free)} B forecast free")
    for p in placements:
        g, j = gpu_by_id.get(p.gpu_id), job_by_id.get(p.job_id)
        if g is None or j is None:
            out.append(f"job {p.job_id} on GPU {p.gpu_id}: not among the round's inputs")
            continue
        act = action_of.get(p.job_id, Action.START)
        if act == Action.KEEP:
            if g.health not in (GpuHealth.HEALTHY, GpuHealth.UNHEALTHY):
                out.append(f"job {p.job_id} kept on GPU {p.gpu_id}, which is {g.health.value}")
            if p.sm_pct != j.current_sm_pct:
                out.append(f"job {p.job_id} kept at {p.sm_pct}% but runs at {j.current_sm_pct}%")
        elif g.health != GpuHealth.HEALTHY:
            out.append(f"job {p.job_id}: {act.value} onto GPU {p.gpu_id}, which is {g.health.value}")
        if act != Action.KEEP and not sm.min_pct <= p.sm_pct <= sm.max_pct and sm.fixed_pct is None:
            out.append(f"job {p.job_id}: SM {p.sm_pct}% outside [{sm.min_pct}, {sm.max_pct}]")
        if sm.fixed_pct is not None and act != Action.KEEP and p.sm_pct != sm.fixed_pct:
            out.append(f"job {p.job_id}: SM {p.sm_pct}% but the fixed share is {sm.fixed_pct}%")
        free = g.memory_bytes - g.forecast_mem_bytes
        if p.mem_quota_bytes > free:
            out.append(f"job {p.job_id}: memory quota {p.mem_quota_bytes} B exceeds the {int(free)} B "
                       f"forecast free on GPU {p.gpu_id}")
        if j.mem_bytes > p.mem_quota_bytes:
            out.append(f"job {p.job_id}: needs {j.mem_bytes} B, quota {p.mem_quota_bytes} B")
        if not may_share(g.run_as_user, j.run_as_user):
            out.append(f"job {p.job_id} of user {j.run_as_user} on GPU {p.gpu_id}, whose online replica runs as "
                       f"{g.run_as_user} (MPS serves one user per GPU)")
        if g.gpu_type not in j.allowed_gpu_types:
            out.append(f"job {p.job_id}: GPU type {g.gpu_type} not allowed ({sorted(j.allowed_gpu_types)})")
    return out
