"""Explicit configuration of the Dagster deployment (one object, passed to ``build_definitions``).

Where it comes from, first match wins:

1. ``MUXFLOW_SETTINGS`` — path of a JSON file with any of the fields below;
2. ``$DAGSTER_HOME/muxflow.json`` — written by the main job (``make run``), so
   that ``make ui`` shows the cluster the main job ran;
3. ``MUXFLOW_*`` environment variables, each overriding its default.

Nothing here connects to anything: resources open the store and the cluster
when a run uses them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path

from executors.store.db import resolve_url

SETTINGS_FILE = "muxflow.json"
DEFAULT_ROUNDS_START = dt.datetime(2026, 1, 5, tzinfo=dt.timezone.utc)


class SettingsError(ValueError):
    """Invalid deployment configuration."""


@dataclass(frozen=True)
class MuxflowSettings:
    db_url: str
    cluster: str = "simulated"  # simulated | slurm
    slurm_url: str | None = None
    gpu_types: tuple[str, ...] = ("a10", "t4")
    rounds_start: dt.datetime = DEFAULT_ROUNDS_START
    # Exclusive end of the round partitions; None = open-ended (a live cluster). The main
    # job sets it to the end of its simulated hours, so the UI lists just those windows.
    rounds_end: dt.datetime | None = None
    seed: int = 0
    samples_per_type: int = 2000
    max_holdout_mae: float = 0.10  # asset check bound on a predictor's held-out MAE of normalized throughput
    migration_penalty: float = 0.05
    epochs: int = 250
    report_dir: str = ".muxflow/report"
    warmup_minutes: int = 60  # simulated cluster: online-only history recorded before its first round

    def __post_init__(self) -> None:
        if self.cluster not in ("simulated", "slurm"):
            raise SettingsError(f"cluster must be 'simulated' or 'slurm', got {self.cluster!r}")
        if self.cluster == "slurm" and not self.slurm_url:
            raise SettingsError("cluster 'slurm' needs slurm_url (MUXFLOW_SLURM_URL)")
        if not self.gpu_types or len(set(self.gpu_types)) != len(self.gpu_types):
            raise SettingsError(f"gpu_types must be a non-empty list of distinct names, got {self.gpu_types!r}")
        for name in ("rounds_start", "rounds_end"):
            t = getattr(self, name)
            if t is None:
                continue
            if t.tzinfo is None:
                raise SettingsError(f"{name} must carry a time zone (UTC)")
            if t.minute % 15 or t.second or t.microsecond:
                raise SettingsError(f"{name} must fall on a 15-minute boundary, got {t.isoformat()}")
        if self.rounds_end is not None and self.rounds_end <= self.rounds_start:
            raise SettingsError("rounds_end must be after rounds_start")
        if not 0 < self.max_holdout_mae:
            raise SettingsError("max_holdout_mae must be > 0")
        if self.samples_per_type < 10 or self.epochs < 1 or self.migration_penalty < 0 or self.warmup_minutes < 15:
            raise SettingsError("samples_per_type >= 10, epochs >= 1, migration_penalty >= 0 and "
                                "warmup_minutes >= 15 are required")

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["gpu_types"] = list(self.gpu_types)
        d["rounds_start"] = self.rounds_start.isoformat()
        d["rounds_end"] = self.rounds_end.isoformat() if self.rounds_end else None
        return d

    @classmethod
    def from_json(cls, d: dict) -> MuxflowSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise SettingsError(f"unknown settings: {', '.join(unknown)}")
        d = dict(d)
        if "gpu_types" in d:
            d["gpu_types"] = tuple(d["gpu_types"])
        for name in ("rounds_start", "rounds_end"):
            if d.get(name) is not None:
                d[name] = _parse_time(d[name], name)
        try:
            return cls(**d)
        except TypeError as exc:
            raise SettingsError(str(exc)) from exc


def _parse_time(v: str | dt.datetime, name: str = "rounds_start") -> dt.datetime:
    if isinstance(v, dt.datetime):
        return v
    try:
        t = dt.datetime.fromisoformat(v)
    except ValueError as exc:
        raise SettingsError(f"{name}: not an ISO time: {v!r}") from exc
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def write_settings(settings: MuxflowSettings, dagster_home: Path) -> Path:
    dagster_home.mkdir(parents=True, exist_ok=True)
    path = dagster_home / SETTINGS_FILE
    path.write_text(json.dumps(settings.to_json(), indent=2) + "\n")
    return path


def load_settings(environ: dict[str, str] | None = None) -> MuxflowSettings:
    env = os.environ if environ is None else environ
    path = env.get("MUXFLOW_SETTINGS")
    if not path and env.get("DAGSTER_HOME"):
        candidate = Path(env["DAGSTER_HOME"]) / SETTINGS_FILE
        path = str(candidate) if candidate.exists() else None
    if path:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SettingsError(f"cannot read settings file {path}: {exc}") from exc
        data.setdefault("db_url", resolve_url(None, env))
        return MuxflowSettings.from_json(data)
    d: dict = {"db_url": resolve_url(None, env)}
    conv = {
        "MUXFLOW_CLUSTER": ("cluster", str), "MUXFLOW_SLURM_URL": ("slurm_url", str),
        "MUXFLOW_GPU_TYPES": ("gpu_types", lambda v: tuple(x.strip() for x in v.split(",") if x.strip())),
        "MUXFLOW_ROUNDS_START": ("rounds_start", _parse_time),
        "MUXFLOW_ROUNDS_END": ("rounds_end", lambda v: _parse_time(v, "rounds_end")), "MUXFLOW_SEED": ("seed", int),
        "MUXFLOW_SAMPLES_PER_TYPE": ("samples_per_type", int), "MUXFLOW_MAX_HOLDOUT_MAE": ("max_holdout_mae", float),
        "MUXFLOW_MIGRATION_PENALTY": ("migration_penalty", float), "MUXFLOW_EPOCHS": ("epochs", int),
        "MUXFLOW_REPORT_DIR": ("report_dir", str),
    }
    for var, (name, fn) in conv.items():
        if var in env:
            try:
                d[name] = fn(env[var])
            except ValueError as exc:
                raise SettingsError(f"{var}={env[var]!r}: {exc}") from exc
    return MuxflowSettings(**d)
