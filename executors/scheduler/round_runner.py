"""Runs one scheduling round against the store and a cluster, and books what the cluster reports.

The same code path serves the simulated cluster and (later) Slurm: snapshot
from the store → ``scheduler_core.round.plan.plan_round`` → round and placements
stored → each action logged as intent, sent, then logged with its result
(an action key makes a repeated dispatch a no-op) → job states moved.
"""

from __future__ import annotations

import bisect
import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

import numpy as np

from executors.cluster import Cluster, IntervalReport
from executors.store import dispatch as dispatch_log
from executors.store import inventory, repo
from executors.store import models as m
from executors.store.summary import recent_shared_minutes, service_minutes
from executors.store.db import Session, Store
from executors.store.jobs import transition
from executors.store.rounds import (
    fills_of_window,
    latest_round,
    latest_round_window,
    round_for_window,
    round_snapshot_values,
    stored_result,
)
from scheduler_core.domain import (
    SCHEDULABLE_JOB_STATES,
    Action,
    GpuCandidate,
    GpuHealth,
    IllegalTransition,
    JobCandidate,
    JobState,
    PlanAction,
    RoundResult,
)
from scheduler_core.jobs.admission import remaining_solo_s
from scheduler_core.online import budget_pacing
from scheduler_core.online.budget_pacing import PacingParams
from scheduler_core.online.dynamic_sm import SmPolicy
from scheduler_core.online import correction as allowance_correction
from scheduler_core.online.correction import NO_CORRECTION, Correction, CorrectionParams, corrected_allowance
from scheduler_core.online.forecast import ForecastPolicy, forecast_next
from scheduler_core.online.latency_budget import budget_allowances
from scheduler_core.online.latency_model import LatencyCurve
from scheduler_core.online.latency_model import fit as fit_latency
from scheduler_core.online.split import fill_split_gaps, fit_split
from scheduler_core.prediction.features import round_online_features
from scheduler_core.round.clock import DEFAULT_PERIOD_S
from scheduler_core.round.plan import RoundConfig, from_snapshot, plan_round, snapshot

log = logging.getLogger(__name__)

HISTORY = dt.timedelta(hours=25)
FEATURE_WINDOW_MIN = 15
# How rounds correct each service's allowance on its measured tail against it (scheduler_core.online.correction).
CORRECTION = CorrectionParams()
# How rounds pace a budgeted service's budget to what its requests spent (scheduler_core.online.budget_pacing).
PACING = PacingParams()


class RoundOrderError(ValueError):
    """A round was asked for a window at or before the latest stored round."""


class NoPredictorError(RuntimeError):
    """No promoted speed predictor exists."""

    MESSAGE = "no promoted speed predictor in the store: train one first (muxflow train)"


def require_predictor(store: Store) -> None:
    """Refuse a round before it changes anything (history recorded, jobs profiled, states synced) when it
    could not plan: no promoted speed predictor. NoPredictorError."""
    with store.session() as s:
        if not repo.has_promoted_predictor(s):
            raise NoPredictorError(NoPredictorError.MESSAGE)


def _by_service_type(rows, series) -> dict[tuple[str, str], list[dict[str, np.ndarray]]]:
    """The GPUs' series pooled per (service, GPU type): what the round fits its per-service models on."""
    pooled: dict[tuple[str, str], list[dict[str, np.ndarray]]] = {}
    for gpu, gtype, svc, _replica in rows:
        pooled.setdefault((svc.name, gtype.name), []).append(series[gpu.id])
    return pooled


def _latency_curves(pooled) -> dict[tuple[str, str], LatencyCurve | None]:
    """Per (service, GPU type), the replicas' latency alone against their SM activity over the history."""
    return {k: fit_latency(np.concatenate([s["sm"] for s in v]), np.concatenate([s["latency"] for s in v]))
            for k, v in pooled.items()}


