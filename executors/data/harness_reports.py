"""Co-location harness reports as ``muxflow.colocation/1`` service points, each with its caveats and verdict.

The harness (``executors.node.profiling.colocate``, docs/PROFILING.md) measures one online service and one
offline job on one GPU under MPS at a few SM shares and writes a report (``muxflow-colocation-report/1``;
``/2`` adds repetitions, a baseline after the points and per-window readings). :func:`convert` turns
reports into one ``muxflow.colocation/1`` document (docs/CALIBRATION.md, "Service points"): the GPU, its
driver, the date and the method, then one row per measured point with the window length, the number of
repetitions, the baseline policy, the noise the verdict assumed and, when the point is kept out of the
samples, why.

A point is kept out (``usable: false``) when its run failed, when the service was not GPU-bound (its
solo GPU utilization, where recorded, under ``min_service_util_pct``: its latency is then the host's —
Python, launches, wake-ups — and a co-located job cannot be told from noise), or when the service or the
job ran *faster* beside the other by more than the noise (not physics, a baseline that moved). The noise
is measured where the report can tell it (the spread of repetitions, the drift between the baselines
before and after the points), else it is the stated ``noise`` (a run with one repetition and one
baseline cannot measure its own noise).

What a ``/2`` report adds that is read: a point's ``repetitions`` (a list of per-repetition points, each
shaped as a ``/1`` point: the row takes their means and their [min, max]), a point's own ``baselines``
(the service alone around it: a list, or ``{"before": …, "after": …}``, each shaped as ``solo_service``)
and a report-level ``solo_service_after``. Every other field, known or not, is optional.

:func:`report_from_suite_output` recovers a report from the printed output of the GPU suite's harness
test (tests/gpu/test_profiling_gpu.py), which prints the raw reports of the run but not the file.

Pure: no store, no Dagster, no torch (``make gpu-check`` runs it on a GPU machine without them).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from executors.data.measurements import (FORMAT, MAX_NORM_TPUT, MAX_SLOWDOWN, METHODS, MeasurementError,
                                         parse_document)
from scheduler_core.gpu_specs import UnknownGpuDevice, type_for_device_name
from scheduler_core.interference.transfer import COUNTERS

REPORT_FORMATS = ("muxflow-colocation-report/1", "muxflow-colocation-report/2")
DEFAULT_NOISE = 0.10  # assumed relative noise of a slowdown when the report cannot measure it
MIN_SERVICE_UTIL_PCT = 30.0  # below it, a service's latency is the host's rather than the GPU's
_DEVICE = re.compile(r"^(?P<model>.+?) \(driver (?P<driver>[^)]+)\)$")
_VALUES = ("norm_tput", "slowdown_avg", "slowdown_p99")


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _mean(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def load_report(path: str | Path) -> dict:
    """A harness report (JSON), or the GPU suite's printed output (text) recovered as one."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MeasurementError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        if SUITE_SUMMARY in text:
            return report_from_suite_output(text, str(path))
        raise MeasurementError(f"{path}: neither a harness report (JSON) nor the GPU suite's output") from None
    if not isinstance(doc, dict) or doc.get("format") not in REPORT_FORMATS:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise MeasurementError(f"{path}: format: expected one of {', '.join(REPORT_FORMATS)}, got {got!r}")
    return doc


BASELINE_KEYS = ("solo_service", "solo_service_after")  # the service alone: before the points, and (/2) after


def _baselines(report: Mapping, point: Mapping | None = None) -> list[Mapping]:
    """The service's solo runs that apply to ``point``: its own (``baselines``, report /2: a list, or
    before/after by name), else the report's."""
    own = (point or {}).get("baselines")
    if isinstance(own, Mapping):
        own = [own[k] for k in sorted(own)]
    own = [b for b in own if isinstance(b, Mapping)] if isinstance(own, list) else []
    return own or [report[k] for k in BASELINE_KEYS if isinstance(report.get(k), Mapping)]


def _latency(b: Mapping) -> Mapping:
    return b.get("latency") if isinstance(b.get("latency"), Mapping) else b


def _util(b: Mapping) -> float | None:
    m = b.get("metrics")
    return _num(m.get("gpu_util_pct")) if isinstance(m, Mapping) and m.get("source", "measured") == "measured" else None


def baseline_policy(report: Mapping, point: Mapping | None = None) -> str:
    n = len(_baselines(report, point))
    where = "this point" if _baselines(report, point) != _baselines(report) else "the points"
    if n >= 2:
        return f"{n} solo runs of the service (before and after {where})"
    return "one solo run of each, before the points" if n == 1 else "none"


