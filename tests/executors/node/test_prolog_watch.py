"""The node agent runs the Prolog slurmd skipped, for a TaskProlog waiting for its plan (fake /proc)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from executors.node.prolog_watch import PROLOG_PATH, PrologWatch, SlurmJobFacts
from tests.executors.node.test_xcuda_check import TASK_PROLOG, UPTIME_S, USER_UID, fake_proc, genuine_task_prolog, stepd

NODE = "mx-t4-1"


def task_prolog(root: Path, pid: int, job: int, node: str = NODE, partition: str = "offline",
                age_s: float = 3.0) -> int:
    """Slurm's TaskProlog (Slurm marks it and its children SLURM_SCRIPT_CONTEXT=prolog_task) and its sleep, under the
    job's slurmstepd as on the dev cluster: root slurmstepd (pid - 2) → the user's slurmstepd (pid - 1) → the
    TaskProlog (pid) → sleep (pid + 1). Returns the TaskProlog's pid."""
    env = {"SLURM_SCRIPT_CONTEXT": "prolog_task", "SLURMD_NODENAME": node, "SLURM_JOB_PARTITION": partition}
    tp = genuine_task_prolog(root, pid - 2, job, env=env, age_s=age_s)
    fake_proc(root, pid + 1, pid, "sleep", job=job, env=env, age_s=0.1)
    return tp


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
    fake_proc(root, 1, 0, "systemd", uid=0)
    return root, plans


def watch(dirs, run, slurm_job=None) -> PrologWatch:
    root, plans = dirs
    return PrologWatch("/etc/slurm/muxflow/prolog.sh", plans, NODE, proc_root=root, env={"PATH": "/usr/bin"},
                       task_prolog=TASK_PROLOG, slurm_job=slurm_job, run=run)


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
    assert env["PATH"] == PROLOG_PATH and env["MUXFLOW_PROLOG_BY"] == "node-agent"
    assert (env["SLURM_JOB_UID"], env["SLURM_JOB_GID"]) == (str(USER_UID), str(USER_UID))  # the kernel's, below
    assert w.once() == [] and len(prolog.calls) == 1  # the plan is there now


