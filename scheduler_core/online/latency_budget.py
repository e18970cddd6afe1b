"""A service's slowdown budget over its requests: share the GPU more in quiet minutes, less at the peak.

A flat slowdown allowance (paper §4.3: at most +20 % on every minute) treats a minute at the daily
trough, with a tenth of the peak's requests, like a minute at the peak. What a service's users feel is
the slowdown of their requests, so a service may instead declare a *budget*: the mean slowdown of its
requests, each weighted by its latency alone, over the day (``slowdown_budget``, e.g. 0.1), with its
per-minute allowance as a cap (``slowdown_allowance``). The round then gives each GPU-interval the
allowance

    a_t = min(cap, λ / w_t)

where ``w_t`` is the interval's request weight (its requests × their latency alone) and ``λ`` the
*water level*: the largest per-minute spend with which the replica's last day, replayed with these
allowances, meets the budget — ``Σ_t min(cap · w_t, λ) = budget · Σ_t w_t``. Quiet minutes (small
``w``) get up to the cap; busy ones get less than the budget; every minute spends at most ``λ``
(request-weighted slowdown units). A budget at or above the cap is the flat allowance (the cap); a
replica with no load in its history gets the budget itself, flat.

The weight of a minute comes from what the monitors report: requests follow the replica's SM activity
(its load, :mod:`scheduler_core.online.load`), their latency alone the service's fitted latency curve
(:mod:`scheduler_core.online.latency_model`) where it has one, else a constant. The last day stands for the
coming one (the forecaster's periodicity, :mod:`scheduler_core.online.forecast`); a replica with less
history is budgeted over what it has.
"""

from __future__ import annotations

import numpy as np

from scheduler_core.online.latency_model import LatencyCurve

DAY_MINUTES = 24 * 60
# What a service declares when it says nothing: its requests' mean slowdown over the day within +10 %, each minute's
# predicted slowdown within +25 % (the allowance, the p99 its shared minutes are held to by the allowance correction,
# under the +30 % a minute must never reach). The budget is paced to the cluster's headroom
# (scheduler_core.online.budget_pacing); docs/EVALUATION.md has how these were chosen against the paper's flat +20 %.
DEFAULT_SLOWDOWN_BUDGET = 0.1
DEFAULT_SLOWDOWN_ALLOWANCE = 0.25
ROWS_PER_CHUNK = 2048  # replicas whose water levels are computed together (memory: ~12 arrays of rows × day)


def request_weights(sm_pct, curve: LatencyCurve | None = None) -> np.ndarray:
    """Each minute's weight in the request-weighted mean latency: SM activity (∝ requests) × mean latency alone.

    NaN (a missing minute) and negative activity weigh 0; without a latency curve every request weighs 1.
    """
    x = np.asarray(sm_pct, dtype=float)
    x = np.where(np.isfinite(x), np.maximum(x, 0.0), 0.0)
    return x if curve is None else x * curve.mean_at(x)


def water_levels(weights, budget, cap) -> np.ndarray:
    """Per row of ``weights`` (replicas × minutes), λ with ``Σ_t min(cap·w_t, λ) = budget · Σ_t w_t``.

    ``budget`` and ``cap`` are scalars or one value per row. ``inf`` where the budget is at least the cap
    (every minute may take the cap) and NaN where the row weighs nothing (no requests to budget).
    """
    w = np.asarray(weights, dtype=float)
    if w.ndim != 2:
        raise ValueError(f"expected a (replicas, minutes) array of weights, got shape {w.shape}")
    rows, n = w.shape
    b = np.broadcast_to(np.asarray(budget, dtype=float), (rows,))
    c = np.broadcast_to(np.asarray(cap, dtype=float), (rows,))
    if np.any(b < 0) or np.any(c < 0) or not (np.isfinite(b).all() and np.isfinite(c).all()):
        raise ValueError("slowdown budgets and caps must be finite and >= 0")
    if n == 0:
        return np.full(rows, np.nan)
    w = np.where(np.isfinite(w), np.maximum(w, 0.0), 0.0)
    total = w.sum(axis=1)
    target = b * total
    spend = np.sort(c[:, None] * w, axis=1)  # each minute's spend at the cap, ascending
    done = np.cumsum(spend, axis=1)
    # Spent in all with λ at the k-th smallest cap spend: the k+1 smallest in full, the rest at λ.
    at_k = done + (n - 1 - np.arange(n)) * spend
    k = np.argmax(at_k >= target[:, None], axis=1)
    before = np.where(k > 0, done[np.arange(rows), np.maximum(k - 1, 0)], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        level = (target - before) / (n - k)
    level = np.where(b >= c, np.inf, level)
    return np.where(total > 0, level, np.nan)


def allowances(forecast_weight, levels, budget, cap) -> np.ndarray:
    """Each replica's allowance for the coming interval: ``min(cap, λ / w)``.

    The cap where the forecast weighs nothing (no requests to slow) or the level is ``inf``; the budget
    itself where the level is NaN (no history to shape it) or the forecast is unknown.
    """
    wf = np.asarray(forecast_weight, dtype=float)
    lv = np.asarray(levels, dtype=float)
    b = np.broadcast_to(np.asarray(budget, dtype=float), wf.shape)
    c = np.broadcast_to(np.asarray(cap, dtype=float), wf.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        shaped = np.where(wf > 0, np.minimum(c, lv / np.where(wf > 0, wf, 1.0)), c)
    flat = np.minimum(b, c)
    return np.where(np.isfinite(wf) & ~np.isnan(lv), shaped, flat)


def budget_allowances(history_sm, forecast_sm, budget, cap, curve: LatencyCurve | None = None,
                      window_minutes: int = DAY_MINUTES) -> np.ndarray:
    """Allowances of replicas with SM histories ``history_sm`` (replicas × minutes, oldest first, NaN: missing)
    and forecasts ``forecast_sm`` (%), budgeted over their last ``window_minutes``; one latency curve for all
    (None: requests weigh alike). Where ``budget`` is NaN the replica has no budget: its cap, flat."""
    h = np.asarray(history_sm, dtype=float)
    if h.ndim == 1:
        h = h[None, :]
    fc = np.atleast_1d(np.asarray(forecast_sm, dtype=float))
    if h.shape[0] != fc.size:
        raise ValueError(f"{h.shape[0]} histories for {fc.size} forecasts")
    b = np.broadcast_to(np.asarray(budget, dtype=float), fc.shape)
    c = np.broadcast_to(np.asarray(cap, dtype=float), fc.shape)
    b_eff = np.where(np.isnan(b), c, b)
    levels = np.empty(fc.size)
    for lo in range(0, fc.size, ROWS_PER_CHUNK):  # a few sorted (rows × day) arrays at a time, not the fleet's
        hi = lo + ROWS_PER_CHUNK
        levels[lo:hi] = water_levels(request_weights(h[lo:hi, -window_minutes:], curve), b_eff[lo:hi], c[lo:hi])
    wf = np.where(np.isfinite(fc), request_weights(fc, curve), np.nan)
    return allowances(wf, levels, b_eff, c)  # no budget: b_eff is the cap, so the level is inf or NaN: the cap

