"""Every reader and writer of a plan agrees with its one schema (``executors/slurm/plan.py``).

The dispatcher and the node agent use the module itself; the node scripts run it as a tool and read the plan file
it writes; ``job_submit.lua`` and the TaskProlog recognize a plan by its marker. These tests hold the scripts to the
schema, so that a field renamed or a command changed in ``plan.py`` fails here rather than on a node.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from executors.slurm import plan as plans

EXECUTORS = Path(plans.__file__).resolve().parents[1]
PROLOG = EXECUTORS / "node" / "slurm" / "prolog.sh"
TASK_PROLOG = EXECUTORS / "node" / "slurm" / "task_prolog.sh"
EPILOG = EXECUTORS / "node" / "slurm" / "epilog.sh"
JOB_SUBMIT = EXECUTORS / "scheduler" / "slurm" / "job_submit.lua"
MARKER = plans.MARKER

PLACE = plans.Plan(slurm_job_id=4711, job_id=12, kind="place", gpu_index=2, sm_pct=35, mem_bytes=4 << 30,
                   kp=1.0, ki=20.0, kd=0.0)
PROFILE = plans.Plan(slurm_job_id=4712, job_id=13, kind="profile", gpu_index=1, run_id=7)


def _file_keys(plan: plans.Plan) -> set[str]:
    return {line.split("=", 1)[0] for line in plan.file_text("gpu-node-1").splitlines()}


def _keys_read(script: Path) -> set[str]:
    """The plan-file keys a script reads: ``val KEY`` (prolog, TaskProlog) and ``s/^KEY=...`` (Epilog)."""
    text = script.read_text()
    return set(re.findall(r"\$\(val ([a-z]+)\)", text)) | set(re.findall(r"s/\^([a-z]+)=", text))


def _tool_commands(script: Path) -> list[list[str]]:
    """The arguments each ``python3 "$PLAN_TOOL" …`` call passes, as written."""
    text = re.sub(r"\\\n\s*", " ", script.read_text())  # continuation lines joined
    calls = re.findall(r'python3 "\$PLAN_TOOL" ([^|)<\n]*)', text)
    return [[w for w in c.split() if not w.startswith(("2>", ">", "&"))] for c in calls]


@pytest.mark.parametrize("script", [PROLOG, TASK_PROLOG, EPILOG], ids=lambda p: p.name)
def test_the_node_scripts_read_only_keys_a_plan_file_has(script: Path) -> None:
    read = _keys_read(script)
    assert read, f"{script.name} reads no plan key: the pattern of this test no longer matches the script"
    assert read <= _file_keys(PLACE) | _file_keys(PROFILE), sorted(read - _file_keys(PLACE) - _file_keys(PROFILE))


def test_the_keys_only_one_kind_has_are_read_only_for_that_kind() -> None:
    # The TaskProlog reads `run` in its profile branch and `pct` in its placement branch.
    assert "run" in _file_keys(PROFILE) and "run" not in _file_keys(PLACE)
    assert "pct" in _file_keys(PLACE) and "pct" not in _file_keys(PROFILE)
    text = TASK_PROLOG.read_text()
    profile_branch = text[text.index('if [[ "$kind" == profile ]]'):text.index("pct=$(val pct)")]
    assert "$(val run)" in profile_branch


@pytest.mark.parametrize("script", [PROLOG, EPILOG], ids=lambda p: p.name)
def test_the_node_scripts_call_the_plan_tool_as_it_parses_its_arguments(script: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("{}"))  # the prolog command reads squeue's JSON
    calls = _tool_commands(script)
    assert calls, f"{script.name} does not call the plan tool"
    for args in calls:
        # Shell words stand for one argument each; the tool's usage message (exit 2) means it did not parse them.
        code = plans.main(["/nonexistent" if a.startswith('"') or a.startswith("$") else a for a in args])
        assert code != 2 or "usage:" not in capsys.readouterr().err, args


def test_what_users_may_not_write_into_a_comment_is_the_plans_marker() -> None:
    lua = JOB_SUBMIT.read_text()
    assert f'string.find(comment, "{MARKER}", 1, true)' in lua
    assert f"Comment={MARKER}" in TASK_PROLOG.read_text()
    assert plans.PREFIX.startswith(MARKER)
    assert plans.is_plan_text(f"please {MARKER}1 gpu=0") and not plans.is_plan_text("muxflow plan 1")


def test_a_plan_round_trips_through_its_comment_and_its_plan_file() -> None:
    key = plans.new_key()
    for plan in (PLACE, PROFILE):
        comment = plans.encode(plan, key)
        assert comment.startswith(plans.PREFIX)
        assert plans.decode(comment, key, plan.slurm_job_id) == plan
        lines = dict(line.split("=", 1) for line in plan.file_text("n1").splitlines())
        assert lines["kind"] == plan.kind and lines["gpu"] == str(plan.gpu_index) and lines["node"] == "n1"
    assert plans.placed_plan(type("J", (), {"comment": plans.encode(PLACE, key), "job_id": 4711})(), key) == PLACE
    assert plans.placed_plan(type("J", (), {"comment": plans.encode(PROFILE, key), "job_id": 4712})(), key) is None
