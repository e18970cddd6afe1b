"""How far any planner could go: a lower bound on offline JCT when every minute's online slowdown is capped.

An operator picks each service's slowdown allowance; this module says what the allowance costs
whatever the planner does. For a cap ``c`` on the replica's latency slowdown in every minute
(``slowdown − 1 ≤ c``, the flat allowance's promise) it gives, per job type, the fastest the job can
run on any GPU of the simulated cluster: alone beside an idle replica (request rate 0) of the
service and GPU type that suit it best, at the MPS share (1–100 %) that runs it fastest within the
cap, on the simulated GPU of the simulator itself (:func:`scheduler_core.interference.gpu_model.with_offline`,
xCUDA pacing included). Every job then starts the moment it arrives, never waits, never migrates,
never warms up, and runs at that rate until it finishes or the day ends: the mean of those JCTs
(censored at the end of the run, as :func:`scheduler_core.simulator.metrics.compute_metrics`
counts them) is a lower bound on the mean censored JCT of every planner that keeps the cap.

Why it is a bound: co-runners only add pressure (several jobs per GPU are slower each), and in the
model no busier minute lets a job run faster within the cap
(``idle_dominates`` checks it on the catalog), so the idle replica is the best any minute offers.
It ignores GPU capacity (every job gets the best GPU at once), so it is loosest under overload.

A cap on every minute is not the same as a cap on the mean over shared minutes: a planner that
shares busy minutes lightly lowers that mean without slowing any request less. The bound speaks of
what a per-minute promise costs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler_core.interference.gpu_model import OnlineModel, online_alone, with_offline
from scheduler_core.gpu_specs import get_spec
from scheduler_core.simulator.config import SimConfig
from scheduler_core.simulator.workload import JobTable
from scheduler_core.workloads import ONLINE_FAMILIES, WorkloadCatalog

SHARES_PCT = np.arange(1, 101, dtype=float)  # MPS active-thread percentages are integral


@dataclass(frozen=True)
class BestRate:
    """One job type's fastest operating point within a slowdown cap."""

    job_type: str
    norm_tput: float       # of its solo speed on that GPU type (0: no share keeps the cap)
    speed: float           # norm_tput × the GPU type's speed relative to the reference GPU
    service: str | None
    gpu_type: str | None
    sm_pct: int | None
    slowdown: float | None  # the replica's latency factor there (≥ 1)

    def as_dict(self) -> dict:
        return {"job_type": self.job_type, "norm_tput": round(self.norm_tput, 4), "speed": round(self.speed, 4),
                "service": self.service, "gpu_type": self.gpu_type, "sm_pct": self.sm_pct,
                "slowdown": None if self.slowdown is None else round(self.slowdown, 4)}


def _online_models(cfg: SimConfig, catalog: WorkloadCatalog) -> list[tuple[str, str, float, OnlineModel]]:
    """(service, GPU type, relative speed, online model) for each service on each GPU type of the cluster."""
    out = []
    for gtype in sorted({t for t, _ in cfg.types()}):
        spec = get_spec(gtype)
        for s in cfg.services:
            fam = ONLINE_FAMILIES[s.family]
            out.append((s.name, gtype, float(spec.relative_speed), OnlineModel.of(fam, catalog.online[fam.name], spec)))
    return out


def best_rates(cfg: SimConfig, catalog: WorkloadCatalog, job_types: list[str], cap: float) -> list[BestRate]:
    """Each job type's fastest point with the replica's slowdown within ``1 + cap`` (``cap`` may be inf)."""
    if not cap >= 0.0:
        raise ValueError(f"cap must be >= 0 (inf: no cap), got {cap}")
    models = _online_models(cfg, catalog)
    out = []
    for name in job_types:
        traits = catalog.offline[name].traits
        best = BestRate(name, 0.0, 0.0, None, None, None, None)
        for service, gtype, rel, model in models:
            shared = with_offline(online_alone(model, 0.0), model, traits, SHARES_PCT, 1.0, 0.0,
                                  cfg.interference, cfg.xcuda_target_util)
            ok = shared.slowdown - 1.0 <= cap + 1e-12
            if not ok.any():
                continue
            speed = np.where(ok, shared.norm_tput * rel, -1.0)
            i = int(np.argmax(speed))
            if speed[i] > best.speed:
                best = BestRate(name, float(shared.norm_tput[i]), float(speed[i]), service, gtype,
                                int(SHARES_PCT[i]), float(shared.slowdown[i]))
        out.append(best)
    return out


def arrived_mask(cfg: SimConfig, jobs: JobTable) -> np.ndarray:
    """The jobs that arrive within the run (those :func:`compute_metrics` averages JCT over)."""
    last_minute_s = (cfg.minutes - 1) * 60.0
    return jobs.arrival_s <= last_minute_s


def jct_bound(cfg: SimConfig, jobs: JobTable, sps_ref: np.ndarray, rates: list[BestRate]) -> dict:
    """The per-job lower bound on censored JCT at ``rates`` (one per ``jobs.types``), and its mean.

    ``sps_ref``: each job type's solo steps per second on the reference GPU, by ``jobs.types``.
    """
    if len(rates) != len(jobs.types) or len(sps_ref) != len(jobs.types):
        raise ValueError("one rate and one solo speed per job type")
    end = cfg.minutes * 60.0
    speed = np.array([r.speed for r in rates])[jobs.job_type] * np.asarray(sps_ref, dtype=float)[jobs.job_type]
    with np.errstate(divide="ignore"):
        run = np.where(speed > 0, jobs.total_steps / np.where(speed > 0, speed, 1.0), np.inf)
    arrived = arrived_mask(cfg, jobs)
    per_job = np.minimum(jobs.arrival_s + run, end) - jobs.arrival_s
    finish = (jobs.arrival_s + run <= end) & arrived
    return {"per_job_s": np.where(arrived, per_job, np.nan), "arrived": int(arrived.sum()),
            "finished": int(finish.sum()), "jct_censored_s": float(per_job[arrived].mean())}


def idle_dominates(cfg: SimConfig, catalog: WorkloadCatalog, job_types: list[str], caps: list[float],
                   points: int = 11) -> bool:
    """Whether the idle replica offers each job at least the throughput any busier minute offers within each cap.

    The bound's premise, checked on the cluster's services and GPU types from request rate 0 to each
    service's peak: at every rate, the fastest share within the cap is no faster than at rate 0. (The
    slowdown itself need not grow with the load: xCUDA throttles the job in a busy minute, which
    lowers the slowdown it causes with its throughput.)
    """
    peak = {s.name: s.qps_max for s in cfg.services}
    for service, _gtype, _rel, model in _online_models(cfg, catalog):
        qps = np.linspace(0.0, peak[service], points)[:, None]
        for name in job_types:
            sh = with_offline(online_alone(model, qps), model, catalog.offline[name].traits, SHARES_PCT[None, :],
                              1.0, 0.0, cfg.interference, cfg.xcuda_target_util)
            for cap in caps:
                best = np.where(sh.slowdown - 1.0 <= cap + 1e-12, sh.norm_tput, 0.0).max(axis=1)
                if (best[1:] > best[0] + 1e-12).any():
                    return False
    return True
