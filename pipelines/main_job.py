"""The main job (`make run`): a full scheduling run on a simulated cluster, executed through Dagster.

The operator's part (create the simulated cluster) and the users' part
(submissions arriving from a Philly trace) happen here; everything the
scheduler does runs as Dagster runs, in process, against the Dagster instance
under ``DAGSTER_HOME`` — the one ``make ui`` reads:

refresh_job (profiles, online features, co-location samples) → train_job per
GPU type (candidate, blocking held-out check, promotion) → for each simulated
15-minute window: the submission and eviction sensors are ticked and their run
requests executed, then the round sensor is ticked at the window start (its
clock is the simulated time) and its round_job run (plan, dispatch, the simulated window) → report_job.

Every figure it prints comes from the simulated cluster and says so.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from assets.reports import write_run_plots
from executors.data.calibration import SAMPLE_TRACE, default_catalog, holdout_reports
from executors.scheduler.submission import SubmissionError, spec_from_trace, submit
from executors.simulated.evaluation import load_trace
from executors.simulated.setup import init_simulated_cluster
from executors.store import summary as summary_db
from executors.store.db import Store, cannot_open
from executors.store.migrate import upgrade
from executors.store.rounds import round_for_window, window_figures
from pipelines.definitions import build_definitions
from pipelines.settings import MuxflowSettings, write_settings
from scheduler_core.online import budget_pacing
from scheduler_core.prediction.predictor import PredictorConfig

log = logging.getLogger(__name__)
ROUND = dt.timedelta(minutes=15)
SIM_START = dt.datetime(2026, 1, 5, 0, 0, tzinfo=dt.timezone.utc)
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DAGSTER_HOME = Path(".dagster_home")


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
    max_jobs_per_gpu: int = 1
    max_holdout_mae: float = 0.10
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    dagster_home: Path = DEFAULT_DAGSTER_HOME


def _say(progress: Callable[[str], None] | None, msg: str) -> None:
    if progress:
        progress(msg)
    log.info(msg)


def absolute_db_url(url: str) -> str:
    """SQLite URLs with an absolute path, so the UI finds the same file from any directory."""
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        path = url.split("///", 1)[1]
        if path and path != ":memory:":
            return f"sqlite:///{Path(path).resolve()}"
    return url


def open_dagster_instance(home: Path):
    """The Dagster instance under ``home``, created from the project's dagster.yaml when new.

    The copy names ``home`` itself as the SQLite directory (the project file reads it
    from ``$DAGSTER_HOME``), so the instance is the same whatever the environment says.
    """
    import yaml
    from dagster import DagsterInstance

    home = home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    if not target.exists():
        config = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
        if "sqlite" in config.get("storage", {}):
            config["storage"]["sqlite"]["base_dir"] = str(home)
        target.write_text("# Written by muxflow from the project's dagster.yaml for this DAGSTER_HOME.\n"
                          + yaml.safe_dump(config, sort_keys=False))
    return DagsterInstance.from_config(str(home))


def reset_dagster_home(home: Path) -> None:
    """Forget the runs of an earlier main job: the SQLite storage of the instance under ``home``.

    Only what Dagster's SQLite storage writes there is removed (its dagster.yaml
    and settings stay); a home with other storage is left alone.
    """
    for name in ("history", "schedules", "storage", ".logs_queue", ".nux", ".telemetry"):
        target = home / name
        if target.is_dir():
            shutil.rmtree(target)


class DagsterDriver:
    """Runs jobs in process and ticks sensors (the round sensor at simulated times), as the daemon would."""

    def __init__(self, defs, instance, log_level: str = "WARNING"):
        from dagster import build_sensor_context

        self.defs, self.instance = defs, instance
        # Every event still goes to the instance (the UI shows it); the console only gets warnings.
        self.run_config = {"loggers": {"console": {"config": {"log_level": log_level}}}}
        self._cursors: dict[str, str | None] = {}
        self._build_sensor_context = build_sensor_context
        self.runs = 0

    def execute(self, job_name: str, partition_key: str | None = None, tags: dict | None = None):
        from dagster import DynamicPartitionsDefinition

        job = self.defs.resolve_job_def(job_name)
        parts = job.partitions_def
        if isinstance(parts, DynamicPartitionsDefinition) and partition_key is not None \
                and not self.instance.has_dynamic_partition(parts.name, partition_key):
            # As the UI's "add partition" before launching a run of a window nobody ran yet.
            self.instance.add_dynamic_partitions(parts.name, [partition_key])
        res = job.execute_in_process(instance=self.instance, partition_key=partition_key, tags=tags or {},
                                     raise_on_error=False, run_config=self.run_config)
        self.runs += 1
        if not res.success:
            failures = [e.message for e in res.all_events if e.is_failure]
            raise RuntimeError(f"Dagster run {res.run_id} of {job_name}"
                               f"{f' [{partition_key}]' if partition_key else ''} failed: {failures[-3:]}")
        return res

    def tick_sensor(self, name: str) -> list:
        """Evaluate a sensor once, as the daemon would: its partitions added, its runs executed; the runs' results."""
        from dagster import partition_loading_context

        sensor = self.defs.resolve_sensor_def(name)
        with partition_loading_context(dynamic_partitions_store=self.instance), \
                self._build_sensor_context(instance=self.instance, cursor=self._cursors.get(name),
                                           instance_ref=self.instance.get_ref() if self.instance.is_persistent else None,
                                           resources=self.defs.resources, definitions=self.defs) as ctx:
            data = sensor.evaluate_tick(ctx)
        self._cursors[name] = data.cursor
        for req in data.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        return [self.execute(sensor.job_name, req.partition_key, {**req.tags, "dagster/sensor_name": name})
                for req in data.run_requests or []]


