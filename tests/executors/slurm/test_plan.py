"""The plan schema (executors.slurm.plan): signed plans in a job's comment, as an attacker would try them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from executors.slurm import plan as plans
from executors.slurm.plan import KeyFileError, Plan, PlanError

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))
PLACE = Plan(slurm_job_id=4711, job_id=12, kind="place", gpu_index=2, sm_pct=35, mem_bytes=4 << 30, kp=1.0, ki=20.0,
             kd=0.0)
WINDOW = Plan(slurm_job_id=4711, job_id=12, kind="profile", gpu_index=1, run_id=3)
TOOL = Path(plans.__file__)
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to other owners")


@pytest.mark.parametrize("plan", [PLACE, WINDOW])
def test_a_plan_reads_back_as_written_for_its_own_job(plan: Plan) -> None:
    text = plans.encode(plan, KEY)
    assert text.startswith("muxflow-plan=1 ") and plans.is_plan_text(text)
    assert plans.decode(text, KEY, 4711) == plan


def test_a_plan_is_not_mine_without_my_key_or_with_any_field_changed() -> None:
    text = plans.encode(PLACE, KEY)
    with pytest.raises(PlanError, match="bad signature"):
        plans.decode(text, OTHER, 4711)
    for a, b in (("pct=35", "pct=100"), ("gpu=2", "gpu=0"), ("kind=place", "kind=profile"), ("job=12", "job=13")):
        with pytest.raises(PlanError):
            plans.decode(text.replace(a, b), KEY, 4711)


def test_a_plan_copied_from_another_job_is_refused() -> None:
    """A user sees another job's signed plan in squeue and submits his own job with it."""
    text = plans.encode(PLACE, KEY)
    with pytest.raises(PlanError, match="written for Slurm job 4711, not 4712"):
        plans.decode(text, KEY, 4712)
    forged = text.replace("slurm=4711", "slurm=4712")  # and changing the id breaks the signature
    with pytest.raises(PlanError, match="bad signature"):
        plans.decode(forged, KEY, 4712)


@pytest.mark.parametrize("text", [
    "",
    "muxflow: type=cnn mem=1GiB",                                      # a user's hints
    "muxflow-job=12 muxflow-gpu=2 muxflow-pct=100",                    # the old unsigned form
    "muxflow-plan=1 slurm=4711 job=12 kind=place gpu=2 pct=100",       # unsigned
    "muxflow-plan=2 slurm=4711 job=12 kind=place gpu=2 pct=100 sig=" + "0" * 64,
    "muxflow-plan=1 slurm=4711 job=12 kind=place gpu=2 pct=100 sig=" + "0" * 64,
    "muxflow-plan=1 slurm=4711 job=12 kind=place gpu=2;id pct=35 sig=" + "0" * 64,
    "muxflow-plan=1 slurm=4711 job=12 kind=place gpu=$(id) pct=35 sig=" + "0" * 64,
    "muxflow-plan=1 slurm=4711 job=12 kind=place gpu=2 gpu=3 pct=35 sig=" + "0" * 64,
    "muxflow-plan=1 slurm=4711 job=12 kind=place gpu=2 pct=35 node=evil sig=" + "0" * 64,
    "muxflow-plan=1 slurm=4711 job=12 kind=place gpu=2 pct=35\nnode=x sig=" + "0" * 64,
])
def test_what_a_user_can_write_is_no_plan(text: str) -> None:
    assert plans.try_decode(text, KEY, 4711) is None


def test_plan_fields_are_validated() -> None:
    with pytest.raises(PlanError):
        Plan(slurm_job_id=1, job_id=1, kind="place", gpu_index=0, sm_pct=0)
    with pytest.raises(PlanError):
        Plan(slurm_job_id=1, job_id=1, kind="evict", gpu_index=0)
    with pytest.raises(PlanError):
        Plan(slurm_job_id=1, job_id=1, kind="profile", gpu_index=0)  # a window names its run


def test_the_key_file_must_be_the_owners_alone(tmp_path: Path) -> None:
    path = tmp_path / "plan.key"
    plans.write_key(path, KEY)
    assert (path.stat().st_mode & 0o777) == 0o600 and plans.read_key(path) == KEY
    path.chmod(0o640)
    with pytest.raises(KeyFileError, match="mode 0640 lets others read or change it"):
        plans.read_key(path)
    path.chmod(0o600)
    link = tmp_path / "link.key"
    link.symlink_to(path)
    with pytest.raises(KeyFileError):
        plans.read_key(link)
    short = tmp_path / "short.key"
    plans.write_key(short, KEY[:8])
    with pytest.raises(KeyFileError, match="at least 32"):
        plans.read_key(short)
    with pytest.raises(KeyFileError, match="no such file"):
        plans.read_key(tmp_path / "missing.key")


@root_only
def test_a_key_file_of_another_user_is_refused(tmp_path: Path) -> None:
    """Root reads any file: a key another user owns (and so could have written) is still not taken."""
    path = tmp_path / "plan.key"
    plans.write_key(path, KEY, uid=65534)
    with pytest.raises(KeyFileError, match="owned by uid 65534"):
        plans.read_key(path)


def _squeue(*jobs: dict) -> str:
    return json.dumps({"jobs": list(jobs)})


def test_the_prologs_view_picks_the_job_and_its_partition() -> None:
    text = plans.encode(PLACE, KEY)
    listing = _squeue({"job_id": 99, "partition": "offline", "comment": "x"},
                      {"job_id": 4711, "partition": "offline", "comment": text})
    assert plans.prolog_plan(listing, KEY, 4711, {"offline", "profile"}) == PLACE
    with pytest.raises(PlanError, match="partition 'online'"):
        plans.prolog_plan(_squeue({"job_id": 4711, "partition": "online", "comment": text}), KEY, 4711, {"offline"})
    with pytest.raises(PlanError, match="not in squeue"):
        plans.prolog_plan(listing, KEY, 5, {"offline"})
    with pytest.raises(PlanError, match="unreadable"):
        plans.prolog_plan("not json", KEY, 4711, {"offline"})


