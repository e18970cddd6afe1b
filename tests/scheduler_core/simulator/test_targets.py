"""The evaluation's targets judged on comparison results (scheduler_core.simulator.targets), and
`muxflow simulate evaluation` as a user runs it: every trace × size, sharded runs, the tables in a page."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from executors.data.calibration import SAMPLE_TRACE
from pipelines.cli import main
from scheduler_core.simulator.targets import judge, markdown, sensitivity_markdown


def _svc(name: str, avg: float, p99: float, over: int = 0, slo: float | None = 1.0) -> dict:
    return {"name": name, "all_avg_norm": avg, "all_p99_norm": p99, "shared_avg_norm": avg + 0.05,
            "shared_p99_norm": p99 + 0.05, "worst_minute_norm": p99 + 0.1, "minutes_over_cap": over, "cap": 0.3,
            "slo_attainment": slo}


def _doc(jct: dict[str, float], oversold: dict[str, float], services: list[dict], evicted: float = 0.0) -> dict:
    metrics = {p: {"offline": {"jct_censored_s": j, "oversold_gpu": oversold.get(p, 0.5), "eviction_rate": 0.0,
                               "jobs": 100}, "services": []} for p, j in jct.items()}
    metrics["muxflow"]["services"] = services
    metrics["muxflow"]["offline"]["eviction_rate"] = evicted
    return {"trace": "/t/philly_vc_abc.trace", "config": {"gpus": 200, "slo_scale": 1.5}, "calibration": "transfer",
            "metrics": metrics}


def test_every_target_met_when_muxflow_beats_every_baseline_within_every_service_limit() -> None:
    doc = _doc({"muxflow": 3600.0, "salus": 3700.0, "pb-time-sharing": 4000.0, "time-sharing": 5000.0},
               {"muxflow": 0.8, "pb-time-sharing": 0.6}, [_svc("a", 1.08, 1.099), _svc("b", 1.02, 1.05)])
    j = judge(doc)
    assert all(j["met"].values()), j["met"]
    assert j["jct_baseline_over_muxflow"]["salus"] == pytest.approx(3700 / 3600, abs=1e-4)
    assert j["oversold_vs_pb"] == pytest.approx(0.8 / 0.6, abs=1e-4) and j["gpus"] == 200


def test_the_worst_service_decides_and_each_miss_is_its_own() -> None:
    doc = _doc({"muxflow": 3600.0, "salus": 3500.0, "pb-time-sharing": 4000.0, "time-sharing": 5000.0},
               {"muxflow": 0.7, "pb-time-sharing": 0.6},
               [_svc("a", 1.08, 1.099), _svc("b", 1.02, 1.11, over=2, slo=0.985)], evicted=0.02)
    m = judge(doc)["met"]
    assert m == {"services_all_avg": True, "services_all_p99": False, "no_minute_over_cap": False,
                 "slo_attainment": False, "evicted": False, "jct_vs_every_baseline": False, "oversold_vs_pb": False}


def test_the_slo_target_counts_only_the_minutes_the_service_keeps_alone() -> None:
    svc = _svc("a", 1.05, 1.05, slo=0.80)
    svc.update(slo_attainment_alone=0.81, slo_kept_where_alone_keeps=0.995)  # its misses are its own
    doc = _doc({"muxflow": 3600.0, "salus": 3700.0, "pb-time-sharing": 4000.0, "time-sharing": 5000.0},
               {"muxflow": 0.8, "pb-time-sharing": 0.6}, [svc])
    assert judge(doc)["met"]["slo_attainment"] is True
    svc["slo_kept_where_alone_keeps"] = 0.98
    assert judge(doc)["met"]["slo_attainment"] is False
    assert "| 80.00 % / 81.00 % | 98.00 % |" in markdown([judge(doc)])


def test_targets_that_the_comparison_cannot_judge_are_left_open() -> None:
    # No PB run, no SLOs: those targets are unknown, not met.
    doc = _doc({"muxflow": 3600.0, "salus": 3700.0}, {"muxflow": 0.8}, [_svc("a", 1.05, 1.05, slo=None)])
    m = judge(doc)["met"]
    assert m["oversold_vs_pb"] is None and m["slo_attainment"] is None and m["jct_vs_every_baseline"] is None
    with pytest.raises(ValueError, match="no muxflow run"):
        judge({"metrics": {"salus": {}}})


def test_the_tables_give_one_line_per_run_and_per_service() -> None:
    ok = judge(_doc({"muxflow": 3600.0, "salus": 3700.0, "pb-time-sharing": 4000.0, "time-sharing": 5000.0},
                    {"muxflow": 0.8, "pb-time-sharing": 0.6}, [_svc("a", 1.08, 1.099), _svc("b", 1.02, 1.05)]))
    text = markdown([ok])
    run_lines = [ln for ln in text.splitlines() if ln.startswith("| abc |")]
    assert len(run_lines) == 3  # the run, then its two services
    assert "1.028 (salus) — met" in run_lines[0] and "+8.0 % / +9.9 % — met" in run_lines[0]
    assert "| abc | 200 | b | +2.0 % / +5.0 % |" in text


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_simulate_evaluation_runs_each_trace_and_size_and_writes_the_tables(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(SAMPLE_TRACE, traces / "philly_vc_one.trace")
    shutil.copy(SAMPLE_TRACE, traces / "philly_vc_two.trace")
    page = tmp_path / "EVALUATION.md"
    page.write_text("# Evaluation\n\nbefore\n<!-- targets:begin -->\nstale\n<!-- targets:end -->\nafter\n")
    out = tmp_path / "out"
    common = ["simulate", "evaluation", "--traces", str(traces), "--sizes", "10,6", "--jobs-at", "6=20",
              "--hours", "1", "--out", str(out), "--doc", str(page), "--quiet"]
    res = run(*common, "--trace", "philly_vc_one")  # one shard
    assert res.exit_code == 0, res.stderr
    assert sorted(p.parent.name for p in out.glob("*/results.json")) == ["philly_vc_one-10", "philly_vc_one-6"]
    res = run(*common, "--trace", "philly_vc_two.trace")  # the other shard: the tables hold both
    assert res.exit_code == 0, res.stderr
    runs = json.loads((out / "targets.json").read_text())["runs"]
    assert [(Path(r["trace"]).stem, r["gpus"]) for r in runs] == [
        ("philly_vc_one", 10), ("philly_vc_two", 10), ("philly_vc_one", 6), ("philly_vc_two", 6)]
    assert runs[2]["jobs"] == 20 and runs[0]["slo_scale"] == 1.5
    assert {s["name"] for s in runs[0]["services"]} == {"search-cnn", "translate-transformer", "ads-recommender"}
    text = page.read_text()
    assert "stale" not in text and text.startswith("# Evaluation\n\nbefore\n<!-- targets:begin -->\n| trace |")
    assert text.endswith("<!-- targets:end -->\nafter\n") and text.count("| one | 10 |") == 4  # run + 3 services
    assert (out / "TARGETS.md").read_text().count("| two | 6 |") == 4
    # The tables again from what is there, without running anything.
    (out / "TARGETS.md").unlink()
    assert run("simulate", "evaluation", "--tables-only", "--out", str(out)).exit_code == 0
    assert (out / "TARGETS.md").is_file()


def test_simulate_evaluation_passes_the_services_budget_and_the_jobs_per_gpu_to_every_comparison(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(SAMPLE_TRACE, traces / "philly_vc_one.trace")
    out = tmp_path / "out"
    res = run("simulate", "evaluation", "--traces", str(traces), "--sizes", "6", "--hours", "1", "--out", str(out),
              "--quiet", "--slowdown-budget", "none", "--slowdown-allowance", "0.2", "--max-jobs-per-gpu", "2")
    assert res.exit_code == 0, res.stderr
    cfg = json.loads((out / "philly_vc_one-6" / "results.json").read_text())["config"]
    assert set(cfg["slowdown_budgets"].values()) == {None} and set(cfg["slowdown_allowances"].values()) == {0.2}
    assert cfg["max_jobs_per_gpu"] == 2
    bad = run("simulate", "evaluation", "--traces", str(traces), "--slowdown-budget", "-1", "--out", str(out))
    assert bad.exit_code == 2 and "slowdown-budget" in bad.stderr


@pytest.mark.parametrize("args, message", [
    (["--traces", "nowhere"], "is not a folder"),
    (["--traces", "."], "no *.trace file"),
    (["--traces", ".", "--trace", "missing"], "not found"),
    (["--traces", ".", "--sizes", "0"], "sizes: expected integers >= 1"),
    (["--traces", ".", "--sizes", "big"], "sizes: expected comma-separated integers"),
    (["--traces", ".", "--jobs-at", "200:2000"], "GPUS=JOBS"),
    ([], "give --traces"),
])
def test_simulate_evaluation_refuses_bad_input_before_running(tmp_path: Path, monkeypatch, args, message) -> None:
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["simulate", "evaluation", "--out", str(tmp_path / "o"), *args])
    assert res.exit_code != 0 and message in res.stderr


def test_a_page_without_the_markers_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "r").mkdir(parents=True)
    doc = _doc({"muxflow": 3600.0, "salus": 3700.0}, {"muxflow": 0.8}, [_svc("a", 1.05, 1.05)])
    (out / "r" / "results.json").write_text(json.dumps(doc))
    page = tmp_path / "page.md"
    page.write_text("no markers here\n")
    res = CliRunner().invoke(main, ["simulate", "evaluation", "--tables-only", "--out", str(out), "--doc", str(page)])
    assert res.exit_code != 0 and "needs one <!-- targets:begin --> line" in res.stderr
    assert page.read_text() == "no markers here\n"


def _row(name: str, verdicts: dict[str, bool | None]) -> dict:
    known = [v for v in verdicts.values()]
    return {"name": name, "claim": f"{name} claim", "holds_under_all": None if None in known else all(known),
            "by_calibration": {c: {"holds": v, "value": "x"} for c, v in verdicts.items()}}


def test_sensitivity_table_says_which_conclusions_hold_under_every_calibration() -> None:
    runs = [
        {"trace": "t/philly_vc_a.trace", "config": {"gpus": 200},
         "matrix": [_row("ranking", {"transfer": True, "pessimistic": False}),
                    _row("latency", {"transfer": True, "pessimistic": None})]},
        {"trace": "t/philly_vc_a.trace", "config": {"gpus": 1000},
         "matrix": [_row("ranking", {"transfer": True, "pessimistic": True})]},
    ]
    text = sensitivity_markdown(runs)
    lines = text.splitlines()
    assert lines[0] == "Calibrations: pessimistic, transfer."
    assert lines[2] == "| conclusion | a, 1,000 | a, 200 |"          # the larger cluster first
    assert "| ranking | yes | NO (pessimistic) |" in lines
    assert "| latency | – | n/a (pessimistic) |" in lines
    assert "- ranking: ranking claim" in lines
    assert sensitivity_markdown([]) == ""


def test_simulate_evaluation_with_sensitivity_tables_the_conclusions(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(SAMPLE_TRACE, traces / "philly_vc_one.trace")
    page = tmp_path / "EVALUATION.md"
    page.write_text("<!-- targets:begin -->\n<!-- targets:end -->\nmid\n<!-- sensitivity:begin -->\nstale\n"
                    "<!-- sensitivity:end -->\n")
    out = tmp_path / "out"
    res = run("simulate", "evaluation", "--traces", str(traces), "--sizes", "6", "--hours", "1", "--sensitivity",
              "--out", str(out), "--doc", str(page), "--quiet")
    assert res.exit_code == 0, res.stderr
    assert (out / "philly_vc_one-6" / "sensitivity.json").is_file()
    sens = (out / "SENSITIVITY.md").read_text()
    assert "| conclusion | one, 6 |" in sens and "optimistic" in sens and "pessimistic" in sens
    text = page.read_text()
    assert "stale" not in text and "| conclusion | one, 6 |" in text and "\nmid\n" in text
