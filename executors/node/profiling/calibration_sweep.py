"""``make gpu-check``'s calibration part: the co-location harness's SM sweep, sized to a deadline.

    python -m executors.node.profiling.calibration_sweep --out DIR --deadline 100 [--simulate]
        [--pairs cnn+cnn] [--sm 20,50,80] [--repeat 3] [--window auto] [--qps auto] [--gpu-type auto]

For each service+job pair (default one: the ``cnn`` service and the ``cnn`` job) it runs the harness
(:mod:`executors.node.profiling.colocate`): a solo QPS calibration (``--qps auto``: the service GPU-bound,
0.3..0.6 of the GPU alone, with dynamic batching), then rounds over the SM %s with the service's solo
baseline before and after every point and the job's before and after every round. The windows are sized so
that the whole sweep fits ``--deadline`` (:func:`plan`); the harness also stops starting points that would
not fit, so a slow machine gives fewer points rather than a killed part.

It writes one file, ``DIR/calibration.json`` (``muxflow.gpu-check.part/1``, part ``calibration``),
rewritten after every point: ``results`` holds the plan, the harness reports
(``muxflow-colocation-report/2``, what ``colocation.json`` is converted from) and a summary per point.
Scratch files go to ``DIR/.calibration-work/``. ``--simulate``: tiny workloads on the CPU with simulated
GPU metrics, in seconds; its numbers test the code path and are labelled ``simulated``. Exit 0 when it ran
(even partly), 2 on bad arguments (one line, ``error: ...``).
"""

from __future__ import annotations

import argparse
import logging
import math
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from executors.node.gpu_check_part import now_iso, part_document
from executors.node.profiling import forked

PART = "calibration"
WORK = f".{PART}-work"
DEFAULT_PAIRS = "cnn+cnn"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Costs:
    """What a sweep spends besides its windows (seconds): the plan's estimates. The harness itself stops starting
    points that would pass its deadline, so an estimate too low costs points, never the part."""

    setup_s: float        # fork server (torch imported once), the service's and the jobs' processes ready
    calibration_s: float  # the QPS calibration's steps
    stop_s: float         # stopping the processes and MPS
    margin_s: float       # kept free
    colocated_s: float    # per co-located window beyond its length (release, warm-up iterations, pause)
    service_s: float      # per solo window of the service
    job_s: float          # per solo window of the job
    window_min_s: float
    window_max_s: float


GPU_COSTS = Costs(setup_s=14.0, calibration_s=10.0, stop_s=3.0, margin_s=5.0, colocated_s=0.7, service_s=0.35,
                  job_s=0.8, window_min_s=1.5, window_max_s=6.0)
CPU_COSTS = Costs(setup_s=4.0, calibration_s=2.0, stop_s=0.5, margin_s=1.5, colocated_s=0.25, service_s=0.3,
                  job_s=0.3, window_min_s=0.2, window_max_s=0.3)
BASELINE_SHARE = 0.8  # a solo window's length ÷ a co-located one's


@dataclass(frozen=True)
class Plan:
    window_s: float
    baseline_window_s: float
    repeat: int
    sm_pcts: list[int]
    pairs: list[tuple[str, str]]
    per_pair_s: float
    estimate_s: float
    fits: bool
    note: str

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["pairs"] = [f"{s}+{j}" for s, j in self.pairs]
        return d


def estimate_s(costs: Costs, points: int, repeat: int, window_s: float, qps_auto: bool = True) -> float:
    """One pair's sweep: ``points × repeat`` co-located windows, one more solo window of the service, the job's
    solo windows before and after every round."""
    colo, svc, job = points * repeat, points * repeat + 1, repeat + 1
    base = BASELINE_SHARE * window_s
    return (costs.setup_s + (costs.calibration_s if qps_auto else 0.0) + costs.stop_s + costs.margin_s
            + colo * (window_s + costs.colocated_s) + svc * (base + costs.service_s) + job * (base + costs.job_s))


