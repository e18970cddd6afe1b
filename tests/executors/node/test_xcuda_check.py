"""The node agent sees an offline job whose processes run without xCUDA, and evicts that job alone.

Against hand-made /proc trees (every case: a child with a cleared environment, a process too young to
judge, a zombie, unreadable maps, a job not placed here, NVML's GPU processes), against real processes
of this machine (one preloading the real libxcuda.so, one not), and through the agent's wiring into the
store: the eviction row carries the reason and the job is EVICTED, the well-behaved job is not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from executors.node.agent import AgentConfig
from executors.node.placements import OfflineOnGpu, StaticPlacements
from executors.node.sampler import SimulatedSampler
from executors.node.wiring import SourceConfig, build_agent, node_gpus
from executors.node import xcuda_check
from executors.node.xcuda_check import XcudaCheck, XcudaWatch, job_of_processes, loads_xcuda, read_procs
from executors.store import models as m
from tests.executors.node.test_node_store import CALM, _running, _wait

HZ = os.sysconf("SC_CLK_TCK")
UPTIME_S = 10_000.0
LIB = "/opt/muxflow/executors/node/xcuda/build/libxcuda.so"  # the installed library: made per test (below)


USER_UID = 1001  # the jobs' user in the fake trees (root's processes say uid=0)
USERS = {"mxuser1": USER_UID, "mxuser2": 1002, "svc": 1500, "runner": os.getuid()}  # this node's users (pwd, as the agent looks them up)


@pytest.fixture(autouse=True)
def installed_lib(tmp_path_factory, monkeypatch) -> Path:
    """The installed libxcuda.so of these tests (a file: the check knows it by device and inode), and the node's
    users."""
    lib = tmp_path_factory.mktemp("installed") / "libxcuda.so"
    lib.write_bytes(b"\x7fELF installed")
    monkeypatch.setattr(sys.modules[__name__], "LIB", str(lib))
    monkeypatch.setattr(xcuda_check, "DEFAULT_XCUDA_LIB", str(lib))
    monkeypatch.setattr(xcuda_check, "pw_uid", USERS.get)
    return lib


def dev_ino(path: str) -> str:
    """The maps columns "major:minor inode" of a file, as the kernel writes them (fe:00 3 for a file not here)."""
    try:
        st = os.stat(path)
    except OSError:
        return "fe:00 3"
    return f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} {st.st_ino}"


def fake_proc(root: Path, pid: int, ppid: int, comm: str, *, job: int | None = None, libs: tuple[str, ...] = (),
              age_s: float = 60.0, state: str = "S", maps: bool = True, env: dict[str, str] | None = None,
              uid: int | tuple[int, int, int, int] = USER_UID, gid: int | None = None,
              cmdline: tuple[str, ...] | None = None, cpu_ticks: int = 0) -> None:
    """A /proc/<pid> as the kernel shows it: stat (ppid, CPU time in utime, start time, comm), status (real,
    effective, saved and filesystem uid and gid), cmdline (NUL-separated; the process's own to rewrite, as comm
    is), environ, maps."""
    d = root / str(pid)
    d.mkdir(parents=True)
    start = int((UPTIME_S - age_s) * HZ)
    rest = [state, str(ppid)] + ["0"] * 9 + [str(cpu_ticks)] + ["0"] * 7 + [str(start), "0", "0"]
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")
    uids = (uid,) * 4 if isinstance(uid, int) else uid
    gids = (uids[0] if gid is None else gid,) * 4
    (d / "status").write_text(f"Name:\t{comm[:15]}\nUmask:\t0022\nState:\t{state}\nPPid:\t{ppid}\n"
                              f"Uid:\t{chr(9).join(map(str, uids))}\nGid:\t{chr(9).join(map(str, gids))}\n")
    (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in (cmdline if cmdline is not None else (comm,))))
    env = {"PATH": "/usr/bin", **({"SLURM_JOB_ID": str(job)} if job is not None else {}), **(env or {})}
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")
    if maps:
        lines = ["55d0c0a00000-55d0c0a20000 r-xp 00000000 fe:00 1 /usr/bin/python3.11",
                 "7f75b5c0c000-7f75b5c0f000 r--p 00000000 fe:00 2 /usr/lib/x86_64-linux-gnu/libc.so.6",
                 "7ffd1e1f0000-7ffd1e211000 rw-p 00000000 00:00 0 [stack]"]
        lines += [f"7f75b5d00000-7f75b5d03000 r-xp 00003000 {dev_ino(lib)} {lib}" for lib in libs]
        (d / "maps").write_text("\n".join(lines) + "\n")


@pytest.fixture()
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "uptime").write_text(f"{UPTIME_S:.2f} 1234.00\n")
    fake_proc(root, 1, 0, "systemd", uid=0)
    fake_proc(root, 50, 1, "slurmd", uid=0, cmdline=("slurmd", "-D"))  # runs the Prolog and the Epilog
    fake_proc(root, 200, 1, "slurmstepd", uid=0, cmdline=("slurmstepd: [501.batch]",))  # no SLURM_JOB_ID
    fake_proc(root, 201, 200, "sh", job=501, libs=(LIB,))          # job 501's batch shell, preloaded
    fake_proc(root, 202, 201, "python (train) x", libs=())         # `env -i python …`: no env, no xCUDA
    fake_proc(root, 300, 1, "sh", job=502, libs=(LIB,))            # job 502: well behaved
    fake_proc(root, 301, 300, "python", job=502, libs=(LIB,))
    fake_proc(root, 400, 1, "train.sh", job=503, age_s=1.0)        # job 503: its first process, a moment old
    fake_proc(root, 401, 1, "python", job=503, state="Z", maps=False)  # a zombie
    fake_proc(root, 500, 1, "sleep", job=999)                      # a job not placed on this node
    fake_proc(root, 600, 1, "secret", job=504, maps=False)          # maps unreadable
    return root


TASK_PROLOG = "/etc/slurm/muxflow/task_prolog.sh"  # slurm.conf's TaskProlog= in these trees


def stepd(root: Path, pid: int, job: int, *, step: str = "batch", uid: int = 0, ppid: int = 1,
          age_s: float = 60.0) -> None:
    """A slurmstepd as Slurm 22.05 shows it: comm ``slurmstepd``, cmdline ``slurmstepd: [<job>.<step>]``, no job
    environment. The step's own is root's (a child of init: it daemonizes); it forks one per task, which takes the
    job user's identity and runs the TaskProlog before it execs the task."""
    fake_proc(root, pid, ppid, "slurmstepd", uid=uid, cmdline=(f"slurmstepd: [{job}.{step}]", "", ""), age_s=age_s)