def _plan_file(d: Path, name: str, text: str, uid: int = 0, mode: int = 0o644) -> Path:
    p = d / name
    p.write_text(text)
    os.chmod(p, mode)
    if uid != os.geteuid():
        os.chown(p, uid, -1)
    return p


@root_only
def test_caps_are_the_largest_of_the_root_written_plans_on_the_gpu(tmp_path: Path) -> None:
    _plan_file(tmp_path, "1.plan", PLACE.file_text("n1"))                                  # gpu 2, 35 %, 4 GiB
    _plan_file(tmp_path, "2.plan", Plan(2, 2, "place", 2, 60, 1 << 30).file_text("n1"))   # gpu 2, 60 %, 1 GiB
    _plan_file(tmp_path, "3.plan", Plan(3, 3, "place", 2, 90).file_text("n2"))            # another node
    _plan_file(tmp_path, "4.plan", Plan(4, 4, "place", 1, 90).file_text("n1"))            # another GPU
    assert plans.gpu_caps(tmp_path, "n1", 2) == (60, 4 << 30)
    assert plans.gpu_caps(tmp_path, "n1", 2, exclude=tmp_path / "2.plan") == (35, 4 << 30)
    assert plans.gpu_caps(tmp_path, "n1", 0) is None
    _plan_file(tmp_path, "5.plan", WINDOW.file_text("n1"))                                 # gpu 1: a window
    assert plans.gpu_caps(tmp_path, "n1", 1) == (100, None)


@root_only
def test_plan_files_anyone_else_could_have_written_are_ignored(tmp_path: Path) -> None:
    """An attacker's file in the plan directory (his own, group-writable, or a link) sets no caps."""
    _plan_file(tmp_path, "6.plan", Plan(6, 6, "place", 0, 100).file_text("n1"), uid=65534)
    _plan_file(tmp_path, "7.plan", Plan(7, 7, "place", 0, 100).file_text("n1"), mode=0o666)
    real = _plan_file(tmp_path / "..", "elsewhere.plan", Plan(8, 8, "place", 0, 100).file_text("n1"))
    (tmp_path / "8.plan").symlink_to(real)
    assert plans.gpu_caps(tmp_path, "n1", 0) is None
    assert plans.read_plan_file(tmp_path / "6.plan") is None


def test_the_node_scripts_tool(tmp_path: Path) -> None:
    key = tmp_path / "plan.key"
    plans.write_key(key, KEY)
    listing = _squeue({"job_id": 4711, "partition": "profile", "comment": plans.encode(WINDOW, KEY)})
    out = subprocess.run([sys.executable, str(TOOL), "prolog", str(key), "4711", "offline,profile", "n1"],
                         input=listing, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == WINDOW.file_text("n1") and out.stderr == ""
    forged = _squeue({"job_id": 4711, "partition": "offline", "comment": plans.encode(WINDOW, OTHER)})
    out = subprocess.run([sys.executable, str(TOOL), "prolog", str(key), "4711", "offline,profile", "n1"],
                         input=forged, capture_output=True, text=True)
    assert out.returncode == 1 and out.stdout == "" and "bad signature" in out.stderr
    out = subprocess.run([sys.executable, str(TOOL), "nonsense"], capture_output=True, text=True)
    assert out.returncode == 2 and "usage" in out.stderr


def test_the_plan_key_command_makes_a_private_key_and_never_replaces_one(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from pipelines.cli import main

    path = tmp_path / "plan.key"
    out = CliRunner().invoke(main, ["slurm", "plan-key", "--write", str(path)])
    assert out.exit_code == 0 and "a new plan key" in out.output
    key = plans.read_key(path)
    assert (path.stat().st_mode & 0o777) == 0o600 and len(key) == plans.KEY_BYTES
    again = CliRunner().invoke(main, ["slurm", "plan-key", "--write", str(path)])
    assert again.exit_code == 0 and "exists" in again.output and plans.read_key(path) == key
    path.chmod(0o644)
    bad = CliRunner().invoke(main, ["slurm", "plan-key", "--write", str(path)])
    assert bad.exit_code == 2 and "lets others read" in bad.output


def test_a_placement_never_carries_a_quota_near_zero() -> None:
    """A quota under the floor is no plan, written or read: MPS reads a 0M limit as none."""
    from executors.slurm.plan import MIN_MEM_BYTES

    for mem in (1, MIN_MEM_BYTES - 1):
        with pytest.raises(PlanError, match="mem must be at least"):
            Plan(slurm_job_id=4711, job_id=12, kind="place", gpu_index=2, sm_pct=35, mem_bytes=mem)
    assert Plan(slurm_job_id=4711, job_id=12, kind="place", gpu_index=2, sm_pct=35, mem_bytes=MIN_MEM_BYTES)
    import hashlib
    import hmac

    fields = {"slurm": "4711", "job": "12", "kind": "place", "gpu": "2", "pct": "35", "mem": "1"}
    sig = hmac.new(KEY, plans._canonical(fields), hashlib.sha256).hexdigest()  # as an older MuxFlow signed it
    signed = " ".join([plans.PREFIX, *(f"{k}={v}" for k, v in fields.items()), f"sig={sig}"])
    with pytest.raises(PlanError, match="mem must be at least"):
        plans.decode(signed, KEY, 4711)
