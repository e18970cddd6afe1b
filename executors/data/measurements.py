"""Measured co-location samples: the file format, its reader, and the data the interference model is fitted on.

The format (``muxflow.colocation/1``, docs/CALIBRATION.md) is one JSON document::

    {"format": "muxflow.colocation/1",
     "stressor": "ResNet-50 (batch size 16)",                         # optional
     "gpus": {"v100": {"gpu_model": "Tesla V100-SXM2-16GB", "driver": "535.104.05",
                       "method": "mps", "date": "2025-03-14",
                       "relative_speed": 2.1, "notes": "..."}},      # the last two optional
     "solo": [{"gpu_type": "v100", "job_type": "ResNet-50 (batch size 16)", "steps_per_s": 12.3,
               "gpu_util_pct": 97, "sm_activity_pct": 81, "sm_occupancy_pct": 35,
               "mem_bw_util_pct": 40, "mem_used_bytes": 4200000000}],  # counters optional
     "pairs": [{"gpu_type": "v100", "job_type": "A", "partner": "B",
                "norm_tput": 0.61, "partner_norm_tput": 0.55}],       # the last optional
     "service_points": [{"gpu_type": "v100", "service": "cnn", "qps": 200, "job_type": "A", "sm_pct": 20,
                         "norm_tput": 0.26, "slowdown_avg": 1.29, "slowdown_p99": 2.56,
                         "usable": true, "window_s": 10, "repetitions": 1, "baseline": "before"}],  # optional
     "caveats": ["..."]}                                                # optional

``norm_tput`` is the job's steps/s while sharing the GPU with ``partner`` over its solo steps/s on
the same GPU type with the same method. The reader also takes Gavel's published layout (the
bundled K80/P100 file). A bad field is one ``MeasurementError`` line naming the file and field.

``service_points`` are a different kind of measurement: an online service at a request rate and an
offline job at an MPS SM share on one GPU (the co-location harness, paper §7.1; converted by
:mod:`executors.data.harness_reports`), each with its caveats and a verdict (``usable``, else
``reasons``). They are carried for comparison with the simulated GPU (``ServicePoint``); the
interference model is fitted on ``pairs`` only, and a GPU type described for its service points
alone (no solo run, no pair) is not a type of that model.

Where the chain's measurements come from: the bundled Gavel file, then every file named in the
``MUXFLOW_MEASUREMENTS`` environment variable (``os.pathsep``-separated); a later file's GPU type
replaces an earlier one's.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from scheduler_core.gpu_specs import GPU_SPECS
from scheduler_core.interference.errors import TypeData
from scheduler_core.interference.pairs import PairMeasurement
from scheduler_core.interference.transfer import COUNTERS

FORMAT = "muxflow.colocation/1"
ENV_VAR = "MUXFLOW_MEASUREMENTS"
METHODS = ("mps", "no-mps", "simulated", "unknown")
# A GPU-bound job small enough to co-fit in memory with any other (ResNet-50 is the canonical
# compute-bound training benchmark; batch 16 is its smallest configuration here).
DEFAULT_STRESSOR = "ResNet-50 (batch size 16)"
MAX_NORM_TPUT = 1.5  # sharing cannot make a job much faster than alone; more is a broken measurement
MAX_SLOWDOWN = 1e3  # a usable point's online slowdown; more is a broken measurement
_DATE = re.compile(r"^\d{4}(-\d{2}(-\d{2})?)?$")
GAVEL_FILE = Path(__file__).resolve().parent / "gavel" / "colocation_throughputs_k80_p100.json"
GAVEL_META = {
    g: {"gpu_model": f"NVIDIA Tesla {g.upper()}", "driver": "not recorded", "method": "unknown", "date": "2020",
        "notes": "Gavel (Stanford, MIT licence, commit c4fa400): two training jobs sharing one GPU, no SM limit"}
    for g in ("k80", "p100")
}


SERVICE_POINT_LIMITS = {  # optional numbers of a service point: (low, high, low end open)
    "slowdown_p99": (0.0, 1e3, True), "window_s": (0.0, 1e6, True), "noise": (0.0, 10.0, False),
    "service_solo_gpu_util_pct": (0.0, 100.0, False), "service_busy_frac": (0.0, 1.0, False),
    "solo_iter_time_s": (0.0, 1e6, True), "iter_time_s": (0.0, 1e6, True),
    "solo_latency_avg_ms": (0.0, 1e9, True), "solo_latency_p99_ms": (0.0, 1e9, True),
    "latency_avg_ms": (0.0, 1e9, True), "latency_p99_ms": (0.0, 1e9, True), "requests": (0.0, 1e12, False),
}


class MeasurementError(ValueError):
    """A measurement file that cannot be used, with the file and field at fault."""


@dataclass(frozen=True)
class GpuMeta:
    gpu_model: str
    driver: str
    method: str
    date: str
    source: str
    relative_speed: float | None = None
    notes: str = ""


@dataclass(frozen=True)
class MeasuredType:
    gpu_type: str
    meta: GpuMeta
    solo_steps_per_s: dict[str, float]
    pairs: tuple[PairMeasurement, ...]
    counters: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class ServicePoint:
    """An online service and an offline job sharing one GPU under an MPS SM limit (docs/CALIBRATION.md).

    ``usable`` False: kept out of every sample, with its ``reasons``; its numbers (None where the
    run produced none) stay for the record. ``row``: the point as written, caveats included."""

    gpu_type: str
    service: str
    qps: float
    job_type: str
    sm_pct: float
    norm_tput: float | None
    slowdown_avg: float | None
    slowdown_p99: float | None
    usable: bool
    reasons: tuple[str, ...]
    meta: GpuMeta
    row: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class MeasurementSet:
    types: dict[str, MeasuredType]
    stressor: str = DEFAULT_STRESSOR
    sources: tuple[str, ...] = ()
    service_points: tuple[ServicePoint, ...] = ()
    caveats: tuple[str, ...] = ()

    def merged(self, other: MeasurementSet) -> MeasurementSet:
        """``other``'s types replace these, and its service points these on its GPU types; its stressor wins
        when it names one."""
        theirs = {p.gpu_type for p in other.service_points} | set(other.types)
        points = tuple(p for p in self.service_points if p.gpu_type not in theirs) + other.service_points
        return MeasurementSet({**self.types, **other.types}, other.stressor, self.sources + other.sources, points,
                              self.caveats + other.caveats)

    def type_data(self) -> dict[str, TypeData]:
        """Per type, the inputs of the interference model, with a relative speed for every type.

        Speed: the file's ``relative_speed``, else the GPU spec's, else the stressor's solo
        steps/s against the known-speed type whose stressor runs closest to it (a GPU-bound job
        scales with the GPU; the nearest type keeps the extrapolation short).
        """
        known = {g: t.meta.relative_speed or (GPU_SPECS[g].relative_speed if g in GPU_SPECS else None)
                 for g, t in self.types.items()}
        base = {g: s for g, s in known.items() if s}
        if not base:
            base = {sorted(self.types)[0]: 1.0}
        out = {}
        for g, t in self.types.items():
            speed = base.get(g)
            if speed is None:
                mine = t.solo_steps_per_s.get(self.stressor)
                refs = [k for k in base if self.stressor in self.types[k].solo_steps_per_s]
                if mine is None or not refs:
                    raise MeasurementError(f"{g}: no relative_speed and no solo run of the stressor "
                                           f"{self.stressor!r} to estimate it from")
                k = min(refs, key=lambda r: abs(math.log(self.types[r].solo_steps_per_s[self.stressor] / mine)))
                speed = base[k] * mine / self.types[k].solo_steps_per_s[self.stressor]
            out[g] = TypeData(g, {j: 1.0 / v for j, v in t.solo_steps_per_s.items()}, t.pairs, speed, t.counters)
        return out


def _number(value, where: str, lo: float, hi: float, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MeasurementError(f"{where}: expected a number, got {value!r}")
    if value < lo or value > hi or (lo_open and value == lo):
        bound = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise MeasurementError(f"{where}: {value!r} is outside {bound}")
    return float(value)


def _text(obj: dict, key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise MeasurementError(f"{where}.{key}: required, a non-empty string")
    return value.strip()


def _list(doc: dict, key: str, where: str) -> list:
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise MeasurementError(f"{where}: {key}: expected a list")
    return value


def parse_document(doc: object, source: str) -> MeasurementSet:
    """A ``muxflow.colocation/1`` document, validated field by field."""
    if not isinstance(doc, dict):
        raise MeasurementError(f"{source}: expected a JSON object")
    if doc.get("format") != FORMAT:
        raise MeasurementError(f"{source}: format: expected {FORMAT!r}, got {doc.get('format')!r}")
    gpus = doc.get("gpus")
    if not isinstance(gpus, dict) or not gpus:
        raise MeasurementError(f"{source}: gpus: required, an object with one entry per GPU type")
    metas = {}
    for name, meta in gpus.items():
        where = f"{source}: gpus.{name}"
        if not isinstance(meta, dict):
            raise MeasurementError(f"{where}: expected an object")
        model, driver, method = (_text(meta, k, where) for k in ("gpu_model", "driver", "method"))
        if method not in METHODS:
            raise MeasurementError(f"{where}.method: {method!r} is not one of {', '.join(METHODS)}")
        date = _text(meta, "date", where)
        if not _DATE.match(date):
            raise MeasurementError(f"{where}.date: {date!r} is not YYYY, YYYY-MM or YYYY-MM-DD")
        speed = meta.get("relative_speed")
        metas[name.lower()] = GpuMeta(
            model, driver, method, date, source,
            None if speed is None else _number(speed, f"{where}.relative_speed", 0.0, 1e3, lo_open=True),
            str(meta.get("notes", "")))
    solo: dict[str, dict[str, float]] = {g: {} for g in metas}
    counters: dict[str, dict[str, dict[str, float]]] = {g: {} for g in metas}
    for i, row in enumerate(_list(doc, "solo", source)):
        where = f"{source}: solo[{i}]"
        if not isinstance(row, dict):
            raise MeasurementError(f"{where}: expected an object")
        gtype, job = _gpu_of(row, where, metas), _text(row, "job_type", where)
        if job in solo[gtype]:
            raise MeasurementError(f"{where}: a second solo run of {job!r} on {gtype}")
        solo[gtype][job] = _number(row.get("steps_per_s"), f"{where}.steps_per_s", 0.0, 1e9, lo_open=True)
        have = {k: _number(row[k], f"{where}.{k}", 0.0, 100.0) for k in COUNTERS if row.get(k) is not None}
        if row.get("mem_used_bytes") is not None:
            have["mem_used_bytes"] = _number(row["mem_used_bytes"], f"{where}.mem_used_bytes", 0.0, 1e15)
        if have:
            counters[gtype][job] = have
    pairs: dict[str, dict[tuple[str, str], float]] = {g: {} for g in metas}
    implied: dict[str, dict[tuple[str, str], float]] = {g: {} for g in metas}
    for i, row in enumerate(_list(doc, "pairs", source)):
        where = f"{source}: pairs[{i}]"
        if not isinstance(row, dict):
            raise MeasurementError(f"{where}: expected an object")
        gtype = _gpu_of(row, where, metas)
        job, partner = _text(row, "job_type", where), _text(row, "partner", where)
        for key, name in (("job_type", job), ("partner", partner)):
            if name not in solo[gtype]:
                raise MeasurementError(f"{where}.{key}: no solo run of {name!r} on {gtype} to normalize by")
        if (job, partner) in pairs[gtype]:
            raise MeasurementError(f"{where}: a second measurement of ({job!r}, {partner!r}) on {gtype}")
        pairs[gtype][(job, partner)] = _number(row.get("norm_tput"), f"{where}.norm_tput", 0.0, MAX_NORM_TPUT,
                                               lo_open=True)
        if row.get("partner_norm_tput") is not None:
            implied[gtype][(partner, job)] = _number(row["partner_norm_tput"], f"{where}.partner_norm_tput", 0.0,
                                                     MAX_NORM_TPUT, lo_open=True)
    points = tuple(_service_point(row, f"{source}: service_points[{i}]", metas)
                   for i, row in enumerate(_list(doc, "service_points", source)))
    caveats = _strings(doc.get("caveats"), f"{source}: caveats")
    types = {}
    for g, meta in metas.items():
        if not solo[g] and not pairs[g] and any(p.gpu_type == g for p in points):
            continue  # described for its service points alone: not a type of the interference model
        both = {**implied[g], **pairs[g]}  # a pair listed in its own right wins over the implied one
        types[g] = MeasuredType(g, meta, solo[g], tuple(PairMeasurement(a, b, x) for (a, b), x in sorted(both.items())),
                                counters[g])
    stressor = doc.get("stressor", DEFAULT_STRESSOR)
    if not isinstance(stressor, str) or not stressor:
        raise MeasurementError(f"{source}: stressor: expected a job type name")
    return MeasurementSet(types, stressor, (source,), points, caveats)


def _strings(value, where: str) -> tuple[str, ...]:
    """An optional list of non-empty strings."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise MeasurementError(f"{where}: expected a list of non-empty strings")
    return tuple(v.strip() for v in value)