def _split_filled(rows, series, pooled) -> dict[int, dict[str, np.ndarray]]:
    """Each GPU's series with the online split's gap minutes estimated from the replica's request rate.

    The curves are fitted per (service, GPU type) on the minutes the monitors could split
    (:mod:`scheduler_core.online.split`): under MPS a real GPU has none while an offline job runs.
    """
    curves = {k: fit_split(v) for k, v in pooled.items()}
    out, gpus, minutes = {}, 0, 0
    for gpu, gtype, svc, _replica in rows:
        out[gpu.id], filled = fill_split_gaps(series[gpu.id], curves[(svc.name, gtype.name)])
        if filled.any():
            gpus, minutes = gpus + 1, minutes + int(filled.sum())
    if gpus:
        log.info("online SM activity estimated from the request rate on %d GPUs (%d minutes the monitors could "
                 "not split)", gpus, minutes)
    return out


def stored_corrections(rnd: m.SchedulingRound | None) -> dict[str, Correction]:
    """The factors a round stored in its snapshot (``allowance_correction``): the controller's state between rounds,
    and what a fill of the round's window uses as it is. None, or a snapshot without them: no service corrected."""
    stored = (rnd.snapshot or {}).get("allowance_correction") if rnd is not None else None
    return {name: Correction(factor, int(c.get("minutes") or 0), c.get("tail"))
            for name, (factor, c) in _snapshot_entries(stored, "factor").items() if 1.0 < factor < float("inf")}


def _snapshot_entries(stored: object, field: str) -> dict[str, tuple[float, dict]]:
    """A snapshot's per-service entries (``allowance_correction``, ``budget_pacing``) read back: per service, its
    numeric ``field`` and its entry (entries without one are skipped)."""
    out = {}
    for name, c in (stored if isinstance(stored, dict) else {}).items():
        try:
            out[name] = (float(c[field]), c)
        except (TypeError, KeyError, ValueError):
            continue
    return out


def _factors_of(stored: object) -> dict[str, float]:
    """A snapshot's ``allowance_correction`` read back: per service, its factor."""
    return {name: factor for name, (factor, _c) in _snapshot_entries(stored, "factor").items()}


@dataclass(frozen=True)
class _InForce:
    """A per-service value the rounds store in their snapshots (a correction factor, a pace), as it was in force at
    a minute: the value of the latest round (not a fill) that started by the minute."""

    starts: list[dt.datetime]
    values: list[dict[str, float]]

    @classmethod
    def read(cls, s, key: str, of: Callable[[object], dict[str, float]], since: dt.datetime,
             now: dt.datetime) -> _InForce:
        """The snapshots' ``key`` (read back by ``of``) of each round that can cover a minute in [since, now): only
        that key of the snapshots is read."""
        rounds = round_snapshot_values(s, key, since, now)
        return cls([start for start, _ in rounds], [of(stored) for _, stored in rounds])

    def at(self, minute: dt.datetime, name: str, absent: float, before: float | None) -> float | None:
        """``name``'s value in force at ``minute``: ``absent`` where that round stored none for it, ``before`` where
        no round on record started by then."""
        i = bisect.bisect_right(self.starts, minute) - 1
        return before if i < 0 else self.values[i].get(name, absent)


def allowance_corrections(s, now: dt.datetime, previous: dict[str, Correction] | None = None,
                          params: CorrectionParams = CORRECTION) -> dict[str, Correction]:
    """A full round's step of each service's factor (:func:`scheduler_core.online.correction.update`): from its
    ``previous`` one (None: the latest round's, :func:`stored_corrections`) and its shared minutes' p99 slowdown in
    the correction's window before ``now`` against its declared allowance. A round compares its predictions with
    ``allowance / factor``. Services with neither a previous factor nor shared minutes are not in the map."""
    if previous is None:
        previous = stored_corrections(latest_round(s))
    since = now - dt.timedelta(minutes=params.window_minutes)
    by_service: dict[str, list] = {name: [] for name in previous}
    for r in recent_shared_minutes(s, since):
        by_service.setdefault(r.service, []).append(r)
    in_force = (_InForce.read(s, "allowance_correction", _factors_of, since, now) if by_service
                else _InForce([], []))
    out = {}
    for name, rs in sorted(by_service.items()):
        factors = [in_force.at(r.minute_utc, name, 1.0, None) for r in rs]  # None: no round on record by then
        out[name] = allowance_correction.update(
            previous.get(name, NO_CORRECTION).factor, [r.measured for r in rs], [r.allowance for r in rs],
            [r.qps for r in rs], [(now - r.minute_utc).total_seconds() / 60.0 for r in rs], params, factors)
    return out


