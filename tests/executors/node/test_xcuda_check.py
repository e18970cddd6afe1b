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
LIB = "/opt/muxflow/executors/xcuda/build/libxcuda.so"


def fake_proc(root: Path, pid: int, ppid: int, comm: str, *, job: int | None = None, libs: tuple[str, ...] = (),
              age_s: float = 60.0, state: str = "S", maps: bool = True, env: dict[str, str] | None = None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    start = int((UPTIME_S - age_s) * HZ)
    rest = [state, str(ppid)] + ["0"] * 17 + [str(start), "0", "0"]
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")
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
    fake_proc(root, 1, 0, "systemd")
    fake_proc(root, 200, 1, "slurmstepd: [501.batch]")            # no SLURM_JOB_ID: not the job's
    fake_proc(root, 201, 200, "sh", job=501, libs=(LIB,))          # job 501's batch shell, preloaded
    fake_proc(root, 202, 201, "python (train) x", libs=())         # `env -i python …`: no env, no xCUDA
    fake_proc(root, 300, 1, "sh", job=502, libs=(LIB,))            # job 502: well behaved
    fake_proc(root, 301, 300, "python", job=502, libs=(LIB,))
    fake_proc(root, 400, 1, "train.sh", job=503, age_s=1.0)        # job 503: its first process, a moment old
    fake_proc(root, 401, 1, "python", job=503, state="Z", maps=False)  # a zombie
    fake_proc(root, 500, 1, "sleep", job=999)                      # a job not placed on this node
    fake_proc(root, 600, 1, "secret", job=504, maps=False)          # maps unreadable
    return root


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
    """The Prolog (and its squeue/python3 children) and the Epilog run with the job's SLURM_JOB_ID, marked
    SLURM_SCRIPT_CONTEXT by slurmd; the TaskProlog (known by its name, for a minute at most) may wait for its
    plan. A loaded node can make them slow; none is the job's code."""
    fake_proc(proc, 700, 1, "prolog.sh", job=505, env={"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"})
    fake_proc(proc, 701, 700, "python3", job=505, env={"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"})
    fake_proc(proc, 710, 1, "task_prolog.sh", job=506, age_s=25.0, env={"SLURM_SCRIPT_CONTEXT": "prolog_task"})
    fake_proc(proc, 711, 710, "sleep", job=506, env={"SLURM_SCRIPT_CONTEXT": "prolog_task"})
    fake_proc(proc, 720, 1, "epilog.sh", job=507, env={"SLURM_SCRIPT_CONTEXT": "epilog_slurmd"})
    jobs = placed((0, 15, 505), (1, 16, 506), (2, 17, 507))
    assert XcudaCheck(jobs, [0, 1, 2], proc_root=proc, grace_s=5.0).violations() == []
    # The job's own code carries SLURM_SCRIPT_CONTEXT=prolog_task too (Slurm 22.05 leaks it into the tasks): judged.
    fake_proc(proc, 730, 1, "python", job=506, env={"SLURM_SCRIPT_CONTEXT": "prolog_task"})
    assert [v.pid for v in XcudaCheck(jobs, [0, 1, 2], proc_root=proc, grace_s=5.0).violations()] == [730]


def test_a_process_named_like_the_task_prolog_is_exempt_for_a_minute_only(proc: Path) -> None:
    fake_proc(proc, 740, 1, "task_prolog.sh", job=508, age_s=120.0)
    [v] = XcudaCheck(placed((0, 18, 508)), [0], proc_root=proc, grace_s=5.0).violations()
    assert v.pid == 740


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
    from executors.xcuda.build import BuildError, build, missing_tools

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
