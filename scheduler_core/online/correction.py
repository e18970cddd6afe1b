"""Closed-loop correction of a service's slowdown allowance on its measured tail.

A round places an offline job beside an online replica when the *predicted* online slowdown stays within the
service's allowance (:class:`scheduler_core.domain.GpuCandidate.slowdown_allowance`). What the service cares
about is the outcome: its requests' p99 slowdown over its shared minutes against that allowance. The predictor
can miss it in two ways — a bias on the live mix of loads (the service's requests suffer more from a neighbour
than the co-location profiles showed), or a scatter that is right on average while single minutes land over
and under. Correcting on the predictor's per-minute error (measured over predicted increase) cannot tell the
two apart and tightens a service that already meets its target just because its predictions scatter. This
module corrects on the outcome instead: a feedback controller per service on its measured tail against its
allowance, which only acts where the allowance is actually missed.

Per service s, each shared replica-minute t of the recent window gives

    e_t = (measured_t − 1) / a_t

its measured slowdown increase in units of the allowance a_t it had declared for that minute (the uncorrected
one: ``measured_t = 1.25`` under ``a_t = 0.2`` is e = 1.25, a quarter over). The service's error signal is the
weighted 0.99-quantile of e_t (``quantile``), each minute weighing its requests — the service's p99 against its
allowance; E > 1: over, E < 1: within (:func:`tail`; a caller with a yardstick of its own, such as the
simulator's p99 of the requests, hands its E to :func:`step`). The controller keeps a factor c_s ≥ 1 per
service, starting at 1, and at each full round

    c_s ← clip(c_s · E_s^gain, 1, cap)

and the next round compares the predictions with ``allowance / c_s`` (:func:`corrected_allowance`). A service
over its allowance is tightened round after round until its tail is within; one within it relaxes back toward 1
— and never past it: the correction never makes a service looser than it declared, so a service that meets its
target at c = 1 keeps c = 1 and loses no sharing. It is integral action on log E: if the measured tail
increase scales with the allowance the round admits, log E falls by ``gain · log E`` each round.

*Rebasing.* The window holds minutes placed under older factors. Left as they are, a p99 over the window is held
up by the minutes of the looser factors before for as long as they make 1 % of it — nearly the whole window —
and the controller keeps tightening a service that is already within (windup: a 90-minute window with 15-minute
rounds tightened a service 1.5× over six rounds running, to c ≈ 2.8 where 1.5 sufficed). So each minute's excess
is rebased to the factor now in force, ``e_t · c_t / c`` (c_t: the factor its round placed it under, see
:func:`update`): what it would have measured under c if the increase scales with the allowance admitted. The
window's tail is then the tail the current factor yields, and the window can be long enough to hold a real
sample of the service's tail.

Defaults (:class:`CorrectionParams`), and why:

- *gain 0.5.* With gain 1 a single update would cancel the whole excess if the plant were exactly proportional;
  it is not (part of a tail is load that rises within a round's interval, which no allowance moves), and one
  window's tail is noisy, so a full step overshoots and the service oscillates around its allowance. Half the
  log-error per round converges geometrically (an excess of +40 % needs three or four 15-minute rounds to fall
  under +5 %) without chasing one round's burst.
- *window 120 minutes, no half-life.* Eight rounds' minutes, rebased: a few replicas × 120 minutes is a sample
  whose 0.99-quantile is not just its maximum, and the peaks of the last two hours count. A window of one round
  (15 minutes) needs no rebasing but holds too few minutes for a service on a few replicas (on ``muxflow run``'s
  simulated cluster two of its services ended +0.9 and +2.1 points further over their allowance than with 120);
  a day-long window reacts to a change of load too late. ``half_life_minutes`` can weigh recent
  minutes more.
- *min_minutes 30.* Below that many usable shared minutes in the window the factor stays as it is: a handful of
  minutes is mostly load noise, and its 0.99-quantile is its maximum.
- *cap 4.* One bad stretch of measurements cannot close a service to sharing altogether (an allowance of +20 %
  still admits +5 % predicted).

Only usable minutes count: measured slowdown and allowance finite (the allowance > 0), weight a positive finite
number, age within the window; NaN, ±inf, ``None`` (a gap in the latency) and minutes without requests are left
out, not imputed. A previous factor that is not a finite number ≥ 1 is taken as 1.

The module is pure (numpy only): the round runner feeds it the store's shared minutes and the previous round's
factors from its snapshot (``executors.scheduler.round_runner``), the fleet simulator its own minutes and the
factors its policy keeps (``scheduler_core.simulator.policies``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["NO_CORRECTION", "Correction", "CorrectionParams", "corrected_allowance", "rebase", "step", "summary",
           "tail", "update"]


def _is_int(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, int)


def _is_pos(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v > 0


@dataclass(frozen=True)
class CorrectionParams:
    """How the allowance correction reads a service's recent shared minutes and moves its factor (see the module's
    docstring for the mechanism and the defaults' reasons)."""

    quantile: float = 0.99  # the tail of the minutes' e = (measured − 1) / allowance the service is held to
    gain: float = 0.5  # c ← c · E^gain per full round (0 < gain ≤ 1)
    window_minutes: int = 120  # minutes older than this are ignored
    half_life_minutes: float | None = None  # a minute's weight halves with every half-life of age; None: flat
    min_minutes: int = 30  # usable shared replica-minutes in the window before the factor moves
    cap: float = 4.0  # the factor never exceeds this (its floor is 1: never looser than declared)

    def __post_init__(self) -> None:
        if not (_is_pos(self.quantile) and self.quantile < 1):
            raise ValueError(f"quantile must lie in (0, 1), got {self.quantile!r}")
        if not (_is_pos(self.gain) and self.gain <= 1):
            raise ValueError(f"gain must lie in (0, 1], got {self.gain!r}")
        if not _is_int(self.window_minutes) or self.window_minutes < 1:
            raise ValueError(f"window_minutes must be an integer >= 1, got {self.window_minutes!r}")
        if self.half_life_minutes is not None and not _is_pos(self.half_life_minutes):
            raise ValueError(f"half_life_minutes must be a finite number > 0 or None, got {self.half_life_minutes!r}")
        if not _is_int(self.min_minutes) or self.min_minutes < 1:
            raise ValueError(f"min_minutes must be an integer >= 1, got {self.min_minutes!r}")
        if not (_is_pos(self.cap) and self.cap >= 1.0):
            raise ValueError(f"cap must be a finite number >= 1, got {self.cap!r}")


