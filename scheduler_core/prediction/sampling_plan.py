"""Which co-location points to measure next, within a GPU-time budget (paper §6).

A *point* is (GPU type, online service, offline job type, SM %). Points are
measured in *runs*: one session on one GPU measures a (service, job type) pair's
SM percentages co-located, each between solo windows of the service (before the
first point and after every point) and the whole sweep between solo windows of the
job (before and after), so a run of k points costs ``baseline_s + k × point_s``:
three solo windows, then two windows (co-located, then the service alone) a point.

The plan is greedy on information per GPU-second. A point's value is

- ``UNSEEN_TYPE`` if the GPU type has no sample of its job type (neither stored
  nor already planned) — a predictor knows nothing about a job type it never saw;
- plus ``UNSEEN_PAIR`` if the (service, job type) pair has none;
- plus how far its SM % is from the pair's nearest measured SM % (0–1; with
  none yet, 1 − |SM % − 50| / 100): a pair's sweep starts at 50 % and fills the
  widest gaps first (10, 90, 30, 70, …);
- a point measured before is worth only ``REPEAT`` / (1 + times measured).

Its cost is ``point_s``, plus ``baseline_s`` when it opens a run. The point with
the highest value per second that fits the remaining budget is taken, values are
updated, and so on until nothing fits. The weights make every unseen job type's
first point come before anything else (a new type's first point is worth more
than 100 of anything else), then unseen pairs, then the sweep.

Pure: plain data in, plain data out; deterministic (ties by name, then SM %).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

UNSEEN_TYPE = 100.0
UNSEEN_PAIR = 10.0
REPEAT = 0.1


@dataclass(frozen=True)
class PairCandidate:
    """A (service, job type) pair that can be measured on a GPU type, at the service's load ``qps``."""

    gpu_type: str
    service: str
    job_type: str
    qps: float


@dataclass(frozen=True)
class SamplingCost:
    """GPU seconds: each measurement window (co-located or solo, ``window_s``) plus the start-up of its processes."""

    window_s: float
    setup_s: float = 0.0

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.setup_s < 0:
            raise ValueError("window_s must be positive and setup_s non-negative")

    @property
    def one_window_s(self) -> float:
        return self.window_s + self.setup_s

    @property
    def point_s(self) -> float:
        """What a point adds to its run: its co-located window and the service's solo window after it."""
        return 2.0 * self.one_window_s

    @property
    def baseline_s(self) -> float:
        """What every run spends besides its points: the service alone before the first point, the job alone
        before and after the sweep."""
        return 3.0 * self.one_window_s


@dataclass(frozen=True)
class PlannedRun:
    gpu_type: str
    service: str
    job_type: str
    qps: float
    sm_pcts: tuple[int, ...]
    cost_s: float
    opens_job_type: bool   # the GPU type had no sample of this job type


@dataclass
class SamplingPlan:
    runs: list[PlannedRun] = field(default_factory=list)
    budget_s: float = 0.0
    order: list[tuple[str, str, str, int]] = field(default_factory=list)  # points in the order chosen

    @property
    def cost_s(self) -> float:
        return sum(r.cost_s for r in self.runs)

    @property
    def points(self) -> int:
        return sum(len(r.sm_pcts) for r in self.runs)


def plan_sampling(
    candidates: Iterable[PairCandidate],
    measured: Mapping[tuple[str, str, str], Mapping[int, int]],
    budget_s: float,
    cost: SamplingCost,
    sm_grid: Iterable[int] = (10, 20, 30, 40, 50, 60, 70, 80, 90),
) -> SamplingPlan:
    """``measured[(gpu_type, service, job_type)][sm_pct]`` = samples already stored for that point."""
    if budget_s < 0:
        raise ValueError("budget_s must be >= 0")
    grid = sorted({int(p) for p in sm_grid})
    if not grid or grid[0] < 1 or grid[-1] > 100:
        raise ValueError("SM percentages must lie within 1..100")
    pairs = {(c.gpu_type, c.service, c.job_type): c for c in candidates}
    counts: dict[tuple[str, str, str], dict[int, int]] = {
        k: {int(p): int(n) for p, n in v.items() if n > 0} for k, v in measured.items()}
    seen_types = {(g, j) for (g, _s, j), v in counts.items() if v}
    planned: dict[tuple[str, str, str], list[int]] = {}
    opens: dict[tuple[str, str, str], bool] = {}
    plan = SamplingPlan(budget_s=budget_s)
    left = budget_s

    def value(key: tuple[str, str, str], sm: int) -> float:
        have = counts.get(key, {})
        done = set(have) | set(planned.get(key, ()))
        v = 0.0
        if (key[0], key[2]) not in seen_types:
            v += UNSEEN_TYPE
        if not done:
            v += UNSEEN_PAIR
        if sm in done:
            return v + REPEAT / (1 + have.get(sm, 0) + planned.get(key, []).count(sm))
        return v + (min(abs(sm - d) for d in done) / 100.0 if done else 1.0 - abs(sm - 50) / 100.0)

    while True:
        best = None
        for key in sorted(pairs):
            extra = 0.0 if key in planned else cost.baseline_s
            c = cost.point_s + extra
            if c > left + 1e-9:
                continue
            for sm in grid:
                if sm in planned.get(key, ()):
                    continue  # one measurement of a point per plan
                score = value(key, sm) / c
                if best is None or score > best[0] + 1e-12:
                    best = (score, key, sm, c)
        if best is None:
            break
        _, key, sm, c = best
        if key not in planned:
            opens[key] = (key[0], key[2]) not in seen_types
        planned.setdefault(key, []).append(sm)
        seen_types.add((key[0], key[2]))
        left -= c
        plan.order.append((*key, sm))
    for key, sms in planned.items():
        cand = pairs[key]
        plan.runs.append(PlannedRun(cand.gpu_type, cand.service, cand.job_type, cand.qps, tuple(sorted(sms)),
                                    cost.baseline_s + cost.point_s * len(sms), opens[key]))
    first: dict[tuple[str, str, str], int] = {}
    for i, point in enumerate(plan.order):
        first.setdefault(point[:3], i)
    plan.runs.sort(key=lambda r: first[(r.gpu_type, r.service, r.job_type)])
    return plan
