"""Whether docs/EVALUATION.md's conclusions hold in one comparison (``simulate compare --sensitivity``).

Each conclusion is checked on one comparison table (:func:`metrics.compare_table`) and reports
whether it holds, with the figures that decide it, so that a run per interference calibration
shows which conclusions survive the model's uncertainty.
"""

from __future__ import annotations

from dataclasses import dataclass

# MuxFlow paper, Fig. 11: MuxFlow's advantage over the time-sharing baselines.
PAPER_JCT_RANGE = (1.10, 2.24)
PAPER_OVERSOLD_RANGE = (1.08, 1.97)
# §7.3: MuxFlow slows online work by less than 20 %.
LATENCY_BOUND = 1.20
BASELINES = {"time-sharing": "TS", "pb-time-sharing": "PB"}
ABLATIONS = ("muxflow-s", "muxflow-m", "muxflow-s-m")


@dataclass(frozen=True)
class Conclusion:
    name: str
    claim: str
    holds: bool | None  # None: the comparison lacks a policy the claim needs
    value: str

    def as_dict(self) -> dict:
        return {"name": self.name, "claim": self.claim, "holds": self.holds, "value": self.value}


def _by_policy(rows: list[dict]) -> dict[str, dict]:
    return {r["policy"]: r for r in rows}


def _ranking(rows: dict[str, dict]) -> Conclusion:
    claim = "MuxFlow has the shortest JCT and most oversold GPU of all policies; -S and -M beat -S-M"
    others = [p for p in rows if p not in ("online-only", "muxflow")]
    needed = set(ABLATIONS) | set(BASELINES)
    if "muxflow" not in rows or not needed <= set(rows):
        return Conclusion("ranking", claim, None, "needs muxflow, its ablations and both time-sharing baselines")
    jct = {p: rows[p].get("jct_vs_muxflow") for p in others}
    sold = {p: rows[p].get("oversold_vs_muxflow") for p in others}
    if any(v is None for v in (*jct.values(), *sold.values())):
        return Conclusion("ranking", claim, False, "a policy finished no job")
    best = all(v > 1.0 for v in jct.values()) and all(v < 1.0 for v in sold.values())
    ablation = rows["muxflow-s-m"]["jct_vs_muxflow"] >= max(rows["muxflow-s"]["jct_vs_muxflow"],
                                                            rows["muxflow-m"]["jct_vs_muxflow"])
    order = ", ".join(f"{p} {v:.2f}" for p, v in sorted(jct.items(), key=lambda kv: kv[1]))
    return Conclusion("ranking", claim, bool(best and ablation), f"JCT x MuxFlow: {order}")


def _ratios(rows: dict[str, dict], key: str, invert: bool, lo_hi: tuple[float, float], name: str,
            claim: str) -> Conclusion:
    if "muxflow" not in rows or not set(BASELINES) <= set(rows):
        return Conclusion(name, claim, None, "needs muxflow and both time-sharing baselines")
    vals = {}
    for p, short in BASELINES.items():
        v = rows[p].get(key)
        if v is None or v == 0:
            return Conclusion(name, claim, False, f"{short}: no value")
        vals[short] = 1.0 / v if invert else v
    holds = bool(all(lo_hi[0] <= v <= lo_hi[1] for v in vals.values()))
    return Conclusion(name, claim, holds, ", ".join(f"{k} {v:.2f}x" for k, v in vals.items()))


def _latency(rows: dict[str, dict]) -> Conclusion:
    claim = f"MuxFlow slows online work by < {LATENCY_BOUND - 1:.0%} on the GPU-minutes it shares (avg and p99)"
    r = rows.get("muxflow")
    if r is None:
        return Conclusion("latency_bound", claim, None, "needs muxflow")
    avg, p99 = r["shared_avg_latency_vs_online_only"], r["shared_p99_latency_vs_online_only"]
    return Conclusion("latency_bound", claim, bool(avg < LATENCY_BOUND and p99 < LATENCY_BOUND),
                      f"avg {avg:.3f}, p99 {p99:.3f}")


def conclusions(rows: list[dict]) -> list[Conclusion]:
    """The conclusions of docs/EVALUATION.md, checked on one comparison table."""
    by = _by_policy(rows)
    return [
        _ranking(by),
        _ratios(by, "jct_vs_muxflow", False, PAPER_JCT_RANGE, "jct_ratio",
                f"MuxFlow's JCT is {PAPER_JCT_RANGE[0]:.2f}-{PAPER_JCT_RANGE[1]:.2f}x better than TS and PB (Fig. 11)"),
        _ratios(by, "oversold_vs_muxflow", True, PAPER_OVERSOLD_RANGE, "oversold_ratio",
                f"MuxFlow oversells {PAPER_OVERSOLD_RANGE[0]:.2f}-{PAPER_OVERSOLD_RANGE[1]:.2f}x more GPU than "
                "TS and PB (Fig. 11)"),
        _latency(by),
    ]


def conclusion_matrix(per_calibration: dict[str, list[Conclusion]]) -> list[dict]:
    """One row per conclusion: whether it holds under each calibration, and under all of them."""
    names = [c.name for c in next(iter(per_calibration.values()), [])]
    out = []
    for i, name in enumerate(names):
        cells = {cal: cs[i] for cal, cs in per_calibration.items()}
        verdicts = [c.holds for c in cells.values()]
        out.append({"name": name, "claim": cells[next(iter(cells))].claim,
                    "holds_under_all": None if None in verdicts else bool(all(verdicts)),
                    "by_calibration": {cal: {"holds": c.holds, "value": c.value} for cal, c in cells.items()}})
    return out