def plan(deadline_s: float, *, pairs: list[tuple[str, str]], sm_pcts: list[int], repeat: int, costs: Costs,
         window_s: float | None = None, qps_auto: bool = True) -> Plan:
    """The longest windows (within the costs' bounds) for which every pair's sweep fits its share of the
    deadline; fewer repetitions when even the shortest would not (down to one). A given ``window_s`` is kept."""
    share = deadline_s / max(1, len(pairs))
    p = len(sm_pcts)
    note = ""
    if window_s is not None:
        est = estimate_s(costs, p, repeat, window_s, qps_auto)
        return Plan(window_s, BASELINE_SHARE * window_s, repeat, sm_pcts, pairs, share, est, est <= share,
                    "window given")
    for r in range(repeat, 0, -1):
        fixed = estimate_s(costs, p, r, 0.0, qps_auto)
        per_w = p * r + BASELINE_SHARE * (p * r + 1) + BASELINE_SHARE * (r + 1)
        w = (share - fixed) / per_w
        if w >= costs.window_min_s:
            w = min(costs.window_max_s, math.floor(w * 100) / 100)
            if r < repeat:
                note = f"{repeat} repetitions do not fit {share:.0f} s with windows of {costs.window_min_s:g} s: {r}"
            est = estimate_s(costs, p, r, w, qps_auto)
            return Plan(w, round(BASELINE_SHARE * w, 2), r, sm_pcts, pairs, share, est, True, note)
    w = costs.window_min_s
    est = estimate_s(costs, p, 1, w, qps_auto)
    return Plan(w, round(BASELINE_SHARE * w, 2), 1, sm_pcts, pairs, share, est, False,
                f"even one repetition with {w:g} s windows needs about {est:.0f} s of {share:.0f} s: the harness "
                "stops at the deadline")


def _r(x: Any, digits: int = 4) -> Any:
    return round(x, digits) if isinstance(x, float) else x


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """The headline of one harness report: per SM % the mean ± std (min..max, n) of each value."""
    pair = f"{report.get('service_family')}+{report.get('job_family')}"
    rows = []
    for p in report.get("points") or []:
        row: dict[str, Any] = {"pair": pair, "sm_pct": p.get("sm_pct"), "unstable": p.get("unstable_repetitions")}
        for k, st in (p.get("stats") or {}).items():
            row[k] = {x: _r(st.get(x)) for x in ("mean", "std", "min", "max", "n")}
        if p.get("error"):
            row["error"] = p["error"]
        rows.append(row)
    solo = report.get("solo_service") or {}
    job = report.get("solo_job") or {}
    sel = report.get("qps_selection") or {}
    return {
        "pair": pair, "points": rows,
        "qps": {"qps": _r(report.get("qps"), 2), "mode": sel.get("mode"), "in_target": sel.get("in_target"),
                "why": sel.get("why")},
        "service": {"family": report.get("service_family"), "max_batch": report.get("max_batch"),
                    "solo_utilization": _r(solo.get("utilization"), 3), "gpu_bound": report.get("gpu_bound"),
                    "solo_avg_ms": _r((solo.get("latency") or {}).get("avg_ms"), 3),
                    "solo_p99_ms": _r((solo.get("latency") or {}).get("p99_ms"), 3)},
        "job": {"family": report.get("job_family"), "job_type": report.get("job_type"),
                "solo_iter_s": _r((job.get("iterations") or {}).get("mean_s"), 6)},
    }


class PartFile:
    """``DIR/calibration.json``, rewritten (atomically) whenever something was measured."""

    def __init__(self, out: Path, method: str, gpu: dict | None, plan_: Plan, simulate: bool):
        self.path = out / f"{PART}.json"
        self.doc: dict[str, Any] = part_document(
            PART, method, gpu=gpu, simulated=simulate,
            results={"plan": plan_.as_dict(), "reports": [], "points_summary": [], "qps": {}, "service": {},
                     "job": {}})
        self.done: list[dict] = []

    def update(self, current: dict | None = None) -> None:
        from executors.job.runtime.timing import write_json_atomic

        reports = self.done + ([current] if current is not None else [])
        if current is not None and not self.doc.get("simulated") and current.get("method"):
            self.doc["method"] = current["method"]  # "mps" unless its daemon could not be started
        res = self.doc["results"]
        res["reports"] = reports
        sums = [summarize(r) for r in reports]
        res["points_summary"] = [row for s in sums for row in s["points"]]
        for key in ("qps", "service", "job"):
            res[key] = {s["pair"]: s[key] for s in sums}
        write_json_atomic(self.path, self.doc)

    def finish(self, complete: bool, why: str | None) -> None:
        self.doc.update(ended=now_iso(), complete=complete, why_incomplete=None if complete else why)
        self.update()


class _ArgParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        self.exit(2, f"error: {message}\n")


def _pairs(text: str) -> list[tuple[str, str]]:
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        service, sep, job = item.partition("+")
        if not sep or not service or not job:
            raise ValueError(f"pairs: SERVICE+JOB[,SERVICE+JOB...], got {item!r}")
        out.append((service, job))
    if not out:
        raise ValueError("pairs: none given")
    return out


