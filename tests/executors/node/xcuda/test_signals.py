"""Graceful exit (paper §4.2): on SIGINT/SIGTERM xCUDA freezes new launches and
synchronizes the CUDA contexts, then lets the signal do what the program
intended: terminate (the contexts released first), run the program's handler
(the contexts kept, launches resumed: a checkpoint needs them), or nothing
(ignored). The fake driver logs the context events; the harness logs its own
handler in the same file."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import base_env, wait_for_line

FAST = {"XCUDA_FALLBACK_LAUNCH_RATE": "1000000", "XCUDA_LOG_LEVEL": "info"}


def _events(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _burst_then(spawn, tmp_path: Path, sig: int, *setup: str) -> tuple[subprocess.Popen, list[str], str, str]:
    log = tmp_path / "events.log"
    proc = spawn(*setup, "burst", XCUDA_FAKE_EVENT_LOG=str(log), **FAST)
    seen = wait_for_line(proc.stdout, "ready", deadline_s=20)  # launching flat out now
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    return proc, _events(log), "".join(seen) + out, err


def _ordered(events: list[str], *prefixes: str) -> bool:
    """The events start with these prefixes in this order (others may come between)."""
    idx = [next((i for i, e in enumerate(events) if e.startswith(p)), -1) for p in prefixes]
    return -1 not in idx and idx == sorted(idx)


def test_sigterm_during_a_burst_releases_the_context_then_terminates(spawn, tmp_path) -> None:
    proc, events, _, err = _burst_then(spawn, tmp_path, signal.SIGTERM, "init")
    assert proc.returncode == -signal.SIGTERM  # died of the signal, as SIG_DFL intends
    assert _ordered(events, "cuInit", "ctx_synchronize", "primary_ctx_reset dev=0")
    assert "launch_after_release" not in events
    assert "1 context(s) released" in err


@pytest.mark.parametrize("api", ["sigaction", "signal"])
def test_the_programs_handler_runs_after_the_synchronize_with_its_context_kept(spawn, tmp_path, api) -> None:
    # A handler that exits at once: no kernel of the program is in flight when it runs.
    proc, events, out, err = _burst_then(spawn, tmp_path, signal.SIGTERM, "init", "sig", "SIGTERM", "exit42", api,
                                         "sigquery", "SIGTERM")
    assert proc.returncode == 42
    assert _ordered(events, "ctx_synchronize", "primary_ctx_release", "program_handler SIGTERM")
    assert not any(e.startswith(("primary_ctx_reset", "ctx_destroy")) for e in events)
    assert "context(s) synchronized and kept" in err
    # The program asked what its handler is and was told: its own.
    assert "sigquery handler=exit42" in out


def test_a_handler_installed_before_cuda_is_chained_too(spawn, tmp_path) -> None:
    proc, events, _, _ = _burst_then(spawn, tmp_path, signal.SIGTERM, "sig", "SIGTERM", "exit42", "sigaction",
                                     "init")
    assert proc.returncode == 42
    assert _ordered(events, "ctx_synchronize", "program_handler SIGTERM")
    assert not any(e.startswith("primary_ctx_reset") for e in events)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_handler_that_returns_launches_on_for_its_checkpoint(spawn, tmp_path, sig) -> None:
    # A training loop's handler sets a flag and returns; the loop finishes its step and saves a checkpoint,
    # which launches and copies on the context it had. On a real driver a released context fails those
    # calls (the job's next synchronizing call reports "invalid argument") and the checkpoint is lost.
    name = sig.name
    proc, events, out, err = _burst_then(spawn, tmp_path, sig, "init", "sig", name, "record", "signal")
    assert proc.returncode == 0, out + err
    assert f"after-signal launches=100 errors=0 signal={int(sig)}" in out
    assert _ordered(events, "ctx_synchronize", "program_handler_returned")
    assert not any(e.startswith(("primary_ctx_reset", "ctx_destroy", "launch_after_release")) for e in events)
    # The primary context's reference count is where the program left it: retained once, by the runtime.
    release = [e for e in events if e.startswith("primary_ctx_release")]
    assert release and release[-1].endswith("refs=1")


def test_a_second_signal_after_the_handler_reset_to_default_releases_and_terminates(harness, tmp_path) -> None:
    # resethand: the first SIGTERM runs the program's handler (contexts kept) and resets the action to the
    # default; the second is then a termination, and the contexts are released before the process dies.
    log = tmp_path / "events.log"
    run = harness("init", "sig", "SIGTERM", "resethand", "sigaction", "raise", "SIGTERM", "wait-exit", "20",
                  "launch", "10", "raise", "SIGTERM", "wait-exit", "20",
                  XCUDA_FAKE_EVENT_LOG=str(log), **FAST)
    assert run.returncode == -signal.SIGTERM
    events = _events(log)
    assert [e.split()[0] for e in events] == ["cuInit", "ctx_synchronize", "primary_ctx_release",
                                              "program_handler_returned", "ctx_synchronize", "primary_ctx_reset"]
    assert events[4].endswith("launches=10")  # the launches after the handler reached the driver


def test_created_contexts_are_destroyed(harness, tmp_path) -> None:
    log = tmp_path / "events.log"
    # A context made with cuCtxCreate is synchronized and destroyed as well as the primary one.
    run = harness("init", "call-all", "raise", "SIGTERM", "wait-exit", "20", XCUDA_FAKE_EVENT_LOG=str(log),
                  XCUDA_MEM_QUOTA_BYTES="1GiB", **FAST)
    assert run.returncode == -signal.SIGTERM  # no handler: released, then the default action
    events = _events(log)
    created = sum(e.startswith("ctx_create") for e in events)
    assert created == 9  # cuCtxCreate_v2/_v3/_v4, three paths each
    assert sum(e.startswith("ctx_destroy") for e in events) == created
    assert _ordered(events, "ctx_synchronize", "ctx_destroy", "primary_ctx_reset")


def test_an_ignored_signal_stays_ignored(harness, tmp_path) -> None:
    log = tmp_path / "events.log"
    run = harness("init", "sig", "SIGTERM", "ign", "sigaction", "raise", "SIGTERM", "launch", "100",
                  XCUDA_FAKE_EVENT_LOG=str(log), **FAST)
    assert run.returncode == 0
    assert run.fields("launched") == {"n": "100", "seconds": run.fields("launched")["seconds"], "errors": "0"}
    assert not any(e.startswith("ctx_synchronize") for e in _events(log))


def test_before_cuda_is_used_signals_are_left_alone(harness, tmp_path) -> None:
    log = tmp_path / "events.log"
    run = harness("sig", "SIGTERM", "exit42", "sigaction", "raise", "SIGTERM", "wait-exit", "20",
                  XCUDA_FAKE_EVENT_LOG=str(log))
    assert run.returncode == 42
    assert _events(log) == ["program_handler SIGTERM"]


def test_default_action_without_cuda_is_untouched(harness) -> None:
    run = harness("raise", "SIGTERM")
    assert run.returncode == -signal.SIGTERM


PYTHON_LOOP = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
ctx = ctypes.c_void_p()
assert cuda.cuInit(0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
launch = cuda.cuLaunchKernel
launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
n, rc = 0, 0
try:
    while True:
        rc = launch(None, 1, 1, 1, 64, 1, 1, 0, None, None, None)
        n += 1
        if n == 1000:
            print("ready", flush=True)
except KeyboardInterrupt:
    print(f"KeyboardInterrupt after {n} launches, last rc={rc}", flush=True)
"""


def test_a_python_training_loop_gets_its_keyboardinterrupt_with_its_context(xcuda, tmp_path) -> None:
    # Python installs its SIGINT handler at start-up, before any CUDA call: taken
    # over at cuInit, chained after the synchronize; the loop's held launch goes
    # on and the interpreter raises KeyboardInterrupt, with the context intact.
    log = tmp_path / "events.log"
    env = base_env(xcuda, tmp_path, XCUDA_FAKE_EVENT_LOG=str(log), **FAST)
    proc = subprocess.Popen([sys.executable, "-c", PYTHON_LOOP], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        seen = wait_for_line(proc.stdout, "ready", deadline_s=30)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    text = "".join(seen) + out
    assert "KeyboardInterrupt after" in text and "last rc=0" in text
    assert _ordered(_events(log), "cuInit", "ctx_synchronize")
    assert not any(e.startswith(("primary_ctx_reset", "launch_after_release")) for e in _events(log))
