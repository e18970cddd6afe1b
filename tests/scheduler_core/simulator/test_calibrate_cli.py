"""`muxflow calibrate` as a user runs it: errors of the interference model, a site's file, refit."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from executors.data import calibration as cal
from executors.data.measurements import ENV_VAR, GAVEL_FILE, load_file, to_document
from pipelines.cli import main


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture()
def v100(tmp_path):
    """A site's file: Gavel's P100 pairs, as measured on a GPU twice as fast (a new type)."""
    doc = to_document(load_file(GAVEL_FILE))
    doc["gpus"] = {"v100": {"gpu_model": "test V100", "driver": "535.104.05", "method": "no-mps",
                            "date": "2025-02-01"}}
    doc["solo"] = [{**r, "gpu_type": "v100", "steps_per_s": 2 * r["steps_per_s"]} for r in doc["solo"]
                   if r["gpu_type"] == "p100"]
    doc["pairs"] = [{**r, "gpu_type": "v100"} for r in doc["pairs"] if r["gpu_type"] == "p100"]
    path = tmp_path / "v100.json"
    path.write_text(json.dumps(doc))
    return path


def test_report_prints_the_leave_one_type_out_table() -> None:
    res = run("calibrate", "report")
    assert res.exit_code == 0, res.stderr
    assert "p100 -> k80" in res.stdout and "k80 -> p100" in res.stdout and "+ residuals" in res.stdout
    assert "80% interval, measured profiles: log-odds" in res.stdout and "(pessimistic)" in res.stdout
    doc = json.loads(run("calibrate", "report", "--json").stdout)
    assert {r["test"] for r in doc["leave_one_type_out"]} == {"k80", "p100"}
    # Every row carries the coverage of the interval built without its own type's pairs.
    for r in doc["leave_one_type_out_subsets"]:
        assert 0.0 <= r["after"]["coverage_80"] <= 1.0 and 0.0 <= r["zero_shot"]["coverage_80"] <= 1.0
    iv = doc["intervals"]["after"]
    assert iv["log_odds_lo"] < 0.0 < iv["log_odds_hi"] and iv["from_types"] == ["k80", "p100"]
    assert iv["factor_optimistic"] < 1.0 < iv["factor_pessimistic"]


def test_check_and_convert(tmp_path) -> None:
    out = tmp_path / "gavel.json"
    res = run("calibrate", "convert-gavel", str(GAVEL_FILE), str(out))
    assert res.exit_code == 0, res.stderr
    res = run("calibrate", "check", str(out))
    assert res.exit_code == 0, res.stderr
    assert "p100: NVIDIA Tesla P100, driver not recorded, method unknown, 2020: 26 solo runs, 656 pair" in res.stdout


def test_check_says_whether_the_file_can_be_used_as_refit_would_use_it(v100, tmp_path) -> None:
    res = run("calibrate", "check", str(v100))
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines()[-1].startswith("usable: with the installed measurements (k80, p100, v100) the "
                                                  "interference model fits on ")
    # Well-formed, but its GPU's speed cannot be known (no relative_speed, no solo run of the stressor):
    # check refuses it as refit does, with the same one line.
    small = tmp_path / "small.json"
    small.write_text(json.dumps({
        "format": "muxflow.colocation/1",
        "gpus": {"v100": {"gpu_model": "V100", "driver": "535.104.05", "method": "mps", "date": "2025-03-14"}},
        "solo": [{"gpu_type": "v100", "job_type": "A", "steps_per_s": 10.0},
                 {"gpu_type": "v100", "job_type": "B", "steps_per_s": 4.0}],
        "pairs": [{"gpu_type": "v100", "job_type": "A", "partner": "B", "norm_tput": 0.6,
                   "partner_norm_tput": 0.7}]}))
    checked = run("calibrate", "check", str(small))
    refit = run("calibrate", "refit", "--data", str(small), "--no-predictors")
    assert checked.exit_code == refit.exit_code == 2
    assert checked.stderr == refit.stderr and checked.stderr.startswith("error: v100: no relative_speed")
    assert "usable" not in checked.stdout


def test_a_bad_file_is_a_one_line_error(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "muxflow.colocation/1", "gpus": {"v100": {"gpu_model": "x"}}}))
    res = run("calibrate", "refit", "--data", str(bad), "--no-predictors")
    assert res.exit_code == 2
    assert res.stderr.strip() == f"error: {bad}: gpus.v100.driver: required, a non-empty string"


def test_refit_prints_before_and_after_and_how_to_install(v100) -> None:
    res = run("calibrate", "refit", "--data", str(v100), "--types", "t4", "--samples", "200", "--epochs", "3")
    assert res.exit_code == 0, res.stderr
    before, after = res.stdout.split("AFTER")
    assert "v100" not in before.split("on the file")[0] and "p100 -> v100" not in before
    assert "k80,p100 -> v100" in after and "v100: " in after
    assert "predictors, p100 per-job fit" in res.stdout and "predictors, transfer, refit" in res.stdout
    assert f"export {ENV_VAR}={v100.resolve()}" in res.stdout
    # Nothing was installed by the command itself.
    assert cal.calibrations() == ["k80", "p100", "optimistic", "transfer", "pessimistic"] and ENV_VAR not in os.environ


def test_refit_json_on_the_data_already_installed_changes_nothing() -> None:
    res = run("calibrate", "refit", "--data", str(GAVEL_FILE), "--no-predictors", "--json")
    rep = json.loads(res.stdout)
    assert rep["same_measurements"] is True and "predictors" not in rep
    assert rep["before"]["leave_one_type_out"] == rep["after"]["leave_one_type_out"]


H200 = GAVEL_FILE.parents[3] / "docs" / "evaluation" / "gpu" / "2026-11-27-h200" / "colocation.json"


def harness_report(tmp_path, name: str = "colocation.json", **changes) -> str:
    """A harness report (format /1) of two points: one usable, one where the service ran faster than alone."""
    def pt(sm, tput, avg):
        return {"sm_pct": sm, "iterations": {"mean_s": 0.1 / tput}, "latency": {"avg_ms": 4 * avg, "p99_ms": 9.0},
                "norm_tput": tput, "slowdown_avg": avg, "slowdown_p99": 1.1}
    rep = {"format": "muxflow-colocation-report/1", "method": "mps", "gpu_type": "h200", "service_family": "cnn",
           "qps": 200.0, "job_type": "Transformer (batch size 32)", "window_s": 8.0, "started_unix": 1795808331.9,
           "device": "NVIDIA H200 (driver 580.159.04)",
           "solo_service": {"latency": {"avg_ms": 4.0, "p99_ms": 8.0, "busy_frac": 0.5},
                            "metrics": {"gpu_util_pct": 45.0, "source": "measured"}},
           "solo_job": {"iterations": {"mean_s": 0.1}, "metrics": {"sm_activity_pct": 80.0, "mem_bw_util_pct": 30.0}},
           "points": [pt(20, 0.25, 1.3), pt(80, 0.8, 0.7)], **changes}
    path = tmp_path / name
    path.write_text(json.dumps(rep))
    return str(path)


def test_from_harness_writes_service_points_that_check_and_service_model_read(tmp_path) -> None:
    out = tmp_path / "h200.json"
    res = run("calibrate", "from-harness", harness_report(tmp_path), "-o", str(out), "--caveat", "one repetition")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines() == [
        f"{out}: h200: 2 service points, 1 usable, 1 kept out",
        "  kept out: colocation.json cnn + Transformer (batch size 32) at 80 %: online slowdown x0.70 (average) is "
        "below 1 by more than the noise (10 %): the service ran faster beside the job, which is not interference"]
    doc = json.loads(out.read_text())
    assert doc["caveats"] == ["one repetition"] and doc["gpus"]["h200"]["driver"] == "580.159.04"
    checked = run("calibrate", "check", str(out))
    assert checked.exit_code == 0, checked.stderr
    assert ("  h200: NVIDIA H200, driver 580.159.04, method mps, 2026-11-27: 2 service points (1 usable, 1 kept "
            "out)") in checked.stdout
    table = run("calibrate", "service-model", str(out))
    assert table.exit_code == 0, table.stderr
    assert table.stdout.splitlines()[2].startswith("| colocation.json | cnn, 200 | 0.14 / 0.50 | Transformer "
                                                   "(batch size 32) | 20 | yes | 0.25 / ")
    rows = json.loads(run("calibrate", "service-model", str(out), "--json").stdout)
    assert [r["usable"] for r in rows] == [True, False] and rows[0]["measured"]["slowdown_avg"] == 1.3


@pytest.mark.parametrize("setup,args,message", [
    (lambda p: (p / "notes.txt").write_text("11 passed\n"), ["notes.txt"],
     "{dir}/notes.txt: neither a harness report (JSON) nor the GPU suite's output"),
    (lambda p: None, ["missing.json"], "{dir}/missing.json: cannot read: No such file or directory"),
    (lambda p: harness_report(p, "cpu.json", method="cpu"), ["cpu.json"],
     "{dir}/cpu.json: method 'cpu': a CPU run tests the harness, it measures no GPU "
     "(convert it only as method 'simulated')"),
    (lambda p: harness_report(p), ["colocation.json", "--workload-note", "no equals sign"],
     "workload-note: expected JOB_TYPE=TEXT, got 'no equals sign'"),
    (lambda p: harness_report(p), ["colocation.json", "--date", "27.11.2026"],
     "converted reports: gpus.h200.date: '27.11.2026' is not YYYY, YYYY-MM or YYYY-MM-DD"),
])
def test_from_harness_refuses_a_bad_input_in_one_line(tmp_path, setup, args, message) -> None:
    setup(tmp_path)
    out = tmp_path / "out.json"
    res = run("calibrate", "from-harness", str(tmp_path / args[0]), *args[1:], "-o", str(out))
    assert res.exit_code == 2
    assert res.stderr.splitlines() == [f"error: {message.format(dir=tmp_path)}"]
    assert not out.exists()


def test_the_committed_h200_file_checks_and_service_model_needs_service_points() -> None:
    res = run("calibrate", "check", str(H200))
    assert res.exit_code == 0, res.stderr
    assert "h200: NVIDIA H200, driver 580.159.04, method mps, 2026-11-27: 11 service points (2 usable, 9 kept " \
           "out)" in res.stdout
    assert res.stdout.splitlines()[-1].startswith("usable: with the installed measurements (k80, p100) ")
    none = run("calibrate", "service-model", str(GAVEL_FILE))
    assert none.exit_code == 2 and none.stderr.strip() == f"error: {GAVEL_FILE}: no service points to compare"