def test_nothing_runs_when_the_plan_is_there_or_no_task_prolog_waits(dirs) -> None:
    root, plans = dirs
    (plans / "8.plan").write_text("gpu=0\npct=30\n")
    task_prolog(root, 200, 8)  # the Prolog ran: plan present
    fake_proc(root, 210, 1, "python", job=9)  # a finished job's process while its Epilog removed the plan
    fake_proc(root, 220, 1, "prolog.sh", job=9, env={"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}, uid=0)  # slurmd's
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
    for pid in (298, 299, 300, 301):
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


def test_the_job_is_given_the_kernels_uid_not_the_owner_of_its_proc_directory(dirs) -> None:
    """Attack: a process that calls prctl(PR_SET_DUMPABLE, 0) has its /proc/<pid> owned by root; the Prolog was told
    the job's uid from that owner. It is the kernel's real, effective, saved and filesystem uid now (status), and
    a process whose four uids disagree is nobody's TaskProlog."""
    root, plans = dirs
    tp = task_prolog(root, 100, 7)
    assert (root / str(tp)).stat().st_uid != USER_UID  # the fake directory is the test runner's, as root's would be
    prolog = FakeProlog(plans)
    watch(dirs, prolog).once()
    assert [(c["SLURM_JOB_ID"], c["SLURM_JOB_UID"]) for c in prolog.calls] == [("7", str(USER_UID))]
    fake_proc(root, 200, 199, "task_prolog.sh", job=8, env={"SLURMD_NODENAME": NODE, "SLURM_JOB_PARTITION": "offline"},
              uid=(USER_UID, 0, USER_UID, USER_UID), cmdline=("/bin/bash", TASK_PROLOG), age_s=3.0)
    stepd(root, 198, 8)
    stepd(root, 199, 8, uid=USER_UID, ppid=198)
    assert watch(dirs, prolog).once() == [] and len(prolog.calls) == 1


def test_attack_a_process_named_like_the_task_prolog_cannot_have_the_prolog_run_for_another_job(dirs) -> None:
    """Attack: a user's process named task_prolog.sh, with SLURM_JOB_ID of another user's job in its own
    environment, had root run the Prolog for that job with the attacker's uid (MPS caps on the attacker's server,
    a plan file for a job that does not run here). Only Slurm's TaskProlog of the job counts: under the job's
    slurmstepd (a root one, and the job user's fork of it), running the configured TaskProlog script, with that job
    id."""
    root, plans = dirs
    env = {"SLURMD_NODENAME": NODE, "SLURM_JOB_PARTITION": "offline"}
    # the attacker's own job 20: its batch shell (a child of the root slurmstepd, as the dev cluster shows it)
    stepd(root, 400, 20)
    fake_proc(root, 401, 400, "slurm_script", job=20, env=env)
    # 1. exec'd a file named task_prolog.sh (or prctl PR_SET_NAME), claiming job 7, under its own shell
    fake_proc(root, 410, 401, "task_prolog.sh", job=7, env=env, cmdline=("/bin/bash", TASK_PROLOG))
    # 2. the same, a child of init (double fork)
    fake_proc(root, 420, 1, "task_prolog.sh", job=7, env=env, cmdline=("/bin/bash", TASK_PROLOG))
    # 3. a process that calls itself slurmstepd with job 7's title, without the root slurmstepd of job 7 above it
    fake_proc(root, 430, 401, "slurmstepd", job=None, cmdline=("slurmstepd: [7.batch]",))
    fake_proc(root, 431, 430, "task_prolog.sh", job=7, env=env, cmdline=("/bin/bash", TASK_PROLOG))
    # 4. under its own job's genuine steps, running the real script, but saying it is job 7's
    genuine_task_prolog(root, 440, 20, env={**env, "SLURM_JOB_ID": "7"})
    # 5. under its own job's genuine steps, saying it is its own job's, but running another script
    genuine_task_prolog(root, 450, 21, env=env, script="/home/mxuser1/task_prolog.sh")
    # 6. job 7's root slurmstepd is there (another user's job runs here): the attacker's process is not under it
    stepd(root, 460, 7)
    prolog = FakeProlog(plans)
    assert watch(dirs, prolog).once() == [] and prolog.calls == []


def test_slurms_word_on_the_job_is_checked_when_the_agent_can_ask(dirs) -> None:
    """With Slurm's record of the job (its user, partition, nodes), a TaskProlog whose uid is not the job user's,
    or a job not running on this node in the offline partition, gets no Prolog; the partition given to the Prolog is
    Slurm's. Slurm unreachable: the process tree's word stands."""
    import pwd

    root, plans = dirs
    for pid, job in ((100, 7), (200, 8), (300, 9), (400, 10), (500, 11)):
        task_prolog(root, pid, job)
    user = pwd.getpwuid(USER_UID).pw_name if USER_UID in {p.pw_uid for p in pwd.getpwall()} else None
    facts = {7: SlurmJobFacts("root", "offline", (NODE,), "RUNNING"),                    # another user's job
             8: SlurmJobFacts(user or "root", "offline", ("mx-a10-1",), "RUNNING"),      # not on this node
             9: SlurmJobFacts(user or "root", "online", (NODE,), "RUNNING"),             # not an offline job
             10: SlurmJobFacts(user or "root", "offline,profile", (NODE,), "RUNNING")}   # the job user's, here

    def slurm_job(sid: int):
        if sid == 11:
            raise ConnectionError("slurmrestd away")
        return facts[sid]

    prolog = FakeProlog(plans)
    runs = watch(dirs, prolog, slurm_job).once()
    want = [10, 11] if user else [11]  # without a local user of uid 1001, job 10's "root" is not the TaskProlog's
    assert [r.slurm_job_id for r in runs] == want
    assert [c["SLURM_JOB_PARTITION"] for c in prolog.calls] == (["offline,profile", "offline"] if user else ["offline"])


def test_attack_the_prolog_the_agent_runs_gets_none_of_the_agents_secrets(dirs, tmp_path: Path) -> None:
    """What the Prolog starts (the MPS control daemon, whose servers run as the jobs' users) once inherited the whole
    agent environment: the store's URL with its password, Slurm's token."""
    root, plans = dirs
    task_prolog(root, 100, 7)
    seen = tmp_path / "prolog-env"
    prolog = tmp_path / "prolog.sh"
    prolog.write_text(f"#!/bin/sh\nenv > {seen}\n")
    prolog.chmod(0o755)
    agent_env = {"PATH": "/home/mxuser1/bin:/usr/bin", "MUXFLOW_DATABASE_URL": "postgresql://muxflow:pw@db/muxflow",
                 "SLURM_JWT": "eyJsecret", "MUXFLOW_SLURM_JWT_FILE": "/etc/muxflow/jwt", "LD_PRELOAD": "/tmp/x.so",
                 "SLURM_CONF": "/etc/slurm/slurm.conf", "MUXFLOW_MPS_PIPE_ROOT": "/run/muxflow/mps",
                 "MUXFLOW_NODE_LOG_DIR": "/var/log/muxflow", "MUXFLOW_OFFLINE_PARTITION": "offline"}
    w = PrologWatch(prolog, plans, NODE, proc_root=root, env=agent_env, task_prolog=TASK_PROLOG)
    [run] = w.once()
    assert run.ok, run.detail
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    env.pop("PWD", None), env.pop("SHLVL", None), env.pop("_", None)  # the shell's own
    assert env == {"PATH": PROLOG_PATH, "SLURM_CONF": "/etc/slurm/slurm.conf", "MUXFLOW_MPS_PIPE_ROOT": "/run/muxflow/mps",
                   "MUXFLOW_NODE_LOG_DIR": "/var/log/muxflow", "MUXFLOW_OFFLINE_PARTITION": "offline",
                   "SLURM_JOB_ID": "7", "SLURMD_NODENAME": NODE, "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
                   "MUXFLOW_PROLOG_BY": "node-agent", "SLURM_JOB_PARTITION": "offline",
                   "SLURM_JOB_UID": str(USER_UID), "SLURM_UID": str(USER_UID), "SLURM_JOB_GID": str(USER_UID),
                   **({"SLURM_JOB_USER": env["SLURM_JOB_USER"]} if "SLURM_JOB_USER" in env else {})}
