"""Scheduling policies of the evaluation (paper §7.3, §7.4), one signature and a registry.

A policy is a sharing mechanism (how a placed offline job shares its GPU, see
:mod:`scheduler_core.simulator.fleet`), whether SysMonitor protects the online
service, and a planner called once per round::

    planner(view: RoundView) -> (list[PlanAction], dict of round stats)

The MuxFlow family plans with the production round,
:func:`scheduler_core.round.plan.plan_round` — speed predictor, dynamic SM,
maximum-weight matching — configured as the ablation says:

- MuxFlow: dynamic SM + matching.
- MuxFlow-S: fixed SM percentage (``SmPolicy.fixed_pct``) + matching.
- MuxFlow-M: dynamic SM + first fit (``RoundConfig.matcher="first_fit"``).
- MuxFlow-S-M: fixed SM + first fit: only the protection mechanisms.

The baselines place first come, first served on the first GPU without an
offline job (Time-sharing, PB-time-sharing), or spread jobs over GPUs and let
each GPU run its residents shortest-remaining-time first (Salus).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from scheduler_core.domain import (
    Action,
    GpuCandidate,
    JobCandidate,
    OfflineFeatures,
    PlanAction,
)
from scheduler_core.online import budget_pacing
from scheduler_core.online.correction import Correction, corrected_allowance, rebase, step
from scheduler_core.online.dynamic_sm import SmPolicy
from scheduler_core.prediction.features import round_online_features
from scheduler_core.online.forecast import ForecastPolicy, forecast_many
from scheduler_core.online.latency_budget import budget_allowances
from scheduler_core.online.latency_model import ServiceLatencyModels
from scheduler_core.round.plan import RoundConfig, plan_round
from scheduler_core.simulator.config import SimConfig
from scheduler_core.simulator.metrics import mixture_p99
from scheduler_core.simulator.users import user_name


@dataclass
class RoundView:
    """What a planner may see at a round: the fleet (read-only by convention) and the time."""

    fleet: object  # scheduler_core.simulator.fleet.Fleet
    now_s: float
    between_rounds: bool = False  # a placement between rounds (SimConfig.between_rounds): start waiting jobs only


Planner = Callable[[RoundView], tuple[list[PlanAction], dict]]


@dataclass(frozen=True)
class Policy:
    name: str
    sharing: str  # none | mps | time | priority | salus
    protection: bool  # SysMonitor evicts offline work on Overlimit
    description: str
    make_planner: Callable[[SimConfig, object], Planner]


def _no_offline(cfg: SimConfig, inputs) -> Planner:
    return lambda view: ([], {})


def _muxflow(fixed_sm: bool, matcher: str) -> Callable[[SimConfig, object], Planner]:
    def make(cfg: SimConfig, inputs) -> Planner:
        if fixed_sm:
            sm = SmPolicy(fixed_pct=cfg.fixed_sm_pct)
        elif cfg.sm_fallback_levels is not None:
            sm = SmPolicy(fallback_levels=cfg.sm_fallback_levels)
        else:
            sm = SmPolicy()
        round_cfg = replace(inputs.round_config, sm=sm, matcher=matcher,
                            migration_penalty=cfg.round_migration_penalty(), max_jobs_per_gpu=cfg.max_jobs_per_gpu)
        return _MuxFlowPlanner(cfg, inputs, round_cfg)

    return make


class _MuxFlowPlanner:
    """Candidates from what the simulated monitors observed → the production round."""

    def __init__(self, cfg: SimConfig, inputs, round_cfg: RoundConfig):
        self.cfg, self.inputs, self.round_cfg = cfg, inputs, round_cfg
        self.forecast = ForecastPolicy(horizon_minutes=cfg.round_minutes)
        self.latency = ServiceLatencyModels()
        self.slos = cfg.service_slos_ms()
        self._profiles: dict[int, dict[str, OfflineFeatures]] = {}
        # The last round's forecast SM, p99 alone and allowance per GPU (placements between rounds reuse them).
        self._last: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        keep = cfg.allowance_correction is not None or cfg.budget_pacing is not None
        self.correction = _SharedMinutes(cfg) if keep else None  # the correction's and the pacing's minutes

    def profiles(self, fleet, type_index: int) -> dict[str, OfflineFeatures]:
        got = self._profiles.get(type_index)
        if got is None:
            name = fleet.jobs.types[type_index]
            got = {g: self.inputs.profiles[(name, g)] for g in fleet.type_names}
            self._profiles[type_index] = got
        return got

    def _latency_limits(self, f, recent: dict, hist: np.ndarray, fc: np.ndarray,
                        budgets: dict[str, float | None]) -> tuple[np.ndarray, np.ndarray]:
        """Each replica's p99 alone at its forecast load, from its service's latency model (NaN: no SLO or no
        model yet), and its allowance for the interval (its service's budget as paced, ``budgets``, where it
        declares one, shapes it from its SM history ``hist``: :mod:`scheduler_core.online.latency_budget`)."""
        out = np.full(f.n, np.nan)
        allow = np.asarray(f.allowance, dtype=float).copy()
        for s, spec in enumerate(self.cfg.services):
            budget = budgets.get(spec.name)
            if self.slos[s] is None and budget is None:
                continue
            for t, name in enumerate(f.type_names):
                idx = np.flatnonzero((f.service_index == s) & (f.gpu_type == t))
                if idx.size == 0:
                    continue
                # The samples are the replicas' own metrics (what the monitor attributes to the online service).
                self.latency.observe(spec.name, name, recent["sm"][idx], recent["latency"][idx])
                curve = self.latency.curve(spec.name, name)
                if curve is not None and self.slos[s] is not None:
                    out[idx] = curve.p99_at(fc[idx])
                if budget is not None:
                    allow[idx] = budget_allowances(hist[idx], fc[idx], budget, allow[idx], curve)
        return out, allow

    def __call__(self, view: RoundView) -> tuple[list[PlanAction], dict]:
        f = view.fleet
        if self.correction is not None:  # the minutes since the last call
            self.correction.take(f)
        recent = f.recent_online()
        run = f.running()
        if view.between_rounds and self._last is not None:
            # Between rounds: the round's forecast holds for its interval; only free GPUs take waiting jobs.
            fc, p99, allow = self._last
            free = np.ones(f.n, dtype=bool)
            free[f.gpu[run]] = False
            gpu_ids, job_ids = np.flatnonzero(free), f.queued()
        else:
            hist = f.sm_history()
            fc = forecast_many(hist, self.forecast)
            fc = np.where(np.isfinite(fc), fc, recent["sm"])
            budgets = {sv.name: sv.slowdown_budget for sv in self.cfg.services}
            if self.correction is not None and self.cfg.budget_pacing is not None:
                budgets = self.correction.paced(f, budgets)
            p99, allow = self._latency_limits(f, recent, hist, fc, budgets)
            if self.correction is not None and self.cfg.allowance_correction is not None:
                allow = self.correction.corrected(f, allow)
            self._last = (fc, p99, allow)
            gpu_ids, job_ids = range(f.n), np.concatenate([run, f.queued()])
        on_gpu = {int(f.gpu[j]): int(j) for j in run}
        gpus = []
        for i in gpu_ids:
            i = int(i)
            cur = on_gpu.get(i)
            gpus.append(GpuCandidate(
                gpu_id=i, gpu_type=f.gpu_type_name[i], memory_bytes=int(f.mem_total[i]),
                max_sm_clock_mhz=int(f.max_clock[i]), health=f.health_of(i),
                service_name=self.cfg.services[int(f.service_index[i])].name,
                online=round_online_features({k: v[i] for k, v in recent.items()}, fc[i]),
                forecast_sm_pct=float(fc[i]), forecast_mem_bytes=float(f.svc_mem[i]),
                slowdown_allowance=float(allow[i]),
                current_job_id=cur, current_sm_pct=int(f.sm_pct[cur]) if cur is not None else None,
                run_as_user=user_name(int(f.gpu_user[i])),
                latency_slo_ms=self.slos[int(f.service_index[i])],
                forecast_p99_ms=None if np.isnan(p99[i]) else float(p99[i]),
            ))
        all_types = frozenset(f.type_names)
        jobs = []
        # Solo seconds of work left on the reference GPU: what the trace tells (Salus's SRTF knows it too).
        remaining = (f.jobs.total_steps - f.steps_done) / f.sps_ref[f.jobs.job_type]
        # Queue order: running jobs, then waiting ones by arrival (the job table is in arrival order).
        for j in job_ids:
            j = int(j)
            running = f.state[j] == 2
            jobs.append(JobCandidate(
                job_id=j, mem_bytes=int(f.jobs.mem_bytes[j]), allowed_gpu_types=all_types,
                profiles=self.profiles(f, int(f.jobs.job_type[j])),
                current_gpu_id=int(f.gpu[j]) if running else None,
                current_sm_pct=int(f.sm_pct[j]) if running else None,
                run_as_user=user_name(int(f.job_user[j])),
                remaining_s=float(remaining[j]),
            ))
        result = plan_round(gpus, jobs, self.inputs.predictors, self.round_cfg)
        sm = self.round_cfg.sm
        return result.actions, {
            "placements": len(result.placements), "objective": result.objective,
            "certified_optimal": result.certified_optimal, "plan_s": result.timings_s.get("total", 0.0),
            "sm_pcts": [p.sm_pct for p in result.placements],
            "sm_bounds": (sm.fixed_pct, sm.fixed_pct) if sm.fixed_pct is not None else (sm.min_pct, sm.max_pct),
        }


class _SharedMinutes:
    """MuxFlow's allowance correction and budget pacing in the fleet simulator (:mod:`scheduler_core.online.correction`,
    :mod:`scheduler_core.online.budget_pacing`): the fleet's recent minutes as the pipeline's store keeps them — per
    GPU-minute the measured online slowdown (NaN: no offline job there), the requests, the latency alone, and the
    correction factor and pace the minute was planned under — in a ring of the longer of the two windows, and each
    service's factor and pace, which every full round updates from them.
    """

    def __init__(self, cfg: SimConfig):
        self.params = cfg.allowance_correction
        self.pacing = cfg.budget_pacing
        self.window = max(p.window_minutes for p in (self.params, self.pacing) if p is not None)
        self.n = cfg.gpus
        self.names = [sv.name for sv in cfg.services]
        self.measured = np.full((self.window, self.n), np.nan)
        self.weight = np.zeros((self.window, self.n))
        self.solo = np.full((self.window, self.n), np.nan)  # mean latency alone (ms)
        self.in_force = np.ones((self.window, self.n))  # the factor each GPU-minute's placements were made under
        self.paced_k = np.ones((self.window, self.n))  # the budget's pace k each GPU-minute was planned under
        self.minute = np.full(self.window, -np.inf)  # the fleet's minute count of each row
        self.written = 0  # rows written (the fleet's minutes taken)
        self.seen = 0  # the fleet's minutes_stepped at the last call
        self.factors: dict[str, Correction] = {}  # per service: its factor after the last full round
        self.paces: dict[str, float] = {}  # per service: its budget's pace k after the last full round
        self.current_k = np.ones(self.n)  # per GPU: its service's pace in force
        self.current = np.ones(self.n)  # per GPU: its service's factor in force

    def take(self, fleet) -> None:
        slow, qps, solo = fleet.shared_minutes(self.seen)
        first = fleet.minutes_stepped - slow.shape[0]
        for k in range(slow.shape[0]):
            row = self.written % self.window
            self.measured[row], self.weight[row], self.solo[row] = slow[k], qps[k], solo[k]
            self.in_force[row] = self.current
            self.paced_k[row] = self.current_k
            self.minute[row] = first + k
            self.written += 1
        self.seen = fleet.minutes_stepped

    def paced(self, fleet, budgets: dict[str, float | None]) -> dict[str, float | None]:
        """A full round's step of each budgeted service's pace (:mod:`scheduler_core.online.budget_pacing`) from
        every minute of its replicas in the pacing window — a minute without an offline job spends nothing — and
        the budgets the round plans with."""
        p = self.pacing
        age = self.seen - self.minute  # the latest minute taken is 1 minute old
        inside = (age >= 1) & (age <= p.window_minutes)
        out = dict(budgets)
        for s, name in enumerate(self.names):
            budget = budgets.get(name)
            cols = fleet.service_index == s
            if budget is None or not cols.any():
                continue
            cap = float(fleet.allowance[cols][0])
            prev = self.paces.get(name)  # None: no k yet (the service starts at its cap)
            spend, n = budget_pacing.spent(self.measured[inside][:, cols],
                                           self.weight[inside][:, cols] * self.solo[inside][:, cols],
                                           self.paced_k[inside][:, cols], prev or 1.0)
            k = budget_pacing.step(prev, spend, n, budget, cap, p)
            self.paces[name] = k
            self.current_k[cols] = k
            out[name] = budget_pacing.paced_budget(budget, cap, k)
        return out

    def corrected(self, fleet, allow: np.ndarray) -> np.ndarray:
        """A full round's step: each service's factor updated from its shared minutes' tail against its declared
        allowance, and each replica's allowance over its service's factor.

        The tail is the yardstick the simulator's metrics report (``shared_p99_norm``): the p99 of the requests of
        the window's shared minutes (a mixture of each minute's latency distribution, weighed by its requests)
        over the same requests' p99 alone — not the p99 of per-minute ratios, which sits above it (a minute's
        ratio is largest where the latency alone is small, and those requests are not the tail). Each minute's
        slowdown increase is rebased to the factor now in force (:func:`scheduler_core.online.correction.rebase`).
        """
        p = self.params
        age = (self.seen - self.minute)[:, None]  # minutes before this call
        inside = (age >= 0) & (age < p.window_minutes)
        out = np.asarray(allow, dtype=float).copy()
        for s, name in enumerate(self.names):
            cols = fleet.service_index == s
            if not cols.any():
                continue
            prev = self.factors.get(name)
            prev_c = None if prev is None else prev.factor
            slow, w, solo = self.measured[:, cols], self.weight[:, cols], self.solo[:, cols]
            ok = inside & np.isfinite(slow) & np.isfinite(w) & (w > 0) & np.isfinite(solo) & (solo > 0)
            n = int(ok.sum())
            e = None
            if n >= p.min_minutes:
                k = rebase(self.in_force[:, cols][ok], prev_c if prev_c is not None else 1.0, n, p)
                lat = solo[ok] * (1.0 + (slow[ok] - 1.0) * k)
                alone = mixture_p99(solo[ok], w[ok], p.quantile)
                e = (mixture_p99(lat, w[ok], p.quantile) / alone - 1.0) / float(fleet.allowance[cols][0])
            c = step(prev_c, e, n, p)
            self.factors[name] = c
            self.current[cols] = c.factor
            if c.factor != 1.0:
                out[cols] = np.array([corrected_allowance(float(a), c) for a in out[cols]])
        return out


def _first_come_first_fit(cfg: SimConfig, inputs) -> Planner:
    """Gandiva/AntMan-style packing: each waiting job, in arrival order, on the first GPU with no offline job."""

    def plan(view: RoundView) -> tuple[list[PlanAction], dict]:
        f = view.fleet
        busy = np.zeros(f.n, dtype=bool)
        busy[f.gpu[f.running()]] = True
        free = list(np.flatnonzero(~busy))
        actions = []
        room = f.mem_total - f.svc_mem
        k = 0
        for j in f.queued():
            while k < len(free) and room[free[k]] < f.jobs.mem_bytes[j]:
                k += 1
            if k >= len(free):
                break
            actions.append(PlanAction(Action.START, int(j), int(free[k]), None, None))
            k += 1
        return actions, {"placements": len(actions)}

    return plan


def _salus(cfg: SimConfig, inputs) -> Planner:
    """Salus: several resident jobs per GPU (memory permitting), each waiting job to the least-loaded GPU."""
    sh = cfg.sharing

    def plan(view: RoundView) -> tuple[list[PlanAction], dict]:
        f = view.fleet
        run = f.running()
        residents = np.bincount(f.gpu[run], minlength=f.n)
        mem_used = f.svc_mem.copy()
        np.add.at(mem_used, f.gpu[run], f.jobs.mem_bytes[run].astype(float))
        work = np.zeros(f.n)
        if run.size:
            np.add.at(work, f.gpu[run], (f.jobs.total_steps[run] - f.steps_done[run]) / f.solo_sps(run, f.gpu[run]))
        cap = f.mem_total * sh.salus_mem_frac
        actions = []
        for j in f.queued():
            ok = (residents < sh.salus_max_resident) & (mem_used + f.jobs.mem_bytes[j] <= cap)
            if not ok.any():
                break
            score = np.where(ok, residents * 1e12 + work, np.inf)
            g = int(np.argmin(score))
            actions.append(PlanAction(Action.START, int(j), g, None, None))
            residents[g] += 1
            mem_used[g] += f.jobs.mem_bytes[j]
            work[g] += f.jobs.total_steps[j] / float(f.solo_sps(np.array([j]), np.array([g]))[0])
        return actions, {"placements": len(actions)}

    return plan


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("online-only", "none", False, "Online services alone: the latency reference (paper §7.3)", _no_offline),
        Policy("time-sharing", "time", False, "GPU-driver time slices, first come first fit (Gandiva)",
               _first_come_first_fit),
        Policy("pb-time-sharing", "priority", False,
               "Priority time slices for online work, first come first fit (AntMan, PAI)", _first_come_first_fit),
        Policy("muxflow", "mps", True, "Dynamic SM + matching + protection (paper)", _muxflow(False, "km")),
        Policy("muxflow-s", "mps", True, "Fixed SM percentage + matching + protection", _muxflow(True, "km")),
        Policy("muxflow-m", "mps", True, "Dynamic SM + first fit + protection", _muxflow(False, "first_fit")),
        Policy("muxflow-s-m", "mps", True, "Fixed SM + first fit: protection only", _muxflow(True, "first_fit")),
        Policy("salus", "salus", False, "Iteration-level time sharing, SRTF among resident jobs (Salus)", _salus),
    )
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
