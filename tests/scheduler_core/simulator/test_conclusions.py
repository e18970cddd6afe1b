"""The conclusions of docs/EVALUATION.md, checked on comparison tables built by hand."""

from __future__ import annotations

import pytest

from scheduler_core.simulator.conclusions import conclusion_matrix, conclusions


def table(**over) -> list[dict]:
    """A comparison where every conclusion holds; ``over`` replaces one policy's ratios."""
    rows = {
        "online-only": {},
        "time-sharing": {"jct_vs_muxflow": 1.5, "oversold_vs_muxflow": 0.6},
        "pb-time-sharing": {"jct_vs_muxflow": 1.35, "oversold_vs_muxflow": 0.7},
        "muxflow": {"jct_vs_muxflow": 1.0, "oversold_vs_muxflow": 1.0,
                    "shared_avg_latency_vs_online_only": 1.15, "shared_p99_latency_vs_online_only": 1.12},
        "muxflow-s": {"jct_vs_muxflow": 1.2, "oversold_vs_muxflow": 0.8},
        "muxflow-m": {"jct_vs_muxflow": 1.1, "oversold_vs_muxflow": 0.85},
        "muxflow-s-m": {"jct_vs_muxflow": 1.25, "oversold_vs_muxflow": 0.79},
        "salus": {"jct_vs_muxflow": 1.2, "oversold_vs_muxflow": 0.8},
    }
    for name, values in over.items():
        rows[name.replace("_", "-")] = {**rows[name.replace("_", "-")], **values}
    return [{"policy": p, **v} for p, v in rows.items()]


def verdicts(rows: list[dict]) -> dict[str, bool | None]:
    return {c.name: c.holds for c in conclusions(rows)}


def test_every_conclusion_holds_on_the_reference_table() -> None:
    assert verdicts(table()) == {"ranking": True, "jct_ratio": True, "oversold_ratio": True, "latency_bound": True}
    c = {c.name: c for c in conclusions(table())}
    assert c["jct_ratio"].value == "TS 1.50x, PB 1.35x"
    assert c["oversold_ratio"].value == "TS 1.67x, PB 1.43x"
    assert c["ranking"].value.startswith("JCT x MuxFlow: muxflow-m 1.10, ")


@pytest.mark.parametrize("over,broken", [
    ({"salus": {"jct_vs_muxflow": 0.95}}, "ranking"),  # a baseline finishes jobs sooner
    ({"muxflow_s": {"oversold_vs_muxflow": 1.02}}, "ranking"),  # an ablation oversells more
    ({"muxflow_s_m": {"jct_vs_muxflow": 1.15}}, "ranking"),  # -S-M beats -S
    ({"pb_time_sharing": {"jct_vs_muxflow": 1.05}}, "jct_ratio"),  # below the paper's 1.10
    ({"time_sharing": {"jct_vs_muxflow": 2.5}}, "jct_ratio"),  # above the paper's 2.24
    ({"time_sharing": {"oversold_vs_muxflow": 0.97}}, "oversold_ratio"),
    ({"muxflow": {"shared_p99_latency_vs_online_only": 1.21}}, "latency_bound"),
])
def test_each_conclusion_fails_on_its_own_counter_example(over, broken) -> None:
    v = verdicts(table(**over))
    assert v[broken] is False
    assert all(ok for name, ok in v.items() if name != broken)


def test_a_comparison_without_the_policies_a_claim_needs_leaves_it_open() -> None:
    rows = [r for r in table() if r["policy"] in ("online-only", "muxflow", "time-sharing")]
    assert verdicts(rows) == {"ranking": None, "jct_ratio": None, "oversold_ratio": None, "latency_bound": True}


def test_matrix_holds_only_when_every_calibration_agrees() -> None:
    m = conclusion_matrix({"a": conclusions(table()),
                           "b": conclusions(table(muxflow={"shared_avg_latency_vs_online_only": 1.3}))})
    by = {row["name"]: row for row in m}
    assert by["latency_bound"]["holds_under_all"] is False
    assert by["latency_bound"]["by_calibration"]["a"]["holds"] is True
    assert by["ranking"]["holds_under_all"] is True