def _service_point(row: object, where: str, metas: dict) -> ServicePoint:
    if not isinstance(row, dict):
        raise MeasurementError(f"{where}: expected an object")
    gtype = _gpu_of(row, where, metas)
    service, job = _text(row, "service", where), _text(row, "job_type", where)
    qps = _number(row.get("qps"), f"{where}.qps", 0.0, 1e9, lo_open=True)
    sm_pct = _number(row.get("sm_pct"), f"{where}.sm_pct", 0.0, 100.0, lo_open=True)
    usable = row.get("usable", True)
    if not isinstance(usable, bool):
        raise MeasurementError(f"{where}.usable: expected true or false, got {usable!r}")
    reasons = _strings(row.get("reasons"), f"{where}.reasons")
    if not usable and not reasons:
        raise MeasurementError(f"{where}.reasons: required when usable is false (why the point is kept out)")

    def value(key: str, hi: float) -> float | None:
        if row.get(key) is None:
            if usable:
                raise MeasurementError(f"{where}.{key}: required in a usable point")
            return None
        # A kept-out point records what was measured, even a value no GPU produces (that is why it is out).
        return _number(row[key], f"{where}.{key}", 0.0, hi if usable else math.inf, lo_open=True)

    norm_tput, slowdown_avg = value("norm_tput", MAX_NORM_TPUT), value("slowdown_avg", MAX_SLOWDOWN)
    for key, (lo, hi, lo_open) in SERVICE_POINT_LIMITS.items():
        if row.get(key) is not None:
            _number(row[key], f"{where}.{key}", lo, hi, lo_open)
    reps = row.get("repetitions")
    if reps is not None and (isinstance(reps, bool) or not isinstance(reps, int) or reps < 1):
        raise MeasurementError(f"{where}.repetitions: expected a whole number >= 1, got {reps!r}")
    if row.get("baseline") is not None and (not isinstance(row["baseline"], str) or not row["baseline"].strip()):
        raise MeasurementError(f"{where}.baseline: expected a non-empty string")
    _strings(row.get("notes"), f"{where}.notes")
    p99 = row.get("slowdown_p99")
    return ServicePoint(gtype, service, qps, job, sm_pct, norm_tput, slowdown_avg,
                        None if p99 is None else float(p99), usable, reasons, metas[gtype], dict(row))


