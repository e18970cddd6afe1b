"""Profiling directories: MuxFlow's alone, never world-writable, never someone else's reused (the runs' reports and
the harness's state files become the samples every predictor trains on)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from executors.node.profiling.colocate import private_work_dir
from executors.scheduler.profiling.runs import ProfileDirError, prepare_run_dir
from executors.scheduler.profiling.settings import ProfilingSettings, SamplingSettings

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="directories of another uid")
OTHER_UID = 65534


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_run_directories_are_fresh_and_not_world_writable(tmp_path: Path) -> None:
    base = tmp_path / "profiling"
    a, b = prepare_run_dir(str(base), "sampling-run1-t4"), prepare_run_dir(str(base), "sampling-run1-t4")
    assert a != b and a.parent == b.parent == base
    for d in (base, a):
        assert not _mode(d) & 0o022, oct(_mode(d))  # they were 1777


@needs_root
@pytest.mark.parametrize("spoil", ["other-uid", "1777", "link", "group-writable"])
def test_attack_a_profile_dir_someone_else_made_first_is_refused_in_one_line(tmp_path: Path, spoil: str) -> None:
    base = tmp_path / "muxflow-profiling"
    if spoil == "link":
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        base.symlink_to(theirs)
    else:
        base.mkdir()
        if spoil == "other-uid":
            os.chown(base, OTHER_UID, OTHER_UID)
        else:
            os.chmod(base, 0o1777 if spoil == "1777" else 0o775)
    with pytest.raises(ProfileDirError) as err:
        prepare_run_dir(str(base), "sampling-run1-t4")
    assert str(err.value).startswith(f"profile_dir {base} ") and "\n" not in str(err.value)
    target = tmp_path / "theirs" if spoil == "link" else base
    assert list(target.iterdir()) == []  # nothing made in it


@needs_root
def test_a_shared_setgid_group_directory_gives_group_run_directories(tmp_path: Path) -> None:
    base = tmp_path / "profiling"
    base.mkdir()
    os.chmod(base, 0o2770)
    assert _mode(prepare_run_dir(str(base), "r")) == 0o2770


@needs_root
def test_root_hands_the_run_directory_to_the_reference_account(tmp_path: Path) -> None:
    d = prepare_run_dir(str(tmp_path / "profiling"), "sampling-run1-t4", owner_uid=OTHER_UID)
    assert (os.lstat(d).st_uid, _mode(d)) == (OTHER_UID, 0o755)
    # the reference account's own profile directory is MuxFlow's too
    os.chown(tmp_path / "profiling", OTHER_UID, OTHER_UID)
    assert prepare_run_dir(str(tmp_path / "profiling"), "r", owner_uid=OTHER_UID).parent == tmp_path / "profiling"


def test_the_default_profile_dir_is_not_under_tmp() -> None:
    assert not ProfilingSettings().profile_dir.startswith("/tmp/")
    assert not SamplingSettings().profile_dir.startswith("/tmp/")


@needs_root
@pytest.mark.parametrize("spoil", ["other-uid", "world-writable", "link"])
def test_attack_a_work_directory_someone_made_first_is_not_used(tmp_path: Path, spoil: str) -> None:
    """The harness's control and state files in a .colocate-work someone else made are theirs to rewrite."""
    work = tmp_path / "run" / ".colocate-work"
    work.parent.mkdir()
    if spoil == "link":
        (tmp_path / "theirs").mkdir()
        work.symlink_to(tmp_path / "theirs")
    else:
        work.mkdir()
        os.chmod(work, 0o1777 if spoil == "world-writable" else 0o700)
        if spoil == "other-uid":
            os.chown(work, OTHER_UID, OTHER_UID)
    with pytest.raises(ValueError, match="not this account's private directory"):
        private_work_dir(work)


def test_the_work_directory_is_private(tmp_path: Path) -> None:
    work = private_work_dir(tmp_path / "run" / ".colocate-work")
    assert _mode(work) == 0o700
    assert private_work_dir(work) == work  # this account's own, from an earlier run: kept
