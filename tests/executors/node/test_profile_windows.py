"""The node agent measures profiling windows (executors.node.profile_windows); a job's iteration report is user
input read by root, and is attacked here as a malicious job would."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sqlalchemy import select

from executors.job.runtime.profiling import REPORT_FORMAT
from executors.node.profile_windows import (
    MAX_REPORT_BYTES,
    ProfileWindows,
    ReportRefused,
    WindowJob,
    parse_iteration_report,
    read_iteration_report,
)
from executors.store import models as m
from executors.store.db import Store
from executors.store.migrate import upgrade

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent runs as root; files of other owners need root")
USER = 65534  # the job's user (nobody)
SID = 4711
GOOD = {"format": REPORT_FORMAT, "final": False, "iterations": 20, "warmup_iterations": 2, "total_iterations": 22,
        "mean_s": 0.05, "p50_s": 0.05, "p95_s": 0.06, "window_start_unix": 1000.0, "window_end_unix": 1001.0,
        "elapsed_s": 1.2, "observed": True}


def _job_dir(root: Path, owner: int = USER) -> Path:
    """The layout the Prolog makes: a root-owned job-state directory, the job's own directory inside it."""
    top = root / "jobs"
    top.mkdir(mode=0o755)
    d = top / str(SID)
    d.mkdir(mode=0o700)
    os.chown(d, owner, owner)
    return top


def _write(path: Path, data: bytes | str, owner: int = USER) -> Path:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    os.chown(path, owner, owner)
    return path


def test_a_good_report_is_read(tmp_path: Path) -> None:
    top = _job_dir(tmp_path)
    assert read_iteration_report(top, SID, USER) is None  # none yet
    _write(top / str(SID) / "iteration.json", json.dumps(GOOD))
    got = read_iteration_report(top, SID, USER)
    assert got["iterations"] == 20 and got["mean_s"] == 0.05 and got["observed"] is True


@pytest.mark.parametrize("attack, why", [
    ("symlink", "iteration.json"),          # a link to a file root can read (/etc/shadow)
    ("fifo", "not a regular file"),         # a FIFO: opening must not hang the agent
    ("root_owned", "not the job user's"),  # a file the user did not write
    ("huge", r"bytes \(at most"),
    ("dir_is_link", "the job's directory"),  # the job's directory replaced by a link
    ("dir_other_owner", "not its user's"),
])
def test_what_a_job_can_put_in_its_directory_is_refused(tmp_path: Path, attack: str, why: str) -> None:
    top = _job_dir(tmp_path)
    d = top / str(SID)
    report = d / "iteration.json"
    secret = tmp_path / "secret"
    secret.write_text(json.dumps(GOOD))
    if attack == "symlink":
        report.symlink_to(secret)
    elif attack == "fifo":
        os.mkfifo(report)
        os.chown(report, USER, USER)
    elif attack == "root_owned":
        _write(report, json.dumps(GOOD), owner=0)
    elif attack == "huge":
        _write(report, b" " * (MAX_REPORT_BYTES + 1))
    elif attack == "dir_is_link":
        os.rmdir(d)
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        os.chown(elsewhere, USER, USER)
        _write(elsewhere / "iteration.json", json.dumps(GOOD))
        d.symlink_to(elsewhere)
    elif attack == "dir_other_owner":
        os.chown(d, 0, 0)
        _write(report, json.dumps(GOOD))
    with pytest.raises(ReportRefused, match=why):
        read_iteration_report(top, SID, USER)


def test_a_job_state_directory_others_can_write_is_not_trusted(tmp_path: Path) -> None:
    top = _job_dir(tmp_path)
    os.chmod(top, 0o777)
    with pytest.raises(ReportRefused, match="not the agent's alone"):
        read_iteration_report(top, SID, USER)
    with pytest.raises(ReportRefused, match="unknown"):
        read_iteration_report(top, SID, None)


