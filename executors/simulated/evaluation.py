"""Inputs and outputs of the trace-driven simulator (scheduler_core.simulator): what is not pure.

- solo profiles of every (job type, GPU type) from the simulated GPU model,
- one speed predictor per GPU type trained on simulated co-location samples of
  the simulation's online services (cached on disk: training costs seconds per
  type, a simulation run should not pay it again),
- trace files, progress and the comparison plots.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from executors.simulated.calibration import default_catalog, holdout_reports
from executors.simulated.profiling import colocation_samples, offline_profile
from scheduler_core.predictor import PredictorConfig, SpeedPredictor, one_torch_thread, train
from scheduler_core.rng import rng_stream
from scheduler_core.simulator import SimConfig, SimInputs
from scheduler_core.trace import TraceJob, parse_trace
from scheduler_core.workloads import ONLINE_FAMILIES

log = logging.getLogger(__name__)

PREDICTOR_SAMPLES = 2000
PREDICTOR_EPOCHS = 250


def load_trace(path: str | os.PathLike[str]) -> list[TraceJob]:
    """Parse a Philly-format trace; a malformed line raises TraceError with its line number."""
    with open(path, encoding="utf-8") as fh:
        return parse_trace(fh)


def _cache_key(cfg: SimConfig, gpu_type: str, samples: int, epochs: int) -> str:
    key = json.dumps({
        "v": 1, "seed": cfg.seed, "gpu_type": gpu_type, "samples": samples, "epochs": epochs,
        "services": [(s.family, s.qps_min, s.qps_max) for s in cfg.services],
        "interference": cfg.interference.__dict__,
    }, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def simulation_predictors(cfg: SimConfig, cache_dir: Path | None, samples: int = PREDICTOR_SAMPLES,
                          epochs: int = PREDICTOR_EPOCHS) -> tuple[dict[str, SpeedPredictor], dict]:
    """One predictor per GPU type of the simulated cluster; (models, {type: info})."""
    catalog = default_catalog()
    services = [(s.name, s.family, float(ONLINE_FAMILIES[s.family].mem_bytes)) for s in cfg.services]
    models, info = {}, {}
    for gtype in sorted({t for t, _ in cfg.types()}):
        path = cache_dir / f"sim-predictor-{gtype}-{_cache_key(cfg, gtype, samples, epochs)}.bin" if cache_dir else None
        if path is not None and path.exists():
            models[gtype] = SpeedPredictor.from_bytes(path.read_bytes())
            info[gtype] = {"cached": str(path)}
            continue
        rows = colocation_samples(catalog, gtype, services, sorted(catalog.offline), samples,
                                  rng_stream(cfg.seed, f"sim-samples-{gtype}"), cfg.interference)
        from executors.steps import training_matrix

        x, yt, ys = training_matrix(rows, gtype)
        with one_torch_thread():
            model, report = train(x, yt, ys, PredictorConfig(epochs=epochs, seed=cfg.seed))
        models[gtype] = model
        info[gtype] = {"trained_on_simulated_samples": samples, "holdout_mae_tput": report.holdout_mae_tput,
                       "holdout_mae_slowdown": report.holdout_mae_slowdown}
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(model.to_bytes())
            tmp.replace(path)
    return models, info


def simulation_inputs(cfg: SimConfig, cache_dir: Path | None = None) -> tuple[SimInputs, dict]:
    catalog = default_catalog()
    types = sorted({t for t, _ in cfg.types()})
    profiles = {(job, g): offline_profile(catalog, job, g) for job in catalog.offline for g in types}
    predictors, info = simulation_predictors(cfg, cache_dir)
    # How well the interference model reproduces measured pairs it was not fitted on (Gavel K80/P100).
    info = {"predictors": info, "interference_calibration_holdout": [r.as_dict() for r in holdout_reports()]}
    return SimInputs(catalog=catalog, profiles=profiles, predictors=predictors), info


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
