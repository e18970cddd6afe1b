"""One user per GPU: an offline job shares a GPU only with an online replica of its own user (DESIGN §4).

MPS runs one server per GPU for one user id at a time: a client of another uid waits until
every client of the running server has exited (``nvidia-cuda-mps-control`` man page). An
offline job co-runs with the GPU's online replica — the space-sharing of the paper (§4) —
only when both run as the same user. So a (GPU, job) pair is feasible only when

- the GPU's replica has no declared user (``GpuCandidate.run_as_user`` None: any job), or
- the job's user is unknown (``JobCandidate.run_as_user`` None: a job of the simulated
  cluster, which runs everything under one identity), or
- both are the same user.

The round applies it as one more eligibility mask beside the type, memory and health
feasibility of :mod:`scheduler_core.pair_weights`: jobs are grouped into classes, so the
user enters the class key, collapsed to what the round's GPUs can tell apart (a user no
replica runs as is "another user" like any other), and the mask is set per (class user,
GPU user) group, never per pair. :mod:`scheduler_core.unplaced` names the rule when it is
what leaves a job out.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ANY", "OTHER", "class_user", "gpu_users", "mask_classes", "may_share", "sharing_gpus"]

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
