"""Who runs what in a simulation: the user of each GPU's online replica and of each offline job (docs/DESIGN.md §4).

MPS serves one user per GPU, so a MuxFlow round pairs a job only with a GPU whose replica
runs as the job's user (:mod:`scheduler_core.jobs.run_as`). To measure what that costs, a
simulation can give users to both sides (``SimConfig.users`` > 0; 0: nobody declares a
user and the rule is off). The distribution, documented in docs/EVALUATION.md:

- there are ``users`` identities — teams, each owning some online replicas and submitting
  some offline jobs; team *k* (1-based) has weight ``k ** -users_zipf_s`` (Zipf: a few
  large teams and a long tail, as job submissions per user are in production traces);
- each GPU's replica runs as a team drawn from those weights (``sim-users-gpus`` stream),
  each offline job is submitted by a team drawn from the same weights (``sim-users-jobs``),
  independently. A team's share of the jobs thus matches its expected share of the GPUs,
  and every difference between the two is the rule's to absorb.

Arrays of team indices (0-based); −1 where no user is declared.
"""

from __future__ import annotations

import numpy as np

from scheduler_core.rng import rng_stream


def user_weights(users: int, zipf_s: float) -> np.ndarray:
    """(users,) probabilities of each team, Zipf with exponent ``zipf_s`` (0: uniform)."""
    w = np.arange(1, users + 1, dtype=float) ** -float(zipf_s)
    return w / w.sum()


def assign_users(seed: int, users: int, zipf_s: float, n_gpus: int, n_jobs: int) -> tuple[np.ndarray, np.ndarray]:
    """(each GPU's replica user, each job's user); all −1 when ``users`` is 0."""
    if users <= 0:
        return np.full(n_gpus, -1, dtype=np.int64), np.full(n_jobs, -1, dtype=np.int64)
    p = user_weights(users, zipf_s)
    gpus = rng_stream(seed, "sim-users-gpus").choice(users, size=n_gpus, p=p)
    jobs = rng_stream(seed, "sim-users-jobs").choice(users, size=n_jobs, p=p)
    return gpus.astype(np.int64), jobs.astype(np.int64)


def user_name(index: int) -> str | None:
    """The name a round sees for a team index (None: not declared)."""
    return None if index < 0 else f"team{index + 1}"
