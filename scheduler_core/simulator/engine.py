"""The simulation loop: arrivals, a round every ``round_minutes``, one fleet minute at a time, metrics.

Events happen at minute granularity (arrivals join the queue and wait for the
next round, as submissions do in production; completions are timed inside
their minute). With ``SimConfig.between_rounds`` every policy's planner is also
called in a minute after a job arrived or a GPU freed while jobs wait
(``RoundView.between_rounds``), a mechanism measured here that the pipeline does
not have: its rounds are periodic. Deterministic per seed: randomness comes from named streams
(:func:`scheduler_core.rng.rng_stream`): ``trace-repeat``, ``sim-online-load``,
``sim-bursts`` — the online load is the same under every policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from scheduler_core.domain import OfflineFeatures
from scheduler_core.round.plan import RoundConfig
from scheduler_core.rng import rng_stream
from scheduler_core.simulator.config import SimConfig
from scheduler_core.simulator.fleet import DONE, FUTURE, QUEUED, RUNNING, Fleet, hour_of_day
from scheduler_core.simulator.metrics import compute_metrics
from scheduler_core.simulator.policies import Policy, RoundView
from scheduler_core.simulator.workload import build_jobs
from scheduler_core.trace import TraceJob
from scheduler_core.workloads import WorkloadCatalog


@dataclass(frozen=True)
class SimInputs:
    """What the caller provides: the workload catalog, solo profiles per (job type, GPU type), predictors."""

    catalog: WorkloadCatalog
    profiles: dict[tuple[str, str], OfflineFeatures]
    predictors: dict  # GPU type → SpeedPredictor (MuxFlow policies)
    round_config: RoundConfig = field(default_factory=RoundConfig)


@dataclass
class SimResult:
    policy: str
    metrics: dict
    series: dict  # per-minute cluster series (utilization over time)
    invariants: dict
    wall_s: float


Progress = Callable[[int, int, dict], None]


def run_simulation(trace: list[TraceJob], inputs: SimInputs, cfg: SimConfig, policy: Policy,
                   progress: Progress | None = None) -> SimResult:
    t0 = time.perf_counter()
    jobs = build_jobs(trace, inputs.catalog, cfg, rng_stream(cfg.seed, "trace-repeat"))
    fleet = Fleet(cfg, inputs.catalog, jobs, policy.sharing, policy.protection)
    missing = [g for g in fleet.type_names if g not in inputs.predictors]
    if policy.sharing == "mps" and missing:
        raise ValueError(f"policy {policy.name} needs a speed predictor for GPU types {missing}")
    planner = policy.make_planner(cfg, inputs)
    total = cfg.minutes
    n_rounds = -(-total // cfg.round_minutes)
    rec = _Recorder(total, cfg.gpus)
    # What the sharing mechanism allows on one GPU: jobs placed there, and jobs progressing in one minute.
    multi = cfg.max_jobs_per_gpu if policy.sharing == "mps" else 1
    inv = {"max_offline_jobs_per_gpu": 0, "max_active_jobs_per_gpu": 0, "sm_pct_out_of_bounds": 0,
           "refused_actions": 0, "jobs_next_to_another_user": 0, "gpus_over_100_pct_shares": 0,
           "allowed_offline_jobs_per_gpu": cfg.sharing.salus_max_resident if policy.sharing == "salus" else multi,
           "allowed_active_jobs_per_gpu": multi}
    rounds: list[dict] = []
    between = {"calls": 0, "started": 0}

    def plan(now_s: float, between_rounds: bool) -> tuple[dict, dict, np.ndarray]:
        """Plan and apply; the invariants of what was applied. (stats, applied counts, running jobs)."""
        actions, stats = planner(RoundView(fleet, now_s, between_rounds))
        applied = fleet.apply(actions, now_s)
        inv["refused_actions"] += applied["refused"]
        pcts = stats.pop("sm_pcts", [])
        lo, hi = stats.pop("sm_bounds", (1, 100))
        inv["sm_pct_out_of_bounds"] += sum(1 for p in pcts if not lo <= p <= hi)
        run = fleet.running()
        if run.size:
            inv["max_offline_jobs_per_gpu"] = max(inv["max_offline_jobs_per_gpu"],
                                                  int(np.bincount(fleet.gpu[run]).max()))
            if policy.sharing == "mps":  # MPS shares of one GPU's jobs together within the GPU
                shares = np.bincount(fleet.gpu[run], weights=fleet.sm_pct[run], minlength=fleet.n)
                inv["gpus_over_100_pct_shares"] += int((shares > 100).sum())
            # Under MPS a job next to a replica of another user would wait for it (scheduler_core.jobs.run_as).
            gu, ju = fleet.gpu_user[fleet.gpu[run]], fleet.job_user[run]
            inv["jobs_next_to_another_user"] += int(((gu >= 0) & (ju >= 0) & (gu != ju)).sum())
        return stats, applied, run

    freed = False  # a job finished in the last minute
    for minute in range(-cfg.warmup_minutes, total):
        now_s = minute * 60.0
        if minute >= 0 and minute % cfg.round_minutes == 0:
            fleet.admit(now_s)
            t = time.perf_counter()
            stats, applied, run = plan(now_s, False)
            rounds.append({**stats, **applied, "round_s": time.perf_counter() - t, "queued": int(fleet.queued().size),
                           "running": int(run.size)})
            if progress is not None:
                progress(len(rounds), n_rounds, rounds[-1])
        elif minute > 0 and cfg.between_rounds and (fleet.admit(now_s) or freed) and fleet.queued().size:
            # A job arrived or a GPU freed in the last minute, and jobs wait: place them now.
            _stats, applied, _run = plan(now_s, True)
            between["calls"] += 1
            between["started"] += applied["start"]
        m = fleet.step(minute, hour_of_day(now_s), now_s)
        freed = m.finished > 0
        if minute >= 0:
            rec.add(minute, m)
            inv["max_active_jobs_per_gpu"] = max(inv["max_active_jobs_per_gpu"], m.active_per_gpu_max)
    fleet.admit(total * 60.0)
    states = fleet.state
    inv["jobs"] = int(jobs.size)
    inv["accounted"] = {"done": int((states == DONE).sum()), "running": int((states == RUNNING).sum()),
                        "queued": int((states == QUEUED).sum()), "not_arrived": int((states == FUTURE).sum())}
    inv["all_accounted"] = sum(inv["accounted"].values()) == jobs.size
    metrics = compute_metrics(cfg, fleet, rec, rounds)
    metrics["policy"] = policy.name
    if cfg.between_rounds:
        metrics["between_rounds"] = between
    wall = time.perf_counter() - t0
    metrics["timing"] = {"wall_s": round(wall, 3),
                         "round_s_mean": round(float(np.mean([r["round_s"] for r in rounds])), 4) if rounds else 0.0,
                         "round_s_max": round(float(np.max([r["round_s"] for r in rounds])), 4) if rounds else 0.0}
    return SimResult(policy.name, metrics, rec.series(cfg.round_minutes), inv, wall)


class _Recorder:
    """Per GPU-minute online latency and load (for the p99), per-minute cluster means."""

    def __init__(self, minutes: int, n: int):
        self.lat = np.zeros((minutes, n), dtype=np.float32)
        self.solo = np.zeros((minutes, n), dtype=np.float32)
        self.qps = np.zeros((minutes, n), dtype=np.float32)
        self.cols = {k: np.zeros(minutes) for k in (
            "util", "sm", "mem", "solo_util", "solo_sm", "solo_mem", "offline_gpu_equiv", "running", "evicted",
            "burst_paced")}

    def add(self, minute: int, m) -> None:
        self.lat[minute], self.solo[minute], self.qps[minute] = m.latency_ms, m.solo_latency_ms, m.qps
        c = self.cols
        c["util"][minute], c["sm"][minute], c["mem"][minute] = m.util_pct.mean(), m.sm_pct.mean(), m.mem_frac.mean()
        c["solo_util"][minute], c["solo_sm"][minute] = m.solo_util_pct.mean(), m.solo_sm_pct.mean()
        c["solo_mem"][minute] = m.solo_mem_frac.mean()
        c["offline_gpu_equiv"][minute], c["running"][minute], c["evicted"][minute] = (
            m.offline_gpu_equiv, m.running, m.evicted)
        c["burst_paced"][minute] = m.burst_paced

    def series(self, bin_minutes: int) -> dict:
        """Means per ``bin_minutes`` (one point per round interval)."""
        out = {}
        for k, v in self.cols.items():
            n = v.size // bin_minutes * bin_minutes
            out[k] = v[:n].reshape(-1, bin_minutes).mean(axis=1).round(4).tolist() if n else []
        out["bin_minutes"] = bin_minutes
        return out