@dataclass(frozen=True)
class Pace:
    """A budgeted service's pace after a round: k, the budget the round planned with (``min(cap, k · budget)``),
    and what its requests spent in the pacing window before it (None: no minute to tell), over how many minutes."""

    k: float
    budget: float
    spent: float | None = None
    minutes: int = 0

    def as_json(self) -> dict:
        return {"k": round(self.k, 6), "budget": round(self.budget, 6),
                "spent": None if self.spent is None else round(self.spent, 6), "minutes": self.minutes}


def stored_paces(rnd: m.SchedulingRound | None) -> dict[str, float]:
    """The paces k a round stored in its snapshot (``budget_pacing``): the pacing's state between rounds, and what a
    fill of the round's window plans with. None, or a snapshot without them: every budget as declared (k = 1)."""
    return _paces_of((rnd.snapshot or {}).get("budget_pacing") if rnd is not None else None)


def _paces_of(stored: object) -> dict[str, float]:
    """A snapshot's ``budget_pacing`` read back: per service, its k (entries without a positive finite k skipped)."""
    return {name: k for name, (k, _e) in _snapshot_entries(stored, "k").items() if np.isfinite(k) and k > 0}


def budget_paces(s, now: dt.datetime, params: PacingParams = PACING) -> dict[str, Pace]:
    """A full round's step of each budgeted service's pace (:func:`scheduler_core.online.budget_pacing.step`): from
    the latest round's k (:func:`stored_paces`) and what every minute of its replicas spent in the pacing window
    before ``now``, a minute planned under a lower k than that counted at it. Services without a budget are not in
    the map."""
    budgeted = s.query(m.OnlineService).filter(m.OnlineService.slowdown_budget.is_not(None)).all()
    if not budgeted:
        return {}
    previous = stored_paces(latest_round(s))
    since = now - dt.timedelta(minutes=params.window_minutes)
    minutes = service_minutes(s, since, now)
    in_force = _InForce.read(s, "budget_pacing", _paces_of, since, now)
    out = {}
    for svc in budgeted:
        slow, weight, stamps, counts = minutes.get(svc.name, (np.zeros(0), np.zeros(0), [], np.zeros(0, int)))
        k_prev = previous.get(svc.name)  # None: no k on record (a new service starts at its cap)
        then = [in_force.at(t, svc.name, 1.0, 1.0) for t in stamps]  # none on record: 1, the budget as declared
        spend, _ = budget_pacing.spent(slow, weight, np.asarray(then, dtype=float), k_prev or 1.0)
        n = int(counts.sum())  # replica-minutes with requests
        k = budget_pacing.step(k_prev, spend, n, svc.slowdown_budget, svc.slowdown_allowance, params)
        out[svc.name] = Pace(k, budget_pacing.paced_budget(svc.slowdown_budget, svc.slowdown_allowance, k), spend, n)
    return out


def paces_metadata(paces: dict[str, Pace]) -> dict:
    """What a round stores of its paces (its snapshot's ``budget_pacing``; the Dagster metadata)."""
    return {name: p.as_json() for name, p in sorted(paces.items())}


def corrections_metadata(corrections: dict[str, Correction]) -> dict:
    """What a round stores of its corrections (its snapshot's ``allowance_correction``; the Dagster metadata)."""
    return {name: c.as_json() for name, c in sorted(corrections.items())}


