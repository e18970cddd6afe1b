"""Why a round left a job unplaced (paper §5: a job is matched only along feasible pairs).

For every job the plan does not place, the first constraint of the round's
feasibility (docs/DESIGN.md §3.5; :mod:`scheduler_core.round.weights`) that rules out every
GPU, in the order a user can act on:

``no_gpu_of_allowed_type``   no GPU of a type the job allows is in the round
``no_predictor``             such GPUs are, but no speed predictor for their type
``no_profile``               the job has no profile on those types
``gpu_not_healthy``          none of those GPUs is Healthy (new work only goes on Healthy GPUs, §4.1)
``run_as_user``              the online replicas of those GPUs run as other users (MPS serves one user per GPU,
                             :mod:`scheduler_core.jobs.run_as`)
``memory``                   the job's memory exceeds the offline quota of every candidate GPU
``out_of_predictor_range``   the predictor accepts none of the candidate pairs (inputs outside its training range)
``slowdown``                 the predicted online slowdown exceeds the service's allowance on every candidate
                             GPU at every share level
``no_throughput``            the predicted throughput is 0 wherever the slowdown is allowed
``one_user_per_gpu``         matched to a GPU the matching also gave to another user's jobs, which kept it
                             (several jobs per GPU: MPS serves one user per GPU;
                             :func:`scheduler_core.jobs.run_as.one_user_per_gpu`)
``not_matched``              feasible somewhere, but the matching gave those GPUs to other jobs
``deferred_srpt``            the round was overloaded and jobs with less remaining work competed first
                             (:mod:`scheduler_core.jobs.admission`)

Cheap: jobs are explained by class (jobs with the same memory, allowed types and
profiles share every feasibility answer), only classes with an unplaced job are
looked at, a class feasible anywhere is ``not_matched`` from the round's own weight
row, and only infeasible classes re-read the round's prediction tables.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from scheduler_core.domain import GpuCandidate, GpuHealth, JobCandidate
from scheduler_core.round.weights import slo_allowance
from scheduler_core.jobs.run_as import sharing_gpus

NO_GPU_OF_ALLOWED_TYPE = "no_gpu_of_allowed_type"
NO_PREDICTOR = "no_predictor"
NO_PROFILE = "no_profile"
GPU_NOT_HEALTHY = "gpu_not_healthy"
RUN_AS_USER = "run_as_user"
MEMORY = "memory"
OUT_OF_PREDICTOR_RANGE = "out_of_predictor_range"
SLOWDOWN = "slowdown"
NO_THROUGHPUT = "no_throughput"
ONE_USER_PER_GPU = "one_user_per_gpu"
NOT_MATCHED = "not_matched"
DEFERRED_SRPT = "deferred_srpt"
REASONS = (NO_GPU_OF_ALLOWED_TYPE, NO_PREDICTOR, NO_PROFILE, GPU_NOT_HEALTHY, RUN_AS_USER, MEMORY,
           OUT_OF_PREDICTOR_RANGE, SLOWDOWN, NO_THROUGHPUT, ONE_USER_PER_GPU, NOT_MATCHED, DEFERRED_SRPT)
GIB = 1024**3


def _types(names) -> str:
    return ", ".join(sorted(names)) or "none"


def unplaced_reasons(gpus: list[GpuCandidate], jobs: list[JobCandidate], predictors: dict, graph,
                     placed_job_ids: set[int], deferred: tuple[str, list[JobCandidate]] | None = None,
                     other_user: tuple[str, list[JobCandidate]] | None = None) -> dict:
    """``{"counts": {reason: jobs}, "jobs": {reason: {detail: "<job id>,<job id>,…"}}}`` for the jobs not placed.

    ``gpus`` are all the round's GPUs (any health), ``graph`` its
    :class:`~scheduler_core.round.weights.RoundGraph` (rows: the eligible GPUs). Nested
    dicts of strings and numbers: the round's stats are stored as such (:func:`groups`
    reads the job ids back). ``deferred``: the jobs admission kept out of the round, with why;
    ``other_user``: the matched jobs dropped for another user's jobs on their GPU, with why.
    """
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    if other_user is not None and other_user[1]:
        groups[(ONE_USER_PER_GPU, other_user[0])].extend(j.job_id for j in other_user[1])
    explained = placed_job_ids | {j.job_id for j in (other_user[1] if other_user is not None else ())}
    left = [j for j, job in enumerate(jobs) if job.job_id not in explained]
    if left:
        job_class = graph.weights.job_class
        why = {}
        in_round = {g.gpu_type for g in gpus}
        predicted = in_round & set(predictors)
        healthy_types = {g.gpu_type for g in gpus if g.health == GpuHealth.HEALTHY}
        cands: list = []  # the candidate GPUs, computed once if any class needs them
        home, home_w = graph.weights.home, graph.weights.home_weight
        for j in left:
            if home[j] >= 0 and np.isfinite(home_w[j]):  # a running job that could have stayed where it is
                groups[(NOT_MATCHED, _NOT_CHOSEN)].append(jobs[j].job_id)
                continue
            # A class is built from what the round's eligible GPUs can use; the types a job allows
            # beyond those, and its profiles there, tell apart why classes are empty.
            key = (int(job_class[j]), jobs[j].allowed_gpu_types, frozenset(jobs[j].profiles), jobs[j].run_as_user)
            if key not in why:
                why[key] = _explain(jobs[j], key[0], gpus, in_round, predicted, healthy_types, graph, cands)
            groups[why[key]].append(jobs[j].job_id)
    if deferred is not None and deferred[1]:
        groups[(DEFERRED_SRPT, deferred[0])].extend(j.job_id for j in deferred[1])
    counts: dict[str, int] = defaultdict(int)
    for (reason, _detail), ids in groups.items():
        counts[reason] += len(ids)
    by_reason: dict[str, dict[str, str]] = {}
    for (r, d), ids in sorted(groups.items(), key=lambda kv: (REASONS.index(kv[0][0]), kv[0][1])):
        by_reason.setdefault(r, {})[d] = ",".join(str(i) for i in sorted(ids))
    return {"counts": {r: counts[r] for r in REASONS if counts[r]}, "jobs": by_reason}


def groups(unplaced: dict | None) -> list[tuple[str, str, list[int]]]:
    """(reason, detail, job ids) of a round's ``stats["unplaced"]``, in the order of :data:`REASONS`."""
    out = []
    for reason, details in ((unplaced or {}).get("jobs") or {}).items():
        for detail, ids in details.items():
            out.append((reason, detail, [int(i) for i in str(ids).split(",") if i]))
    return sorted(out, key=lambda g: (REASONS.index(g[0]) if g[0] in REASONS else len(REASONS), g[1]))