def _gpu_of(row: dict, where: str, metas: dict) -> str:
    gtype = _text(row, "gpu_type", where).lower()
    if gtype not in metas:
        raise MeasurementError(f"{where}.gpu_type: {gtype!r} is not described under gpus")
    return gtype


def parse_gavel(doc: dict, source: str) -> MeasurementSet:
    """Gavel's layout: ``{type: {"('job', scale)": {"null": solo, "('other', 1)": [x_job, x_other]}}}``.

    Single-GPU jobs only; ``[0, 0]`` means not measured (never a measured zero).
    """
    types = {}
    for gtype, table in doc.items():
        solo, pairs = {}, {}
        for key, entry in table.items():
            job, scale = ast.literal_eval(key)
            if scale == 1 and entry.get("null"):
                solo[job] = float(entry["null"])
        for key, entry in table.items():
            job, scale = ast.literal_eval(key)
            if scale != 1 or job not in solo:
                continue
            for pkey, tputs in entry.items():
                if pkey == "null" or list(tputs) == [0.0, 0.0]:
                    continue
                partner, pscale = ast.literal_eval(pkey)
                x = tputs[0] / solo[job]
                if pscale == 1 and partner in solo and 0.0 < x <= MAX_NORM_TPUT:
                    pairs[(job, partner)] = x
        meta = GAVEL_META.get(gtype.lower(), {"gpu_model": gtype, "driver": "not recorded", "method": "unknown",
                                              "date": "2020", "notes": "Gavel layout"})
        types[gtype.lower()] = MeasuredType(
            gtype.lower(), GpuMeta(meta["gpu_model"], meta["driver"], meta["method"], meta["date"], source,
                                   notes=meta["notes"]),
            solo, tuple(PairMeasurement(a, b, x) for (a, b), x in sorted(pairs.items())))
    return MeasurementSet(types, DEFAULT_STRESSOR, (source,))


