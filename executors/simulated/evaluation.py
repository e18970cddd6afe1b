"""Inputs and outputs of the trace-driven simulator (scheduler_core.simulator): what is not pure.

- the workload traits of one interference calibration (executors/data/calibration.py,
  ``transfer`` by default) on the cluster's GPU type,
- solo profiles of every (job type, GPU type) from the simulated GPU model,
- one speed predictor per GPU type trained on simulated co-location samples of
  the simulation's online services under the same calibration (cached on disk:
  training costs seconds per type, a simulation run should not pay it again),
- trace files, progress and the comparison plots.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from executors.data import calibration as cal
from executors.scheduler.predictors import training_matrix
from executors.simulated.profiling import colocation_samples, offline_profile
from scheduler_core.prediction.predictor import PredictorConfig, SpeedPredictor, one_torch_thread, train
from scheduler_core.rng import rng_stream
from scheduler_core.simulator import SimConfig, SimInputs, bounds
from scheduler_core.simulator.workload import build_jobs
from scheduler_core.trace import TraceJob, parse_trace
from scheduler_core.workloads import ONLINE_FAMILIES, WorkloadCatalog

log = logging.getLogger(__name__)

PREDICTOR_SAMPLES = 2000
PREDICTOR_EPOCHS = None  # the network's default (scheduler_core.prediction.config)


def load_trace(path: str | os.PathLike[str]) -> list[TraceJob]:
    """Parse a Philly-format trace; a malformed line raises TraceError with its line number."""
    with open(path, encoding="utf-8") as fh:
        return parse_trace(fh)


def _cache_key(cfg: SimConfig, gpu_type: str, samples: int, epochs: int | None, catalog: WorkloadCatalog) -> str:
    net = PredictorConfig(epochs=epochs, seed=cfg.seed)  # the network the predictor is trained as, defaults resolved
    key = json.dumps({
        "v": 3, "seed": cfg.seed, "gpu_type": gpu_type, "samples": samples, "epochs": net.epochs,
        "arch": net.arch, "hidden": net.hidden, "layers": net.layers,
        "services": [(s.family, s.qps_min, s.qps_max) for s in cfg.services],
        "interference": cfg.interference.__dict__,
        "calibration": [catalog.calibration, catalog.gpu_type, cal.installed_calibrator().fingerprint()],
    }, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def traits_gpu_type(cfg: SimConfig) -> str:
    """The GPU type whose traits the simulated fleet uses: the cluster's, or its most common one.

    The fleet keeps one trait table for every GPU; a mixed cluster uses its largest type's.
    """
    return max(sorted(cfg.types()), key=lambda tc: tc[1])[0]


def simulation_catalog(cfg: SimConfig, calibration: str = cal.TRANSFER) -> WorkloadCatalog:
    return cal.catalog_for(calibration, traits_gpu_type(cfg))


def services_of(cfg: SimConfig) -> list[tuple[str, str, float]]:
    return [(s.name, s.family, float(ONLINE_FAMILIES[s.family].mem_bytes)) for s in cfg.services]


def train_on_samples(catalog: WorkloadCatalog, gtype: str, cfg: SimConfig, samples: int, epochs: int | None,
                     stream: str) -> tuple[SpeedPredictor, dict]:
    """A predictor for ``gtype`` trained on simulated samples of ``catalog``'s traits; (model, its report)."""
    rows = colocation_samples(catalog, gtype, services_of(cfg), sorted(catalog.offline), samples,
                              rng_stream(cfg.seed, stream), cfg.interference)
    x, yt, ys = training_matrix(rows, gtype)
    with one_torch_thread():
        model, report = train(x, yt, ys, PredictorConfig(epochs=epochs, seed=cfg.seed))
    return model, {"trained_on_simulated_samples": samples, "holdout_mae_tput": report.holdout_mae_tput,
                   "holdout_mae_slowdown": report.holdout_mae_slowdown}


def simulation_predictors(cfg: SimConfig, cache_dir: Path | None, samples: int = PREDICTOR_SAMPLES,
                          epochs: int | None = PREDICTOR_EPOCHS, catalog: WorkloadCatalog | None = None,
                          ) -> tuple[dict[str, SpeedPredictor], dict]:
    """One predictor per GPU type of the simulated cluster, on the fleet's traits; (models, {type: info})."""
    catalog = catalog or simulation_catalog(cfg)
    models, info = {}, {}
    for gtype in sorted({t for t, _ in cfg.types()}):
        key = _cache_key(cfg, gtype, samples, epochs, catalog)
        path = cache_dir / f"sim-predictor-{gtype}-{key}.bin" if cache_dir else None
        if path is not None and path.exists():
            models[gtype] = SpeedPredictor.from_bytes(path.read_bytes())
            info[gtype] = {"cached": str(path)}
            continue
        models[gtype], info[gtype] = train_on_samples(catalog, gtype, cfg, samples, epochs, f"sim-samples-{gtype}")
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(models[gtype].to_bytes())
            tmp.replace(path)
    return models, info