def genuine_task_prolog(root: Path, pid: int, job: int, *, env: dict[str, str] | None = None, age_s: float = 3.0,
                        step: str = "batch", uid: int = USER_UID, script: str = TASK_PROLOG) -> int:
    """The tree the dev cluster shows (docs/NODE_AGENT.md "What the agent trusts"): root slurmstepd [job.step] (pid)
    → the job user's slurmstepd [job.step] (pid + 1) → ``/bin/bash <TaskProlog>`` (pid + 2, returned)."""
    stepd(root, pid, job, step=step, age_s=age_s + 0.1)
    stepd(root, pid + 1, job, step=step, uid=uid, ppid=pid, age_s=age_s + 0.05)  # forked just before the TaskProlog
    env = {"SLURM_SCRIPT_CONTEXT": "prolog_task", **(env or {})}
    fake_proc(root, pid + 2, pid + 1, "task_prolog.sh", job=job, env=env, age_s=age_s, uid=uid,
              cmdline=("/bin/bash", script))
    return pid + 2


def placed(*jobs: tuple) -> StaticPlacements:
    """(GPU index, store job id, Slurm job id[, user]) → the placements' view (the user: mxuser1 unless told)."""
    view: dict[int, list[OfflineOnGpu]] = {}
    for gpu, job, sid, *user in jobs:
        view.setdefault(gpu, []).append(OfflineOnGpu(job, sid, 40, 2 << 30, None, None, *(user or ["mxuser1"])))
    return StaticPlacements({g: tuple(v) for g, v in view.items()})


def test_processes_are_the_jobs_by_environment_or_ancestry(proc: Path) -> None:
    procs = read_procs(proc)
    assert procs[202].comm == "python (train) x" and procs[202].ppid == 201
    assert procs[400].age_s == pytest.approx(1.0, abs=0.05) and procs[401].state == "Z"
    jobs = job_of_processes(procs, {501, 502, 503}, proc, {502: USER_UID, 503: USER_UID})
    assert jobs == {201: 501, 202: 501, 300: 502, 301: 502, 400: 503, 401: 503}
    assert loads_xcuda(201, proc) is True and loads_xcuda(202, proc) is False and loads_xcuda(600, proc) is None


def test_only_the_job_with_a_process_without_xcuda_is_a_violation(proc: Path) -> None:
    check = XcudaCheck(placed((0, 11, 501), (1, 12, 502), (2, 13, 503), (3, 14, 504)), [0, 1, 2, 3],
                       proc_root=proc, grace_s=5.0)
    [v] = check.violations()
    assert (v.gpu_index, v.job_id, v.slurm_job_id, v.pid) == (0, 11, 501, 202)
    assert v.reason == ("xCUDA not loaded: process 202 (python (train) x) of Slurm job 501 runs without libxcuda.so "
                        "(LD_PRELOAD removed)")
    # Once the young process is old enough, it is judged like any other.
    assert {x.slurm_job_id for x in XcudaCheck(placed((2, 13, 503)), [2], proc_root=proc,
                                              grace_s=0.5).violations()} == {503}


