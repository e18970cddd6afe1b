"""Edge weights of the round's bipartite graph, stored by job class (paper §5, Alg. 1).

Jobs of one class (same memory need, allowed GPU types and profiles) have the
same predicted weight on every GPU, so the weights are one row per class, not
one per job: 350 classes × 20,000 GPUs instead of 10,000 × 20,000. A running
job differs from its class in two ways only, and both are per job:

- ``home``: the GPU it runs on, where its weight is ``home_weight`` (it may
  stay on an Unhealthy GPU where no new job may go, so this can be feasible
  where the class row is not);
- ``penalty``: subtracted from its weight on every other GPU (the migration
  penalty; 0 reproduces the paper).

So the weight of GPU ``i`` and job ``j`` of class ``k`` is::

    w[i, j] = home_weight[j]            if i == home[j]
            = base[k, i] − penalty[j]   otherwise

and the pair is an edge of the graph only when ``w[i, j] > 0`` (``−inf`` marks
an infeasible pair; a pair worth nothing is never worth matching). ``base`` may
be float32 (a round's predictions are float32 numbers: half the memory at
10,000 classes × 20,000 GPUs); every computation on it is in float64.

Columns are what a GPU offers one job: the GPU, or each of its slots when it
hosts several offline jobs (:mod:`scheduler_core.round.slots`; a GPU with b slots
is b columns, so the matching of columns is the GPUs' b-matching).

Invariant: ``home_weight[j] ≥ base[k, home[j]] − penalty[j]`` — staying on its
GPU is never worth less to a job than arriving there as a stranger would be.
A round satisfies it by construction (the home weight is the class weight
without penalty, or feasible where the class's is not); it lets every
maximum over GPUs be taken per class, with the home as one extra candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class GroupedWeights:
    base: np.ndarray  # (K, n) float64, −inf where infeasible
    job_class: np.ndarray  # (m,) int64 in [0, K)
    home: np.ndarray  # (m,) int64, −1 = none
    home_weight: np.ndarray  # (m,) float64, −inf where no home or infeasible there
    penalty: np.ndarray  # (m,) float64 ≥ 0

    def __post_init__(self) -> None:
        base = np.asarray(self.base)
        if base.dtype not in (np.float32, np.float64):
            base = base.astype(np.float64)
        if base.ndim != 2:
            raise ValueError(f"base must be a (classes, gpus) matrix, got shape {base.shape}")
        if np.isnan(base).any() or np.isposinf(base).any():
            raise ValueError("base weights must be finite or −inf (infeasible)")
        m = np.asarray(self.job_class).shape[0]
        arrays = {
            "job_class": np.asarray(self.job_class, dtype=np.int64).reshape(-1),
            "home": np.asarray(self.home, dtype=np.int64).reshape(-1),
            "home_weight": np.asarray(self.home_weight, dtype=np.float64).reshape(-1),
            "penalty": np.asarray(self.penalty, dtype=np.float64).reshape(-1),
        }
        for name, arr in arrays.items():
            if arr.shape[0] != m:
                raise ValueError(f"{name} has {arr.shape[0]} entries for {m} jobs")
        k, n = base.shape
        if m and (arrays["job_class"].min() < 0 or arrays["job_class"].max() >= k):
            raise ValueError("job_class out of range")
        if m and (arrays["home"].min() < -1 or arrays["home"].max() >= n):
            raise ValueError("home out of range")
        if not np.all(np.isfinite(arrays["penalty"])) or (arrays["penalty"] < 0).any():
            raise ValueError("penalties must be finite and >= 0")
        hw = arrays["home_weight"]
        if np.isnan(hw).any() or np.isposinf(hw).any():
            raise ValueError("home weights must be finite or −inf")
        has = np.flatnonzero(arrays["home"] >= 0)
        if has.size:
            stranger = base[arrays["job_class"][has], arrays["home"][has]] - arrays["penalty"][has]
            bad = hw[has] < stranger
            if bad.any():
                j = int(has[np.argmax(bad)])
                raise ValueError(f"job {j}: home weight {hw[j]!r} is below the class weight minus penalty at its "
                                 f"home ({float(stranger[np.argmax(bad)])!r})")
        object.__setattr__(self, "base", base)
        for name, arr in arrays.items():
            object.__setattr__(self, name, arr)

    @property
    def n_gpus(self) -> int:
        return int(self.base.shape[1])

    @property
    def n_jobs(self) -> int:
        return int(self.job_class.shape[0])

    @property
    def n_classes(self) -> int:
        return int(self.base.shape[0])

    @classmethod
    def from_dense(cls, weights: np.ndarray, feasible: np.ndarray) -> GroupedWeights:
        """Every job its own class: the general (n GPUs × m jobs) weight matrix."""
        w = np.asarray(weights, dtype=np.float64)
        ok = np.asarray(feasible, dtype=bool)
        if w.shape != ok.shape or w.ndim != 2:
            raise ValueError(f"weights {w.shape} and feasibility {ok.shape} must be equal 2-D shapes")
        if not np.all(np.isfinite(w[ok])):
            raise ValueError("feasible edges must have finite weights")
        m = w.shape[1]
        return cls(
            base=np.where(ok, w, -np.inf).T.copy(),
            job_class=np.arange(m),
            home=np.full(m, -1),
            home_weight=np.full(m, -np.inf),
            penalty=np.zeros(m),
        )

    def weights_at(self, gpus: np.ndarray, jobs: np.ndarray) -> np.ndarray:
        """w[i, j] for aligned index arrays."""
        i = np.asarray(gpus, dtype=np.int64)
        j = np.asarray(jobs, dtype=np.int64)
        w = self.base[self.job_class[j], i] - self.penalty[j]
        at_home = i == self.home[j]
        return np.where(at_home, self.home_weight[j], w)

    def to_dense(self) -> np.ndarray:
        """(n × m) weights with −inf for infeasible pairs. For tests and small instances only."""
        w = (self.base[self.job_class] - self.penalty[:, None]).T.copy()
        has = self.home >= 0
        w[self.home[has], np.flatnonzero(has)] = self.home_weight[has]
        return w

    def feasible_pair_count(self) -> int:
        """Number of (GPU, job) pairs with a finite weight."""
        per_class = np.isfinite(self.base).sum(axis=1)
        total = int(per_class[self.job_class].sum())
        has = np.flatnonzero(self.home >= 0)
        if has.size:
            in_row = np.isfinite(self.base[self.job_class[has], self.home[has]])
            at_home = np.isfinite(self.home_weight[has])
            total += int(at_home.sum()) - int(in_row.sum())
        return total


def best_reduced(
    problem: GroupedWeights, u: np.ndarray, jobs: np.ndarray | None = None, chunk_classes: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """For each job j: max over GPUs i of (w[i, j] − u[i]) and a GPU attaining it.

    Computed per class (the maximum of ``base[k] − u``, minus the job's
    penalty, against its home as the one exception — exact by the class's
    invariant), never per pair: O(classes × GPUs + jobs). Returns (−inf, −1)
    for a job with no finite pair.
    """
    jobs = np.arange(problem.n_jobs) if jobs is None else np.asarray(jobs, dtype=np.int64)
    u = np.asarray(u, dtype=np.float64)
    k_of = problem.job_class[jobs]
    top1, arg1 = class_max(problem.base, u, np.unique(k_of), chunk_classes)
    off_val = top1[k_of] - problem.penalty[jobs]
    h = problem.home[jobs]
    hv = np.full(jobs.shape, -np.inf)
    has = h >= 0
    hv[has] = problem.home_weight[jobs[has]] - u[h[has]]
    use_home = hv > off_val
    return np.where(use_home, hv, off_val), np.where(use_home, h, arg1[k_of])


def class_max(base: np.ndarray, u: np.ndarray, classes: np.ndarray, chunk_classes: int = 64):
    """(max, argmax) of ``base[k] − u`` for the given classes, as arrays over all classes (−inf, −1 elsewhere)."""
    top1 = np.full(base.shape[0], -np.inf)
    arg1 = np.full(base.shape[0], -1, dtype=np.int64)
    if base.shape[1] == 0:
        return top1, arg1
    for start in range(0, classes.size, chunk_classes):
        ks = classes[start : start + chunk_classes]
        red = base[ks] - u
        a1 = np.argmax(red, axis=1)
        t1 = red[np.arange(ks.size), a1]
        top1[ks] = t1
        arg1[ks] = np.where(np.isfinite(t1), a1, -1)
    return top1, arg1