@dataclass(frozen=True)
class Correction:
    """One service's correction after a round's update: the factor, and what it rests on (logs, round metadata)."""

    factor: float  # c_s ≥ 1: the round uses allowance / factor; 1.0 = the allowance as declared
    minutes: int  # usable shared minutes inside the window
    tail: float | None  # E_s: the minutes' weighted quantile of (measured − 1) / allowance; None: too few minutes

    @property
    def active(self) -> bool:
        """Whether the allowance is tightened."""
        return self.factor != 1.0

    def as_json(self) -> dict:
        return {"factor": round(self.factor, 4), "minutes": self.minutes,
                "tail": None if self.tail is None else round(float(self.tail), 4)}


NO_CORRECTION = Correction(1.0, 0, None)


def _floats(values: Iterable) -> np.ndarray:
    """A float array of ``values`` with ``None`` (or anything not a number) as NaN."""
    if isinstance(values, np.ndarray) and values.dtype.kind == "f":
        return values.astype(float, copy=False).ravel()
    out = []
    for v in values:
        try:
            out.append(float(v) if v is not None else math.nan)
        except (TypeError, ValueError):
            out.append(math.nan)
    return np.asarray(out, dtype=float)


def tail(measured, allowance, weight, age_minutes, params: CorrectionParams = CorrectionParams(), scale=None
         ) -> tuple[float | None, int]:
    """(E, n): the weighted ``params.quantile`` of ``(measured − 1) / allowance`` over the usable minutes, and their
    number n; E is None below ``params.min_minutes`` usable minutes.

    ``measured``: each shared minute's slowdown *ratio* (latency over latency alone, 1.25 = +25 %), ``allowance``:
    the allowance the service declared for it (0.2 = +20 %; a scalar applies to every minute), ``weight``: its
    requests (QPS or a count), ``age_minutes``: how long before the round it was (≥ 0). Aligned sequences or
    arrays; entries that are None, NaN or infinite, allowances and weights that are not > 0 and ages outside the
    window are left out.
    """
    m, w, age = (_floats(x) for x in (measured, weight, age_minutes))
    a = _floats(allowance) if np.ndim(allowance) else np.full(m.size, _floats([allowance])[0])
    if not m.size == a.size == w.size == age.size:
        raise ValueError(f"measured, allowance, weight and age_minutes must be aligned, got lengths "
                         f"{m.size}, {a.size}, {w.size}, {age.size}")
    with np.errstate(invalid="ignore"):
        ok = (np.isfinite(m) & np.isfinite(a) & (a > 0) & np.isfinite(w) & (w > 0) & np.isfinite(age)
              & (age >= 0) & (age < params.window_minutes))
    n = int(ok.sum())
    if n < params.min_minutes:
        return None, n
    e = (m[ok] - 1.0) / a[ok]
    if scale is not None:  # each minute rebased (see update); a scale that is not a finite number > 0 counts as 1
        k = _floats(scale) if np.ndim(scale) else np.full(m.size, _floats([scale])[0])
        if k.size != m.size:
            raise ValueError(f"scale must be aligned with measured, got lengths {k.size}, {m.size}")
        k = k[ok]
        with np.errstate(invalid="ignore"):
            e = e * np.where(np.isfinite(k) & (k > 0), k, 1.0)
    w, age = w[ok], age[ok]
    if params.half_life_minutes is not None:
        w = w * np.exp2(-age / params.half_life_minutes)
    return _weighted_quantile(e, w, params.quantile), n


