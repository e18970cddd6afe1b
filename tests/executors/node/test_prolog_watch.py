"""The node agent runs the Prolog slurmd skipped, for a TaskProlog waiting for its plan (fake /proc)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from executors.node.prolog_watch import PrologWatch
from tests.executors.node.test_xcuda_check import UPTIME_S, fake_proc

NODE = "mx-t4-1"


def task_prolog(root: Path, pid: int, job: int, node: str = NODE, partition: str = "offline",
                age_s: float = 3.0) -> None:
    """A TaskProlog (Slurm marks it and its children SLURM_SCRIPT_CONTEXT=prolog_task) and its sleep."""
    env = {"SLURM_SCRIPT_CONTEXT": "prolog_task", "SLURMD_NODENAME": node, "SLURM_JOB_PARTITION": partition}
    fake_proc(root, pid, 1, "task_prolog.sh", job=job, env=env, age_s=age_s)
    fake_proc(root, pid + 1, pid, "sleep", job=job, env=env, age_s=0.1)


class FakeProlog:
    """Records each run; writes the plan file unless told not to (a job that is not a MuxFlow placement)."""

    def __init__(self, plan_dir: Path, writes: bool = True, rc: int = 0):
        self.plan_dir, self.writes, self.rc = plan_dir, writes, rc
        self.calls: list[dict[str, str]] = []

    def __call__(self, argv, env, **_kw) -> subprocess.CompletedProcess:
        self.calls.append(env)
        if self.writes:
            (self.plan_dir / f"{env['SLURM_JOB_ID']}.plan").write_text("gpu=1\npct=40\n")
        return subprocess.CompletedProcess(argv, self.rc, "", "" if self.rc == 0 else "boom")


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    root, plans = tmp_path / "proc", tmp_path / "plans"
    root.mkdir()
    plans.mkdir()
    (root / "uptime").write_text(f"{UPTIME_S:.2f} 1234.00\n")
    fake_proc(root, 1, 0, "systemd")
    return root, plans


def watch(dirs, run) -> PrologWatch:
    root, plans = dirs
    return PrologWatch("/etc/slurm/prolog.sh", plans, NODE, proc_root=root, env={"PATH": "/usr/bin"}, run=run)


def test_a_waiting_task_prolog_gets_the_prolog_run_once_with_slurmds_environment(dirs) -> None:
    root, plans = dirs
    task_prolog(root, 100, 7)
    prolog = FakeProlog(plans)
    w = watch(dirs, prolog)
    runs = w.once()
    assert [(r.slurm_job_id, r.task_prolog_pid, r.ok) for r in runs] == [(7, 100, True)]  # not its sleep child
    assert "plan file written" in runs[0].detail
    env = prolog.calls[0]
    assert (env["SLURM_JOB_ID"], env["SLURMD_NODENAME"], env["SLURM_JOB_PARTITION"]) == ("7", NODE, "offline")
    assert env["PATH"] == "/usr/bin" and env["MUXFLOW_PROLOG_BY"] == "node-agent"
    assert env["SLURM_JOB_UID"] == str((root / "100").stat().st_uid)  # the TaskProlog's owner, not its environment
    assert w.once() == [] and len(prolog.calls) == 1  # the plan is there now


def test_nothing_runs_when_the_plan_is_there_or_no_task_prolog_waits(dirs) -> None:
    root, plans = dirs
    (plans / "8.plan").write_text("gpu=0\npct=30\n")
    task_prolog(root, 200, 8)  # the Prolog ran: plan present
    fake_proc(root, 210, 1, "python", job=9)  # a finished job's process while its Epilog removed the plan
    fake_proc(root, 220, 1, "prolog.sh", job=9, env={"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"})  # slurmd's Prolog
    task_prolog(root, 230, 10, node="mx-a10-1")  # another node's
    task_prolog(root, 240, 14, partition="online")  # not an offline job: it waits for nothing
    task_prolog(root, 250, 15, age_s=0.2)  # an offline job's TaskProlog a moment old: not waiting yet
    prolog = FakeProlog(plans)
    assert watch(dirs, prolog).once() == [] and prolog.calls == []


def test_a_prolog_that_writes_no_plan_runs_once_per_task_prolog(dirs) -> None:
    root, plans = dirs
    task_prolog(root, 300, 11)
    prolog = FakeProlog(plans, writes=False)
    w = watch(dirs, prolog)
    assert [r.detail for r in w.once()] == ["exit 0; plan file not written"]
    assert w.once() == []  # the same TaskProlog still waits: not retried
    # that TaskProlog gave up and ended; the job's next task (a new TaskProlog) gets another try
    for pid in (300, 301):
        for f in (root / str(pid)).iterdir():
            f.unlink()
        (root / str(pid)).rmdir()
    assert w.once() == []
    task_prolog(root, 310, 11)
    assert [r.task_prolog_pid for r in w.once()] == [310] and len(prolog.calls) == 2


def test_a_failing_prolog_is_reported_not_raised(dirs) -> None:
    root, plans = dirs
    task_prolog(root, 400, 12)
    (run,) = watch(dirs, FakeProlog(plans, writes=False, rc=3)).once()
    assert not run.ok and run.detail.startswith("exit 3: boom")
