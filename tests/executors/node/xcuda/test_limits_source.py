"""Where xCUDA's limits come from: the root-owned plan file of the job whose step daemon (root's ``slurmstepd:
[<job>.<step>]``) the process descends from, never the job's environment, which may only make them stricter
(executors/node/xcuda/README.md "Configuration", docs/SECURITY.md "xCUDA's limits").

The attacker is the job's user: after the TaskProlog he exports whatever he likes, writes his own GPU record and
claims another job's id. These tests run the harness under the real library as he would, with a plan of the
test's in a directory of its own; the test library (XCUDA_TEST_HOOKS) counts this user as root for the plan
directory, the plan file, the step daemon and the record, the only difference from the installed library, which
the last tests run to show that it honours none of the test switches.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from executors.node.xcuda.build import Artifacts
from executors.node.xcuda.shm import GpuSample, encode

from .conftest import RecordFeeder, Run

MIB = 1 << 20
IDLE = GpuSample(u_sm=0.0, sm_clock_mhz=1590.0, clock_threshold_mhz=1290.0, clock_max_mhz=1590.0)
# What the job's user exports after the TaskProlog ran.
ATTACK = {"XCUDA_FALLBACK_LAUNCH_RATE": "1e9", "XCUDA_MIN_LAUNCH_RATE": "1e9", "XCUDA_MEM_QUOTA_BYTES": "none",
          "XCUDA_TARGET_UTIL": "2", "XCUDA_SHM_STALE_MS": "3600000", "XCUDA_GPU_INDEX": "7",
          "SLURM_JOB_ID": "4712", "XCUDA_TEST_ENV_CONFIG": "0"}
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")


def _plan(d: Path, job: int, **fields: object) -> Path:
    p = d / f"{job}.plan"
    p.write_text("".join(f"{k}={v}\n" for k, v in fields.items()))
    p.chmod(0o644)
    return p


@pytest.fixture
def plans(tmp_path: Path) -> Path:
    d = tmp_path / "plans"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    return d


@pytest.fixture
def job(xcuda: Artifacts, tmp_path: Path, plans: Path):
    """job(*harness_args, library=None, stepd="4711.0", **env) -> Run: the harness as a task of job 4711, a child
    of a process named slurmstepd whose title is ``slurmstepd: [4711.0]`` (stepd=None: outside any job)."""
    stepd = tmp_path / "slurmstepd"
    stepd.symlink_to("/bin/bash")  # comm is the name it was run by

    def run(*args: str, library: Path | None = None, stepd_title: str | None = "slurmstepd: [4711.0]",
            **extra: str) -> Run:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("XCUDA_", "SLURM_")) and k != "LD_PRELOAD"}
        env.update(LD_LIBRARY_PATH=str(xcuda.fake_dir), LD_PRELOAD=str(library or xcuda.test_library),
                   XCUDA_TEST_PLAN_DIR=str(plans), XCUDA_FAKE_TOTAL_MEM=str(10 * MIB), XCUDA_LOG_LEVEL="info")
        env.update(extra)
        if stepd_title is None:
            cmd, exe = [str(xcuda.harness), *args], None
        else:  # a list, so bash forks the harness and stays its parent
            cmd, exe = [stepd_title, "-c", '"$@"; exit $?', "task", str(xcuda.harness), *args], str(stepd)
        p = subprocess.run(cmd, executable=exe, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert p.returncode == 0, p.stderr
        return Run(p.returncode, p.stdout, p.stderr)

    return run


def _alloc_rc(run: Run) -> int:
    return int(run.fields("alloc")["rc"])


def _seconds(run: Run) -> float:
    return float(run.fields("launched")["seconds"])


def test_attack_the_environment_lifts_no_limit_of_the_plan(job, plans: Path, tmp_path: Path) -> None:
    agent = tmp_path / "agent-record"  # the plan's record: none there, so launches are paced at the fallback rate
    _plan(plans, 4711, kind="place", gpu=0, pct=30, mem=MIB, fallback=100, floor=10, shm=agent, uid=os.getuid())
    _plan(plans, 4712, kind="place", gpu=0, pct=100, mem=1 << 30, fallback=1000000000, uid=os.getuid())  # not his
    own = tmp_path / "own-record"  # his own record, claiming an idle GPU
    with RecordFeeder(own, IDLE):
        run = job("init", "alloc", "v2", str(2 * MIB), "launch", "200", XCUDA_SHM_PATH=str(own), **ATTACK)
    assert _alloc_rc(run) == 2, run.stdout  # CUDA_ERROR_OUT_OF_MEMORY: the plan's 1 MiB, not none (nor 4712's)
    # 200 launches at the plan's 100/s take about 2 s (a loaded machine only makes it longer); under the job's
    # 1e9/s, or its idle record opening the gate, a few milliseconds.
    assert _seconds(run) > 1.0, run.stdout
    assert "limits: plan" in run.stderr and "4711.plan" in run.stderr, run.stderr
    for name in ("XCUDA_FALLBACK_LAUNCH_RATE", "XCUDA_MEM_QUOTA_BYTES", "XCUDA_SHM_PATH", "XCUDA_TARGET_UTIL",
                 "XCUDA_GPU_INDEX"):
        assert f"{name}: " in run.stderr and "may only make xCUDA stricter" in run.stderr, (name, run.stderr)


def test_the_environment_may_tighten_the_plan(job, plans: Path, tmp_path: Path) -> None:
    _plan(plans, 4711, kind="place", gpu=0, pct=30, mem=8 * MIB, shm=tmp_path / "none", uid=os.getuid())
    assert _alloc_rc(job("init", "alloc", "v2", str(4 * MIB))) == 0
    tight = job("init", "alloc", "v2", str(4 * MIB), "launch", "200", XCUDA_MEM_QUOTA_BYTES="2MiB",
                XCUDA_FALLBACK_LAUNCH_RATE="100")
    assert _alloc_rc(tight) == 2 and _seconds(tight) > 1.0, tight.stdout
    assert "stricter" not in tight.stderr, tight.stderr


def test_attack_another_jobs_id_in_slurm_job_id_is_not_the_job(job, plans: Path, tmp_path: Path) -> None:
    # His job 4711 has no plan; 4712's (another's, looser) is not taken on his word: the built-in defaults.
    _plan(plans, 4712, kind="place", gpu=0, pct=100, mem=1 << 30, uid=os.getuid())
    run = job("init", "alloc", "v2", str(5 * MIB), SLURM_JOB_ID="4712")
    assert _alloc_rc(run) == 2, run.stdout  # 40 % of the 10 MiB device
    assert "job 4711: no plan file for the job: built-in defaults" in run.stderr, run.stderr


def test_outside_a_step_daemon_the_defaults_hold(job, plans: Path) -> None:
    _plan(plans, 4711, kind="place", gpu=0, pct=100, mem=1 << 30, uid=os.getuid())
    run = job("init", "alloc", "v2", str(5 * MIB), stepd_title=None, SLURM_JOB_ID="4711", **{
        "XCUDA_MEM_QUOTA_BYTES": "none"})
    assert _alloc_rc(run) == 2, run.stdout
    assert "not under a Slurm step daemon: built-in defaults" in run.stderr, run.stderr
    # A process of his own named like the step daemon, with a forged title: not root's (test build: not this
    # user's) is what the installed library checks; here the title alone must match a step's.
    forged = job("init", "alloc", "v2", str(5 * MIB), stepd_title="slurmstepd: [4711]")
    assert _alloc_rc(forged) == 2, forged.stdout


def test_a_plan_for_another_uid_is_none(job, plans: Path) -> None:
    _plan(plans, 4711, kind="place", gpu=0, pct=100, mem=1 << 30, uid=os.getuid() + 1)
    run = job("init", "alloc", "v2", str(5 * MIB))
    assert _alloc_rc(run) == 2 and "the plan is another user's" in run.stderr, run.stderr


def test_a_plan_others_could_write_is_none(job, plans: Path) -> None:
    _plan(plans, 4711, kind="place", gpu=0, pct=100, mem=1 << 30, uid=os.getuid()).chmod(0o666)
    run = job("init", "alloc", "v2", str(5 * MIB))
    assert _alloc_rc(run) == 2 and "not a regular file only root can write" in run.stderr, run.stderr
    plans.chmod(0o777)
    (plans / "4711.plan").chmod(0o644)
    run = job("init", "alloc", "v2", str(5 * MIB))
    assert _alloc_rc(run) == 2 and "not root's alone" in run.stderr, run.stderr


@as_root
def test_attack_a_record_the_job_wrote_at_the_plans_path_is_not_trusted(job, plans: Path, tmp_path: Path) -> None:
    # He got to the plan's record path first (a world-writable /dev/shm): his file, claiming an idle GPU.
    record = tmp_path / "record"
    _plan(plans, 4711, kind="place", gpu=0, pct=30, mem=MIB, fallback=100, stale=3600000, shm=record, uid=0)
    record.write_bytes(encode(IDLE, 0, time.monotonic_ns()))
    record.chmod(0o644)
    os.chown(record, 1001, 1001)
    run = job("init", "launch", "200")
    assert _seconds(run) > 1.0, run.stdout  # fallback pacing: the record was refused
    assert "untrusted" in run.stderr, run.stderr


def test_the_installed_library_honours_no_test_switch(job, xcuda: Artifacts, plans: Path, tmp_path: Path) -> None:
    """The production library: its plan directory is compiled in; XCUDA_TEST_PLAN_DIR and XCUDA_TEST_ENV_CONFIG
    are nothing to it, and without its plan the defaults hold against every looser variable."""
    _plan(plans, 4711, kind="place", gpu=0, pct=100, mem=1 << 30, uid=os.getuid())
    own = tmp_path / "own-record"
    with RecordFeeder(own, IDLE):
        run = job("init", "alloc", "v2", str(5 * MIB), "launch", "1000", library=xcuda.library,
                  XCUDA_SHM_PATH=str(own), **{**ATTACK, "XCUDA_TEST_ENV_CONFIG": "1"})
    assert _alloc_rc(run) == 2, run.stdout  # 40 % of 10 MiB, not none, not the test directory's 1 GiB
    # 1,000 launches at the default 2,000/s (two periods banked): at least 0.4 s; unpaced, a millisecond.
    assert _seconds(run) > 0.25, run.stdout
    assert "may only make xCUDA stricter" in run.stderr and "test build" not in run.stderr, run.stderr
