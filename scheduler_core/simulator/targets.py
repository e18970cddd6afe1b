"""The evaluation's targets, judged on `simulate compare` results (SIMULATED).

MuxFlow is held to what each online service's users see and to what the offline users get, on each trace and
cluster size:

- every service: the mean and the p99 slowdown over all its requests within ``ALL_REQUESTS`` (+10 %), no
  service-minute over the hard cap (+30 %), and with p99 SLOs at least ``SLO_ATTAINMENT`` (99 %) of its
  service-minutes within its SLO — of the minutes its replicas alone keep it (a minute the service misses alone,
  at a burst or on its busiest replicas, is no co-location's doing; both shares are reported);
- evicted executions at most ``EVICTED`` (1.5 %);
- a shorter JCT (every arrived job, unfinished ones counted to the end of the day) than every baseline;
- oversold GPU at least ``OVERSOLD_VS_PB`` (1.3×) PB-time-sharing's.

:func:`judge` reads one comparison (a ``results.json`` document) and says which targets it meets; :func:`markdown`
renders the tables of several.
"""

from __future__ import annotations

import math

ALL_REQUESTS = 0.10
SLO_ATTAINMENT = 0.99
EVICTED = 0.015
OVERSOLD_VS_PB = 1.3
BASELINES = ("salus", "pb-time-sharing", "time-sharing")
POLICY = "muxflow"


def _met(ok: bool | None) -> str:
    return "–" if ok is None else ("met" if ok else "**not met**")


def judge(doc: dict, policy: str = POLICY) -> dict:
    """The targets of one comparison: ``doc`` is what ``simulate compare`` writes to ``results.json``."""
    metrics = doc["metrics"]
    if policy not in metrics:
        raise ValueError(f"results: no {policy} run in this comparison")
    mine = metrics[policy]
    off = mine["offline"]
    jct = off.get("jct_censored_s")
    ratios = {b: round(metrics[b]["offline"]["jct_censored_s"] / jct, 4)
              for b in BASELINES if b in metrics and jct and metrics[b]["offline"].get("jct_censored_s")}
    pb = metrics.get("pb-time-sharing", {}).get("offline", {}).get("oversold_gpu")
    services = []
    for s in mine.get("services", []):
        attained = s.get("slo_kept_where_alone_keeps", s.get("slo_attainment"))
        services.append({
            **{k: s.get(k) for k in ("name", "all_avg_norm", "all_p99_norm", "shared_avg_norm", "shared_p99_norm",
                                     "worst_minute_norm", "minutes_over_cap", "cap", "slo_attainment",
                                     "slo_attainment_alone", "slo_kept_where_alone_keeps")},
            "met": {
                "all_avg": s["all_avg_norm"] is not None and s["all_avg_norm"] <= 1 + ALL_REQUESTS + 1e-9,
                "all_p99": s["all_p99_norm"] is not None and s["all_p99_norm"] <= 1 + ALL_REQUESTS + 1e-9,
                "cap": s["minutes_over_cap"] == 0,
                "slo": None if attained is None else attained >= SLO_ATTAINMENT,
            },
        })
    oversold_vs_pb = round(off["oversold_gpu"] / pb, 4) if pb else None
    met = {
        "services_all_avg": all(s["met"]["all_avg"] for s in services) if services else None,
        "services_all_p99": all(s["met"]["all_p99"] for s in services) if services else None,
        "no_minute_over_cap": all(s["met"]["cap"] for s in services) if services else None,
        "slo_attainment": (all(s["met"]["slo"] for s in services)
                           if services and all(s["met"]["slo"] is not None for s in services) else None),
        "evicted": off["eviction_rate"] <= EVICTED + 1e-12,
        "jct_vs_every_baseline": all(r > 1.0 for r in ratios.values()) if len(ratios) == len(BASELINES) else None,
        "oversold_vs_pb": None if oversold_vs_pb is None else oversold_vs_pb >= OVERSOLD_VS_PB - 1e-12,
    }
    cfg = doc.get("config", {})
    return {"trace": doc.get("trace"), "gpus": cfg.get("gpus"), "jobs": metrics[policy]["offline"]["jobs"],
            "calibration": doc.get("calibration"), "slo_scale": cfg.get("slo_scale"),
            "evicted": off["eviction_rate"], "jct_h": None if jct is None else round(jct / 3600.0, 3),
            "jct_baseline_over_muxflow": ratios, "oversold_gpu": off["oversold_gpu"],
            "oversold_vs_pb": oversold_vs_pb, "services": services, "met": met}


def _fmt(v: float | None, spec: str) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _pct(norm: float | None) -> str:
    return "–" if norm is None else f"{100 * (norm - 1):+.1f} %"


