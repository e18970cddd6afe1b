"""``make gpu-check``'s orchestrator: parts run with deadlines, a part that hangs is killed and what it wrote is kept,
the summary is rewritten after each part, at most eight files, and nothing it runs needs the database libraries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from executors.dev import gpu_check
from executors.dev.gpu_check import PART_FORMAT, Part, pytest_counts

REPO = Path(__file__).resolve().parents[3]
NO_DB_SITE = Path(__file__).resolve().parent / "no_db_site"


def _env_without_databases() -> dict[str, str]:
    """This interpreter, with importing sqlalchemy/alembic/dagster/ortools/psycopg2 failing (no_db_site)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(NO_DB_SITE), str(REPO)])}


def test_the_blocker_blocks() -> None:
    out = subprocess.run([sys.executable, "-c", "import sqlalchemy"], env=_env_without_databases(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "blocked to check gpu-check" in out.stderr


def test_pytest_counts() -> None:
    assert pytest_counts("....\n3 passed, 1 skipped, 2 errors in 2.31s\n") == {"passed": 3, "skipped": 1, "errors": 2}
    assert pytest_counts("==== 11 passed in 118.02s (0:01:58) ====") == {"passed": 11}
    assert pytest_counts("no summary here") == {}


def test_unknown_part_and_bad_budget_are_one_line(tmp_path, capsys) -> None:
    assert gpu_check.main(["--out", str(tmp_path), "--parts", "xcuda,nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope" in err and "gpu_suite" in err
    assert gpu_check.main(["--out", str(tmp_path), "--budget", "0"]) == 2


def _stub_parts(monkeypatch, behaviours: dict[str, str]) -> None:
    parts = tuple(Part(name, "stub_part", 30.0, 30.0) for name in behaviours)
    monkeypatch.setattr(gpu_check, "PARTS", parts)
    monkeypatch.setattr(gpu_check, "PART_NAMES", tuple(behaviours))
    monkeypatch.setattr(gpu_check, "GRACE_S", 1.0)
    monkeypatch.setenv("PYTHONPATH", str(NO_DB_SITE))


def test_a_part_that_hangs_is_killed_and_what_it_wrote_is_kept(tmp_path, monkeypatch) -> None:
    _stub_parts(monkeypatch, {"xcuda": "hang"})
    monkeypatch.setenv("STUB_PART", "hang")
    monkeypatch.setattr(gpu_check, "MIN_PART_S", 1.0)
    summary = gpu_check.run(tmp_path, budget_s=gpu_check.RESERVE_S + 8.0, parts=["xcuda"], simulate=True,
                            command="test")
    part = summary["parts"]["xcuda"]
    assert part["status"] == "partial" and part["exit_code"] is None and "killed" in part["why"]
    kept = json.loads((tmp_path / "xcuda.json").read_text())
    assert kept["format"] == PART_FORMAT and kept["results"]["first"] == 1 and kept["complete"] is False
    assert json.loads((tmp_path / "summary.json").read_text())["parts"]["xcuda"]["status"] == "partial"


def test_parts_run_in_order_and_a_crash_or_no_time_is_said(tmp_path, monkeypatch) -> None:
    _stub_parts(monkeypatch, {"xcuda": "finish", "protection": "finish"})
    monkeypatch.setenv("STUB_PART", "finish")
    summary = gpu_check.run(tmp_path, budget_s=600, parts=["xcuda"], simulate=True, command="test")
    assert summary["parts"]["xcuda"]["status"] == "complete" and summary["parts"]["protection"]["status"] == "not run"
    assert summary["simulated"] is True and summary["gpu"] is None
    assert "SIMULATED" in (tmp_path / "SUMMARY.md").read_text()
    # A part with no time left is skipped, with the reason.
    summary = gpu_check.run(tmp_path, budget_s=gpu_check.RESERVE_S + 5, parts=["xcuda"], simulate=True, command="t")
    assert summary["parts"]["xcuda"]["status"] == "skipped" and "left of the budget" in summary["parts"]["xcuda"]["why"]
    assert not (tmp_path / "xcuda.json").exists()   # an earlier run's file is not left to be mistaken for this one's


def test_the_gpu_suite_part_runs_without_the_database_libraries(tmp_path, monkeypatch) -> None:
    """On a machine without a GPU the suite's tests skip; the part records pytest's counts."""
    monkeypatch.setenv("PYTHONPATH", str(NO_DB_SITE))
    log = gpu_check.Log(tmp_path / "gpu-check.log")
    gpu_check.run_gpu_suite(tmp_path, 240, True, log)
    doc = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert doc["complete"] is True and doc["results"]["exit_code"] == 0, doc["results"]["output_tail"]
    counts = doc["results"]["counts"]
    assert counts.get("skipped", 0) + counts.get("passed", 0) >= 11 and not counts.get("failed")
    assert "ImportError" not in doc["results"]["output_tail"]


def test_pytest_counts_from_the_summary_line_or_from_the_tests_it_reported() -> None:
    assert gpu_check.pytest_counts("x\n=== 9 passed, 2 skipped in 118.20s ===\n") == {"passed": 9, "skipped": 2}
    killed = ("tests/gpu/test_a.py::test_one PASSED   [ 33%]\ntests/gpu/test_a.py::test_two[x] FAILED [ 66%]\n"
              "tests/gpu/test_b.py::test_three SKIPPED (no GPU) [100%]\n")
    assert gpu_check.pytest_counts(killed) == {"passed": 1, "failed": 1, "skipped": 1, "unfinished": 1}
    assert gpu_check.pytest_counts("nothing ran\n") == {}


def test_a_gpu_suite_that_hangs_is_killed_with_its_threads_dumped_and_its_finished_tests_counted(
        tmp_path, monkeypatch) -> None:
    repo = tmp_path / "repo"
    (repo / "tests" / "gpu").mkdir(parents=True)
    (repo / "tests" / "gpu" / "test_suite.py").write_text(
        "import threading\n\n\ndef test_passes():\n    assert True\n\n\n"
        "def test_never_returns():\n    threading.Event().wait()\n")
    monkeypatch.setattr(gpu_check, "REPO", repo)
    out = tmp_path / "out"
    out.mkdir()
    rc = gpu_check.run_gpu_suite(out, 20, True, gpu_check.Log(out / "gpu-check.log"))
    doc = json.loads((out / "gpu_suite.json").read_text())
    assert rc is None and doc["complete"] is False and "killed at its deadline" in doc["why_incomplete"]
    assert doc["results"]["counts"] == {"passed": 1, "unfinished": 1}
    # where it hung, from the fault handler, in the log and the part's file
    hung = doc["results"]["where_it_hung"]
    assert hung.startswith("Fatal Python error: Aborted") and "in test_never_returns" in hung
    assert "test_never_returns" in (out / "gpu-check.log").read_text()


def test_a_simulated_run_end_to_end_without_the_database_libraries(tmp_path) -> None:
    """The real parts (two of them, to keep it short: each part's own tests run it whole), their files, the summary
    and colocation.json, in a process where importing SQLAlchemy, Alembic, Dagster, OR-Tools or psycopg2 fails."""
    from executors.data.measurements import parse_document

    out = tmp_path / "results"
    run = subprocess.run([sys.executable, "-m", "executors.dev.gpu_check", "--simulate", "--out", str(out),
                          "--parts", "xcuda,calibration", "--budget", "200"], env=_env_without_databases(),
                         capture_output=True, text=True, timeout=400, cwd=REPO)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == ["SUMMARY.md", "calibration.json", "colocation.json", "gpu-check.log", "summary.json",
                     "xcuda.json"], (out / "gpu-check.log").read_text()[-3000:]
    assert len(files) <= 8
    summary = json.loads((out / "summary.json").read_text())
    assert summary["format"] == "muxflow.gpu-check/1" and summary["simulated"] is True
    assert summary["parts"]["xcuda"]["status"] == "complete" and summary["parts"]["calibration"]["status"] == "complete"
    assert summary["parts"]["protection"]["status"] == "not run"
    assert summary["parts"]["xcuda"]["headline"]["fallback"]["launches_per_s"] > 0
    for name in ("xcuda", "calibration"):
        doc = json.loads((out / f"{name}.json").read_text())
        assert doc["format"] == PART_FORMAT and doc["method"] in ("simulated", "cpu") and doc["complete"] is True
    md = (out / "SUMMARY.md").read_text()
    assert md.count("SIMULATED") >= 1 and "| xcuda | complete |" in md
    parse_document(json.loads((out / "colocation.json").read_text()), "colocation.json")   # raises if invalid
    assert not any(p.name.startswith(".") for p in out.iterdir())   # the parts' scratch folders are gone
