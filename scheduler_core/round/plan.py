"""One scheduling round (paper Alg. 1, docs/DESIGN.md §3.5).

healthy GPUs + forecast load → dynamic SM % per GPU → predicted normalized
throughput and online slowdown for every feasible (GPU, job) pair →
maximum-weight matching → plan → diff against what runs now.

At production scale (20,000 GPUs × 10,000 jobs) nothing is done per pair:
predictions are made once per distinct (GPU input, job profile)
(:mod:`scheduler_core.round.weights`), the matching is solved on job classes
and certified optimal on every pair (:mod:`scheduler_core.matching.assignment`,
:mod:`scheduler_core.matching.certificate`). :mod:`scheduler_core.round.dense` keeps the
every-pair reference.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from scheduler_core.jobs.admission import AdmissionPolicy, admit, capacity
from scheduler_core.matching.assignment import SolverConfig, solve
from scheduler_core.domain import (
    Action,
    GpuCandidate,
    GpuHealth,
    JobCandidate,
    OfflineFeatures,
    OnlineFeatures,
    PlanAction,
    PlannedPlacement,
    RoundResult,
)
from scheduler_core.online.dynamic_sm import SmPolicy
from scheduler_core.matching.first_fit import first_fit
from scheduler_core.round.weights import build_graph, mem_quota_bytes
from scheduler_core.jobs.run_as import one_user_per_gpu
from scheduler_core.round.slots import keeps_share
from scheduler_core.jobs.unplaced import unplaced_reasons

MATCHERS = ("km", "first_fit")

__all__ = ["RoundConfig", "plan_round", "mem_quota_bytes", "diff_plan", "snapshot", "from_snapshot"]


@dataclass(frozen=True)
class RoundConfig:
    sm: SmPolicy = field(default_factory=SmPolicy)
    # xCUDA's memory quota for offline work: a share of device memory (paper §6: 40 %),
    # never more than what the online service is forecast to leave free.
    mem_quota_frac: float = 0.4
    mem_reserve_bytes: int = 512 * 1024**2
    # Subtracted from the weight of moving a running job to another GPU. 0 = paper.
    migration_penalty: float = 0.0
    # A kept job whose MPS share exceeds the planned one by more than this is
    # restarted in place with the planned share.
    resize_threshold_pct: int = 15
    solver: SolverConfig = field(default_factory=SolverConfig)
    # "km": maximum-weight matching (paper §5). "first_fit": the MuxFlow-M
    # ablation (paper §7.4) — same feasibility, no optimisation.
    matcher: str = "km"
    # Most offline jobs on one GPU (scheduler_core.round.slots); 1 = the paper.
    max_jobs_per_gpu: int = 1
    # Throughput an offline job keeps per offline co-runner on its GPU (MPS isolation; scheduler_core.round.slots).
    corunner_efficiency: float = 0.75
    # Which jobs compete when more wait than the GPUs can take (scheduler_core.jobs.admission).
    admission: AdmissionPolicy = field(default_factory=AdmissionPolicy)

    def __post_init__(self) -> None:
        if self.matcher not in MATCHERS:
            raise ValueError(f"matcher must be one of {', '.join(MATCHERS)}, got {self.matcher!r}")
        if self.max_jobs_per_gpu < 1:
            raise ValueError(f"max_jobs_per_gpu must be >= 1, got {self.max_jobs_per_gpu}")
        if not 0.0 < self.corunner_efficiency <= 1.0:
            raise ValueError(f"corunner_efficiency must lie in (0, 1], got {self.corunner_efficiency}")
        # Stored rounds keep their config as JSON (dataclasses.asdict): nested settings come back as dicts.
        if isinstance(self.sm, dict):
            object.__setattr__(self, "sm", SmPolicy(**self.sm))
        if isinstance(self.admission, dict):
            object.__setattr__(self, "admission", AdmissionPolicy(**self.admission))
        if isinstance(self.solver, dict):
            known = SolverConfig.__dataclass_fields__
            object.__setattr__(self, "solver", SolverConfig(**{k: v for k, v in self.solver.items() if k in known}))


def plan_round(
    gpus: list[GpuCandidate],
    jobs: list[JobCandidate],
    predictors: dict,
    cfg: RoundConfig = RoundConfig(),
) -> RoundResult:
    """Plan one round; the matching comes with an optimality certificate checked on every pair.

    A running job that cannot be moved (``movable=False``: it does not checkpoint) stays where it is: its GPU
    and it are left out of the matching and it is KEPT at its running share, whatever the matching would
    prefer. An Unhealthy GPU keeps it too: Unhealthy takes no new work, but what runs there runs on (the node's
    SysMonitor evicts it if the GPU goes Overlimit), and moving it would throw its progress away for a state
    that often passes. Only a GPU that has failed (Overlimit, Disabled, Init) lets the matching move it (its
    progress is lost then, as it would be anyway). One whose GPU the round does not see (no online metrics)
    gets no action at all.
    """
    kept, gpus, jobs = _pinned(gpus, jobs, predictors)
    result = _plan_matching(gpus, jobs, predictors, cfg)
    if not kept:
        return result
    placements, actions, over = _keep_pinned(kept, predictors, cfg)
    result.stats["pinned"] = {"kept": len(actions), "over_allowance": over}
    return replace(result, placements=result.placements + placements, actions=result.actions + actions,
                   objective=result.objective + float(sum(p.predicted_norm_tput for p in placements)),
                   jobs_considered=result.jobs_considered + len(actions),
                   gpus_considered=result.gpus_considered + len({p.gpu_id for p in placements}))


def _pinned(gpus: list[GpuCandidate], jobs: list[JobCandidate], predictors: dict
            ) -> tuple[dict[int, tuple[GpuCandidate, list[JobCandidate]]], list[GpuCandidate], list[JobCandidate]]:
    """The running jobs that stay put, by GPU (with the GPU), and the GPUs and jobs left for the matching."""
    by_id = {g.gpu_id: g for g in gpus}
    kept: dict[int, tuple[GpuCandidate, list[JobCandidate]]] = {}
    rest = []
    for j in jobs:
        g = by_id.get(j.current_gpu_id) if j.current_gpu_id is not None else None
        if j.movable or j.current_gpu_id is None:
            rest.append(j)
        elif g is None:
            continue  # its GPU is not in this round: nothing is sent, it runs on
        elif g.health in (GpuHealth.HEALTHY, GpuHealth.UNHEALTHY) and g.gpu_type in predictors:
            kept.setdefault(g.gpu_id, (g, []))[1].append(j)
        else:
            rest.append(j)  # a failing GPU: the matching moves it
    if not kept and len(rest) == len(jobs):
        return kept, gpus, jobs
    return kept, [g for g in gpus if g.gpu_id not in kept], [j for j in rest if j.current_gpu_id not in kept]


def _keep_pinned(kept: dict[int, tuple[GpuCandidate, list[JobCandidate]]], predictors: dict, cfg: RoundConfig
                 ) -> tuple[list[PlannedPlacement], list[PlanAction], list[int]]:
    """KEEP placements for the pinned jobs, each predicted at its running share on its GPU (alone: co-runners on
    a shared GPU are not priced in); ``over``: the jobs whose GPU's service would not have taken them now
    (the node's SysMonitor protects it meanwhile)."""
    placements, actions, over = [], [], []
    one = replace(cfg, max_jobs_per_gpu=1)
    for g, pinned in kept.values():
        for slot, j in enumerate(pinned):
            graph = build_graph([g], [j], predictors, one)
            zero = np.zeros(1, dtype=np.int64)
            tput, slow = graph.predicted(zero, zero)
            if not np.isfinite(graph.weights.weights_at(zero, zero)).all():
                over.append(j.job_id)
            pct = int(j.current_sm_pct if j.current_sm_pct is not None else graph.pair_pct(zero, zero)[0])
            placements.append(PlannedPlacement(j.job_id, g.gpu_id, pct, mem_quota_bytes(g, cfg),
                                               float(np.nan_to_num(tput[0])), float(np.nan_to_num(slow[0], nan=1.0)),
                                               slot))
            actions.append(PlanAction(Action.KEEP, j.job_id, g.gpu_id, g.gpu_id, pct))
    return placements, actions, over


def _plan_matching(
    gpus: list[GpuCandidate],
    jobs: list[JobCandidate],
    predictors: dict,
    cfg: RoundConfig,
) -> RoundResult:
    t0 = time.perf_counter()
    all_jobs = jobs
    slots = capacity(gpus, predictors, cfg.max_jobs_per_gpu)
    jobs, deferred = admit(all_jobs, slots, cfg.admission)
    graph = build_graph(gpus, jobs, predictors, cfg)
    while len(jobs) > graph.layout.n_slots and graph.layout.n_slots < slots:
        # Several jobs per GPU: the round opened fewer slots than its GPUs could hold (splits that do not pay
        # are undone), so fewer of the shortest jobs compete: the matching must not fill slots with long jobs.
        # The slots only go down, so this ends (at one slot per eligible GPU at the latest).
        slots = graph.layout.n_slots
        jobs, deferred = admit(all_jobs, slots, cfg.admission)
        graph = build_graph(gpus, jobs, predictors, cfg)
    t_graph = time.perf_counter()
    gt = graph.stats.get("timings_s", {})
    stats = {k: v for k, v in graph.stats.items() if k != "timings_s"}
    if cfg.matcher == "first_fit":
        pairs, total, stats["solver"] = first_fit(graph.weights, levels=graph.class_level)
        certified, gap = False, None
    else:
        sol = solve(graph.weights, cfg.solver)
        pairs, total, certified, gap = sol.pairs, sol.total, sol.certificate.ok, sol.certificate.gap_bound
        stats["solver"] = {k: v for k, v in sol.stats.items() if k != "history"}
        stats["certificate"] = sol.certificate.as_dict()
    t_match = time.perf_counter()
    ci, ji = _as_arrays(pairs)
    # Several jobs per GPU: one user per GPU among them (MPS), which the matching cannot express.
    rc, rj, dropped = one_user_per_gpu(ci, ji, graph.layout.gpu, [j.run_as_user for j in jobs],
                                       graph.weights.weights_at)
    other_user = [jobs[j] for j in dropped.tolist()]
    if rc.size != ci.size or not (np.array_equal(rc, ci) and np.array_equal(rj, ji)):
        after = float(graph.weights.weights_at(rc, rj).sum())
        lost = max(0.0, float(total) - after)
        ci, ji, total = rc, rj, after
        # The certificate is for the matching without the constraint, whose optimum is an upper bound:
        # the plan is within the matching's gap plus what the regrouping lost.
        certified = certified and lost <= 1e-9
        gap = None if gap is None else float(gap) + lost
        stats["one_user_per_gpu"] = {"regrouped": True, "dropped": len(other_user), "lost_weight": lost}
    slot_pairs = list(zip(graph.layout.gpu[ci].tolist(), ji.tolist()))
    placements, actions = diff_plan(graph.gpus, jobs, slot_pairs, graph.pair_pct(ci, ji), graph.slot_quota[ci],
                                    *graph.predicted(ci, ji), cfg, graph.layout.count[ci])
    # A running job admission left out is checkpointed and waits (shorter jobs take its place).
    actions += [PlanAction(Action.EVICT, j.job_id, None, j.current_gpu_id, None)
                for j in deferred if j.current_gpu_id is not None]
    t_plan = time.perf_counter()
    # Why each job the plan leaves out is not placed (`muxflow jobs list`, the round's metadata).
    why_deferred = (f"{len(all_jobs)} jobs for {slots} offline slots: the {len(jobs)} with the least work left "
                    f"competed (a running job counts its remaining work x{cfg.admission.preempt_ratio:g})")
    stats["admission"] = {"slots": slots, "competing": len(jobs), "deferred": len(deferred),
                          "preempted": sum(1 for j in deferred if j.current_gpu_id is not None)}
    why_other_user = ("the matching also gave their GPU to another user's jobs, whose jobs there weigh more "
                      "(several jobs per GPU: MPS serves one user per GPU)")
    stats["unplaced"] = unplaced_reasons(gpus, jobs, predictors, graph, {p.job_id for p in placements},
                                         (why_deferred, deferred), (why_other_user, other_user))
    t_end = time.perf_counter()
    return RoundResult(
        placements=placements,
        actions=actions,
        objective=float(sum(p.predicted_norm_tput for p in placements)),
        gpus_considered=len(graph.gpus),
        jobs_considered=len(all_jobs),
        feasible_pairs=graph.weights.feasible_pair_count(),
        timings_s={
            "features": gt.get("features", 0.0),
            "prediction": gt.get("prediction", 0.0),
            "feasibility": gt.get("feasibility", 0.0),
            "matching": t_match - t_graph,
            "plan": t_plan - t_match,
            "unplaced": t_end - t_plan,
            "total": t_end - t0,
        },
        certified_optimal=certified,
        optimality_gap_bound=gap,
        matching_objective=total,
        stats=stats,
    )


def _as_arrays(pairs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def diff_plan(
    gpus: list[GpuCandidate],
    jobs: list[JobCandidate],
    pairs: list[tuple[int, int]],
    pair_pct: np.ndarray,
    pair_quota: np.ndarray,
    tput: np.ndarray,
    slowdown: np.ndarray,
    cfg: RoundConfig,
    slots_on_gpu: np.ndarray | None = None,
) -> tuple[list[PlannedPlacement], list[PlanAction]]:
    """Matched (GPU index, job index) pairs, with each pair's planned MPS share and memory quota, → placements
    and actions. ``slots_on_gpu``: the slots the pair's GPU was opened with (1 when omitted)."""
    placements: list[PlannedPlacement] = []
    actions: list[PlanAction] = []
    matched_jobs = set()
    slots_on_gpu = np.ones(len(pairs), dtype=np.int64) if slots_on_gpu is None else slots_on_gpu
    taken: dict[int, int] = {}
    for (i, j), pct, q, t_hat, s_hat, b in zip(pairs, pair_pct, pair_quota, tput, slowdown, slots_on_gpu):
        g, job = gpus[i], jobs[j]
        matched_jobs.add(job.job_id)
        pct = int(pct)
        if job.current_gpu_id is None:
            action = Action.START
        elif job.current_gpu_id != g.gpu_id:
            action = Action.MIGRATE
        elif keeps_share(job, pct, cfg, int(b)):
            # An MPS share is fixed for the life of a process: keep the running one
            # unless it now exceeds the planned share by more than the threshold
            # (then the online service needs the SMs back).
            action, pct = Action.KEEP, job.current_sm_pct
        else:
            action = Action.MIGRATE  # same GPU, restarted with the smaller MPS share
        slot = taken.get(g.gpu_id, 0)
        taken[g.gpu_id] = slot + 1
        placements.append(PlannedPlacement(job.job_id, g.gpu_id, pct, int(q), float(t_hat), float(s_hat), slot))
        actions.append(PlanAction(action, job.job_id, g.gpu_id, job.current_gpu_id, pct))
    for job in jobs:
        if job.current_gpu_id is not None and job.job_id not in matched_jobs:
            actions.append(PlanAction(Action.EVICT, job.job_id, None, job.current_gpu_id, None))
    return placements, actions


def snapshot(gpus: list[GpuCandidate], jobs: list[JobCandidate]) -> dict:
    """JSON-able round inputs, so a stored round can be re-planned exactly."""

    def gpu_dict(g: GpuCandidate) -> dict:
        d = asdict(g)
        d["health"] = g.health.value
        return d

    def job_dict(j: JobCandidate) -> dict:
        d = asdict(j)
        d["allowed_gpu_types"] = sorted(j.allowed_gpu_types)
        return d

    return {"gpus": [gpu_dict(g) for g in gpus], "jobs": [job_dict(j) for j in jobs]}


def from_snapshot(snap: dict) -> tuple[list[GpuCandidate], list[JobCandidate]]:
    gpus = []
    for d in snap["gpus"]:
        d = dict(d)
        d["health"] = GpuHealth(d["health"])
        d["online"] = OnlineFeatures(**d["online"])
        gpus.append(GpuCandidate(**d))
    jobs = []
    for d in snap["jobs"]:
        d = dict(d)
        d["allowed_gpu_types"] = frozenset(d["allowed_gpu_types"])
        d["profiles"] = {k: OfflineFeatures(**v) for k, v in d["profiles"].items()}
        jobs.append(JobCandidate(**d))
    return gpus, jobs