def _repetitions(point: Mapping) -> tuple[list[Mapping], str | None]:
    """The point's successful repetitions (report /2; none in /1) and, when every one failed, why."""
    reps = point.get("repetitions")
    if not isinstance(reps, list):
        return [], None
    good = [r for r in reps if isinstance(r, Mapping) and not r.get("error")]
    failed = [r.get("error") for r in reps if isinstance(r, Mapping) and r.get("error")]
    return good, (None if good else f"every repetition failed ({failed[0] if failed else 'none ran'})")


def _rel_spread(xs: list[float]) -> float | None:
    return statistics.stdev(xs) / statistics.fmean(xs) if len(xs) >= 2 and statistics.fmean(xs) > 0 else None


def point_row(report: Mapping, point: Mapping, source: str, *, gpu_type: str, noise: float = DEFAULT_NOISE,
              min_service_util_pct: float = MIN_SERVICE_UTIL_PCT, other_utils: Sequence[tuple[str, float]] = (),
              workload_notes: Mapping[str, str] | None = None) -> dict:
    """One harness point as a ``service_points`` row: values (repetitions' means), caveats and verdict.

    ``other_utils``: (source, solo GPU utilization %) of the same service at the same QPS in other reports,
    quoted where this one did not record its own. ``workload_notes``: a caveat per workload label, added to
    every point whose job or service stands for it."""
    reps, all_failed = _repetitions(point)
    values = {k: _mean(_num(r.get(k)) for r in reps) if reps else _num(point.get(k)) for k in _VALUES}
    base = _baselines(report, point)
    solo_lat = [_latency(b) for b in base]
    solo_avg = _mean(_num(s.get("avg_ms")) for s in solo_lat)
    solo_p99 = _mean(_num(s.get("p99_ms")) for s in solo_lat)
    util = _mean(_util(b) for b in base)
    busy = _mean(_num(s.get("busy_frac")) for s in solo_lat)
    solo_job = report.get("solo_job") if isinstance(report.get("solo_job"), Mapping) else {}
    solo_it = _num((solo_job.get("iterations") or {}).get("mean_s"))
    it = _mean(_num((r.get("iterations") or {}).get("mean_s")) for r in (reps or [point]))
    lat = [r.get("latency") or {} for r in (reps or [point])]

    measured = {}  # relative noise of the slowdowns, where the report can tell it
    spreads = [_rel_spread([x for x in (_num(r.get(k)) for r in reps) if x]) for k in ("slowdown_avg", "slowdown_p99")]
    if any(x is not None for x in spreads):
        measured["repetitions"] = max(x for x in spreads if x is not None)
    avgs = [a for a in (_num(s.get("avg_ms")) for s in solo_lat) if a]
    if len(avgs) >= 2:
        measured["baselines"] = (max(avgs) - min(avgs)) / statistics.fmean(avgs)
    used_noise = max(measured.values()) if measured else noise

    reasons, notes = [], []
    error = point.get("error") or all_failed
    if error:
        reasons.append(f"the run failed: {error}")
    elif values["norm_tput"] is None or values["slowdown_avg"] is None:
        reasons.append("no co-located window (no job iterations or no request inside it)")
    if util is not None and util < min_service_util_pct:
        reasons.append(f"the service was not GPU-bound: {util:.1f} % GPU utilization alone (< "
                       f"{min_service_util_pct:g} %), so its latency is the host's and the job's effect on it is "
                       "not separable from noise")
    for key, what in (("slowdown_avg", "average"), ("slowdown_p99", "p99")):
        v = values[key]
        if v is not None and v < 1.0 - used_noise:
            reasons.append(f"online slowdown x{v:.2f} ({what}) is below 1 by more than the noise "
                           f"({100 * used_noise:.0f} %): the service ran faster beside the job, which is not "
                           "interference")
    if values["norm_tput"] is not None and values["norm_tput"] > 1.0 + used_noise:
        reasons.append(f"the job ran x{values['norm_tput']:.2f} faster beside the service than alone, more than "
                       f"the noise ({100 * used_noise:.0f} %)")
    elif values["norm_tput"] is not None and values["norm_tput"] > MAX_NORM_TPUT:
        reasons.append(f"the job ran x{values['norm_tput']:.2f} faster beside the service than alone, beyond "
                       f"what sharing can give (x{MAX_NORM_TPUT:g}): a broken measurement, whatever the noise "
                       f"({100 * used_noise:.0f} %)")
    if values["slowdown_avg"] is not None and values["slowdown_avg"] > MAX_SLOWDOWN:
        reasons.append(f"online slowdown x{values['slowdown_avg']:.0f} (average) is beyond x{MAX_SLOWDOWN:g}: a "
                       "broken measurement")
    if util is None:
        seen = "; ".join(f"{u:.1f} % in {s}" for s, u in other_utils)
        notes.append("the service's solo GPU utilization was not recorded in this run"
                     + (f" (the same service at the same QPS on this GPU: {seen})" if seen else ""))
    if not measured:
        notes.append(f"noise not measured (a single repetition and a single solo baseline): assumed "
                     f"{100 * noise:.0f} %")
    notes += [str(c) for c in report.get("caveats", []) if isinstance(c, str)]
    job_type = str(report.get("job_type") or "")
    service_type = _latency(base[0]).get("job_type") if base else None
    for label, text in (workload_notes or {}).items():
        roles = [r for r, t in (("job", job_type), ("service", service_type)) if t == label]
        if roles:
            notes.append(f"{' and '.join(roles)} {label!r}: {text}")

    row: dict[str, Any] = {
        "gpu_type": gpu_type, "service": report.get("service_family"), "qps": _num(report.get("qps")),
        "job_type": job_type, "sm_pct": _num(point.get("sm_pct")),
        **{k: _round(values[k], 4) for k in _VALUES}, "usable": not reasons}
    if reasons:
        row["reasons"] = reasons
    row.update({
        "window_s": _num(report.get("window_s")), "repetitions": max(1, len(reps)),
        "baseline": baseline_policy(report, point), "noise": round(used_noise, 4),
        "noise_from": " and ".join(sorted(measured)) if measured else "assumed",
        "service_solo_gpu_util_pct": _round(util, 1), "service_busy_frac": _round(busy, 4),
        "solo_iter_time_s": _round(solo_it, 6),
        "iter_time_s": _round(it, 6), "solo_latency_avg_ms": _round(solo_avg, 3),
        "solo_latency_p99_ms": _round(solo_p99, 3),
        "latency_avg_ms": _round(_mean(_num(x.get("avg_ms")) for x in lat), 3),
        "latency_p99_ms": _round(_mean(_num(x.get("p99_ms")) for x in lat), 3),
        "requests": _mean(_num(x.get("requests")) for x in lat)})
    if len(reps) >= 2:
        row["spread"] = {k: [round(min(xs), 4), round(max(xs), 4)] for k in _VALUES
                         if (xs := [x for x in (_num(r.get(k)) for r in reps) if x is not None])}
    metrics = solo_job.get("metrics") if isinstance(solo_job.get("metrics"), Mapping) else {}
    job_solo = {k: round(float(metrics[k]), 1) for k in (*COUNTERS, "mem_used_bytes") if _num(metrics.get(k))
                is not None}
    if job_solo:
        row["job_solo"] = job_solo
    row.update({"service_job_type": service_type, "method": report.get("method"),
                "method_note": report.get("method_note"), "source": source})
    if notes:
        row["notes"] = notes
    return {k: v for k, v in row.items() if v is not None}


