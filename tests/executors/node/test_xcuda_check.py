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
from executors.node.xcuda_check import XcudaCheck, XcudaWatch, job_of_processes, loads_xcuda, read_procs
from executors.store import models as m
from tests.executors.node.test_node_store import CALM, _running, _wait

HZ = os.sysconf("SC_CLK_TCK")
UPTIME_S = 10_000.0
LIB = "/opt/muxflow/executors/node/xcuda/build/libxcuda.so"


USER_UID = 1001  # the jobs' user in the fake trees (root's processes say uid=0)


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
        lines += [f"7f75b5d00000-7f75b5d03000 r-xp 00003000 fe:00 3 {lib}" for lib in libs]
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


def placed(*jobs: tuple[int, int, int]) -> StaticPlacements:
    """(GPU index, store job id, Slurm job id) → the placements' view."""
    view: dict[int, list[OfflineOnGpu]] = {}
    for gpu, job, sid in jobs:
        view.setdefault(gpu, []).append(OfflineOnGpu(job, sid, 40, 2 << 30, None))
    return StaticPlacements({g: tuple(v) for g, v in view.items()})


def test_processes_are_the_jobs_by_environment_or_ancestry(proc: Path) -> None:
    procs = read_procs(proc)
    assert procs[202].comm == "python (train) x" and procs[202].ppid == 201
    assert procs[400].age_s == pytest.approx(1.0, abs=0.05) and procs[401].state == "Z"
    jobs = job_of_processes(procs, {501, 502, 503}, proc)
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
    jobs = placed((0, 23, 514), (1, 24, 515), (2, 25, 516), (3, 26, 517))                              # slurmd's
    got = {v.slurm_job_id: v.pid for v in XcudaCheck(jobs, [0, 1, 2, 3], proc_root=proc).violations()}
    assert got == {514: 801, 515: 802, 516: 803, 517: 804}


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
    jobs = placed((0, 30, 520), (1, 31, 521))
    check = XcudaCheck(jobs, [0, 1], proc_root=proc)
    assert job_of_processes(read_procs(proc), {520, 521}, proc) == {901: 520, 921: 521, 922: 521, 930: 520}
    assert {v.slurm_job_id: v.pid for v in check.violations()} == {521: 922}


def test_on_real_gpus_no_task_prolog_is_exempt_on_a_gpu(proc: Path) -> None:
    """Slurm's TaskProlog never uses a GPU: on real GPUs (only processes with a GPU context are judged) a process
    on a GPU is judged even under a genuine TaskProlog (whose environment, PATH and BASH_ENV are the job's)."""
    tp = genuine_task_prolog(proc, 820, 518, age_s=10.0)
    fake_proc(proc, 823, tp, "sleep", job=518)  # the user's "sleep" on its PATH
    jobs = placed((0, 27, 518))
    assert XcudaCheck(jobs, [0], proc_root=proc, task_prolog=TASK_PROLOG).violations() == []  # simulated: exempt
    [v] = XcudaCheck(jobs, [0], gpu_pids=lambda: {823}, proc_root=proc, task_prolog=TASK_PROLOG).violations()
    assert v.pid == 823


def test_on_real_gpus_only_the_processes_on_a_gpu_count(proc: Path) -> None:
    jobs = placed((0, 11, 501), (1, 12, 502))
    assert XcudaCheck(jobs, [0, 1], gpu_pids=lambda: {301}, proc_root=proc).violations() == []
    [v] = XcudaCheck(jobs, [0, 1], gpu_pids=lambda: {202, 301}, proc_root=proc).violations()
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
        jobs = placed((0, 1, 990001), (1, 2, 990002))
        check = XcudaCheck(jobs, [0, 1], grace_s=0.0)
        _wait("both processes to map their libraries",
              lambda: loads_xcuda(good.pid, Path("/proc")) and loads_xcuda(bad.pid, Path("/proc")) is False)
        [v] = check.violations()
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
