"""The main job (`make run`): a full scheduling run on a simulated cluster.

store → simulated cluster → Philly trace submissions → profiling → co-location
samples → one predictor per GPU type → 15-minute rounds over several simulated
hours → summary and plots. Every figure it prints comes from the simulated
cluster and says so.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from sqlalchemy import func, select

from executors import round_runner, steps
from executors.simulated.calibration import SAMPLE_TRACE, default_catalog, holdout_reports
from executors.simulated.cluster import SOURCE, SimSettings
from executors.simulated.setup import cluster_from_store, init_simulated_cluster, register_job
from executors.store import models as m
from executors.store.db import Store
from executors.store.migrate import upgrade
from executors.submission import SubmissionError, spec_from_trace, submit
from scheduler_core.predictor import PredictorConfig
from scheduler_core.round import RoundConfig
from scheduler_core.trace import parse_trace

log = logging.getLogger(__name__)
ROUND = dt.timedelta(minutes=15)
SIM_START = dt.datetime(2026, 1, 5, 0, 0, tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class MainJobConfig:
    db_url: str
    report_dir: Path
    types: dict[str, int] = field(default_factory=lambda: {"t4": 32, "a10": 32})
    services: int = 5
    hours: float = 8.0
    warmup_minutes: int = 60
    jobs: int = 120
    trace: Path = SAMPLE_TRACE
    samples_per_type: int = 2000
    seed: int = 0
    migration_penalty: float = 0.05
    predictor: PredictorConfig = field(default_factory=PredictorConfig)


def _say(progress: Callable[[str], None] | None, msg: str) -> None:
    if progress:
        progress(msg)
    log.info(msg)


def run_main_job(cfg: MainJobConfig, progress: Callable[[str], None] | None = print) -> dict:
    t0 = time.perf_counter()
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    upgrade(cfg.db_url)
    store = Store(cfg.db_url)
    catalog = default_catalog()
    gpu_types = tuple(sorted(cfg.types))
    with store.session() as s:
        info = init_simulated_cluster(s, cfg.types, cfg.services, seed=cfg.seed)
    _say(progress, f"[1/5] simulated cluster: {info['gpus']} GPUs ({', '.join(f'{k}:{v}' for k, v in sorted(cfg.types.items()))}) "
                   f"on {info['nodes']} nodes, {info['services']} online services")

    with open(cfg.trace) as fh:
        trace = parse_trace(fh)
    single = [t for t in trace if t.scale_factor == 1][: cfg.jobs]
    skipped = sum(1 for t in trace if t.scale_factor != 1)
    horizon_s = cfg.hours * 3600 * 0.6
    last = max((t.arrival_s for t in single), default=0.0) or 1.0
    compression = max(1.0, last / horizon_s)
    arrivals = sorted(((t.arrival_s / compression, t) for t in single), key=lambda p: p[0])
    _say(progress, f"[2/5] trace {cfg.trace.name}: {len(single)} single-GPU jobs "
                   f"({skipped} multi-GPU lines not eligible for space-sharing); arrivals compressed x{compression:.0f}")

    counts = steps.collect_samples(store, catalog, cfg.samples_per_type, cfg.seed)
    _say(progress, f"[3/5] co-location samples (simulated): {counts}; calibration held-out error: "
                   + ", ".join(f"{r.gpu_type} MAE {r.mae:.3f} (mean-baseline {r.baseline_mae:.3f})" for r in holdout_reports()))
    trained = steps.train_predictors(store, cfg.predictor)
    for t in trained:
        _say(progress, f"      predictor {t.gpu_type} v{t.version}: held-out MAE normalized tput {t.holdout_mae_tput:.3f}, "
                       f"online slowdown {t.holdout_mae_slowdown:.3f} ({t.n_train} train / {t.n_holdout} held out, {t.trained_on})")

    settings = SimSettings(seed=cfg.seed)
    with store.session() as s:
        cluster = cluster_from_store(s, catalog, settings)
    now = SIM_START
    report = cluster.advance(now, cfg.warmup_minutes)
    round_runner.book_interval(store, report, None, SOURCE, now)
    now += dt.timedelta(minutes=cfg.warmup_minutes)
    _say(progress, f"[4/5] {cfg.warmup_minutes} simulated minutes of online-only warm-up recorded")

    round_cfg = RoundConfig(migration_penalty=cfg.migration_penalty)
    n_rounds = int(cfg.hours * 60 // 15)
    next_arrival = 0
    rounds = []
    for k in range(n_rounds):
        elapsed_s = (now - SIM_START).total_seconds() - cfg.warmup_minutes * 60
        with store.session() as s:
            while next_arrival < len(arrivals) and arrivals[next_arrival][0] <= elapsed_s:
                t = arrivals[next_arrival][1]
                next_arrival += 1
                try:
                    job = submit(s, spec_from_trace(t, catalog.offline_workload(t.job_type).mem_bytes, gpu_types),
                                 set(catalog.offline))
                    register_job(cluster, job)
                except SubmissionError as exc:
                    log.warning("trace line %d rejected: %s", t.line_no, exc)
        steps.profile_new_jobs(store, catalog, cfg.seed + k)
        round_id, result = round_runner.plan_and_record(store, cluster, now, round_cfg)
        ok, failed = round_runner.dispatch_round(store, cluster, round_id, result, now)
        interval = cluster.advance(now, 15)
        round_runner.book_interval(store, interval, round_id, SOURCE, now + ROUND)
        realised = _ratio(sum(e.solo_equiv_s for e in interval.executions), sum(e.wall_s for e in interval.executions))
        c = result.action_counts()
        rounds.append({"round": k, "window_start_utc": now.isoformat(), "placements": len(result.placements),
                       "objective": result.objective, "actions": c, "evictions": len(interval.evictions),
                       "completed": len(interval.completed), "oversold_simulated": realised,
                       "matching_s": result.timings_s["matching"], "dispatch_failed": failed})
        _say(progress, f"[5/5] round {k + 1:2d}/{n_rounds} {now:%H:%M} placements {len(result.placements):3d} "
                       f"(start {c['start']}, keep {c['keep']}, migrate {c['migrate']}, evict {c['evict']}) "
                       f"objective {result.objective:6.2f}  oversold(sim) {realised if realised is not None else float('nan'):.2f}  "
                       f"evictions {len(interval.evictions)}  done {len(interval.completed)}")
        now += ROUND

    summary = summarize(store, rounds, cfg, time.perf_counter() - t0, compression)
    cfg.report_dir.mkdir(parents=True, exist_ok=True)
    summary["plots"] = write_plots(store, cfg.report_dir, rounds)
    (cfg.report_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    store.dispose()
    return summary


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def summarize(store: Store, rounds: list[dict], cfg: MainJobConfig, elapsed_s: float, compression: float) -> dict:
    with store.session() as s:
        mt = m.GpuMetricMinute
        rows = s.execute(select(
            mt.gpu_util_pct, mt.sm_activity_pct, mt.mem_used_bytes / mt.mem_total_bytes,
            mt.online_gpu_util_pct, mt.online_sm_activity_pct, mt.online_mem_used_bytes / mt.mem_total_bytes,
            mt.online_latency_ms / mt.online_solo_latency_ms, mt.offline_job_id,
        ).where(mt.minute_utc >= SIM_START + dt.timedelta(minutes=cfg.warmup_minutes))).all()
        arr = np.array([[np.nan if v is None else float(v) for v in r[:7]] for r in rows])
        shared = np.array([r[7] is not None for r in rows])
        ex = s.execute(select(func.sum(m.JobExecution.solo_equiv_s), func.sum(m.JobExecution.wall_s),
                              func.count())).one()
        evictions = s.scalar(select(func.count()).select_from(m.Eviction))
        states = dict(s.execute(select(m.OfflineJob.state, func.count()).group_by(m.OfflineJob.state)).all())
    slow = arr[shared, 6] if shared.any() else np.array([1.0])
    return {
        "label": "SIMULATED cluster (calibrated interference model, no real GPU)",
        "elapsed_s": round(elapsed_s, 1),
        "rounds": len(rounds),
        "hours_simulated": cfg.hours,
        "arrival_compression": round(compression, 1),
        "placements_per_round_avg": round(float(np.mean([r["placements"] for r in rounds])), 1) if rounds else 0,
        "oversold_gpu": round(_ratio(ex[0] or 0.0, ex[1] or 0.0) or 0.0, 3),
        "utilization": {
            "online_only": {"gpu_util_pct": _mean(arr[:, 3]), "sm_activity_pct": _mean(arr[:, 4]),
                            "mem_pct": _mean(100 * arr[:, 5])},
            "shared": {"gpu_util_pct": _mean(arr[:, 0]), "sm_activity_pct": _mean(arr[:, 1]),
                       "mem_pct": _mean(100 * arr[:, 2])},
        },
        "online_latency_slowdown_on_shared_gpus": {"avg": _mean(slow - 1), "p99": round(float(np.nanpercentile(slow - 1, 99)), 3)},
        "executions": int(ex[2]),
        "evictions": int(evictions),
        "eviction_rate": round(evictions / ex[2], 4) if ex[2] else 0.0,
        "jobs_by_state": states,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items() if k != "predictor"},
    }


def _mean(a: np.ndarray) -> float:
    return round(float(np.nanmean(a)), 2) if np.isfinite(a).any() else float("nan")


def write_plots(store: Store, out: Path, rounds: list[dict]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    mt = m.GpuMetricMinute
    with store.session() as s:
        df = pd.DataFrame(s.execute(select(
            mt.minute_utc, mt.gpu_util_pct, mt.sm_activity_pct, mt.online_gpu_util_pct, mt.online_sm_activity_pct,
            (100 * mt.mem_used_bytes / mt.mem_total_bytes).label("mem_pct"),
            (100 * mt.online_mem_used_bytes / mt.mem_total_bytes).label("online_mem_pct"),
        )).all())
    per_min = df.groupby("minute_utc").mean(numeric_only=True)
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for ax, (shared_col, online_col, title) in zip(axes, [
        ("gpu_util_pct", "online_gpu_util_pct", "GPU utilization (%)"),
        ("sm_activity_pct", "online_sm_activity_pct", "SM activity (%)"),
        ("mem_pct", "online_mem_pct", "GPU memory used (%)"),
    ]):
        ax.plot(per_min.index, per_min[shared_col], label="MuxFlow (shared)")
        ax.plot(per_min.index, per_min[online_col], label="online-only", linestyle="--")
        ax.set_ylabel(title)
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper left")
    axes[0].set_title("Cluster average over time — SIMULATED cluster")
    axes[-1].set_xlabel("simulated time (UTC)")
    fig.tight_layout()
    util_path = out / "utilization.png"
    fig.savefig(util_path, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 4))
    idx = [r["round"] + 1 for r in rounds]
    ax.bar(idx, [r["placements"] for r in rounds], color="#4c72b0", label="placements")
    ax2 = ax.twinx()
    ax2.plot(idx, [r["oversold_simulated"] or 0 for r in rounds], color="#dd8452", marker="o", label="oversold GPU")
    ax2.set_ylim(0, 1)
    ax.set_xlabel("round")
    ax.set_ylabel("placements")
    ax2.set_ylabel("oversold GPU (realised)")
    ax.set_title("Placements and oversold GPU per round — SIMULATED cluster")
    fig.legend(loc="upper left")
    fig.tight_layout()
    rounds_path = out / "rounds.png"
    fig.savefig(rounds_path, dpi=110)
    plt.close(fig)
    return [str(util_path), str(rounds_path)]