def _identity(reports: Sequence[tuple[str, Mapping]]) -> tuple[str | None, str | None, str | None]:
    """GPU model and driver from the reports' ``device``, the date from their start (UTC)."""
    model = driver = date = None
    for _, r in reports:
        m = _DEVICE.match(str(r.get("device") or ""))
        if m and model is None:
            model, driver = m["model"], m["driver"]
        t = _num(r.get("started_unix"))
        if t is not None and date is None:
            date = datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d")
    return model, driver, date


def convert(reports: Sequence[tuple[str, Mapping]], *, gpu_type: str | None = None, gpu_model: str | None = None,
            driver: str | None = None, date: str | None = None, method: str | None = None,
            noise: float = DEFAULT_NOISE, min_service_util_pct: float = MIN_SERVICE_UTIL_PCT,
            workload_notes: Mapping[str, str] | None = None, caveats: Sequence[str] = (), notes: str = "") -> dict:
    """``(source, report)`` pairs, all of one GPU, as a validated ``muxflow.colocation/1`` document.

    Unset, the GPU type (of the device's name, else the reports' label), model, driver, date and method come
    from the reports (they must agree);
    ``MeasurementError`` (one line) when they cannot be known or the reports are not GPU measurements."""
    if not reports:
        raise MeasurementError("no harness report to convert")
    if not 0.0 <= noise <= 1.0:
        raise MeasurementError(f"noise: {noise!r} is outside [0, 1]")
    for source, r in reports:
        if r.get("format") not in REPORT_FORMATS:
            raise MeasurementError(f"{source}: format: expected one of {', '.join(REPORT_FORMATS)}, "
                                   f"got {r.get('format')!r}")
        if r.get("method") == "cpu" and method != "simulated":
            raise MeasurementError(f"{source}: method 'cpu': a CPU run tests the harness, it measures no GPU "
                                   "(convert it only as method 'simulated')")
    found = _identity(reports)
    labels = sorted({str(r.get("gpu_type")) for _, r in reports if r.get("gpu_type")})
    if gpu_type is None and found[0]:
        try:
            gpu_type = type_for_device_name(found[0])
        except UnknownGpuDevice:
            pass
    if gpu_type is None:
        if len(labels) != 1:
            raise MeasurementError(f"gpu type: the reports say {', '.join(labels) or 'nothing'}; give it")
        gpu_type = labels[0]
    gpu_type = gpu_type.lower()
    methods = sorted({str(r.get("method")) for _, r in reports if r.get("method")})
    if method is None:
        if len(methods) != 1:
            raise MeasurementError(f"method: the reports say {', '.join(methods) or 'nothing'}; give it")
        method = methods[0]
    if method not in METHODS:
        raise MeasurementError(f"method: {method!r} is not one of {', '.join(METHODS)}")
    gpu_model, driver, date = (given or got for given, got in zip((gpu_model, driver, date), found))
    for name, v in (("gpu model", gpu_model), ("driver", driver), ("date", date)):
        if not v:
            raise MeasurementError(f"{name}: not in the reports; give it")

    utils: dict[tuple, list[tuple[str, float]]] = {}
    for source, r in reports:
        u = _mean(_util(b) for b in _baselines(r))
        if u is not None:
            utils.setdefault((r.get("service_family"), _num(r.get("qps"))), []).append((Path(source).name, u))
    rows = []
    for source, r in reports:
        name = Path(source).name
        others = [(s, u) for s, u in utils.get((r.get("service_family"), _num(r.get("qps"))), []) if s != name]
        for p in r.get("points") or []:
            if isinstance(p, Mapping):
                rows.append(point_row(r, p, name, gpu_type=gpu_type, noise=noise,
                                      min_service_util_pct=min_service_util_pct, other_utils=others,
                                      workload_notes=workload_notes))
    all_caveats = list(caveats)
    if labels and labels != [gpu_type]:
        all_caveats.append(f"the harness labelled these runs {', '.join(repr(x) for x in labels)}; they ran on "
                           f"{gpu_model} ({gpu_type})")
    for source, r in reports:
        if r.get("error"):
            all_caveats.append(f"{Path(source).name}: the run stopped: {r['error']}")
    formats = sorted({str(r["format"]) for _, r in reports})
    meta = {"gpu_model": gpu_model, "driver": driver, "method": method, "date": date,
            "notes": notes or f"co-location harness ({', '.join(formats)}): one online service and one offline "
                              "job at an SM share"}
    doc: dict[str, Any] = {"format": FORMAT, "gpus": {gpu_type: meta}, "solo": [], "pairs": [],
                           "service_points": rows}
    if all_caveats:
        doc["caveats"] = all_caveats
    parse_document(doc, "converted reports")  # a conversion that does not validate is a bug here, not data
    return doc