def _gpu_candidates(s, now: dt.datetime, running: dict, policy: ForecastPolicy,
                    corrections: dict[str, Correction] | None = None,
                    paces: dict[str, float] | None = None) -> list[GpuCandidate]:
    """The round's GPUs; each budgeted service's budget paced by ``paces`` (k per service) and each service's
    allowance corrected by ``corrections`` (None: the latest round's, :func:`stored_paces`,
    :func:`stored_corrections`)."""
    if corrections is None or paces is None:
        latest = latest_round(s)
        corrections = stored_corrections(latest) if corrections is None else corrections
        paces = stored_paces(latest) if paces is None else paces
    rows = inventory.served_gpus(s)
    measured = repo.recent_online_series(s, [g.id for g, _, _, _ in rows], now - HISTORY)
    pooled = _by_service_type(rows, measured)
    curves = _latency_curves(pooled)  # on measured minutes only
    series = _split_filled(rows, measured, pooled)
    on_gpu = {r.gpu_id: r for r in running.values()}
    out = []
    for gpu, gtype, svc, replica in rows:
        ser = series[gpu.id]
        known = np.isfinite(ser["sm"])
        if not known.any():
            log.warning("GPU %s has no online metrics in the last %s; left out of this round", gpu.id, HISTORY)
            continue
        # The service's own load from its last minutes that have it: a minute whose split is a labelled gap
        # (the node could not attribute the GPU while an offline job ran) took the estimate from its request
        # rate above; one without a rate either (no endpoint) does not hide the GPU.
        recent = {k: v[known][-FEATURE_WINDOW_MIN:] for k, v in ser.items()}
        if not known[-FEATURE_WINDOW_MIN:].any():
            log.info("GPU %s: no online split in its latest minutes; features from its last %d known ones",
                     gpu.id, len(recent["sm"]))
        mean = {k: float(np.nanmean(v)) if np.isfinite(v).any() else 0.0 for k, v in recent.items()}
        fc_sm = forecast_next(ser["sm"], policy)
        current = on_gpu.get(gpu.id)
        curve = curves.get((svc.name, gtype.name))  # None until the replicas have enough minutes
        p99 = float(curve.p99_at(fc_sm)) if curve is not None and np.isfinite(fc_sm) else None
        budget = budget_pacing.paced_budget(svc.slowdown_budget, svc.slowdown_allowance, paces.get(svc.name))
        allowance = svc.slowdown_allowance if budget is None else float(
            budget_allowances(ser["sm"], [fc_sm], budget, svc.slowdown_allowance, curve)[0])
        if svc.name in corrections:  # its shared minutes' p99 came out over its allowance lately
            allowance = corrected_allowance(allowance, corrections[svc.name])
        out.append(
            GpuCandidate(
                gpu_id=gpu.id, gpu_type=gtype.name, memory_bytes=gtype.memory_bytes,
                max_sm_clock_mhz=gtype.max_sm_clock_mhz, health=GpuHealth(gpu.health), service_name=svc.name,
                online=round_online_features(mean, fc_sm),
                forecast_sm_pct=fc_sm,
                forecast_mem_bytes=float(np.nanmax(ser["mem"])),
                slowdown_allowance=allowance,
                current_job_id=current.job_id if current else None,
                current_sm_pct=current.sm_pct if current else None,
                run_as_user=replica.run_as_user,
                latency_slo_ms=svc.latency_slo_ms, forecast_p99_ms=p99,
            )
        )
    return out


UNMOVABLE = ("none", "undetected")  # offline_jobs.checkpointing of a job that loses its progress if moved