@pytest.mark.parametrize("change", [
    {"format": "something else"}, {"iterations": -1}, {"mean_s": "fast"}, {"iterations": 2.5}, {"final": "yes"},
    {"window_start_unix": 5.0, "window_end_unix": 1.0}, {"mean_s": 1e300},
])
def test_malformed_reports_are_refused(change: dict) -> None:
    with pytest.raises(ReportRefused):
        parse_iteration_report(json.dumps({**GOOD, **change}).encode())
    with pytest.raises(ReportRefused):
        parse_iteration_report(b'{"format": "muxflow-iteration-report/1", "mean_s": NaN}')
    with pytest.raises(ReportRefused):
        parse_iteration_report(b"[" * 100_000)


def _store(tmp_path: Path) -> tuple[Store, int, int]:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    store = Store(url)
    with store.session() as s:
        s.add(m.GpuType(name="t4", sm_count=40, memory_bytes=16 << 30, max_sm_clock_mhz=1590))
        job = m.OfflineJob(name="j", job_type="", command="", mem_bytes=1 << 30, allowed_gpu_types=["t4"],
                           checkpoint_dir="", total_steps=1, state="PROFILING", slurm_job_id=SID)
        s.add(job)
        s.flush()
        run = m.ProfilingRun(job_id=job.id, gpu_type="t4", state="submitted", run_dir="", slurm_job_id=SID,
                             bound_s=600.0)
        s.add(run)
        s.flush()
        return store, job.id, run.id


def test_a_window_is_measured_into_its_runs_row_until_it_ends(tmp_path: Path) -> None:
    store, job_id, run_id = _store(tmp_path)
    top = _job_dir(tmp_path)
    t = [1000.5]
    windows = [WindowJob(SID, run_id, job_id, 1, USER, 1000.0)]
    agent = ProfileWindows(store, "n1", lambda: list(windows), top, {1: "t4"}, simulated=True, interval_s=0.01,
                           report_s=0.0, wall=lambda: t[0])
    agent.once()
    with store.session() as s:
        run = s.get(m.ProfilingRun, run_id)
        assert run.state == "running" and (run.node, run.gpu_index) == ("n1", 1)
        assert run.report["iteration_report"] is None and run.report["final"] is False
    _write(top / str(SID) / "iteration.json", json.dumps(GOOD))
    import time

    time.sleep(0.1)  # a few simulated samples
    t[0] = 1002.0
    agent.once()
    with store.session() as s:
        rep = s.get(m.ProfilingRun, run_id).report
    assert rep["iteration_report"]["iterations"] == 20 and rep["metrics_source"] == "simulated"
    assert rep["metrics"]["samples"] > 0 and rep["gpu_type"] == "t4" and rep["metrics_generic"] is True
    windows.clear()  # the window ended (requeued, or the job finished)
    agent.once()
    with store.session() as s:
        assert s.get(m.ProfilingRun, run_id).report["final"] is True


def test_a_window_naming_another_jobs_run_is_not_measured(tmp_path: Path) -> None:
    store, job_id, run_id = _store(tmp_path)
    top = _job_dir(tmp_path)
    agent = ProfileWindows(store, "n1", lambda: [WindowJob(SID + 1, run_id, job_id, 0, USER)], top, {0: "t4"},
                           simulated=True, report_s=0.0)
    agent.once()
    with store.session() as s:
        assert s.get(m.ProfilingRun, run_id).report is None
        assert s.scalars(select(m.ProfilingRun)).one().state == "submitted"


def test_the_progress_signal_is_one_muxflow_knows() -> None:
    assert parse_iteration_report(json.dumps({**GOOD, "signal": "optimizer-step"}).encode())["signal"] == \
        "optimizer-step"
    with pytest.raises(ReportRefused, match="signal is not one of"):
        parse_iteration_report(json.dumps({**GOOD, "signal": "'; DROP TABLE job_profiles; --"}).encode())


def _signals(root: Path, pid: int, caught: set[int] = frozenset(), ignored: set[int] = frozenset()) -> None:
    """The kernel's SigCgt/SigIgn lines of a fake process (bit n-1 = signal n)."""
    mask = lambda sigs: sum(1 << (n - 1) for n in sigs)  # noqa: E731
    with (root / str(pid) / "status").open("a") as f:
        f.write(f"SigIgn:\t{mask(ignored):016x}\nSigCgt:\t{mask(caught):016x}\n")