def run_main_job(cfg: MainJobConfig, progress: Callable[[str], None] | None = print) -> dict:
    t0 = time.perf_counter()
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    db_url = absolute_db_url(cfg.db_url)
    catalog = default_catalog()
    gpu_types = tuple(sorted(cfg.types))
    # The whole trace is checked before anything is written or run.
    try:
        trace = load_trace(cfg.trace)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"trace: cannot read {cfg.trace}: {exc}") from exc
    single = [t for t in trace if t.scale_factor == 1][: cfg.jobs]
    skipped = sum(1 for t in trace if t.scale_factor != 1)
    if not single:
        raise ValueError(f"trace {cfg.trace}: no single-GPU job to run ({skipped} multi-GPU lines)")
    for t in single:
        try:
            catalog.offline_workload(t.job_type)
        except KeyError as exc:
            raise ValueError(f"trace line {t.line_no}: {exc.args[0]}") from exc
    try:
        upgrade(db_url)
    except Exception as exc:  # an unreachable server, a path that cannot be created
        raise ValueError(cannot_open(db_url, exc)) from exc
    store = Store(db_url)
    with store.session() as s:
        info = init_simulated_cluster(s, cfg.types, cfg.services, seed=cfg.seed)
    _say(progress, f"[1/5] simulated cluster: {info['gpus']} GPUs ({', '.join(f'{k}:{v}' for k, v in sorted(cfg.types.items()))}) "
                   f"on {info['nodes']} nodes, {info['services']} online services")

    horizon_s = cfg.hours * 3600 * 0.6
    last = max((t.arrival_s for t in single), default=0.0) or 1.0
    compression = max(1.0, last / horizon_s)
    arrivals = sorted(((t.arrival_s / compression, t) for t in single), key=lambda p: p[0])
    _say(progress, f"[2/5] trace {cfg.trace.name}: {len(single)} single-GPU jobs "
                   f"({skipped} multi-GPU lines not eligible for space-sharing); arrivals compressed x{compression:.0f}")

    first_window = SIM_START + dt.timedelta(minutes=cfg.warmup_minutes)
    n_rounds = int(cfg.hours * 60 // 15)
    settings = MuxflowSettings(
        db_url=db_url, gpu_types=gpu_types, rounds_start=SIM_START, rounds_end=first_window + n_rounds * ROUND,
        seed=cfg.seed,
        samples_per_type=cfg.samples_per_type, max_holdout_mae=cfg.max_holdout_mae,
        migration_penalty=cfg.migration_penalty, max_jobs_per_gpu=cfg.max_jobs_per_gpu, epochs=cfg.predictor.epochs,
        report_dir=str(cfg.report_dir.resolve()),
        warmup_minutes=cfg.warmup_minutes,
    )
    instance = open_dagster_instance(cfg.dagster_home)
    write_settings(settings, cfg.dagster_home.resolve())
    sim_now = [SIM_START]  # the round sensor's clock: simulated time, advanced window by window
    defs = build_definitions(settings, now=lambda: sim_now[0])
    driver = DagsterDriver(defs, instance)

    driver.execute("refresh_job")
    with store.session() as s:
        counts = summary_db.sample_counts_by_type(s)
    _say(progress, f"[3/5] Dagster refresh_job: co-location samples (simulated) {counts}; calibration held-out error: "
                   + ", ".join(f"{r.gpu_type} MAE {r.mae:.3f} (mean-baseline {r.baseline_mae:.3f})" for r in holdout_reports()))
    for gtype in gpu_types:
        driver.execute("train_job", partition_key=gtype)
    with store.session() as s:
        for row in summary_db.predictor_versions(s):
            _say(progress, f"      predictor {row.gpu_type} v{row.version}: held-out MAE normalized tput "
                           f"{row.holdout_mae_tput:.3f}, online slowdown {row.holdout_mae_slowdown:.3f} "
                           f"({row.n_train} train / {row.n_holdout} held out, {row.trained_on}) "
                           f"{'promoted' if row.promoted else 'not promoted'}")

    _say(progress, f"[4/5] rounds from {first_window:%Y-%m-%d %H:%M} UTC (simulated time); the first round records "
                   f"{cfg.warmup_minutes} minutes of online-only load first")
    next_arrival = 0
    rounds = []
    now = first_window
    for k in range(n_rounds):
        elapsed_s = (now - first_window).total_seconds()
        with store.session() as s:  # the users: submissions that arrived by now
            while next_arrival < len(arrivals) and arrivals[next_arrival][0] <= elapsed_s:
                t = arrivals[next_arrival][1]
                next_arrival += 1
                try:
                    submit(s, spec_from_trace(t, catalog.offline_workload(t.job_type).mem_bytes, gpu_types),
                           set(catalog.offline))
                except SubmissionError as exc:
                    log.warning("trace line %d rejected: %s", t.line_no, exc)
        driver.tick_sensor("new_submission_sensor")
        driver.tick_sensor("eviction_sensor")
        sim_now[0] = now
        if len(driver.tick_sensor("round_sensor")) != 1:
            raise RuntimeError(f"the round sensor requested no round for {now.isoformat()}")
        rounds.append(_round_row(store, k, now))
        r = rounds[-1]
        c = r["actions"]
        _say(progress, f"[5/5] round {k + 1:2d}/{n_rounds} {now:%H:%M} [{settings.round_clock.key(now)}] placements "
                       f"{r['placements']:3d} (start {c.get('start', 0)}, keep {c.get('keep', 0)}, migrate "
                       f"{c.get('migrate', 0)}, evict {c.get('evict', 0)}) objective {r['objective']:6.2f}  "
                       f"oversold(sim) {r['oversold_simulated'] if r['oversold_simulated'] is not None else float('nan'):.2f}  "
                       f"evictions {r['evictions']}  done {r['completed']}")
        now += ROUND
    driver.execute("report_job")

    summary = summarize(store, rounds, cfg, time.perf_counter() - t0, compression)
    summary["dagster"] = {"home": str(cfg.dagster_home.resolve()), "runs": driver.runs,
                          "ui": "make ui  →  http://127.0.0.1:3000  (assets → placement_plan)"}
    cfg.report_dir.mkdir(parents=True, exist_ok=True)
    summary["plots"] = write_run_plots(store, cfg.report_dir, rounds)
    (cfg.report_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    store.dispose()
    return summary


def _round_row(store: Store, k: int, window: dt.datetime) -> dict:
    """The round's figures as the store has them after its Dagster run."""
    with store.session() as s:
        rnd = round_for_window(s, window)
        f = window_figures(s, rnd.id, window, window + ROUND)
        return {"round": k, "round_id": rnd.id, "window_start_utc": window.isoformat(), "placements": rnd.placements,
                "objective": rnd.objective, "actions": dict(rnd.action_counts), "evictions": f.evictions,
                "completed": f.completed, "oversold_simulated": f.oversold,
                "matching_s": (rnd.timings_s or {}).get("matching")}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def summarize(store: Store, rounds: list[dict], cfg: MainJobConfig, elapsed_s: float, compression: float) -> dict:
    since = SIM_START + dt.timedelta(minutes=cfg.warmup_minutes)
    with store.session() as s:
        f = summary_db.run_figures(s, since)
        services = service_tails(summary_db.shared_service_minutes(s, since))
        # The budget's horizon: the last day of requests (here the whole run, its warm-up alone included), as the
        # rounds' pacing reads it (scheduler_core.online.budget_pacing).
        until = since + dt.timedelta(hours=cfg.hours)
        every = summary_db.service_minutes(s, max(SIM_START, until - dt.timedelta(days=1)), until)
    for entry in services:  # what all its requests saw (a minute alone spends nothing), against its budget
        spend, _n = budget_pacing.spent(*every.get(entry["service"], (np.zeros(0), np.zeros(0), []))[:2])
        entry["all_requests_avg"] = None if spend is None else round(spend, 3)
        if entry["budget"] is not None and spend is not None:
            entry["all_requests_within_budget"] = bool(spend <= entry["budget"] + 1e-9)
    arr, shared, states, evictions = f.metrics, f.shared, f.jobs_by_state, f.evictions
    ex = (f.solo_equiv_s, f.wall_s, f.executions)
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
        "services_on_shared_gpus": services,
        "executions": int(ex[2]),
        "evictions": int(evictions),
        "eviction_rate": round(evictions / ex[2], 4) if ex[2] else 0.0,
        "jobs_by_state": states,
        "restarts": restarts(store),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items() if k != "predictor"},
    }