def _job_candidates(s, running: dict, states=SCHEDULABLE_JOB_STATES) -> list[JobCandidate]:
    jobs = repo.jobs_in_states(s, states)
    profiles = repo.profiles_by_job(s, [j.id for j in jobs])
    out = []
    for j in jobs:
        if j.id not in profiles or j.mem_bytes is None:  # not profiled yet (the profile sets undeclared memory)
            continue
        cur = running.get(j.id)
        out.append(
            JobCandidate(
                job_id=j.id, mem_bytes=j.mem_bytes, allowed_gpu_types=frozenset(j.allowed_gpu_types),
                profiles=profiles[j.id], priority=j.priority,
                current_gpu_id=cur.gpu_id if cur else None, current_sm_pct=cur.sm_pct if cur else None,
                run_as_user=j.run_as_user,
                remaining_s=remaining_solo_s(j.total_steps, j.steps_done, profiles[j.id]),
                movable=j.checkpointing not in UNMOVABLE,
            )
        )
    return out


def round_config_to_json(cfg: RoundConfig) -> dict:
    return asdict(cfg)


def round_config_from_json(d: dict) -> RoundConfig:
    """Inverse of :func:`round_config_to_json`; settings added since the round was stored keep their defaults."""
    d = dict(d)
    sm = SmPolicy(**d.pop("sm", {}))
    known = {f.name for f in fields(RoundConfig)}
    return RoundConfig(sm=sm, **{k: v for k, v in d.items() if k in known})


def plan_and_record(
    store: Store, cluster: Cluster, window_start: dt.datetime, cfg: RoundConfig,
    policy: ForecastPolicy = ForecastPolicy(), period_s: int = DEFAULT_PERIOD_S,
) -> tuple[int, RoundResult]:
    """Plan the round of ``window_start`` from the live state and store it with everything needed to replay it.

    Rounds go forward in time: a window before the latest stored round cannot
    be planned from today's state (replay it with :func:`replay_round`).
    """
    running = cluster.running()
    with store.session() as s:
        latest = latest_round_window(s)
        if latest is not None and window_start <= latest:
            raise RoundOrderError(
                f"window {window_start.isoformat()} is not after the latest round ({latest.isoformat()}); "
                "past rounds are replayed from their snapshot, not planned again"
            )
        corrections = allowance_corrections(s, window_start)
        paces = budget_paces(s, window_start)
        _log_corrections(corrections, paces)
        gpus = _gpu_candidates(s, window_start, running, policy, corrections,
                               {name: p.k for name, p in paces.items()})
        jobs = _job_candidates(s, running)
        return _plan_and_store(s, gpus, jobs, cfg, window_start, cluster.simulated, period_s,
                               extra={"allowance_correction": corrections_metadata(corrections),
                                      "budget_pacing": paces_metadata(paces)})


def _log_corrections(corrections: dict[str, Correction], paces: dict[str, Pace]) -> None:
    if corrections:
        log.info("allowance correction per service (shared p99 against the allowance): %s",
                 allowance_correction.summary(corrections))
    if paces:
        log.info("budget paced per service (k, the budget planned with, spent over the pacing window): %s", ", ".join(
            f"{name} k={p.k:.2f} budget={p.budget:.3f} spent={'n/a' if p.spent is None else f'{p.spent:.3f}'}"
            for name, p in sorted(paces.items())))


def _plan_and_store(s, gpus: list[GpuCandidate], jobs: list[JobCandidate], cfg: RoundConfig,
                    window_start: dt.datetime, simulated: bool, period_s: int, seq: int = 0,
                    extra: dict | None = None, started_utc: dt.datetime | None = None) -> tuple[int, RoundResult]:
    """Plan with the promoted predictors and store the plan with its snapshot (a round, or a fill: ``seq`` > 0)."""
    models = repo.load_predictor_versions(s)
    if not models:
        raise NoPredictorError(NoPredictorError.MESSAGE)
    predictors = {t: model for t, (_, model) in models.items()}
    result = plan_round(gpus, jobs, predictors, cfg)
    action_of = {a.job_id: a.action.value for a in result.actions if a.action != Action.EVICT}
    pending = sum(1 for j in jobs if j.current_gpu_id is None)
    snap = snapshot(gpus, jobs)
    snap["predictor_versions"] = {t: v for t, (v, _) in sorted(models.items())}
    snap["config"] = round_config_to_json(cfg)
    snap.update(extra or {})
    rnd = repo.record_round(s, window_start, result, snap, simulated, pending, action_of, period_s, seq, started_utc)
    return rnd.id, result