def update(previous: float | None, measured, allowance, weight, age_minutes,
           params: CorrectionParams = CorrectionParams(), in_force=None) -> Correction:
    """One full round's step of a service's factor: ``clip(previous · E^gain, 1, cap)`` with E its tail against its
    allowance (:func:`tail`); ``previous`` as it is (clipped to [1, cap]) with too few minutes. ``previous`` None
    or not a finite number: 1 (no correction yet).

    ``in_force``: the factor each minute was placed under (aligned with ``measured``; a scalar, None, or an entry
    that is not a finite number > 0: ``previous``). Each minute's excess is rebased to the factor now in force,
    ``e · in_force / previous`` — under a factor twice as tight the placements admit half the predicted increase
    — so that the window's tail is what the current factor yields, not what older, looser ones did.
    """
    c = _clipped(previous, params)
    scale = rebase(in_force, c, _floats(measured).size, params)
    e, n = tail(measured, allowance, weight, age_minutes, params, scale)
    return step(c, e, n, params)


def _clipped(previous, params: CorrectionParams) -> float:
    return 1.0 if previous is None or not _is_pos(previous) else min(params.cap, max(1.0, float(previous)))


def rebase(in_force, previous: float, n: int, params: CorrectionParams = CorrectionParams()) -> np.ndarray | None:
    """Each minute's rebasing scale ``in_force / previous`` (see :func:`update`); None where ``in_force`` is None."""
    if in_force is None:
        return None
    k = _floats(in_force) if np.ndim(in_force) else np.full(n, _floats([in_force])[0])
    with np.errstate(invalid="ignore"):
        k = np.where(np.isfinite(k) & (k > 0), k, previous)
    return np.clip(k, 1.0, params.cap) / _clipped(previous, params)


def step(previous: float | None, e: float | None, minutes: int, params: CorrectionParams = CorrectionParams()
         ) -> Correction:
    """The controller's step from a tail E already measured (:func:`tail`, or a caller's own yardstick of the
    service's p99 against its allowance): ``clip(previous · E^gain, 1, cap)``; E None: ``previous`` as it is."""
    c = _clipped(previous, params)
    if e is None or not math.isfinite(e):
        return Correction(c, minutes, None)
    # E ≤ 0 (shared minutes measured no slower than alone): as far within as it gets, relax fully
    factor = math.exp(params.gain * math.log(e)) if e > 0 else 0.0
    return Correction(float(min(params.cap, max(1.0, c * factor))), minutes, float(e))


def _weighted_quantile(x: np.ndarray, w: np.ndarray, q: float) -> float:
    """The smallest ``x`` whose share of the total weight at or below it reaches ``q``."""
    order = np.argsort(x, kind="stable")
    cum = np.cumsum(w[order])
    return float(x[order][min(int(np.searchsorted(cum, q * cum[-1])), x.size - 1)])


def corrected_allowance(allowance: float, correction: Correction | float) -> float:
    """The allowance a round compares predictions with: ``allowance / c_s``.

    A negative allowance (a replica that misses its SLO alone: nothing is feasible) stays as it is.
    """
    factor = correction.factor if isinstance(correction, Correction) else float(correction)
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"a correction factor must be a finite number > 0, got {factor!r}")
    return allowance / factor if allowance > 0 else allowance


def summary(corrections: Mapping[str, Correction]) -> str:
    """One log line: each service's factor, its tail against its allowance and the minutes it rests on."""
    parts = [f"{k} c={c.factor:.2f} (allowance ×{1 / c.factor:.2f}, p99/allowance "
             f"{'n/a' if c.tail is None else f'{c.tail:.2f}'}, {c.minutes} shared min)"
             for k, c in sorted(corrections.items())]
    return ", ".join(parts) or "no services"
