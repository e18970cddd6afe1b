"""The TaskProlog as slurmd runs it: what a task of a placed job, and of a job in its profiling window, gets."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from executors.dev.slurm.cluster import install_node_scripts
from executors.dev.slurm.layout import DevClusterLayout

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the plan files must be root's, as the Prolog writes them")
JOB = 4711


@pytest.fixture()
def layout(tmp_path: Path) -> DevClusterLayout:
    layout = DevClusterLayout(state_dir=tmp_path, controller_host="h")
    layout.etc_dir.mkdir()
    install_node_scripts(layout, os.getuid())
    layout.plan_dir.mkdir(parents=True)
    (layout.job_state_dir / str(JOB)).mkdir(parents=True)
    return layout


def _task_prolog(layout: DevClusterLayout, plan: str, **env: str) -> dict[str, str]:
    (layout.plan_dir / f"{JOB}.plan").write_text(plan)
    out = subprocess.run([str(layout.node_script_dir / "task_prolog.sh")], capture_output=True, text=True, check=True,
                         env={"SLURM_JOB_ID": str(JOB), "SLURM_JOB_PARTITION": "offline", "SLURMD_NODENAME": "n1",
                              **env})
    exports = {}
    for line in out.stdout.splitlines():
        assert line.startswith("export "), line
        key, _, value = line.removeprefix("export ").partition("=")
        exports[key] = value
    return exports


def test_a_job_in_its_profiling_window_gets_the_iteration_hook_first_on_its_python_path(
        layout: DevClusterLayout) -> None:
    got = _task_prolog(layout, "kind=profile\ngpu=2\nrun=9\n", SLURM_JOB_PARTITION="profile",
                       PYTHONPATH="/home/u/lib:/opt/x")
    assert got["PYTHONPATH"] == f"{layout.hook_dir}:/home/u/lib:/opt/x"
    assert got["MUXFLOW_ITERATION_REPORT"] == f"{layout.job_state_dir}/{JOB}/iteration.json"
    assert (got["CUDA_VISIBLE_DEVICES"], got["MUXFLOW_PROFILING_RUN"]) == ("2", "9")
    assert "LD_PRELOAD" not in got  # measured alone: no xCUDA in the window
    assert _task_prolog(layout, "kind=profile\ngpu=2\nrun=9\n")["PYTHONPATH"] == str(layout.hook_dir)


def test_a_python_path_with_a_newline_stays_one_export(layout: DevClusterLayout) -> None:
    got = _task_prolog(layout, "kind=profile\ngpu=0\nrun=1\n", PYTHONPATH="/a\nexport LD_PRELOAD=/tmp/evil.so")
    assert got["PYTHONPATH"] == f"{layout.hook_dir}:/aexport LD_PRELOAD=/tmp/evil.so"
    assert "LD_PRELOAD" not in got


def test_a_placed_job_gets_its_share_and_xcuda_not_the_hook(layout: DevClusterLayout) -> None:
    got = _task_prolog(layout, "kind=place\ngpu=1\npct=40\nmem=1073741824\n", PYTHONPATH="/home/u/lib")
    assert (got["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], got["XCUDA_MEM_QUOTA_BYTES"]) == ("40", "1073741824")
    assert got["LD_PRELOAD"].endswith("libxcuda.so") and "PYTHONPATH" not in got
    # xCUDA publishes its counters in the job's own directory, for the node agent's metrics
    assert got["XCUDA_STATS_DIR"] == f"{layout.job_state_dir}/{JOB}"


def test_no_counters_directory_that_is_not_the_jobs_own(layout: DevClusterLayout) -> None:
    job_dir = layout.job_state_dir / str(JOB)
    os.chown(job_dir, 65534, 65534)  # another user's (the script runs as root here: the job user is root)
    got = _task_prolog(layout, "kind=place\ngpu=1\npct=40\nmem=1073741824\n")
    assert "XCUDA_STATS_DIR" not in got and got["LD_PRELOAD"].endswith("libxcuda.so")
    os.chown(job_dir, 0, 0)
    job_dir.rmdir()
    job_dir.symlink_to("/tmp")
    assert "XCUDA_STATS_DIR" not in _task_prolog(layout, "kind=place\ngpu=1\npct=40\nmem=1073741824\n")


def test_a_plan_file_anyone_could_have_written_configures_nothing(layout: DevClusterLayout) -> None:
    (layout.plan_dir / f"{JOB}.plan").write_text("kind=profile\ngpu=0\nrun=1\n")
    os.chown(layout.plan_dir / f"{JOB}.plan", 65534, 65534)
    out = subprocess.run([str(layout.node_script_dir / "task_prolog.sh")], capture_output=True, text=True, check=True,
                         env={"SLURM_JOB_ID": str(JOB), "SLURM_JOB_PARTITION": "profile"})
    assert out.stdout == ""