_NOT_CHOSEN = "feasible, but the matching (the most predicted throughput in all) gave its GPUs to other jobs"


class _Candidates:
    """Per GPU type, the round's Healthy eligible GPUs and their allowances: built once, on first need."""

    def __init__(self, graph):
        healthy = np.array([g.health == GpuHealth.HEALTHY for g in graph.gpus], dtype=bool)
        self.allowance = np.array([slo_allowance(g) for g in graph.gpus], dtype=float)
        self.by_type = {ti: np.flatnonzero((graph.gpu_type_idx == ti) & healthy) for ti in range(len(graph.types))}
        self.gpus = graph.gpus
        self._sharing: dict[str | None, np.ndarray] = {}

    def sharing(self, user: str | None) -> np.ndarray:
        """(n,) bool: the GPUs a job of ``user`` may share (computed once per user)."""
        if user not in self._sharing:
            self._sharing[user] = sharing_gpus(self.gpus, user)
        return self._sharing[user]


def _explain(job: JobCandidate, k: int, gpus, in_round: set[str], predicted: set[str], healthy_types: set[str],
             graph, cands: list) -> tuple[str, str]:
    allowed = set(job.allowed_gpu_types)
    feasible = int(np.unique(graph.layout.gpu[np.isfinite(graph.weights.base[k])]).size)
    if feasible:
        return NOT_MATCHED, f"feasible on {feasible} GPU(s); the matching (the most predicted throughput in all) " \
                            "gave them to other jobs"
    if not allowed & in_round:
        return NO_GPU_OF_ALLOWED_TYPE, f"allows {_types(allowed)}; the round has {_types(in_round)}"
    if not allowed & predicted:
        return NO_PREDICTOR, f"no promoted predictor for {_types(allowed & in_round)}"
    usable = allowed & predicted & set(job.profiles)
    if not usable:
        return NO_PROFILE, f"no profile on {_types(allowed & predicted)}"
    if not usable & healthy_types:
        states = sorted({g.health.value for g in gpus if g.gpu_type in usable})
        return GPU_NOT_HEALTHY, f"no Healthy GPU of {_types(usable)} (they are {', '.join(states)})"
    if not cands:
        cands.append(_Candidates(graph))
    c = cands[0]
    share = c.sharing(job.run_as_user)
    near = [c.by_type.get(graph.types.index(t), np.zeros(0, dtype=np.int64)) for t in usable if t in graph.types]
    if any(i.size for i in near) and not any(share[i].any() for i in near):
        others = sorted({c.gpus[g].run_as_user for i in near for g in i})
        return RUN_AS_USER, (f"runs as {job.run_as_user}; the online replicas of its {sum(i.size for i in near)} "
                             f"candidate GPU(s) run as {', '.join(others)} (MPS serves one user per GPU)")
    fits, largest = 0, 0.0
    accepted = allowed_slowdown = throughput = False
    for t in usable:
        ti = graph.types.index(t) if t in graph.types else -1
        col = graph.class_profile[k, ti] if ti >= 0 else -1
        idx = c.by_type.get(ti, np.zeros(0, dtype=np.int64))
        idx = idx[share[idx]]
        if idx.size:
            largest = max(largest, float(graph.quota[idx].max()))
        sel = idx[graph.quota[idx] >= job.mem_bytes]
        fits += sel.size
        if not sel.size or col < 0:
            continue
        table, allowance = graph.tables[ti], c.allowance[sel]
        for level in range(graph.sm_levels.shape[0]):
            rows = graph.gpu_rows[level][sel]
            tput, slow = table.at(rows, np.full(rows.size, col))
            ok = np.isfinite(tput) & np.isfinite(slow)
            within = ok & (slow - 1.0 <= allowance)
            accepted |= bool(ok.any())
            allowed_slowdown |= bool(within.any())
            throughput |= bool((within & (tput > 0)).any())
    if not fits:
        return MEMORY, (f"needs {job.mem_bytes / GIB:.3g} GiB; the largest offline memory quota on a Healthy GPU "
                        f"of {_types(usable)} is {largest / GIB:.3g} GiB")
    if not accepted:
        return OUT_OF_PREDICTOR_RANGE, (f"the predictor of {_types(usable)} accepts none of {fits} candidate "
                                        "pair(s): the job's profile or the GPUs' online load is outside its training "
                                        "range")
    if not allowed_slowdown:
        return SLOWDOWN, (f"predicted online slowdown over the service's allowance on all {fits} candidate "
                          f"GPU(s) at every share level")
    if not throughput:
        return NO_THROUGHPUT, "predicted throughput 0 on every candidate GPU where the slowdown is allowed"
    return NOT_MATCHED, _NOT_CHOSEN  # not reached: these checks are the round's feasibility
