"""Checkpoint/restart runtime: atomic saves, never a corrupt load, signal → finish iteration, save, exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from executors.job.runtime import CheckpointStore, CorruptCheckpoint, Runtime

REPO = Path(__file__).resolve().parents[4]


def test_save_and_latest_round_trip_and_prune(tmp_path) -> None:
    st = CheckpointStore(tmp_path, keep=2)
    for step in (10, 20, 30):
        st.save(step, {"w": step})
    assert [p.name for p in st.candidates()] == ["ckpt-000000000030.mxck", "ckpt-000000000020.mxck"]
    assert st.latest() == (30, {"w": 30})
    assert not list(tmp_path.glob(".ckpt-*"))  # no temporary file left


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_a_corrupt_newest_checkpoint_is_never_loaded(tmp_path, damage) -> None:
    st = CheckpointStore(tmp_path, keep=3)
    st.save(1, {"w": 1})
    p = st.save(2, {"w": 2})
    data = p.read_bytes()
    p.write_bytes({"truncate": data[:-5], "flip": data[:-1] + bytes([data[-1] ^ 1]), "garbage": b"x" * 100,
                   "empty": b""}[damage])
    with pytest.raises(CorruptCheckpoint):
        st.load(p)
    assert st.latest() == (1, {"w": 1})


def test_a_half_written_temporary_file_is_ignored(tmp_path) -> None:
    st = CheckpointStore(tmp_path)
    st.save(5, "five")
    (tmp_path / ".ckpt-000000000006.mxck.tmp.999999").write_bytes(b"MXCKPT01partial")
    assert st.latest() == (5, "five")
    assert CheckpointStore(tmp_path / "none").latest() is None


def test_signal_finishes_the_iteration_then_saves_and_exits(tmp_path) -> None:
    exits: list[int] = []
    rt = Runtime(tmp_path, every_steps=1000, exit=exits.append)
    try:
        rt.step_done(1, lambda: {"s": 1})
        assert rt.store.latest() is None  # not on the interval
        os.kill(os.getpid(), signal.SIGUSR1)
        assert rt.stop_requested == signal.SIGUSR1 and not exits  # only a flag until the iteration ends
        rt.step_done(2, lambda: {"s": 2})
        assert exits == [0] and rt.store.latest() == (2, {"s": 2})
        assert Runtime(tmp_path, exit=exits.append).resume() == (2, {"s": 2})
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _train(ckpt: Path, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "executors.job.runtime.example_train", "--ckpt", str(ckpt),
                             "--out", str(out), "--steps", "200", "--every", "20", *extra], cwd=REPO)


def test_interrupted_three_times_ends_like_an_uninterrupted_run(tmp_path) -> None:
    ref = _train(tmp_path / "ref", tmp_path / "ref.json")
    assert ref.wait(timeout=120) == 0
    want = json.loads((tmp_path / "ref.json").read_text())
    ckpt, out = tmp_path / "mig", tmp_path / "mig.json"
    stops = []
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR1):
        p = _train(ckpt, out, "--iter-ms", "20")
        before = CheckpointStore(ckpt).latest()
        start = before[0] if before else 0
        end = time.monotonic() + 60
        while p.poll() is None and time.monotonic() < end:  # wait for progress past the resume point
            prog = ckpt / "progress"
            if prog.exists() and int(prog.read_text() or 0) > start + 7:
                break
            time.sleep(0.01)
        p.send_signal(sig)
        assert p.wait(timeout=60) == 0
        latest = CheckpointStore(ckpt).latest()
        assert latest is not None and latest[0] > start
        stops.append(latest[0])
        assert not out.exists()
    final = _train(ckpt, out)
    assert final.wait(timeout=120) == 0
    got = json.loads(out.read_text())
    assert got == want, (got, want, stops)
    assert stops == sorted(stops) and stops[-1] < 200