class FillRefused(RuntimeError):
    """A fill cannot be planned now (the window has no dispatched round, or a later round exists)."""


@dataclass(frozen=True)
class Fill:
    """A fill of a window: the waiting jobs matched to the GPUs that hold no offline job (nothing else moves)."""

    round_id: int | None      # the fill's row (None: nothing to match, nothing stored)
    result: RoundResult | None
    free_gpus: int
    waiting_jobs: int
    seq: int = 0


def plan_fill(store: Store, cluster: Cluster, now: dt.datetime, policy: ForecastPolicy = ForecastPolicy()) -> Fill:
    """Between rounds: start waiting jobs on the GPUs that freed up, as a round over those alone would.

    Jobs finish between the 15-minute rounds, and jobs arrive; a GPU freed and a job waiting then idle
    until the next round (on average half a period). A fill plans the window's free, Healthy GPUs (no
    offline job running or placed on them) against the PENDING jobs only, with the window's round's
    settings and today's forecast; nothing running is kept, moved or evicted, so its plan is STARTs only.
    It follows the latest round (its window, its settings) and is stored as that window's next fill
    (``seq`` 1, 2, …) with its snapshot, and dispatched like a round. Nothing is stored when there is no
    free GPU or no waiting job.
    """
    with store.session() as s:
        rnd = latest_round(s)
        if rnd is None or rnd.status != "dispatched":
            raise FillRefused("no dispatched round to follow: a fill starts jobs between rounds, after the first"
                              if rnd is None else f"round {rnd.id} is not dispatched yet: a fill follows a "
                                                  "dispatched round")
        window_start = rnd.window_start_utc
        cfg = round_config_from_json(rnd.snapshot.get("config", {}))
        period_s = rnd.period_s
        seq = 1 + len(fills_of_window(s, window_start))
        fill_of = rnd.id
        corrections = stored_corrections(rnd)  # a fill follows its round: the factors are updated by rounds only
        paces = stored_paces(rnd)
        stored_pacing = (rnd.snapshot or {}).get("budget_pacing", {})
    running = cluster.running()
    with store.session() as s:
        gpus = [g for g in _gpu_candidates(s, now, running, policy, corrections, paces)
                if g.current_job_id is None and g.health == GpuHealth.HEALTHY]
        # PENDING in the store and not running in the cluster (one Slurm shows started is the sync's to adopt)
        jobs = [j for j in _job_candidates(s, running, [JobState.PENDING]) if j.current_gpu_id is None]
        if not gpus or not jobs:
            return Fill(None, None, len(gpus), len(jobs))
        fill_id, result = _plan_and_store(s, gpus, jobs, cfg, window_start, cluster.simulated, period_s, seq,
                                          {"fill_of_round": fill_of,
                                           "allowance_correction": corrections_metadata(corrections),
                                           "budget_pacing": stored_pacing},
                                          started_utc=now)
    return Fill(fill_id, result, len(gpus), len(jobs), seq)


@dataclass(frozen=True)
class Replay:
    round_id: int
    stored: RoundResult
    replayed: RoundResult
    mismatches: list[str]

    @property
    def matches(self) -> bool:
        return not self.mismatches


