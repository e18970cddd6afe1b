"""One user per GPU: an offline job shares a GPU only with an online replica of its own user (docs/DESIGN.md §4).

MPS runs one server per GPU for one user id at a time: a client of another uid waits until
every client of the running server has exited (``nvidia-cuda-mps-control`` man page). An
offline job co-runs with the GPU's online replica — the space-sharing of the paper (§4) —
only when both run as the same user. So a (GPU, job) pair is feasible only when

- the GPU's replica has no declared user (``GpuCandidate.run_as_user`` None: any job), or
- the job's user is unknown (``JobCandidate.run_as_user`` None: a job of the simulated
  cluster, which runs everything under one identity), or
- both are the same user.

The round applies it as one more eligibility mask beside the type, memory and health
feasibility of :mod:`scheduler_core.round.weights`: jobs are grouped into classes, so the
user enters the class key, collapsed to what the round's GPUs can tell apart (a user no
replica runs as is "another user" like any other), and the mask is set per (class user,
GPU user) group, never per pair. :mod:`scheduler_core.jobs.unplaced` names the rule when it is
what leaves a job out.

Several offline jobs on one GPU (:mod:`scheduler_core.round.slots`) must also be of one user among
themselves, which a matching cannot express (it is a constraint across a GPU's slots). The
round regroups the jobs the matching put on GPUs of several users, one user per GPU, best
weight first (:func:`one_user_per_gpu`); jobs left over are not placed this round. The
matching stays certified for the problem without this constraint, whose optimum bounds the
one with it from above, so the round adds the weight the regrouping lost to its gap bound.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ANY", "OTHER", "class_user", "gpu_users", "mask_classes", "may_share", "one_user_per_gpu",
           "sharing_gpus"]

# Class keys: a job of unknown user (fits any GPU), and a user no replica of the round runs as.
ANY = None
OTHER = "\0other"


def may_share(gpu_user: str | None, job_user: str | None) -> bool:
    """Whether a job of ``job_user`` may run next to a replica of ``gpu_user`` (None: not declared)."""
    return gpu_user is None or job_user is None or gpu_user == job_user


def gpu_users(gpus) -> frozenset[str]:
    """The users the replicas of these GPUs run as (the only ones a round can tell apart)."""
    return frozenset(g.run_as_user for g in gpus if g.run_as_user is not None)


def class_user(job_user: str | None, users: frozenset[str]) -> str | None:
    """A job's user as its class key: itself when some replica runs as it, :data:`OTHER` when none does.

    Without any declared replica user every job's key is :data:`ANY`: the classes are those of a
    round without the rule.
    """
    if job_user is None or not users:
        return ANY
    return job_user if job_user in users else OTHER


def sharing_gpus(gpus, job_user: str | None) -> np.ndarray:
    """(n,) bool: the GPUs whose replica a job of ``job_user`` may share."""
    return np.array([may_share(g.run_as_user, job_user) for g in gpus], dtype=bool)


def mask_classes(base: np.ndarray, class_users: list, slot_gpu: np.ndarray, gpus) -> np.ndarray:
    """Set ``base[k, s]`` to −inf where class ``k``'s user may not share slot ``s``'s GPU; the mask (classes × slots).

    ``slot_gpu``: the GPU (index into ``gpus``) of each slot column. One assignment per
    distinct class user, so the cost is (distinct users) × slots, not classes × slots.
    """
    mask = np.zeros(base.shape, dtype=bool)
    if not base.size or all(u is ANY for u in class_users):
        return mask
    slot_user = np.array([gpus[i].run_as_user for i in slot_gpu], dtype=object)
    declared = np.array([u is not None for u in slot_user], dtype=bool)
    by_user: dict[str, list[int]] = {}
    for k, u in enumerate(class_users):
        if u is not ANY:
            by_user.setdefault(u, []).append(k)
    for u, ks in by_user.items():
        bad = np.flatnonzero(declared & (slot_user != u))  # OTHER matches no replica's user
        if bad.size:
            mask[np.ix_(ks, bad)] = True
    base[mask] = -np.inf
    return mask


def one_user_per_gpu(pair_col: np.ndarray, pair_job: np.ndarray, col_gpu: np.ndarray, job_user: list,
                     weight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The matched pairs regrouped so that each GPU's offline jobs are of one user: (cols, jobs, dropped jobs).

    ``pair_col``/``pair_job``: the matching's pairs (slot column, job index); ``col_gpu``: each
    column's GPU; ``job_user``: each job's user (None: unknown, shares with anyone);
    ``weight(cols, jobs)``: the pairs' weights. Pairs on a GPU whose matched jobs are all of
    one user (or unknown) stay. On the other ("mixed") GPUs the jobs of unknown user stay and
    the known users' jobs are regrouped: repeatedly, the (GPU, user) that places the most weight
    (that user's best jobs of the regrouped ones, as many as the GPU has regrouped slots) takes
    them, until no mixed GPU or no job is left; the jobs left over are dropped. With one job
    per GPU nothing changes.
    """
    col, job = np.asarray(pair_col, dtype=np.int64), np.asarray(pair_job, dtype=np.int64)
    gpu = np.asarray(col_gpu)[col]
    known = np.array([job_user[j] is not None for j in job.tolist()], dtype=bool)
    users_on: dict[int, set] = {}
    for g, j in zip(gpu[known].tolist(), job[known].tolist()):
        users_on.setdefault(g, set()).add(job_user[j])
    mixed = sorted(g for g, us in users_on.items() if len(us) > 1)
    if not mixed:
        return col, job, np.zeros(0, dtype=np.int64)
    regroup = known & np.isin(gpu, mixed)
    cols_of = {g: col[regroup & (gpu == g)] for g in mixed}  # the regrouped slots of each mixed GPU
    first = np.array([cols_of[g][0] for g in mixed], dtype=np.int64)  # a GPU's slots weigh a job alike
    pool: dict[str, np.ndarray] = {}
    for j in job[regroup].tolist():
        pool.setdefault(job_user[j], []).append(j)
    pool = {u: np.array(js, dtype=np.int64) for u, js in sorted(pool.items())}

    def best(u: str) -> tuple[np.ndarray, np.ndarray]:
        """Per mixed GPU: the weight user ``u``'s best jobs place there, and which jobs (−1 padded)."""
        js = pool[u]
        take = max(c.size for c in cols_of.values())
        if js.size == 0:
            return np.full(len(mixed), -np.inf), np.full((len(mixed), take), -1)
        w = weight(np.repeat(first, js.size), np.tile(js, first.size)).reshape(first.size, js.size)
        order = np.argsort(-w, axis=1, kind="stable")[:, :take]
        top = np.take_along_axis(w, order, axis=1)
        room = np.array([cols_of[g].size for g in mixed])[:, None] > np.arange(order.shape[1])[None, :]
        use = room & np.isfinite(top)
        value = np.where(use, top, 0.0).sum(axis=1)
        value[~use.any(axis=1)] = -np.inf
        return value, np.where(use, js[order], -1)

    users = list(pool)
    table = {u: best(u) for u in users}
    open_gpu = np.ones(len(mixed), dtype=bool)
    out_col, out_job = [col[~regroup]], [job[~regroup]]
    while open_gpu.any():
        values = np.array([np.where(open_gpu, table[u][0], -np.inf) for u in users])
        k = int(np.argmax(values))
        ui, gi = divmod(k, len(mixed))
        if not np.isfinite(values[ui, gi]):
            break
        u = users[ui]
        js = table[u][1][gi]
        js = js[js >= 0]
        out_col.append(cols_of[mixed[gi]][:js.size])
        out_job.append(js)
        open_gpu[gi] = False
        pool[u] = pool[u][~np.isin(pool[u], js)]
        table[u] = best(u)
    dropped = np.concatenate(list(pool.values())) if pool else np.zeros(0, dtype=np.int64)
    return np.concatenate(out_col), np.concatenate(out_job), np.sort(dropped)
