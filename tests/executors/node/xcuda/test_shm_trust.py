"""The per-GPU records live in a world-writable directory (/dev/shm): what another user plants there is never
written into by the root agent, and never read by xCUDA (docs/NODE_AGENT.md "What the agent trusts").

Attacks: a user pre-creates the record (a file of his, or a symlink to a file he wants root to overwrite) before
the agent starts, then forges the record other users' jobs pace by — an online load of 0, so their offline work
runs unthrottled next to the online service. The writer replaces anything it cannot trust (never writing into it)
and refuses a directory others could swap; xCUDA's reader refuses a record that is a symlink, not a regular file,
not owned by root (the test build: its own user; a record the job wrote itself is no record), or writable by group or
others, and falls back as without a record.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from executors.node.xcuda.build import Artifacts
from executors.node.xcuda.shm import (
    FLAG_INTEGRAL,
    GpuSample,
    RecordPathError,
    ShmWriter,
    check_record_dir,
    decode,
    encode,
)

SAMPLE = GpuSample(u_sm=0.42, sm_clock_mhz=1215.0, clock_threshold_mhz=1290.0, clock_max_mhz=1590.0)
FORGED = GpuSample(u_sm=0.0, sm_clock_mhz=1590.0, clock_threshold_mhz=1290.0, clock_max_mhz=1590.0)
OTHER_UID = 1001  # another user (root's tests chown to it)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")


def _dump(xcuda: Artifacts, path: Path) -> dict:
    out = subprocess.run([str(xcuda.shm_dump), str(path), "60000"], capture_output=True, text=True, check=True,
                         timeout=30)
    return json.loads(out.stdout)


@pytest.fixture
def shm_dir(tmp_path: Path) -> Path:
    """A world-writable sticky directory like /dev/shm."""
    d = tmp_path / "shm"
    d.mkdir()
    d.chmod(0o1777)
    return d


@as_root
def test_attack_a_record_planted_by_another_user_is_replaced_not_written_into(shm_dir: Path) -> None:
    path = shm_dir / "muxflow-gpu-0"
    path.write_bytes(encode(FORGED, 0, time.monotonic_ns()))
    os.chown(path, OTHER_UID, OTHER_UID)
    path.chmod(0o666)
    planted = os.open(path, os.O_RDWR)  # the attacker keeps it open, to rewrite it whenever he likes
    try:
        with ShmWriter(path, gpu_index=0) as w:
            w.write(SAMPLE)
            st = path.stat()
            assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o644)
            mine = decode(path.read_bytes()).sample
            assert mine == replace(SAMPLE, flags=FLAG_INTEGRAL)
            os.pwrite(planted, encode(FORGED, 0, time.monotonic_ns()), 0)  # reaches his own file only
            assert decode(path.read_bytes()).sample == mine
    finally:
        os.close(planted)


def test_attack_a_symlink_planted_at_the_record_is_replaced_not_followed(shm_dir: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("root's file, which the agent must not overwrite\n")
    path = shm_dir / "muxflow-gpu-1"
    path.symlink_to(victim)
    with ShmWriter(path, gpu_index=1) as w:
        w.write(SAMPLE)
    assert victim.read_text() == "root's file, which the agent must not overwrite\n"
    assert not path.is_symlink() and decode(path.read_bytes()).gpu_index == 1


def test_a_record_writable_by_others_or_linked_elsewhere_is_replaced(shm_dir: Path, tmp_path: Path) -> None:
    path = shm_dir / "muxflow-gpu-2"
    with ShmWriter(path, gpu_index=2) as w:
        w.write(SAMPLE)
    path.chmod(0o666)
    with ShmWriter(path, gpu_index=2) as w:
        w.write(SAMPLE)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    os.link(path, shm_dir / "someone-elses-name")  # a second name: not the agent's alone any more
    with ShmWriter(path, gpu_index=2) as w:
        w.write(SAMPLE)
    assert path.stat().st_nlink == 1


def test_the_agents_own_record_is_kept_for_the_readers_that_hold_it(shm_dir: Path) -> None:
    path = shm_dir / "muxflow-gpu-3"
    with ShmWriter(path, gpu_index=3) as w:
        w.write(SAMPLE)
    ino = path.stat().st_ino
    with ShmWriter(path, gpu_index=3) as w:  # a restarted agent: same file, seq goes on
        assert w.write(SAMPLE) == 4
    assert path.stat().st_ino == ino


def test_a_directory_planted_at_the_record_is_refused_clearly(shm_dir: Path) -> None:
    (shm_dir / "muxflow-gpu-4").mkdir()
    with pytest.raises(RecordPathError, match="muxflow-gpu-4 is a directory"):
        ShmWriter(shm_dir / "muxflow-gpu-4")


def test_directories_others_could_swap_are_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # world-writable without the sticky bit: anyone may rename the agent's records away
    with pytest.raises(RecordPathError, match="writable by group or others without the sticky bit"):
        ShmWriter(open_dir / "muxflow-gpu-0")
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(RecordPathError, match="is a symbolic link"):
        ShmWriter(link / "muxflow-gpu-0")
    assert check_record_dir(real) == real.resolve()
    assert check_record_dir("/dev/shm") == Path("/dev/shm")  # root's, world-writable but sticky


@as_root
def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(RecordPathError, match=f"owned by uid {OTHER_UID}"):
        ShmWriter(theirs / "muxflow-gpu-0")


# -- xCUDA's reader -------------------------------------------------------------------------------------------

def test_the_reader_accepts_the_agents_record(xcuda, shm_dir: Path) -> None:
    path = shm_dir / "muxflow-gpu-0"
    with ShmWriter(path) as w:
        w.write(SAMPLE)
    assert _dump(xcuda, path)["status"] == "ok"


@as_root
def test_attack_the_reader_refuses_a_record_another_user_owns(xcuda, shm_dir: Path) -> None:
    path = shm_dir / "muxflow-gpu-0"
    path.write_bytes(encode(FORGED, 0, time.monotonic_ns()))
    path.chmod(0o644)
    os.chown(path, OTHER_UID, OTHER_UID)
    got = _dump(xcuda, path)
    assert got["status"].startswith("untrusted") and got["u_sm"] == 0.0 and got["seq"] == 0, got


def test_attack_the_reader_refuses_a_record_others_can_write(xcuda, shm_dir: Path) -> None:
    path = shm_dir / "muxflow-gpu-0"
    path.write_bytes(encode(FORGED, 0, time.monotonic_ns()))
    for mode in (0o666, 0o664):
        path.chmod(mode)
        assert _dump(xcuda, path)["status"].startswith("untrusted"), oct(mode)


def test_attack_the_reader_refuses_a_symlink_and_what_is_not_a_file(xcuda, shm_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "forged"
    target.write_bytes(encode(FORGED, 0, time.monotonic_ns()))
    target.chmod(0o644)
    (shm_dir / "link").symlink_to(target)
    assert _dump(xcuda, target)["status"] == "ok"  # the same bytes, at a path of their own, are a record
    assert _dump(xcuda, shm_dir / "link")["status"].startswith("untrusted")
    os.mkfifo(shm_dir / "fifo", 0o644)
    assert _dump(xcuda, shm_dir / "fifo")["status"].startswith("untrusted")


@as_root
def test_attack_a_job_paces_by_the_agents_record_not_a_planted_one(harness, shm_dir: Path) -> None:
    """End to end through the preloaded library: a planted record showing a busy GPU would throttle the job were
    it read; refused, the job runs at the fallback rate, and says why."""
    path = shm_dir / "muxflow-gpu-0"
    path.write_bytes(encode(GpuSample(u_sm=1.0, sm_clock_mhz=1100.0, clock_threshold_mhz=1290.0,
                                      clock_max_mhz=1590.0), 0, time.monotonic_ns()))
    path.chmod(0o644)
    os.chown(path, OTHER_UID, OTHER_UID)
    run = harness("init", "launch-for", "0.5", XCUDA_SHM_PATH=str(path), XCUDA_FALLBACK_LAUNCH_RATE="1000",
                  XCUDA_MIN_LAUNCH_RATE="10", XCUDA_CONTROL_PERIOD_MS="10", XCUDA_SHM_STALE_MS="60000")
    assert run.returncode == 0, run.stderr
    assert "untrusted" in run.stderr and "fixed safe rate of 1000/s" in run.stderr
    assert 300 < int(run.fields("launched")["n"]) < 700  # 1000/s for half a second, not the 10/s floor
