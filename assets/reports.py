"""The utilization report: SQL reports written as CSV, summarized and plotted for the UI."""

from __future__ import annotations

from pathlib import Path

from dagster import MetadataValue

from assets.plots import png_markdown
from executors.store.db import Store
from executors.store.reports import run_report, write_csv
from executors.store.summary import utilization_per_minute

REPORTS = ("utilization_per_hour", "oversold_per_round", "evictions_per_day", "online_latency_per_day",
           "restarts_per_day")


def write_utilization_report(store: Store, out_dir: Path, simulated: bool) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    frames = {name: run_report(store.engine, name) for name in REPORTS}
    paths = {}
    for name, df in frames.items():
        path = out_dir / f"{name}.csv"
        write_csv(df, path)
        paths[name] = str(path.resolve())
    util, over = frames["utilization_per_hour"], frames["oversold_per_round"]
    label = "SIMULATED" if simulated else "measured"
    meta: dict = {f"csv_{k}": MetadataValue.path(v) for k, v in paths.items()}
    meta["hours"] = len(util)
    meta["rounds"] = len(over)
    if len(util):
        shared = util["shared_minutes"].sum()
        meta[f"gpu_util_pct_all_{label.lower()}"] = round(float((util["gpu_util_pct"] * util["gpu_minutes"]).sum()
                                                               / util["gpu_minutes"].sum()), 2)
        meta["shared_gpu_minutes_frac"] = round(float(shared / util["gpu_minutes"].sum()), 4)
        meta["utilization_per_hour"] = _plot(util, label)
    if len(over) and over["oversold_gpu"].notna().any():
        meta[f"oversold_gpu_mean_{label.lower()}"] = round(float(over["oversold_gpu"].dropna().mean()), 4)
        meta["last_rounds"] = MetadataValue.md(over.tail(8)[["round_id", "window_start_utc", "placements", "objective",
                                                              "oversold_gpu"]].to_markdown(index=False, floatfmt=".3f"))
    lat = frames["online_latency_per_day"]
    if len(lat):
        meta["online_latency_per_day"] = MetadataValue.md(lat.tail(12)[[
            "day_utc", "service", "source", "requests", "slowdown_all_requests", "slowdown_shared_requests",
            "slowdown_allowance", "slowdown_budget"]].to_markdown(index=False, floatfmt=".3f"))
    restarts = frames["restarts_per_day"]
    if len(restarts):  # what the rounds' moves cost the jobs: each move or new share restarts one
        meta["restarts_per_day"] = MetadataValue.md(restarts.tail(12).to_markdown(index=False, floatfmt=".2f"))
    return meta


def _plot(util, label: str) -> MetadataValue:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    x = range(len(util))
    ax.plot(x, util["gpu_util_pct"], label="GPU util (all minutes)")
    ax.plot(x, util["online_only_gpu_util_pct"], label="GPU util (online-only minutes)", linestyle="--")
    ax.plot(x, util["sm_activity_pct"], label="SM activity (all minutes)")
    ax.set_xticks(list(x)[:: max(1, len(util) // 8)])
    ax.set_xticklabels(util["hour_utc"].iloc[:: max(1, len(util) // 8)], rotation=30, fontsize=7)
    ax.set_ylim(0, 100)
    ax.set_ylabel("%")
    ax.set_title(f"Cluster utilization per hour — {label}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return png_markdown(fig, "utilization per hour")


def write_run_plots(store: Store, out: Path, rounds: list[dict]) -> list[str]:
    """The main job's plots: cluster utilization over time, placements and oversold GPU per round (SIMULATED)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    with store.session() as s:
        per_min = utilization_per_minute(s)
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