def restarts(store: Store) -> dict:
    """The restarts the rounds caused the jobs (SQL report ``restarts_per_day``, summed over the run's days):
    moves to another GPU and new shares on the job's GPU, per job placed, and the most of one job."""
    from executors.store.reports import run_report

    df = run_report(store.engine, "restarts_per_day")  # no rows: every sum 0
    placed, moves, shares = (int(df[c].sum()) for c in ("jobs_placed", "moves", "new_shares"))
    return {"moves": moves, "new_shares": shares, "per_job_placed": round((moves + shares) / placed, 2) if placed
            else 0.0, "most_of_one_job": int(df["most_restarts_of_a_job"].max()) if len(df) else 0,
            "see": "muxflow report restarts_per_day; muxflow jobs show JOB"}


def _weighted_quantile(x: np.ndarray, w: np.ndarray, q: float) -> float:
    order = np.argsort(x)
    c = np.cumsum(w[order])
    return float(x[order][min(int(np.searchsorted(c, q * c[-1])), x.size - 1)])


def service_tails(df) -> list[dict]:
    """Per online service, what its requests on shared GPUs saw (SIMULATED): the mean and the p99 slowdown over
    those requests (each replica-minute weighs its requests), the worst minute, and whether the p99 stayed within
    the service's allowance; where it did not, why: how many shared minutes went over, and whether the rounds had
    predicted them within the allowance (the simulated interference came out above the prediction) or not."""
    out = []
    for name, g in df.groupby("service", sort=True):
        g = g[np.isfinite(g["slowdown"].astype(float))]
        if g.empty:
            continue
        x = g["slowdown"].to_numpy(float) - 1.0
        w = g["qps"].fillna(0.0).to_numpy(float)
        w = w if w.sum() > 0 else np.ones_like(x)
        allowance = float(g["allowance"].iloc[0])
        p99 = _weighted_quantile(x, w, 0.99)
        over = x > allowance + 1e-9
        entry = {"service": name, "allowance": allowance, "budget": g["budget"].iloc[0],
                 "shared_minutes": int(x.size), "avg": round(float((x * w).sum() / w.sum()), 3),
                 "p99": round(p99, 3), "worst": round(float(x.max()), 3), "minutes_over_allowance": int(over.sum()),
                 "p99_within_allowance": bool(p99 <= allowance + 1e-9)}
        if not entry["p99_within_allowance"]:
            pred = g["predicted"].to_numpy(object)[over]
            known = [float(v) - 1.0 for v in pred if v is not None and v == v]
            within = sum(1 for v in known if v <= allowance + 1e-9)
            entry["why"] = (f"{int(over.sum())} of {x.size} shared minutes over its +{100 * allowance:.0f} % allowance "
                            f"(worst +{100 * x.max():.1f} %); the rounds had predicted {within} of them within it "
                            f"(the simulated interference came out above the prediction), {len(known) - within} over "
                            f"it, {int(over.sum()) - len(known)} without a prediction on record")
        out.append(entry)
    return out


def _mean(a: np.ndarray) -> float:
    return round(float(np.nanmean(a)), 2) if np.isfinite(a).any() else float("nan")
