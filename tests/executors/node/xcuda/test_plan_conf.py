"""The plan directory from the root ``xcuda.conf`` beside the library (src/plan.c xc_conf_plan_dir, src/init.c):
a site, or the dev cluster, whose plans are not in the compiled-in directory installs the library with a file of
root's beside it; a file the job's user could have written, or one in a directory of his (his own link to the
real library beside his own conf), counts for nothing and the compiled-in directory holds
(executors/node/xcuda/README.md "Configuration").

Run as root, these use the installed library, as a node does (the fake step daemon and the files are then
root's); run as another user, the test library, which counts that user as root.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from executors.node.xcuda.build import Artifacts

from .conftest import Run

MIB = 1 << 20
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")


@pytest.fixture
def site(xcuda: Artifacts, tmp_path: Path) -> Path:
    """An install directory: libxcuda.so (a link to the built library, as the dev cluster installs it) beside a
    conf naming a plan directory that holds job 4711's plan with an 8 MiB quota (the defaults give 4 MiB)."""
    plans = tmp_path / "plans"
    plans.mkdir()
    plans.chmod(0o755)
    plan = plans / "4711.plan"
    plan.write_text(f"kind=place\ngpu=0\nmem={8 * MIB}\nshm={tmp_path / 'no-record'}\nuid={os.getuid()}\n")
    plan.chmod(0o644)
    d = tmp_path / "site"
    d.mkdir()
    d.chmod(0o755)
    (d / "libxcuda.so").symlink_to(xcuda.library if os.geteuid() == 0 else xcuda.test_library)
    conf = d / "xcuda.conf"
    conf.write_text(f"# where the Prolog writes the plans\nplan_dir={plans}\n")
    conf.chmod(0o644)
    return d


def _run(xcuda: Artifacts, tmp_path: Path, library: Path) -> Run:
    """Allocates 5 MiB of a 10 MiB device as a task of job 4711 (a child of a process named slurmstepd titled
    ``slurmstepd: [4711.0]``), the library preloaded by the path given."""
    stepd = tmp_path / "slurmstepd"
    if not stepd.exists():
        stepd.symlink_to("/bin/bash")  # comm is the name it was run by
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XCUDA_", "SLURM_")) and k != "LD_PRELOAD"}
    env.update(LD_LIBRARY_PATH=str(xcuda.fake_dir), LD_PRELOAD=str(library), XCUDA_FAKE_TOTAL_MEM=str(10 * MIB),
               XCUDA_LOG_LEVEL="info")
    p = subprocess.run(["slurmstepd: [4711.0]", "-c", '"$@"; exit $?', "task", str(xcuda.harness), "init", "alloc",
                        "v2", str(5 * MIB)], executable=str(stepd), env=env, capture_output=True, text=True,
                       timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    return Run(p.returncode, p.stdout, p.stderr)


def _alloc_rc(run: Run) -> int:
    return int(run.fields("alloc")["rc"])


def test_roots_conf_beside_the_library_names_the_plan_directory(xcuda: Artifacts, tmp_path: Path,
                                                                site: Path) -> None:
    run = _run(xcuda, tmp_path, site / "libxcuda.so")
    assert f"plan directory {tmp_path / 'plans'}, from {site / 'libxcuda.so'}'s xcuda.conf" in run.stderr, run.stderr
    assert f"limits: plan {tmp_path / 'plans'}/4711.plan" in run.stderr, run.stderr
    assert _alloc_rc(run) == 0, run.stdout  # the plan's 8 MiB, not the defaults' 4


def test_without_a_conf_the_compiled_in_directory_holds(xcuda: Artifacts, tmp_path: Path, site: Path) -> None:
    (site / "xcuda.conf").unlink()
    run = _run(xcuda, tmp_path, site / "libxcuda.so")
    assert "plan directory /run/muxflow/plans (compiled in)" in run.stderr and "no xcuda.conf" in run.stderr, \
        run.stderr
    assert _alloc_rc(run) == 2, run.stdout  # no plan there: the defaults' 40 % of 10 MiB


@as_root
def test_attack_a_link_to_the_library_beside_his_own_conf_in_his_directory(xcuda: Artifacts, tmp_path: Path,
                                                                         site: Path) -> None:
    # His directory, his conf naming a plan directory (here root's own, with a looser plan he wants) and his
    # link to the installed library: the path the loader was given is his directory's, which is not root's.
    os.chown(site / "xcuda.conf", 1001, 1001)
    os.chown(site, 1001, 1001)
    run = _run(xcuda, tmp_path, site / "libxcuda.so")
    assert "warning: plan directory /run/muxflow/plans (compiled in)" in run.stderr, run.stderr
    assert "the library's directory is not root's alone" in run.stderr, run.stderr
    assert _alloc_rc(run) == 2, run.stdout
    # Root's conf hard-linked into his directory is no better: the directory is his.
    os.chown(site / "xcuda.conf", 0, 0)
    run = _run(xcuda, tmp_path, site / "libxcuda.so")
    assert "the library's directory is not root's alone" in run.stderr and _alloc_rc(run) == 2, run.stderr


def test_a_conf_others_could_write_is_ignored(xcuda: Artifacts, tmp_path: Path, site: Path) -> None:
    (site / "xcuda.conf").chmod(0o664)
    run = _run(xcuda, tmp_path, site / "libxcuda.so")
    assert "xcuda.conf is not a regular file only root can write" in run.stderr, run.stderr
    assert _alloc_rc(run) == 2, run.stdout
    (site / "xcuda.conf").chmod(0o644)
    site.chmod(0o775)
    run = _run(xcuda, tmp_path, site / "libxcuda.so")
    assert "the library's directory is not root's alone" in run.stderr and _alloc_rc(run) == 2, run.stderr


def test_a_linked_conf_is_ignored(xcuda: Artifacts, tmp_path: Path, site: Path) -> None:
    # A link to a conf elsewhere (root's, valid): the file beside the library must be the file itself.
    elsewhere = tmp_path / "elsewhere.conf"
    (site / "xcuda.conf").rename(elsewhere)
    (site / "xcuda.conf").symlink_to(elsewhere)
    run = _run(xcuda, tmp_path, site / "libxcuda.so")
    assert "xcuda.conf is a symbolic link" in run.stderr and _alloc_rc(run) == 2, run.stderr


def test_the_conf_is_looked_for_beside_the_path_given_not_the_links_target(xcuda: Artifacts, tmp_path: Path,
                                                                           site: Path) -> None:
    # The build directory has no conf: preloading the library there directly ignores the site's.
    run = _run(xcuda, tmp_path, xcuda.library if os.geteuid() == 0 else xcuda.test_library)
    assert "(compiled in)" in run.stderr and _alloc_rc(run) == 2, run.stderr