def interference_info(calibrator: cal.Calibrator | None = None) -> dict:
    """How well the interference models reproduce measured pairs they were not fitted on."""
    c = calibrator or cal.installed_calibrator()
    return {
        # Per-job σ/π fit, held-out pairs of the same type (Gavel K80/P100).
        "interference_calibration_holdout": [r.as_dict() for r in c.holdout_reports()],
        "interference_model": {"measurements": c.fingerprint(), **cal.model_errors(c)},
    }


def simulation_inputs(cfg: SimConfig, cache_dir: Path | None = None,
                      calibration: str = cal.TRANSFER) -> tuple[SimInputs, dict]:
    catalog = simulation_catalog(cfg, calibration)
    types = sorted({t for t, _ in cfg.types()})
    profiles = {(job, g): offline_profile(catalog, job, g) for job in catalog.offline for g in types}
    predictors, info = simulation_predictors(cfg, cache_dir, catalog=catalog)
    info = {"calibration": calibration, "traits_gpu_type": catalog.gpu_type, "predictors": info,
            **interference_info()}
    return SimInputs(catalog=catalog, profiles=profiles, predictors=predictors), info


def jct_bound_report(trace: list[TraceJob], cfg: SimConfig, caps: list[float],
                     calibration: str = cal.TRANSFER) -> dict:
    """The lower bound on mean censored JCT of any MPS planner at each per-minute slowdown cap (SIMULATED).

    :mod:`scheduler_core.simulator.bounds` on ``trace`` shaped as the simulator shapes it for ``cfg``
    (same jobs, same seed); ``caps`` may hold ``inf`` (no cap). Raises ValueError where the bound's
    premise (the idle replica is the best minute) does not hold for this cluster and calibration.
    """
    import numpy as np


    catalog = simulation_catalog(cfg, calibration)
    jobs = build_jobs(trace, catalog, cfg, rng_stream(cfg.seed, "trace-repeat"))
    if not bounds.idle_dominates(cfg, catalog, jobs.types, caps):
        raise ValueError("a busier replica lets some job run faster within a cap than an idle one: the bound's "
                         "premise does not hold for this cluster and calibration")
    sps = np.array([catalog.offline[t].solo_steps_per_s_p100 for t in jobs.types])
    rows = []
    for cap in caps:
        rates = bounds.best_rates(cfg, catalog, jobs.types, cap)
        b = bounds.jct_bound(cfg, jobs, sps, rates)
        rows.append({"cap": None if cap == float("inf") else cap, "jct_censored_s": round(b["jct_censored_s"], 2),
                     "arrived": b["arrived"], "finished": b["finished"],
                     "job_types": [r.as_dict() for r in rates]})
    return {"simulated": True, "calibration": calibration, "jobs": jobs.size, "bounds": rows}


POLICY_COLORS = {
    "online-only": "#7f7f7f", "time-sharing": "#d62728", "pb-time-sharing": "#ff7f0e", "muxflow": "#1f77b4",
    "muxflow-s": "#2ca02c", "muxflow-m": "#9467bd", "muxflow-s-m": "#8c564b", "salus": "#e377c2",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path, title: str) -> Path:
    fig.suptitle(f"{title} (SIMULATED)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_utilization(series: dict[str, dict], path: Path, title: str) -> Path:
    """GPU utilization and SM activity over time per policy (one point per round interval), SIMULATED."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    for name, s in series.items():
        hours = [(i + 0.5) * s["bin_minutes"] / 60.0 for i in range(len(s["util"]))]
        for ax, key in zip(axes, ("util", "sm")):
            ax.plot(hours, s[key], label=name, color=POLICY_COLORS.get(name), linewidth=1.4)
    for ax, label in zip(axes, ("GPU utilization (%)", "SM activity (%)")):
        ax.set_xlabel("simulated hour")
        ax.set_ylabel(label)
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper left")
    return _save(plt, fig, path, title)


def plot_comparison(rows: list[dict], path: Path, title: str) -> Path:
    """Bars like the paper's Figures 11/13: latency vs Online-only, JCT and oversold GPU vs MuxFlow."""
    plt = _pyplot()
    panels = [("avg_latency_vs_online_only", "avg latency\n(× Online-only)"),
              ("p99_latency_vs_online_only", "p99 latency\n(× Online-only)"),
              ("jct_vs_muxflow", "avg JCT\n(× MuxFlow)"),
              ("oversold_vs_muxflow", "oversold GPU\n(× MuxFlow)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 3.8))
    for ax, (key, label) in zip(axes, panels):
        named = [(r["policy"], r.get(key)) for r in rows if r.get(key) is not None]
        ax.bar(range(len(named)), [v for _, v in named], color=[POLICY_COLORS.get(n, "#333") for n, _ in named])
        ax.set_xticks(range(len(named)))
        ax.set_xticklabels([n for n, _ in named], rotation=45, ha="right", fontsize=7)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_title(label, fontsize=9)
        for i, (_, v) in enumerate(named):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=6)
    return _save(plt, fig, path, title)