@pytest.fixture()
def job_tree(tmp_path: Path) -> Path:
    """Job 501 on a node: root slurmstepd → the user's batch shell (bash: catches SIGINT, SIGCHLD) → python."""
    from tests.executors.node.test_xcuda_check import UPTIME_S, fake_proc, stepd

    root = tmp_path / "proc"
    root.mkdir()
    (root / "uptime").write_text(f"{UPTIME_S:.2f} 1234.00\n")
    fake_proc(root, 1, 0, "systemd", uid=0)
    stepd(root, 200, 501)
    _signals(root, 200, caught={10, 15})  # slurmstepd's own handlers are Slurm's, not the job's
    fake_proc(root, 201, 200, "bash", job=501)
    fake_proc(root, 202, 201, "python", job=501)
    fake_proc(root, 300, 1, "python", job=777)  # another job's process catching everything
    _signals(root, 300, caught={10, 15})
    return root


def test_a_job_catching_no_checkpoint_signal_is_seen_as_such(job_tree: Path) -> None:
    from executors.node.profile_windows import job_checkpoint_signals
    from executors.node.xcuda_check import read_procs

    _signals(job_tree, 201, caught={2, 17})
    _signals(job_tree, 202, caught={2})  # Python's own SIGINT handler
    assert job_checkpoint_signals(501, read_procs(job_tree), job_tree) == (set(), True)


@pytest.mark.parametrize(("shell", "program", "expected"), [
    ({"caught": {2, 17}}, {"caught": {2, 10}}, ({"SIGUSR1"}, True)),           # the shell dies of SIGUSR1 first
    ({"caught": {2, 17}, "ignored": {10}}, {"caught": {10, 15}}, ({"SIGUSR1", "SIGTERM"}, True)),  # ... of SIGTERM
    ({"caught": {2, 17}, "ignored": {10, 15}}, {"caught": {10, 15}}, ({"SIGUSR1", "SIGTERM"}, False)),  # trap ''
    ({"caught": {2, 10, 15, 17}}, {"caught": {15}}, ({"SIGUSR1", "SIGTERM"}, False)),  # trap 'kill -USR1 $pid' ...
])
def test_checkpoint_signals_and_whether_the_batch_shell_outlives_them(job_tree: Path, shell: dict, program: dict,
                                                                         expected: tuple) -> None:
    from executors.node.profile_windows import job_checkpoint_signals
    from executors.node.xcuda_check import read_procs

    _signals(job_tree, 201, **shell)
    _signals(job_tree, 202, **program)
    assert job_checkpoint_signals(501, read_procs(job_tree), job_tree) == expected


def test_the_cpu_time_of_the_jobs_own_processes_is_counted_once(job_tree: Path) -> None:
    """Only the user's processes of the job (not slurmstepd, not another job's); a process read twice counts
    what it used in between; a new one all it used so far."""
    from executors.node.profile_windows import job_cpu_delta, job_user_pids
    from executors.node.xcuda_check import read_procs
    from tests.executors.node.test_xcuda_check import HZ, fake_proc

    def set_ticks(pid: int, ticks: int) -> None:
        stat = job_tree / str(pid) / "stat"
        head, _, rest = stat.read_text().rpartition(")")
        f = rest.split()
        f[11] = str(ticks)
        stat.write_text(head + ") " + " ".join(f) + "\n")

    set_ticks(200, 50 * HZ)  # slurmstepd's own CPU is not the job's
    set_ticks(300, 70 * HZ)  # another job's
    set_ticks(201, 1 * HZ)
    set_ticks(202, 10 * HZ)
    seen: dict[int, float] = {}
    procs = read_procs(job_tree)
    pids = job_user_pids(501, procs, job_tree)
    assert pids == {201, 202}
    assert job_cpu_delta(seen, {p: procs[p] for p in pids}) == pytest.approx(11.0)
    set_ticks(202, 14 * HZ)
    fake_proc(job_tree, 203, 202, "python", job=501, cpu_ticks=2 * HZ)
    procs = read_procs(job_tree)
    assert job_cpu_delta(seen, {p: procs[p] for p in job_user_pids(501, procs, job_tree)}) == pytest.approx(6.0)
    procs = read_procs(job_tree)
    assert job_cpu_delta(seen, {p: procs[p] for p in job_user_pids(501, procs, job_tree)}) == 0.0