def test_slurms_own_hooks_for_the_job_are_not_judged_however_long_they_take(proc: Path) -> None:
    """The Prolog (and its squeue/python3 children) and the Epilog run as root, children of slurmd, with the job's
    SLURM_JOB_ID, marked SLURM_SCRIPT_CONTEXT by slurmd; the TaskProlog (Slurm's: under the job's slurmstepd, running
    the configured script, for a minute at most) may wait for its plan. A loaded node can make them slow; none is
    the job's code."""
    fake_proc(proc, 700, 50, "prolog.sh", job=505, env={"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}, uid=0,
              cmdline=("/bin/bash", "/etc/slurm/muxflow/prolog.sh"))
    fake_proc(proc, 701, 700, "python3", job=505, env={"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}, uid=0)
    tp = genuine_task_prolog(proc, 708, 506, age_s=25.0)
    fake_proc(proc, 711, tp, "sleep", job=506, env={"SLURM_SCRIPT_CONTEXT": "prolog_task"})
    fake_proc(proc, 720, 50, "epilog.sh", job=507, env={"SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}, uid=0)
    # the Prolog the node agent itself runs for a job slurmd skipped (executors.node.prolog_watch): its child
    fake_proc(proc, 90, 1, "muxflow", uid=0)
    fake_proc(proc, 730, 90, "prolog.sh", job=509, env={"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}, uid=0)
    jobs = placed((0, 15, 505), (1, 16, 506), (2, 17, 507), (3, 19, 509))
    check = XcudaCheck(jobs, [0, 1, 2, 3], proc_root=proc, grace_s=5.0, task_prolog=TASK_PROLOG, agent_pid=90)
    assert check.violations() == []
    # The job's own code carries SLURM_SCRIPT_CONTEXT=prolog_task too (Slurm 22.05 leaks it into the tasks): judged.
    fake_proc(proc, 740, 708, "python", job=506, env={"SLURM_SCRIPT_CONTEXT": "prolog_task"})
    assert [v.pid for v in check.violations()] == [740]


def test_a_process_named_like_the_task_prolog_is_exempt_for_a_minute_only(proc: Path) -> None:
    tp = genuine_task_prolog(proc, 750, 508, age_s=120.0)
    [v] = XcudaCheck(placed((0, 18, 508)), [0], proc_root=proc, grace_s=5.0, task_prolog=TASK_PROLOG).violations()
    assert v.slurm_job_id == 508 and v.pid in (tp - 1, tp)  # the task's slurmstepd fork, or the TaskProlog


def test_attack_a_process_merely_named_like_the_task_prolog_is_judged(proc: Path) -> None:
    """Attack: GPU work in processes that exec a file named task_prolog.sh (or set that name with prctl), each
    living under a minute, escaped the check forever. Only Slurm's TaskProlog is exempt: a process under the
    job's slurmstepd that runs the configured TaskProlog script."""
    fake_proc(proc, 760, 201, "task_prolog.sh", job=501, age_s=20.0, libs=())   # a child of the job's shell
    fake_proc(proc, 761, 1, "task_prolog.sh", job=502, age_s=20.0, cmdline=("/bin/bash", TASK_PROLOG))  # init's
    # a direct child of the job's step, under the step's name and title, but running the user's own script
    stepd(proc, 770, 510)
    fake_proc(proc, 771, 770, "task_prolog.sh", job=510, age_s=20.0, cmdline=("/bin/bash", "/home/u/task_prolog.sh"))
    # the real script's name under a user process that calls itself slurmstepd, with no root slurmstepd above it
    fake_proc(proc, 780, 1, "slurmstepd", job=None, cmdline=("slurmstepd: [511.batch]",))
    fake_proc(proc, 781, 780, "task_prolog.sh", job=511, age_s=20.0, cmdline=("/bin/bash", TASK_PROLOG))
    # a genuine TaskProlog tree of job 512 whose process says it is job 513's: job 512's, and no TaskProlog
    genuine_task_prolog(proc, 790, 512, env={"SLURM_JOB_ID": "513"}, age_s=20.0)
    jobs = placed((0, 11, 501), (1, 12, 502), (2, 20, 510), (3, 21, 511), (4, 22, 512), (5, 23, 513))
    check = XcudaCheck(jobs, [0, 1, 2, 3, 4, 5], proc_root=proc, grace_s=5.0, task_prolog=TASK_PROLOG)
    got = {v.slurm_job_id: v.pid for v in check.violations()}
    assert got == {501: 202, 502: 761, 510: 771, 511: 781, 512: 792}  # 501: its other process comes first


def test_attack_a_forged_slurm_script_context_is_judged(proc: Path) -> None:
    """Attack: a job sets SLURM_SCRIPT_CONTEXT=prolog_slurmd (or epilog_slurmd) in its own environment. The Prolog
    and the Epilog run as root, children of slurmd: a process of the job's user is never one of them."""
    fake_proc(proc, 800, 1, "sh", job=514, libs=(LIB,))
    fake_proc(proc, 801, 800, "python", job=514, env={"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"})
    fake_proc(proc, 802, 1, "python", job=515, env={"SLURM_SCRIPT_CONTEXT": "epilog_slurmd"})
    fake_proc(proc, 803, 50, "python", job=516, env={"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"})  # slurmd's, not root
    fake_proc(proc, 804, 1, "python", job=517, env={"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}, uid=0)  # root's, not
    fake_proc(proc, 805, 1, "python", job=517, env={"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"})          # slurmd's
    jobs = placed((0, 23, 514), (1, 24, 515), (2, 25, 516), (3, 26, 517))
    got = {v.slurm_job_id: v.pid for v in XcudaCheck(jobs, [0, 1, 2, 3], proc_root=proc).violations()}
    # 804, root's, is no process of job 517 (mxuser1's) whatever its environment says: not judged, no hook either
    assert got == {514: 801, 515: 802, 516: 803, 517: 805}


def test_attack_a_process_claiming_another_users_job_neither_frames_it_nor_escapes(proc: Path) -> None:
    """Attack: SLURM_JOB_ID is the process's own to set. A user's process without xCUDA that claims another user's
    running job got that job evicted (and, inside the user's own job, escaped the check of his own). A job's
    processes are those under its root slurmstepd (the tree proctrack/linuxproc follows); a process outside every
    job's tree is the job of its SLURM_JOB_ID only if it runs as that job's user."""
    stepd(proc, 900, 520)                                                   # the victim's job 520 (uid 1002)
    fake_proc(proc, 901, 900, "python", job=520, uid=1002, libs=(LIB,))     # well behaved
    fake_proc(proc, 910, 1, "python", job=520)                              # the attacker's, outside any job
    stepd(proc, 920, 521)                                                   # the attacker's own job 521
    fake_proc(proc, 921, 920, "sh", job=521, libs=(LIB,))
    fake_proc(proc, 922, 921, "python", job=520)                            # his GPU work, "job 520's"
    fake_proc(proc, 930, 1, "python", job=520, uid=1002, libs=(LIB,))      # the victim's own daemon: still 520's
    jobs = placed((0, 30, 520, "mxuser2"), (1, 31, 521))
    check = XcudaCheck(jobs, [0, 1], proc_root=proc)
    mine = {901: 520, 921: 521, 922: 521, 930: 520}
    assert job_of_processes(read_procs(proc), {520, 521}, proc, {520: 1002, 521: USER_UID}) == mine  # Slurm's users
    assert job_of_processes(read_procs(proc), {520, 521}, proc) == mine  # the users of the jobs' trees
    assert {v.slurm_job_id: v.pid for v in check.violations()} == {521: 922}


def test_on_real_gpus_no_task_prolog_is_exempt_on_a_gpu(proc: Path) -> None:
    """Slurm's TaskProlog never uses a GPU: on real GPUs (only processes with a GPU context are judged) a process
    on a GPU is judged even under a genuine TaskProlog (whose environment, PATH and BASH_ENV are the job's)."""
    tp = genuine_task_prolog(proc, 820, 518, age_s=10.0)
    fake_proc(proc, 823, tp, "sleep", job=518)  # the user's "sleep" on its PATH
    jobs = placed((0, 27, 518))
    assert XcudaCheck(jobs, [0], proc_root=proc, task_prolog=TASK_PROLOG).violations() == []  # simulated: exempt
    [v] = XcudaCheck(jobs, [0], gpu_pids=lambda: {0: {823}}, proc_root=proc, task_prolog=TASK_PROLOG).violations()
    assert v.pid == 823


def test_on_real_gpus_only_the_processes_on_a_gpu_count(proc: Path) -> None:
    jobs = placed((0, 11, 501), (1, 12, 502))
    assert XcudaCheck(jobs, [0, 1], gpu_pids=lambda: {1: {301}}, proc_root=proc).violations() == []
    [v] = XcudaCheck(jobs, [0, 1], gpu_pids=lambda: {0: {202}, 1: {301}}, proc_root=proc).violations()
    assert v.pid == 202


def test_the_watch_evicts_a_job_once_until_it_is_placed_again(proc: Path) -> None:
    jobs = placed((0, 11, 501), (1, 12, 502))
    evicted = []
    watch = XcudaWatch(XcudaCheck(jobs, [0, 1], proc_root=proc), evicted.append)
    assert [v.slurm_job_id for v in watch.once()] == [501]
    assert watch.once() == []  # Slurm has not requeued it yet: still on the node, not evicted twice
    jobs.set(0, ())             # requeued: gone from the node
    assert watch.once() == []
    jobs.set(0, (OfflineOnGpu(11, 501, 40, 2 << 30, None),))  # placed again, and still without xCUDA
    assert [v.slurm_job_id for v in watch.once()] == [501]
    assert [v.job_id for v in evicted] == [11, 11]

    tried = []

    def failing(v) -> None:
        tried.append(v.slurm_job_id)
        raise RuntimeError("slurmctld away")

    retry = XcudaWatch(XcudaCheck(jobs, [0, 1], proc_root=proc), failing)
    assert retry.once() == [] and retry.once() == []
    assert tried == [501, 501]  # a failed eviction is tried again at the next check


@pytest.fixture(scope="module")
def xcuda_lib() -> Path:
    from executors.node.xcuda.build import BuildError, build, missing_tools

    if missing_tools():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: building xCUDA needs {missing_tools()}")
        pytest.skip(f"no C toolchain ({missing_tools()})")
    try:
        return build().library
    except BuildError as exc:
        pytest.fail(str(exc))


def test_real_processes_with_and_without_the_real_library(xcuda_lib: Path) -> None:
    """Two real processes of this machine: one preloads libxcuda.so as the TaskProlog makes it, one does not."""
    base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    good = subprocess.Popen(["sleep", "60"], env={**base, "SLURM_JOB_ID": "990001", "LD_PRELOAD": str(xcuda_lib)})
    bad = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                           env={**base, "SLURM_JOB_ID": "990002"})
    try:
        jobs = placed((0, 1, 990001, "runner"), (1, 2, 990002, "runner"))  # the jobs of this test's user
        check = XcudaCheck(jobs, [0, 1], grace_s=0.0, lib=xcuda_lib)
        _wait("both processes to map their libraries",
              lambda: loads_xcuda(good.pid, Path("/proc"), xcuda_lib)
              and loads_xcuda(bad.pid, Path("/proc"), xcuda_lib) is False)
        # (this machine's other processes with a CUDA_VISIBLE_DEVICES of 0 or 1 are on those simulated GPUs too)
        [v] = [v for v in check.violations() if v.pid in (good.pid, bad.pid)]
        assert (v.slurm_job_id, v.pid, v.job_id) == (990002, bad.pid, 2)
    finally:
        for p in (good, bad):
            p.kill()
            p.wait()


def test_the_agent_evicts_the_job_into_the_store_and_leaves_the_other(cluster_store, proc: Path) -> None:
    store = cluster_store
    pairs = node_gpus(store, "sim-t4-000")
    with store.session() as s:
        j1, j2 = [j.id for j in s.scalars(select(m.OfflineJob).order_by(m.OfflineJob.id)).all()[:2]]
        _running(s, j1, 501)
        _running(s, j2, 502)
    placements = placed((0, j1, 501), (1, j2, 502))
    requeued: list[int] = []
    sampler = SimulatedSampler(replay={g.gpu_index: [CALM] for g, _ in pairs})
    agent = build_agent(store, "sim-t4-000", simulated=True, cfg=AgentConfig(interval_s=1.0), shm_dir=None,
                        requeue=requeued.append, placements=placements, sampler=sampler,
                        sources=SourceConfig(placements="none", xcuda_check_s=0.05, proc_root=str(proc)))
    try:
        _wait("the xCUDA check to evict", lambda: requeued)

        def recorded():
            with store.session() as s:
                return s.scalars(select(m.Eviction)).all()

        [ev] = _wait("the eviction in the store", recorded)
    finally:
        agent.shutdown()
    assert requeued == [501]
    with store.session() as s:
        assert (ev.job_id, ev.gpu_id, ev.source) == (j1, pairs[0][0].id, "simulated")
        assert ev.reason.startswith("xCUDA not loaded: process 202 (python (train) x) of Slurm job 501")
        job1, job2 = s.get(m.OfflineJob, j1), s.get(m.OfflineJob, j2)
        assert job1.state == "EVICTED" and job1.state_reason.startswith("node agent: xCUDA not loaded")
        assert job2.state == "RUNNING"


# -- every process on a shared GPU ------------------------------------------------------------------------------

class Acts:
    """What an XcudaWatch did: the processes it killed and the jobs it evicted."""

    def __init__(self) -> None:
        self.killed: list[int] = []
        self.evicted: list[int | None] = []

    def watch(self, check: XcudaCheck, notices=None) -> XcudaWatch:
        return XcudaWatch(check, lambda v: self.evicted.append(v.slurm_job_id),
                          kill=lambda v: self.killed.append(v.pid) or True, notices=notices)


def test_attack_a_process_that_left_its_jobs_tree_is_killed_on_a_shared_gpu(proc: Path, tmp_path: Path) -> None:
    """Attack: ``setsid -f env -u SLURM_JOB_ID -u LD_PRELOAD ./train`` (or a double fork to init): the process
    belongs to no job, so no job's check saw it, and it ran unpaced next to the online replica. On a GPU an
    online replica or placed offline work uses, every compute process is the replica's or a placed job's (with
    xCUDA); anything else is killed, and its owner told why."""
    stepd(proc, 940, 530)
    fake_proc(proc, 941, 940, "sh", job=530, libs=(LIB,), env={"CUDA_VISIBLE_DEVICES": "0"})
    fake_proc(proc, 950, 1, "train", env={"CUDA_VISIBLE_DEVICES": "0"})        # setsid'd, env -u: no job
    fake_proc(proc, 951, 1, "train", env={"CUDA_VISIBLE_DEVICES": "0"}, libs=(LIB,))  # with xCUDA, still no job's
    fake_proc(proc, 960, 1, "train", env={"CUDA_VISIBLE_DEVICES": "3"})         # on a GPU nobody shares
    jobs = placed((0, 32, 530))
    notices = xcuda_check.Notices(tmp_path / "notices")
    acts = Acts()
    watch = acts.watch(XcudaCheck(jobs, [0, 3], proc_root=proc), notices)
    done = watch.once()
    assert sorted(acts.killed) == [950, 951] and acts.evicted == [] and watch.stopped == 2
    v = next(v for v in done if v.pid == 950)
    assert (v.kind, v.uid, v.slurm_job_id, v.gpu_index) == (xcuda_check.FOREIGN, USER_UID, None, 0)
    assert v.reason == ("not in the plan: process 950 (train), uid 1001, of no Slurm job, runs on GPU 0, which an "
                        "online replica or placed offline work uses (killed)")
    note = tmp_path / "notices" / str(USER_UID)
    assert v.reason in note.read_text() and note.stat().st_uid == (USER_UID if os.geteuid() == 0 else os.geteuid())
    assert note.stat().st_mode & 0o777 == 0o400
    # On real GPUs NVML lists it whatever its environment (env -i: no CUDA_VISIBLE_DEVICES either).
    fake_proc(proc, 970, 1, "train", env={})
    acts = Acts()
    acts.watch(XcudaCheck(jobs, [0, 3], gpu_pids=lambda: {0: {941, 970}, 3: {960}}, proc_root=proc)).once()
    assert acts.killed == [970] and acts.evicted == []


def test_attack_a_file_named_libxcuda_that_is_not_the_installed_library(proc: Path, tmp_path: Path) -> None:
    """Attack: the check took any mapped file whose name is ``libxcuda.so`` for xCUDA: the user's own copy with
    the pacing taken out, or an empty file of that name. Only the installed library counts: its device and inode,
    as the kernel's maps columns (or the mapped file itself) name them."""
    own = tmp_path / "home" / "libxcuda.so"
    own.parent.mkdir()
    own.write_bytes(b"\x7fELF no pacing")
    empty = tmp_path / "empty" / "libxcuda.so"
    empty.parent.mkdir()
    empty.write_bytes(b"")
    fake_proc(proc, 1000, 1, "python", job=535, libs=(str(own),))
    fake_proc(proc, 1001, 1, "python", job=536, libs=(str(empty),))
    fake_proc(proc, 1002, 1, "python", job=537, libs=(LIB,))
    # the installed library's name at a path of the user's, its columns another file's
    fake_proc(proc, 1004, 1, "python", job=538, maps=False)
    (proc / "1004" / "maps").write_text(f"7f0000000000-7f0000001000 r-xp 00000000 {dev_ino(str(own))} {LIB}\n")
    jobs = placed((0, 40, 535), (1, 41, 536), (2, 42, 537), (3, 43, 538))
    got = {v.slurm_job_id: v for v in XcudaCheck(jobs, [0, 1, 2, 3], proc_root=proc).violations()}
    assert sorted(got) == [535, 536, 538]
    assert got[535].kind == xcuda_check.OTHER_LIB and got[535].reason == (
        f"xCUDA not loaded: process 1000 (python) of Slurm job 535 maps a file named libxcuda.so that is not the "
        f"installed library ({LIB})")
    assert loads_xcuda(1002, proc) is True and loads_xcuda(1000, proc) is False and loads_xcuda(1004, proc) is False


def test_attack_a_foreign_process_claiming_a_job_before_its_processes_appear(proc: Path) -> None:
    """Attack: a process of mxuser1 carrying mxuser2's SLURM_JOB_ID, started before that job's own processes
    appear (the job's user then came from nowhere, and the claim stood): mxuser2's job was evicted. The job's
    user is Slurm's (the placements'): a process of another uid is no process of that job, and on a shared GPU it
    is judged as what it is, nobody's."""
    fake_proc(proc, 1010, 1, "python", job=545, env={"CUDA_VISIBLE_DEVICES": "0"})   # mxuser1's, "job 545"
    jobs = placed((0, 45, 545, "mxuser2"))
    acts = Acts()
    [v] = acts.watch(XcudaCheck(jobs, [0], proc_root=proc)).once()
    assert acts.evicted == [] and acts.killed == [1010]
    assert (v.kind, v.slurm_job_id, v.job_id, v.uid) == (xcuda_check.FOREIGN, None, None, USER_UID)
    # on real GPUs alike
    acts = Acts()
    acts.watch(XcudaCheck(jobs, [0], gpu_pids=lambda: {0: {1010}}, proc_root=proc)).once()
    assert acts.evicted == [] and acts.killed == [1010]


def test_the_replicas_mps_servers_and_roots_processes_are_not_judged_but_an_mps_clients_are(proc: Path) -> None:
    """Under MPS, NVML lists the MPS server on the GPU (and, Volta and later, each client): a server is exempt —
    a child of root's nvidia-cuda-mps-control, whatever its uid — and its clients are judged each. The online
    replica's processes run as its registered user; root's own processes are never killed."""
    fake_proc(proc, 1100, 1, "nvidia-cuda-mps-control", uid=0)
    fake_proc(proc, 1101, 1100, "nvidia-cuda-mps-server", uid=1500)   # the replica's user's server
    fake_proc(proc, 1102, 1100, "nvidia-cuda-mps-server", uid=USER_UID)
    fake_proc(proc, 1110, 1, "serve", uid=1500)                       # the replica
    fake_proc(proc, 1120, 1, "nvidia-cuda-mps-server")                # mxuser1's process, named like a server
    fake_proc(proc, 1130, 1, "dcgm", uid=0)                           # root's
    stepd(proc, 1140, 550)
    fake_proc(proc, 1141, 1140, "python", job=550, libs=(LIB,))       # a placed job's MPS client, with xCUDA
    fake_proc(proc, 1150, 1, "python", uid=1002)                      # mxuser2's, on the replica's GPU
    jobs = placed((0, 50, 550))
    acts = Acts()
    check = XcudaCheck(jobs, [0], gpu_pids=lambda: {0: {1101, 1102, 1110, 1120, 1130, 1141, 1150}}, proc_root=proc,
                       replicas={0: "svc"})
    acts.watch(check).once()
    assert sorted(acts.killed) == [1120, 1150] and acts.evicted == []


def test_a_replica_whose_user_is_not_known_here_leaves_its_gpu_unjudged_outside_the_jobs(proc: Path) -> None:
    fake_proc(proc, 1160, 1, "serve", uid=1500)
    stepd(proc, 1170, 551)
    fake_proc(proc, 1171, 1170, "python", job=551)                    # the placed job, without xCUDA: judged
    jobs = placed((0, 51, 551))
    acts = Acts()
    acts.watch(XcudaCheck(jobs, [0], gpu_pids=lambda: {0: {1160, 1171}}, proc_root=proc,
                          replicas={0: None})).once()
    assert acts.killed == [] and acts.evicted == [551]


def test_a_process_of_a_job_on_a_gpu_not_its_own_is_killed_and_its_job_evicted(proc: Path) -> None:
    stepd(proc, 1180, 552)
    fake_proc(proc, 1181, 1180, "python", job=552, libs=(LIB,), env={"CUDA_VISIBLE_DEVICES": "1"})
    stepd(proc, 1190, 553)                                            # a job no plan placed here
    fake_proc(proc, 1191, 1190, "python", job=553, uid=1002, env={"CUDA_VISIBLE_DEVICES": "1"})
    jobs = placed((0, 52, 552), (1, 54, 554))
    acts = Acts()
    done = {v.pid: v for v in acts.watch(XcudaCheck(jobs, [0, 1], proc_root=proc)).once()}
    assert sorted(acts.killed) == [1181, 1191] and sorted(acts.evicted) == [552, 553]
    assert (done[1181].job_id, done[1191].job_id) == (52, None)
    assert done[1191].reason == ("not in the plan: process 1191 (python), uid 1002, of Slurm job 553 runs on GPU 1, "
                                 "which no plan gives that job (killed)")


def test_reads_of_another_users_environment_cmdline_and_maps_are_bounded(proc: Path) -> None:
    """A process's environment and argv are its own to make large (2 MiB at exec, more later), its maps as long as
    it has mappings. A cut environment or argv is unknown (no job, no hook: never more trust); maps past the cut,
    the library not among those read, are not verified: a violation."""
    from executors.node.attribution import ENVIRON_MAX_BYTES, proc_cmdline, proc_env

    pad = "x" * (2 << 20)
    fake_proc(proc, 1200, 1, "python", env={"PAD": pad, "SLURM_JOB_ID": "560", "CUDA_VISIBLE_DEVICES": "0"})
    assert proc_env(1200, proc, "SLURM_JOB_ID") == {}
    fake_proc(proc, 1201, 1, "python", env={"SLURM_JOB_ID": "560", "PAD": "x" * (ENVIRON_MAX_BYTES - 100)})
    assert proc_env(1201, proc, "SLURM_JOB_ID") == {"SLURM_JOB_ID": "560"}
    fake_proc(proc, 1202, 1, "python", cmdline=("python", pad))
    assert proc_cmdline(1202, proc) is None
    # many maps, the library at the end (a preload lies high: the end of the file)
    fake_proc(proc, 1210, 1, "python", job=561, maps=False)
    lines = [f"{k:012x}-{k + 1:012x} r--p 00000000 fe:00 9 /home/u/f{k}" for k in range(1000)]
    st = os.stat(LIB)
    lines.append(f"7f0000000000-7f0000001000 r-xp 00000000 {dev_ino(LIB)} {LIB}")
    (proc / "1210" / "maps").write_text("\n".join(lines) + "\n")
    ident = (st.st_dev, st.st_ino)
    assert xcuda_check.xcuda_mapping(1210, proc, LIB, ident) == xcuda_check.INSTALLED
    assert xcuda_check.xcuda_mapping(1210, proc, LIB, ident, max_lines=500) == xcuda_check.TOO_MANY_MAPS
    assert xcuda_check.xcuda_mapping(1210, proc, LIB, ident, max_bytes=4096) == xcuda_check.TOO_MANY_MAPS


def test_kill_process_kills_the_process_judged_and_no_later_one_with_its_pid() -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        [p] = read_procs(Path("/proc"), only=(child.pid,)).values()
        assert xcuda_check.kill_process(child.pid, p.start_ticks + 1) is False  # another process's start
        assert child.poll() is None
        assert xcuda_check.kill_process(child.pid, p.start_ticks) is True
        assert child.wait() == -9
        assert xcuda_check.kill_process(child.pid, p.start_ticks, Path("/not/proc")) is False
    finally:
        child.kill()
        child.wait()


def test_notices_go_only_into_a_directory_of_the_agents_alone(tmp_path: Path) -> None:
    shared = tmp_path / "open"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    xcuda_check.Notices(shared).tell(USER_UID, "x")
    assert list(shared.iterdir()) == []
    good = tmp_path / "notices"
    n = xcuda_check.Notices(good)
    n.tell(USER_UID, "first\nforged line")
    assert (good / str(USER_UID)).read_text().count("\n") == 1 and "first\\nforged line" in (
        good / str(USER_UID)).read_text()


def test_the_agent_judges_the_simulated_gpus_processes_end_to_end(cluster_store, proc: Path) -> None:
    """Simulated mode through the agent's wiring: the simulated GPU's compute processes (the planned
    CUDA_VISIBLE_DEVICES, the jobs placed on it) drive the same check. A process of a Slurm job no plan puts on
    GPU 1 (a plain job of mxuser2 that picked the GPU) is stopped and its job requeue-held (the store has no row
    of a job MuxFlow did not place: its user reads the reason in their notices); the job placed there is left."""
    store = cluster_store
    pairs = node_gpus(store, "sim-t4-000")
    with store.session() as s:
        j2 = s.scalars(select(m.OfflineJob).order_by(m.OfflineJob.id)).all()[1].id
        _running(s, j2, 502)
        for inst in s.scalars(select(m.ServiceInstance).where(m.ServiceInstance.gpu_id == pairs[1][0].id)):
            inst.run_as_user = "svc"  # the replica's user, as registered: the only other user GPU 1 may have
    stepd(proc, 1300, 570)
    fake_proc(proc, 1301, 1300, "python", job=570, uid=1002,
              env={"CUDA_VISIBLE_DEVICES": "1", "SLURMD_NODENAME": "sim-t4-000"})
    # Another node's job on its own GPU 1 (several simulated nodes share one host), and a program outside Slurm
    # that sets CUDA_VISIBLE_DEVICES: on none of this node's GPUs.
    stepd(proc, 1310, 571)
    fake_proc(proc, 1311, 1310, "python", job=571, uid=1002,
              env={"CUDA_VISIBLE_DEVICES": "1", "SLURMD_NODENAME": "sim-t4-001"})
    fake_proc(proc, 1320, 1, "python", uid=1003, env={"CUDA_VISIBLE_DEVICES": "1"})
    placements = placed((1, j2, 502))
    requeued: list[int] = []
    sampler = SimulatedSampler(replay={g.gpu_index: [CALM] for g, _ in pairs})
    agent = build_agent(store, "sim-t4-000", simulated=True, cfg=AgentConfig(interval_s=1.0), shm_dir=None,
                        requeue=requeued.append, placements=placements, sampler=sampler,
                        sources=SourceConfig(placements="none", xcuda_check_s=0.05, proc_root=str(proc)))
    try:
        _wait("the xCUDA check to evict", lambda: requeued)
    finally:
        agent.shutdown()
    assert requeued == [570]
    with store.session() as s:
        assert s.scalars(select(m.Eviction)).all() == [] and s.get(m.OfflineJob, j2).state == "RUNNING"