def replay_round(store: Store, window_start: dt.datetime) -> Replay:
    """Plan a stored round again from its snapshot, predictor versions and settings; compare with the stored plan."""
    with store.session() as s:
        rnd = round_for_window(s, window_start)
        if rnd is None:
            raise KeyError(f"no stored round for window {window_start.isoformat()}")
        snap = rnd.snapshot
        if "predictor_versions" not in snap:
            raise ValueError(f"round {rnd.id} was stored without predictor versions; it cannot be replayed")
        predictors = {t: repo.load_predictor(s, t, v) for t, v in snap["predictor_versions"].items()}
        stored = stored_result(s, rnd)
        round_id = rnd.id
    gpus, jobs = from_snapshot(snap)
    replayed = plan_round(gpus, jobs, predictors, round_config_from_json(snap.get("config", {})))
    return Replay(round_id, stored, replayed, compare_plans(stored, replayed))


def compare_plans(stored: RoundResult, replayed: RoundResult, tol: float = 1e-9) -> list[str]:
    """Differences between two plans (empty = the same placements, shares, quotas and predictions)."""
    out = []
    a = {p.job_id: p for p in stored.placements}
    b = {p.job_id: p for p in replayed.placements}
    for j in sorted(a.keys() - b.keys()):
        out.append(f"job {j}: stored on GPU {a[j].gpu_id}, not placed in the replay")
    for j in sorted(b.keys() - a.keys()):
        out.append(f"job {j}: placed on GPU {b[j].gpu_id} in the replay, not in the stored plan")
    for j in sorted(a.keys() & b.keys()):
        x, y = a[j], b[j]
        if (x.gpu_id, x.sm_pct, x.mem_quota_bytes) != (y.gpu_id, y.sm_pct, y.mem_quota_bytes):
            out.append(f"job {j}: stored GPU {x.gpu_id} at {x.sm_pct}% / {x.mem_quota_bytes} B, "
                       f"replay GPU {y.gpu_id} at {y.sm_pct}% / {y.mem_quota_bytes} B")
        elif abs(x.predicted_norm_tput - y.predicted_norm_tput) > tol:
            out.append(f"job {j}: predicted tput {x.predicted_norm_tput!r} vs {y.predicted_norm_tput!r}")
    if abs(stored.objective - replayed.objective) > tol * max(1, len(a)):
        out.append(f"objective {stored.objective!r} vs {replayed.objective!r}")
    if stored.actions and sorted(stored.actions, key=_akey) != sorted(replayed.actions, key=_akey):
        out.append(f"plan diff {stored.action_counts()} vs {replayed.action_counts()}")
    return out


def _akey(a: PlanAction) -> tuple:
    return (a.job_id, a.action.value, a.gpu_id or -1)


def requeue_evicted(store: Store, reason: str = "requeued after eviction") -> list[int]:
    """EVICTED → PENDING for every evicted job, so the next round considers it again."""
    with store.session() as s:
        ids = [j.id for j in repo.jobs_in_states(s, [JobState.EVICTED])]
        for job_id in ids:
            transition(s, job_id, JobState.PENDING, reason)
    return ids


def _action_key(round_id: int, a: PlanAction) -> str:
    return f"r{round_id}:{a.action.value}:j{a.job_id}:g{a.gpu_id}:p{a.sm_pct}"


