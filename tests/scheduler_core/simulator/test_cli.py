"""`muxflow simulate`, `simulate compare` and `bench simulate` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from executors.data.calibration import SAMPLE_TRACE
from pipelines.cli import main

TINY = ["--gpus", "12", "--hours", "1.5", "--jobs", "40", "--seed", "1"]


@pytest.fixture()
def in_tmp(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)  # the predictor cache and default outputs go under .muxflow/ here
    return tmp_path


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_simulate_prints_json_metrics_and_progress(in_tmp) -> None:
    res = run("simulate", "--trace", str(SAMPLE_TRACE), *TINY, "--policy", "muxflow", "--json")
    assert res.exit_code == 0, res.stderr
    m = json.loads(res.stdout)
    assert m["simulated"] is True and m["policy"] == "muxflow"
    assert m["config"]["gpus"] == 12 and m["offline"]["jobs"] == 40
    assert m["invariants"]["all_accounted"]
    assert m["inputs"]["interference_calibration_holdout"][0]["gpu_type"] == "k80"
    assert "[muxflow] round 6/6 (100%)" in res.stderr
    assert (in_tmp / ".muxflow" / "cache").is_dir()


def test_simulate_compare_writes_plots_and_a_normalized_table(in_tmp) -> None:
    out = in_tmp / "cmp"
    res = run("simulate", "compare", "--trace", str(SAMPLE_TRACE), *TINY,
              "--policies", "muxflow,time-sharing", "--out", str(out), "--quiet")
    assert res.exit_code == 0, res.stderr
    assert "SIMULATED" in res.stdout and "JCT/MuxFlow" in res.stdout
    lines = {ln.split()[0]: ln.split() for ln in res.stdout.splitlines()[3:] if ln.strip() and ln[0].isalpha()}
    assert set(lines) >= {"online-only", "time-sharing", "muxflow"}
    for name in ("utilization.png", "comparison.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((out / "results.json").read_text())
    assert [r["policy"] for r in doc["table"]] == ["online-only", "muxflow", "time-sharing"]
    # What each service's users see, per policy: the JSON's `services` and the table after the main one.
    services = {p: [s["name"] for s in m["services"]] for p, m in doc["metrics"].items()}
    assert services["muxflow"] == services["time-sharing"] == ["search-cnn", "translate-transformer", "ads-recommender"]
    assert all(s["all_avg_norm"] == 1.0 and s["minutes_over_cap"] == 0 for s in doc["metrics"]["online-only"]["services"])
    assert "per service" in res.stdout and "min over cap" in res.stdout
    assert res.stderr == ""


def test_slo_scale_gives_services_slos_and_reports_violations_per_service_minute(in_tmp) -> None:
    res = run("simulate", "--trace", str(SAMPLE_TRACE), *TINY, "--policy", "muxflow", "--slo-scale", "1.5", "--json",
              "--quiet")
    assert res.exit_code == 0, res.stderr
    m = json.loads(res.stdout)
    slos = m["config"]["service_slos_ms"]
    assert m["config"]["slo_scale"] == 1.5 and all(v > 0 for v in slos.values()) and len(slos) == 3
    slo = m["online"]["slo"]
    assert slo["services_with_slo"] == 3 and slo["service_minutes"] == 3 * 90
    for s in m["services"]:
        assert s["slo_p99_ms"] == slos[s["name"]] and 0.0 <= s["slo_attainment"] <= 1.0
        assert s["service_minutes"] == 90 and s["all_avg_norm"] >= 1.0
    assert 0.0 <= slo["violation_frac"] <= 1.0 and slo["violations"] >= slo["online_only_violations"] - 5
    assert set(slo["per_service"]) == set(slos)
    plain = json.loads(run("simulate", "--trace", str(SAMPLE_TRACE), *TINY, "--policy", "muxflow", "--json",
                           "--quiet").stdout)
    assert plain["online"]["slo"] == {"services_with_slo": 0} and plain["config"]["slo_scale"] is None
    bad = run("simulate", "--trace", str(SAMPLE_TRACE), *TINY, "--slo-scale", "0")
    assert bad.exit_code == 2 and "slo-scale" in bad.stderr


def test_between_rounds_places_arrivals_without_waiting_for_the_round(in_tmp) -> None:
    args = ["simulate", "--trace", str(SAMPLE_TRACE), *TINY, "--policy", "muxflow", "--json", "--quiet"]
    plain = json.loads(run(*args, "--rounds-only").stdout)
    res = run(*args)  # between rounds is the default, as the pipeline's fills on Slurm
    assert res.exit_code == 0, res.stderr
    m = json.loads(res.stdout)
    assert m["config"]["between_rounds"] is True and plain["config"]["between_rounds"] is False
    assert m["between_rounds"]["calls"] > 0 and m["between_rounds"]["started"] > 0 and "between_rounds" not in plain
    assert m["invariants"]["all_accounted"] and m["invariants"]["refused_actions"] == 0
    assert m["offline"]["jct_censored_s"] < plain["offline"]["jct_censored_s"]


def test_round_minutes_sets_every_policys_round_period(in_tmp) -> None:
    res = run("simulate", "--trace", str(SAMPLE_TRACE), *TINY, "--policy", "muxflow", "--json", "--round-minutes", "5")
    assert res.exit_code == 0, res.stderr
    m = json.loads(res.stdout)
    assert m["config"]["round_minutes"] == 5 and m["rounds"]["count"] == 18  # 90 minutes
    assert m["config"]["migration_penalty"] == pytest.approx(90.0 / 300.0)  # a restart over the shorter interval
    assert "[muxflow] round 18/18 (100%)" in res.stderr
    bad = run("simulate", "--trace", str(SAMPLE_TRACE), *TINY, "--round-minutes", "0")
    assert bad.exit_code == 2 and "round-minutes" in bad.stderr


def test_a_malformed_trace_line_is_reported_with_its_number(in_tmp) -> None:
    bad = in_tmp / "bad.trace"
    good = SAMPLE_TRACE.read_text().splitlines()[:2]
    bad.write_text("\n".join([*good, "ResNet-50 (batch size 64)\tcmd\t-s\t0\tmany\t10\t1"]) + "\n")
    res = run("simulate", "--trace", str(bad), *TINY)
    assert res.exit_code == 2
    assert res.stderr.strip() == f"error: {bad}: trace line 3: total steps is not an integer: 'many'"


@pytest.mark.parametrize("args,message", [
    (["--policy", "fifo"], "unknown policy 'fifo'"),
    (["--types", "t4:5"], "add up to 5, not 12"),
    (["--trace", "/no/such/file.trace"], "cannot read /no/such/file.trace"),
    (["--hours", "2", "--arrival-hours", "3"], "arrival-hours: 3 is past the end of the run (--hours 2)"),
])
def test_bad_options_are_one_line_errors(in_tmp, args, message) -> None:
    base = ["--trace", str(SAMPLE_TRACE)] if "--trace" not in args else []
    res = run("simulate", *base, *TINY, *args)
    assert res.exit_code == 2, res.stdout
    assert res.stderr.startswith("error: ") and message in res.stderr


def test_bench_simulate_reports_time_per_policy_against_the_target(in_tmp) -> None:
    res = run("bench", "simulate", "--gpus", "10", "--hours", "1", "--jobs", "20", "--policies", "muxflow,salus",
              "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["target_s"] == 60.0 and out["jobs"] == 20
    assert [r["policy"] for r in out["policies"]] == ["muxflow", "salus"]
    assert all(r["within_target"] and r["rounds"] == 4 for r in out["policies"])


def test_simulate_under_another_calibration_says_which(in_tmp) -> None:
    res = run("simulate", "--trace", str(SAMPLE_TRACE), *TINY, "--calibration", "K80", "--json", "--quiet")
    assert res.exit_code == 0, res.stderr
    m = json.loads(res.stdout)
    assert m["inputs"]["calibration"] == "k80" and m["inputs"]["traits_gpu_type"] == "t4"
    loto = m["inputs"]["interference_model"]["leave_one_type_out"]
    assert {r["test"] for r in loto} == {"k80", "p100"}


def test_an_unknown_calibration_is_a_one_line_error(in_tmp) -> None:
    res = run("simulate", "--trace", str(SAMPLE_TRACE), *TINY, "--calibration", "v100")
    assert res.exit_code == 2
    assert res.stderr.strip() == ("error: calibration: unknown 'v100' "
                                  "(known: k80, p100, optimistic, transfer, pessimistic)")
    res = run("simulate", "compare", "--trace", str(SAMPLE_TRACE), *TINY, "--calibrations", "k80")
    assert res.exit_code == 2 and res.stderr.strip() == "error: calibrations: only with --sensitivity"


def test_compare_sensitivity_reruns_under_each_calibration(in_tmp) -> None:
    out = in_tmp / "sens"
    res = run("simulate", "compare", "--trace", str(SAMPLE_TRACE), *TINY, "--policies",
              "muxflow,time-sharing,pb-time-sharing", "--sensitivity", "--out", str(out), "--quiet")
    assert res.exit_code == 0, res.stderr
    assert "SIMULATED (calibration transfer)" in res.stdout and "SIMULATED (calibration pessimistic)" in res.stdout
    assert "which conclusions hold under each interference calibration" in res.stdout
    doc = json.loads((out / "sensitivity.json").read_text())
    assert doc["simulated"] is True
    # By default: the centre and both ends of the interference model's 80 % interval.
    assert list(doc["calibrations"]) == ["transfer", "optimistic", "pessimistic"]
    matrix = {row["name"]: row for row in doc["matrix"]}
    assert set(matrix) == {"ranking", "jct_ratio", "oversold_ratio", "latency_bound"}
    assert matrix["ranking"]["holds_under_all"] is None  # the ablations did not run
    for row in matrix.values():
        assert set(row["by_calibration"]) == {"transfer", "optimistic", "pessimistic"}
        assert all(c["holds"] in (True, False, None) for c in row["by_calibration"].values())  # JSON booleans
    # Each calibration ran its own comparison: the interval's low end slows MuxFlow's offline work.
    tput = {cal: next(r for r in part["table"] if r["policy"] == "muxflow")["oversold_gpu"]
            for cal, part in doc["calibrations"].items()}
    assert tput["pessimistic"] < tput["transfer"] and tput["pessimistic"] < tput["optimistic"]


def test_a_smaller_slowdown_allowance_plans_less_online_slowdown(in_tmp) -> None:
    args = ["simulate", "--trace", str(SAMPLE_TRACE), *TINY, "--policy", "muxflow", "--json", "--quiet"]
    plain = json.loads(run(*args).stdout)
    res = run(*args, "--slowdown-allowance", "0.05")
    assert res.exit_code == 0, res.stderr
    tight = json.loads(res.stdout)
    assert set(plain["config"]["slowdown_allowances"].values()) == {0.25}  # the default, under a 0.1 budget
    assert set(plain["config"]["slowdown_budgets"].values()) == {0.1}
    assert set(tight["config"]["slowdown_allowances"].values()) == {0.05}
    assert tight["online"]["shared_avg_latency_norm"] < plain["online"]["shared_avg_latency_norm"]
    bad = run(*args, "--slowdown-allowance", "0")
    assert bad.exit_code == 2 and "slowdown-allowance" in bad.stderr


def test_a_slowdown_budget_spends_the_allowance_in_quiet_minutes(in_tmp) -> None:
    args = ["simulate", "--trace", str(SAMPLE_TRACE), *TINY, "--policy", "muxflow", "--json", "--quiet",
            "--slowdown-allowance", "0.3"]
    flat = json.loads(run(*args, "--slowdown-budget", "none").stdout)
    res = run(*args, "--slowdown-budget", "0.05")
    assert res.exit_code == 0, res.stderr
    budgeted = json.loads(res.stdout)
    assert set(flat["config"]["slowdown_budgets"].values()) == {None}
    assert set(budgeted["config"]["slowdown_budgets"].values()) == {0.05}
    assert set(budgeted["config"]["slowdown_allowances"].values()) == {0.3}
    # Busy minutes get less than the cap: the requests see less slowdown than under the flat cap.
    assert budgeted["online"]["shared_avg_latency_norm"] < flat["online"]["shared_avg_latency_norm"]
    for bad in ("0", "-1", "many"):
        res = run(*args, "--slowdown-budget", bad)
        assert res.exit_code == 2 and "slowdown-budget" in res.stderr and "'none'" in res.stderr


def _results_json(path: Path, **config) -> Path:
    """A `simulate compare` results.json as the bound reads it: the run's settings and each policy's JCT."""
    cfg = {"gpus": 12, "gpu_types": {"t4": 12}, "hours": 1.5, "jobs": 40, "arrival_hours": 1.0,
           "mean_job_hours": 1.0, "seed": 1, **config}
    metrics = {p: {"offline": {"jct_censored_s": v}} for p, v in
               (("muxflow", 1500.0), ("salus", 1800.0), ("time-sharing", 2500.0), ("muxflow-s", 1200.0))}
    path.write_text(json.dumps({"config": cfg, "calibration": "transfer", "metrics": metrics}))
    return path


def test_jct_bound_prints_the_bound_per_cap_beside_the_best_baseline(in_tmp) -> None:
    res = run("simulate", "jct-bound", "--trace", str(SAMPLE_TRACE), *TINY, "--caps", "0.2,0.1,inf", "--json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["simulated"] is True and doc["config"]["gpus"] == 12 and doc["jobs"] == 40
    caps = [r["cap"] for r in doc["bounds"]]
    assert caps == [0.1, 0.2, None]  # sorted, inf as none
    jct = [r["jct_censored_s"] for r in doc["bounds"]]
    assert jct[0] >= jct[1] >= jct[2] > 0
    assert all(len(r["job_types"]) >= 1 for r in doc["bounds"])

    results = _results_json(in_tmp / "results.json")
    text = run("simulate", "jct-bound", "--trace", str(SAMPLE_TRACE), *TINY, "--caps", "0.1",
               "--results", str(results))
    assert text.exit_code == 0, text.stderr
    assert "SIMULATED" in text.stdout
    # Salus is the best baseline (MuxFlow's ablations are not baselines): the ratio is the bound over its JCT.
    assert "bound / salus" in text.stdout
    row = next(line for line in text.stdout.splitlines() if line.strip().startswith("0.1"))
    assert float(row.split()[-1]) == pytest.approx(jct[0] / 1800.0, abs=1e-3)


def test_jct_bound_refuses_bad_caps_and_results_of_other_settings(in_tmp) -> None:
    for caps in ("0", "-0.1", "nan", "x"):
        res = run("simulate", "jct-bound", "--trace", str(SAMPLE_TRACE), *TINY, "--caps", caps)
        assert res.exit_code == 2 and "--caps" in res.stderr, caps
    other = _results_json(in_tmp / "other.json", gpus=1000, seed=0)
    res = run("simulate", "jct-bound", "--trace", str(SAMPLE_TRACE), *TINY, "--results", str(other))
    assert res.exit_code != 0
    assert "other settings" in res.stderr and "gpus 1000" in res.stderr and "seed 0" in res.stderr
    broken = in_tmp / "broken.json"
    broken.write_text("{}")
    res = run("simulate", "jct-bound", "--trace", str(SAMPLE_TRACE), *TINY, "--results", str(broken))
    assert res.exit_code != 0 and "is not a `simulate compare` results.json" in res.stderr
    res = run("simulate", "jct-bound", *TINY)
    assert res.exit_code != 0 and "--trace is required" in res.stderr
