"""Pacing a service's slowdown budget to the cluster's headroom.

A service's budget B (:mod:`scheduler_core.online.latency_budget`) is a promise about *all* of its requests: their
mean slowdown stays within B. A round turns it into per-minute allowances as if every minute of the replica shared
its GPU, at exactly its allowance. Neither holds in a real cluster, and how far off it is depends on the load:

- *Headroom.* With more GPUs than offline work, most of a service's requests run on replicas with no offline job
  beside them (they spend nothing), so the shared minutes could each take up to the per-minute cap and the
  service's mean would stay far within B. Planning them at B shares too little.
- *Overload.* With more offline work than GPUs nearly every minute is shared, and the service's mean is the mean of
  its shared minutes: planning at the cap breaks the promise.
- A shared minute's slowdown lands below or above its allowance (the predictor's margin, the discrete shares, the
  load's bursts), by a ratio that is not known in advance.

So the round plans with a paced budget ``min(cap, k · B)``, and k follows what the service's requests actually
spent. Per service, over each of its replica-minutes t of the window (the last day),

    S = Σ_t (slowdown_t − 1) · max(1, k / k_t) · w_t / Σ_t w_t

with ``w_t`` the minute's request weight (its requests × their latency alone, as the mean latency over all the
service's requests weighs them), an unshared minute's slowdown 1, and k_t the k the minute was planned under: the
mean slowdown over all the service's requests of the last day — the quantity it declared B for — with the minutes
planned under a lower k counted at the k now in force (below). At each full round

    k ← clip(k · (σ · B / S)^gain, floor, cap / B)        (S = 0: k = cap / B)

starting at cap / B (nothing spent yet: :func:`step`), with σ = 0.95 the set point (below). A service with
headroom stays at its cap; under overload it is planned within a few rounds at what keeps its requests' day at
σ · B. It is integral action on log(S / σB).

What it corrects besides the load: the round's allowances for an interval are ``λ / w`` at the *forecast* weight,
and the forecast is conservative (never below the recent 0.9-quantile), so even a replica shared every minute
spends less than its water level planned; and a shared minute's slowdown lands below its allowance by the
predictor's margin and the discrete shares. Both show in S.

*Why a day.* The water level moves the spend into quiet minutes on purpose, so an hour in a trough spends more
than B and an hour at the peak less; a shorter window reads the first as overspending and the second as headroom
and undoes the shift (on the fleet simulator under overload, windows of a few hours gave much longer JCTs than a
day's: docs/EVALUATION.md).

*Why the one-sided rebasing.* A day's window answers slowly: a round's new k moves S by one interval's minutes in
a day's. An integral controller on that S alone keeps stepping for hours after the fact and swings between its
floor and its cap from one day to the next. Counting each minute at the k now in force (as the allowance correction
rebases its minutes, :func:`scheduler_core.online.correction.rebase`) makes S answer at once; but counted down, the
spend made under a looser k would be forgiven, and a day that was overspent would end over its budget. So a minute
planned under a *lower* k counts what it would spend now (a loosening shows in S at once), and one planned under a
higher k counts what it did spend (what was spent stays spent: an overspent morning leaves less for the
afternoon). Until the window holds ``min_minutes`` minutes with requests, k stays.

*Why a set point under the budget.* The budget is a bound the service's users were promised, not a level to hover
at: a controller aimed at B ends half its days over it. While k settles — the first day, from an empty window, or
after the load changes — the day's mean overshoots the aim by a few per cent (up to 4.5 % on the daily-cycle plant
of ``tests/scheduler_core/online/test_budget_pacing.py``), so it aims 5 % under.

The module is pure: the round runner feeds it the store's replica-minutes of the last interval and the previous
round's k from its snapshot (``executors.scheduler.round_runner``), the fleet simulator its own minutes
(``scheduler_core.simulator.policies``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["PacingParams", "paced_budget", "spent", "step"]


@dataclass(frozen=True)
class PacingParams:
    """How a service's paced budget follows its spend (the module's docstring has the why of each).

    gain: the exponent of each round's step, as in the allowance correction: half the log-error per round.
    floor: the lowest k: a service that overspends even at its declared budget is planned down to a quarter of it,
    not closed to sharing.
    min_minutes: replica-minutes with requests below which the window says nothing and k stays.
    window_minutes: the minutes whose requests make the spend (a day: the water level's own horizon).
    setpoint: the fraction of the budget the pacing aims at (under it by the controller's overshoot while settling).
    """

    gain: float = 0.5
    floor: float = 0.25
    min_minutes: int = 30
    window_minutes: int = 24 * 60
    setpoint: float = 0.95

    def __post_init__(self) -> None:
        if not (0 < self.gain <= 1):
            raise ValueError("pacing gain must be in (0, 1]")
        if not (0 < self.floor <= 1):
            raise ValueError("pacing floor must be in (0, 1]")
        if self.min_minutes < 1 or self.window_minutes < 1:
            raise ValueError("pacing min_minutes and window_minutes must be >= 1")
        if not (0 < self.setpoint <= 1):
            raise ValueError("pacing setpoint must be in (0, 1]")


def spent(slowdown, weight, k_then=None, k_now: float = 1.0) -> tuple[float | None, int]:
    """What a service's replica-minutes spent, request-weighted (``S`` of the module's docstring), and how many
    minutes counted.

    ``slowdown`` is each minute's latency over its latency alone (NaN: no offline job beside the replica, counted as
    1; below 1: counted as 1, a minute cannot spend less than nothing); ``weight`` its requests × their latency
    alone. ``k_then`` is the k each minute was planned under (None, NaN or ≤ 0: ``k_now``): a minute planned under a
    lower k than ``k_now`` counts its increase × ``k_now / k_then``, what it would spend now; one planned under a
    higher k counts as it was. A minute counts where its weight is a positive finite number. (None, 0) where none
    does.
    """
    s = np.asarray(slowdown, dtype=float)
    w = np.asarray(weight, dtype=float)
    if s.shape != w.shape:
        raise ValueError(f"{s.size} slowdowns for {w.size} weights")
    ok = np.isfinite(w) & (w > 0)
    n = int(ok.sum())
    if n == 0:
        return None, 0
    inc = np.where(np.isfinite(s), np.maximum(s - 1.0, 0.0), 0.0)
    if k_then is not None:
        then = np.broadcast_to(np.asarray(k_then, dtype=float), w.shape)
        then = np.where(np.isfinite(then) & (then > 0), then, k_now)
        inc = inc * np.maximum(k_now / then, 1.0)
    return float((inc[ok] * w[ok]).sum() / w[ok].sum()), n


def step(prev: float | None, spend: float | None, n: int, budget: float, cap: float,
         p: PacingParams = PacingParams()) -> float:
    """One full round's update of a service's k from its window's spend (:func:`spent`).

    ``prev`` None: no k on record. A service with none and too few minutes to tell starts at its cap: it has spent
    nothing yet, and the half-hour it takes to have ``min_minutes`` of evidence can spend at most
    ``cap · min_minutes / window`` on the day's mean (+0.5 points at a +25 % cap), which the pacing then takes back."""
    if not (budget > 0 and cap > budget):
        return 1.0  # nothing to pace: no budget, or a budget at or above the cap (the flat rule)
    top = cap / budget
    no_evidence = spend is None or not math.isfinite(spend) or n < p.min_minutes
    if prev is None and no_evidence:
        return top
    k = prev if prev is not None and math.isfinite(prev) and prev > 0 else 1.0
    k = min(max(k, p.floor), top)
    if no_evidence:
        return k
    if spend <= 0:
        return top
    return float(min(max(k * (p.setpoint * budget / spend) ** p.gain, p.floor), top))


def paced_budget(budget: float | None, cap: float, k: float | None) -> float | None:
    """The budget a round plans a service with: ``min(cap, k · budget)`` (None: the service declares no budget)."""
    if budget is None:
        return None
    if k is None or not math.isfinite(k) or k <= 0:
        k = 1.0
    return float(min(cap, k * budget)) if cap > budget else float(budget)