def dispatch_round(
    store: Store, cluster: Cluster, round_id: int, result: RoundResult, now: dt.datetime,
    persist: Callable[[Session], None] | None = None,
) -> tuple[int, int]:
    """Send the plan once: every intent stored first, then the cluster call, then each result.

    Actions already marked done or failed under their key are not sent again,
    so re-running a dispatch after a crash completes it without duplicates.
    ``persist`` runs in the transaction that stores the results (the simulated
    cluster saves its state there).
    """
    todo: list[tuple[str, PlanAction]] = []
    with store.session() as s:
        logged = dispatch_log.log_by_key(s, round_id)
        for act in result.actions:
            key = _action_key(round_id, act)
            row = logged.get(key)
            if row is None:
                dispatch_log.add_intent(s, round_id, key, act)
            elif row.status in ("done", "failed"):
                continue
            todo.append((key, act))
    results = cluster.dispatch([a for _, a in todo], now) if todo else []
    still_running = cluster.running()
    started = getattr(cluster, "starts_jobs_at_once", False)
    ok_n = failed_n = 0
    with store.session() as s:
        logged = dispatch_log.log_by_key(s, round_id)
        for (key, act), res in zip(todo, results):
            row = logged[key]
            row.status, row.error, row.updated_utc = ("done", None, now) if res.ok else ("failed", res.detail, now)
            try:
                if res.ok:
                    _book_action(s, act, now, started)
                elif act.action == Action.MIGRATE and act.job_id not in still_running:
                    _move(s, act.job_id, [(JobState.MIGRATING, "checkpoint for move"),
                                          (JobState.PENDING, f"restart failed: {res.detail}")], now)
            except IllegalTransition as exc:
                # The job moved meanwhile (the cluster finished or requeued it and the job-state sync saw it
                # first): the action stands in the log, the store keeps the newer truth.
                row.error = f"not booked: {exc}"[:2000]
                log.warning("dispatch of %s: not booked: %s", key, exc)
            ok_n += res.ok
            failed_n += not res.ok
        rnd = s.get(m.SchedulingRound, round_id)
        rnd.status, rnd.finished_utc = "dispatched", now
        if persist is not None:
            persist(s)
    return ok_n, failed_n


def _move(s, job_id: int, steps: list[tuple[JobState, str]], now: dt.datetime) -> None:
    """Several transitions in a row from the job's current state (one compare-and-set each)."""
    for target, reason in steps:
        transition(s, job_id, target, reason, at_utc=now)


def _book_action(s, act: PlanAction, now: dt.datetime, started: bool) -> None:
    """The store's side of an action the cluster carried out.

    A cluster that starts jobs at once (the simulated one) makes a placed job RUNNING;
    on Slurm it is PLACED until Slurm starts it (the job-state sync sees that).
    """
    placed = JobState.RUNNING if started else JobState.PLACED
    where = f"GPU {act.gpu_id} at {act.sm_pct}% SM"
    if act.action == Action.START:
        transition(s, act.job_id, placed, f"placed on {where}", expected=JobState.PENDING, at_utc=now)
    elif act.action == Action.MIGRATE:
        _move(s, act.job_id, [(JobState.MIGRATING, f"checkpoint for move to GPU {act.gpu_id}"),
                              (placed, f"restarted on {where}" if started else f"placed again on {where}")], now)
    elif act.action == Action.EVICT:
        job = s.get(m.OfflineJob, act.job_id)
        if job is not None and job.state == JobState.PLACED.value:
            transition(s, act.job_id, JobState.PENDING, "held again before it started: not in this round's plan",
                       at_utc=now)
        else:
            _move(s, act.job_id, [(JobState.EVICTED, "not in this round's plan"),
                                  (JobState.PENDING, "requeued after plan eviction")], now)


def book_interval(
    store: Store, report: IntervalReport, round_id: int | None, source: str, now: dt.datetime,
    persist: Callable[[Session], None] | None = None,
) -> None:
    """Persist what the cluster observed: metrics, executions, evictions, completions, health.

    Evicted jobs are left EVICTED; :func:`requeue_evicted` (the eviction sensor)
    returns them to the queue.
    """
    with store.session() as s:
        repo.write_metrics(s, report.metrics, source)
        repo.write_executions(s, report.executions, round_id, source)
        repo.write_evictions(s, report.evictions, source)
        for job_id, (steps, ckpt) in report.progress.items():
            job = s.get(m.OfflineJob, job_id)
            job.steps_done, job.checkpoint_step = min(steps, job.total_steps), min(ckpt, job.total_steps)
        for ev in report.evictions:
            transition(s, ev.job_id, JobState.EVICTED, ev.reason, at_utc=ev.at_utc)
        for job_id, at in report.completed.items():
            transition(s, job_id, JobState.DONE, "all steps done", at_utc=at)
        repo.set_gpu_health(s, report.health, now)
        if persist is not None:
            persist(s)