def to_colocation(reports: Sequence[Mapping], **options: Any) -> dict:
    """:func:`convert` for reports that have no file (``make gpu-check``'s calibration part): the n-th is
    ``report n``. A harness run on the CPU converts only with ``method="simulated"``, and is labelled so."""
    return convert([(f"report {i}", r) for i, r in enumerate(reports, 1)], **options)


# -- the GPU suite's printed output --------------------------------------------------------------------
SUITE_SUMMARY = "co-location on the GPU:"
_ITER, _LAT, _PROFILE = "MUXFLOW-ITERATION-REPORT ", "MUXFLOW-LATENCY-REPORT ", "solo profile on the GPU:"
_TRAIN = re.compile(r"INFO __main__: (?P<family>\w+)/(?P<size>\w+) on ")


def _json_after(line: str, marker: str, source: str, n: int) -> dict:
    try:
        return json.loads(line[line.index(marker) + len(marker):])
    except json.JSONDecodeError as exc:
        raise MeasurementError(f"{source}: line {n}: {marker.strip()} is not JSON: {exc}") from exc


def report_from_suite_output(text: str, source: str) -> dict:
    """The harness report of the GPU suite's co-location test, recovered from what the test printed.

    The suite prints the raw reports of the run (the service's latency reports, the job's iteration
    reports, the solo profile of the same job just before) and the points' ``norm_tput`` and slowdowns,
    not the report file. Recovered: the solo baselines, each point's iteration time and values, the
    co-located latencies (slowdown × solo latency). Not printed: the method (inferred: under MPS the job's
    throughput follows its SM share), the GPU type label, the service's solo GPU metrics, the number of
    requests inside each point's window."""
    lines = text.splitlines()
    summary = None
    iters: list[tuple[dict, tuple[str, str] | None]] = []
    lats: list[dict] = []
    profile, trainer = None, None
    for n, line in enumerate(lines, 1):
        if SUITE_SUMMARY in line:
            summary = _json_after(line, SUITE_SUMMARY, source, n)
        elif _ITER in line:
            iters.append((_json_after(line, _ITER, source, n), trainer))
        elif _LAT in line:
            lats.append(_json_after(line, _LAT, source, n))
        elif _PROFILE in line:
            profile = (_json_after(line, _PROFILE, source, n), iters[-1][1] if iters else None)
        elif m := _TRAIN.search(line):
            trainer = (m["family"], m["size"])
    if not summary:
        raise MeasurementError(f"{source}: no {SUITE_SUMMARY!r} line")
    timed = [(r, t) for r, t in iters if r.get("stopped_by") == "seconds"]
    solo_lat = [r for r in lats if not r.get("stopped_early")]
    point_lat = [r for r in lats if r.get("stopped_early")]
    if not timed or not solo_lat:
        raise MeasurementError(f"{source}: the harness's solo reports are missing")
    (solo_it, job), solo_lat = timed[0], solo_lat[-1]
    sms = sorted(int(k) for k in summary)
    if len(timed) - 1 != len(sms) or len(point_lat) != len(sms):
        raise MeasurementError(f"{source}: {len(sms)} points summarised, {len(timed) - 1} iteration and "
                               f"{len(point_lat)} latency reports printed")
    points = []
    for sm, (it, _) in zip(sms, timed[1:]):
        s = summary[str(sm)]
        if not math.isclose(solo_it["mean_s"] / it["mean_s"], s["norm_tput"], rel_tol=1e-6):
            raise MeasurementError(f"{source}: the {sm} % point's iteration report does not give its norm_tput")
        points.append({"sm_pct": sm, "iterations": it, "norm_tput": s["norm_tput"],
                       "slowdown_avg": s["slowdown_avg"], "slowdown_p99": s["slowdown_p99"],
                       "latency": {"avg_ms": s["slowdown_avg"] * solo_lat["avg_ms"],
                                   "p99_ms": s["slowdown_p99"] * solo_lat["p99_ms"]}})
    family, size = job or ("unknown", "unknown")
    same = family == solo_lat.get("family") and size == solo_lat.get("size")
    tputs = [p["norm_tput"] for p in points]
    mps = len(points) >= 2 and tputs[0] < 0.9 * tputs[-1]
    caveats = ["recovered from the GPU suite's printed output: the service's solo GPU metrics and the number of "
               "requests inside each window were not printed; co-located latency = slowdown x solo latency"]
    metrics = None
    if profile is not None and profile[1] == job:
        f = profile[0].get("features", {})
        metrics = {k: f[k] for k in (*COUNTERS, "mem_used_bytes") if k in f}
        caveats.append("the job's solo GPU metrics are those of the suite's solo profile of the same job, just "
                       f"before ({profile[0].get('iterations')} iterations)")
    return {
        "format": REPORT_FORMATS[0], "method": "mps" if mps else "unknown",
        "method_note": (f"not printed; inferred from the job's throughput following its SM share "
                        f"({tputs[0]:.2f} at {sms[0]} %, {tputs[-1]:.2f} at {sms[-1]} %), which only MPS enforces"
                        if mps else "not printed"),
        "gpu_type": None, "service_family": solo_lat.get("family"), "qps": solo_lat.get("qps_target"),
        "job_family": family, "job_type": solo_lat.get("job_type") if same else f"{family}/{size}",
        "size": size, "window_s": solo_it.get("max_seconds"), "sm_pcts": sms,
        "started_unix": solo_lat.get("window_start_unix"),
        "device": (profile[0].get("device") if profile else None),
        "solo_service": {"latency": solo_lat, "metrics": None},
        "solo_job": {"iterations": solo_it, "metrics": metrics},
        "points": points, "caveats": caveats,
    }