def load_file(path: str | os.PathLike[str]) -> MeasurementSet:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise MeasurementError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MeasurementError(f"{path}: not JSON: {exc}") from exc
    if isinstance(doc, dict) and "format" not in doc and doc and all(isinstance(v, dict) for v in doc.values()):
        try:
            return parse_gavel(doc, str(path))
        except (ValueError, SyntaxError, TypeError, AttributeError, IndexError) as exc:
            raise MeasurementError(f"{path}: neither {FORMAT} nor Gavel's layout: {exc}") from exc
    return parse_document(doc, str(path))


def env_paths() -> list[str]:
    return [p for p in os.environ.get(ENV_VAR, "").split(os.pathsep) if p.strip()]


def installed(extra: list[str] | None = None) -> MeasurementSet:
    """The bundled Gavel data, then ``MUXFLOW_MEASUREMENTS``' files, then ``extra``."""
    out = load_file(GAVEL_FILE)
    for path in env_paths() + list(extra or []):
        out = out.merged(load_file(path))
    return out


def to_document(mset: MeasurementSet) -> dict:
    """The ``muxflow.colocation/1`` document of a measurement set (e.g. Gavel's data, converted)."""
    gpus, solo, pairs = {}, [], []
    for g, t in sorted(mset.types.items()):
        m = t.meta
        gpus[g] = {"gpu_model": m.gpu_model, "driver": m.driver, "method": m.method, "date": m.date,
                   **({"relative_speed": m.relative_speed} if m.relative_speed else {}),
                   **({"notes": m.notes} if m.notes else {})}
        for job, sps in sorted(t.solo_steps_per_s.items()):
            solo.append({"gpu_type": g, "job_type": job, "steps_per_s": sps, **t.counters.get(job, {})})
        measured = {(p.workload, p.partner): p.norm_tput for p in t.pairs}
        for (a, b), x in sorted(measured.items()):
            if (b, a) in measured and b < a:
                continue  # written with its reverse as partner_norm_tput
            row = {"gpu_type": g, "job_type": a, "partner": b, "norm_tput": x}
            if (b, a) in measured and a != b:
                row["partner_norm_tput"] = measured[(b, a)]
            pairs.append(row)
    for p in mset.service_points:
        m = p.meta
        gpus.setdefault(p.gpu_type, {"gpu_model": m.gpu_model, "driver": m.driver, "method": m.method,
                                     "date": m.date, **({"notes": m.notes} if m.notes else {})})
    doc = {"format": FORMAT, "stressor": mset.stressor, "gpus": gpus, "solo": solo, "pairs": pairs}
    if mset.service_points:
        doc["service_points"] = [p.row for p in mset.service_points]
    if mset.caveats:
        doc["caveats"] = list(mset.caveats)
    return doc
