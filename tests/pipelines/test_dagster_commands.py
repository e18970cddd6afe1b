"""Dagster as its users run it from the repository root of a fresh clone: ``dg check defs``, ``dg list defs`` and
``dagster definitions validate`` with no DAGSTER_HOME and no settings (pyproject's [tool.dg] / [tool.dagster] name
the code location; dagster.yaml names no environment variable)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ASSETS = {"offline_job_profiles", "online_service_features", "colocation_samples", "speed_predictor_candidate",
          "speed_predictor", "placement_plan", "plan_dispatch", "cluster_interval", "utilization_report"}


def _run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "MUXFLOW_"))}
    env.update(HOME=str(tmp_path), VIRTUAL_ENV=str(BIN.parent), PATH=f"{BIN}:/usr/bin:/bin")
    return subprocess.run(list(argv), cwd=REPO, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_dg_and_dagster_commands_work_from_the_repository_root_without_dagster_home(tmp_path: Path) -> None:
    check = _run(tmp_path, str(BIN / "dg"), "check", "defs")
    assert check.returncode == 0 and "All definitions loaded successfully" in check.stdout + check.stderr, \
        check.stdout + check.stderr
    listed = _run(tmp_path, str(BIN / "dg"), "list", "defs", "--json")
    assert listed.returncode == 0, listed.stderr
    defs = json.loads(listed.stdout)
    assert {a["asset_key"] for a in defs["assets"]} == ASSETS
    assert {s["name"] for s in defs["sensors"]} == {"round_sensor", "new_submission_sensor", "eviction_sensor"}
    assert "round_job" in {j["name"] for j in defs["jobs"]}
    validate = _run(tmp_path, str(BIN / "dagster"), "definitions", "validate")
    out = validate.stdout + validate.stderr
    assert validate.returncode == 0 and "All code locations passed validation" in out, out
    assert not list(REPO.glob(".tmp_dagster_home_*")), "the temporary home is removed afterwards"