def markdown(judged: list[dict]) -> str:
    """The targets table per trace and size, then per service (SIMULATED)."""
    lines = [
        "| trace | GPUs | jobs | evicted (≤ 1.5 %) | best baseline's JCT × MuxFlow's (> 1) | oversold × PB's (≥ 1.3) | "
        "worst service, all requests avg / p99 (≤ +10 %) | minutes over +30 % | lowest SLO kept where kept alone (≥ 99 %) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for j in judged:
        m, sv = j["met"], j["services"]
        best = min(j["jct_baseline_over_muxflow"].items(), key=lambda kv: kv[1]) if j["jct_baseline_over_muxflow"] \
            else None
        worst_avg = max((s["all_avg_norm"] for s in sv if s["all_avg_norm"] is not None), default=None)
        worst_p99 = max((s["all_p99_norm"] for s in sv if s["all_p99_norm"] is not None), default=None)
        slo = [s["slo_kept_where_alone_keeps"] for s in sv if s.get("slo_kept_where_alone_keeps") is not None]
        lines.append(
            f"| {_name(j['trace'])} | {j['gpus']:,} | {j['jobs']:,} | {100 * j['evicted']:.2f} % — {_met(m['evicted'])} | "
            + (f"{best[1]:.3f} ({best[0]}) — {_met(m['jct_vs_every_baseline'])}" if best else "–")
            + f" | {_fmt(j['oversold_vs_pb'], '.2f')} — {_met(m['oversold_vs_pb'])} | "
            f"{_pct(worst_avg)} / {_pct(worst_p99)} — {_met(m['services_all_avg'] and m['services_all_p99'])} | "
            f"{sum(s['minutes_over_cap'] for s in sv)} — {_met(m['no_minute_over_cap'])} | "
            + (f"{100 * min(slo):.2f} % — {_met(m['slo_attainment'])}" if slo else "–") + " |")
    lines += ["", "| trace | GPUs | service | all requests avg / p99 | shared minutes avg / p99 | worst minute | "
                  "minutes over +30 % | SLO attainment, shared / alone | kept where kept alone |",
              "|---|---|---|---|---|---|---|---|---|"]
    for j in judged:
        for s in j["services"]:
            lines.append(f"| {_name(j['trace'])} | {j['gpus']:,} | {s['name']} | {_pct(s['all_avg_norm'])} / "
                         f"{_pct(s['all_p99_norm'])} | {_pct(s['shared_avg_norm'])} / {_pct(s['shared_p99_norm'])} | "
                         f"{_pct(s['worst_minute_norm'])} | {s['minutes_over_cap']} | {_share(s.get('slo_attainment'))} / "
                         f"{_share(s.get('slo_attainment_alone'))} | {_share(s.get('slo_kept_where_alone_keeps'))} |")
    return "\n".join(lines)


def sensitivity_markdown(runs: list[dict]) -> str:
    """Which of the comparison's conclusions hold under every interference calibration, per trace and size.

    ``runs``: what ``simulate compare --sensitivity`` writes to ``sensitivity.json`` (its ``trace``, ``config.gpus``
    and ``matrix``), one per trace and size. A cell is ``yes`` when the conclusion holds under every calibration,
    else ``NO`` with the calibrations it fails under (``n/a`` where a calibration could not judge it)."""
    if not runs:
        return ""
    runs = sorted(runs, key=lambda r: (-(r.get("config", {}).get("gpus") or 0), _name(r.get("trace"))))
    heads = [f"{_name(r.get('trace'))}, {r.get('config', {}).get('gpus', 0):,}" for r in runs]
    cals = sorted({c for r in runs for row in r["matrix"] for c in row["by_calibration"]})
    names: list[str] = []
    claims: dict[str, str] = {}
    for r in runs:
        for row in r["matrix"]:
            if row["name"] not in claims:
                names.append(row["name"])
                claims[row["name"]] = row["claim"]
    lines = [f"Calibrations: {', '.join(cals)}.", "", "| conclusion | " + " | ".join(heads) + " |",
             "|---|" + "---|" * len(heads)]
    for name in names:
        cells = []
        for r in runs:
            row = next((x for x in r["matrix"] if x["name"] == name), None)
            if row is None:
                cells.append("–")
                continue
            failing = [c for c, v in row["by_calibration"].items() if v["holds"] is False]
            unknown = [c for c, v in row["by_calibration"].items() if v["holds"] is None]
            cells.append("yes" if row["holds_under_all"] else
                         (f"NO ({', '.join(failing)})" if failing else f"n/a ({', '.join(unknown)})"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", *(f"- {name}: {claims[name]}" for name in names)]
    return "\n".join(lines)


def _share(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.2f} %"


def _name(trace: str | None) -> str:
    name = (trace or "?").replace("\\", "/").rsplit("/", 1)[-1]
    return name.removesuffix(".trace").removeprefix("philly_vc_")