def main(argv: list[str] | None = None) -> int:
    t0 = time.monotonic()
    ap = _ArgParser(prog="python -m executors.node.profiling.calibration_sweep", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the folder of calibration.json")
    ap.add_argument("--deadline", type=float, required=True, help="seconds the whole part may take")
    ap.add_argument("--simulate", action="store_true", help="no GPU: tiny workloads on the CPU, simulated metrics")
    ap.add_argument("--pairs", default=DEFAULT_PAIRS, help="SERVICE+JOB pairs, comma-separated (default cnn+cnn)")
    ap.add_argument("--sm", default=None, help="SM percentages (default 20,50,80; simulated 20,80)")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions of every SM %% (default 3; simulated 2)")
    ap.add_argument("--window", default="auto", help="seconds of a co-located window, or auto (fit the deadline)")
    ap.add_argument("--qps", default="auto", help="the service's QPS, or auto (a solo calibration)")
    ap.add_argument("--max-batch", type=int, default=None, help="the service's dynamic batching (default 32; sim. 8)")
    ap.add_argument("--gpu-type", default=None, help="a known GPU type or auto (default auto; simulated h100)")
    ap.add_argument("--size", default=None, help="workload size (default gpu; simulated tiny)")
    a = ap.parse_args(argv)
    try:
        if not (a.deadline > 0 and math.isfinite(a.deadline)):
            raise ValueError(f"deadline: a positive number of seconds, got {a.deadline}")
        pairs = _pairs(a.pairs)
        repeat = a.repeat if a.repeat is not None else (2 if a.simulate else 3)
        if repeat < 1:
            raise ValueError(f"repeat: must be >= 1, got {repeat}")
        window = None if a.window == "auto" else float(a.window)
        if window is not None and not window > 0:
            raise ValueError(f"window: a positive number of seconds or auto, got {a.window!r}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from executors.node.gpu_type import gpu_identity, resolve_gpu_type

    try:
        gpu_type = resolve_gpu_type(a.gpu_type or ("h100" if a.simulate else "auto"))
    except ValueError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    forked.start_server()  # torch is imported there while this process imports the harness
    from executors.node.profiling.colocate import Harness, parse_qps, parse_sm

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        sms = parse_sm(a.sm or ("20,80" if a.simulate else "20,50,80"))
        qps = parse_qps(a.qps)
        costs = CPU_COSTS if a.simulate else GPU_COSTS
        used = time.monotonic() - t0
        the_plan = plan(a.deadline - used, pairs=pairs, sm_pcts=sms, repeat=repeat, costs=costs, window_s=window,
                        qps_auto=qps == "auto")
        size = a.size or ("tiny" if a.simulate else "gpu")
        max_batch = a.max_batch if a.max_batch is not None else (8 if a.simulate else 32)
        opts = dict(size=size, qps=qps, window_s=the_plan.window_s, baseline_window_s=the_plan.baseline_window_s,
                    repeat=the_plan.repeat, max_batch=max_batch, gpu_type=gpu_type, auto_max_steps=6)
        if a.simulate:
            opts.update(device="cpu", metrics="simulated", mps="off")
        out = Path(a.out)
        harnesses = [Harness(out / WORK / f"{s}+{j}", service_family=s, job_family=j, write_report=False,
                             **opts) for s, j in pairs]  # type: ignore[arg-type]
    except (ValueError, KeyError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"error: {' '.join(str(msg).split())}", file=sys.stderr)
        return 2
    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _f: stop.append(signum))
    method = "simulated" if a.simulate else harnesses[0].method
    part = PartFile(out, method, None if a.simulate else gpu_identity(0), the_plan, a.simulate)
    part.update()
    whys: list[str] = []
    rc = 0
    for i, h in enumerate(harnesses):
        left = a.deadline - (time.monotonic() - t0)
        share = left / (len(harnesses) - i)
        if stop or share < 10.0:
            whys.append(f"{h.service_family}+{h.job_family}: not run ({'stopped' if stop else f'{left:.0f} s left'})")
            continue
        h.deadline_s, h.stop = share, lambda: bool(stop)
        h.on_progress = part.update
        try:
            rep = h.run(the_plan.sm_pcts)
        except Exception as exc:  # noqa: BLE001 - the part's file says what broke; the other pairs still run
            part.doc["errors"].append(f"{h.service_family}+{h.job_family}: {type(exc).__name__}: {exc}")
            log.exception("calibration pair %s+%s failed", h.service_family, h.job_family)
            rc = 1
            continue
        part.done.append(rep)
        if rep.get("error"):
            part.doc["errors"].append(f"{h.service_family}+{h.job_family}: {rep['error']}")
        if not rep.get("complete"):
            whys.append(f"{h.service_family}+{h.job_family}: {rep.get('why_incomplete')}")
        if method != "simulated":
            part.doc["method"] = rep.get("method") or method
        part.update()
    complete = not whys and not part.doc["errors"]
    part.finish(complete, "; ".join(whys) or ("; ".join(part.doc["errors"]) if part.doc["errors"] else None))
    n = sum(len(s["points"]) for s in (summarize(r) for r in part.done))
    print(f"calibration ({part.doc['method']}): {n} points in {time.monotonic() - t0:.0f} s"
          + ("" if complete else f"; incomplete: {part.doc['why_incomplete']}"), flush=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
