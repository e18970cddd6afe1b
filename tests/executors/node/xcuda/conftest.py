"""xCUDA tests: build the C library, fake driver and harness once per session, and
run the harness under LD_PRELOAD=libxcuda.so with a clean XCUDA_* environment.

Without a C compiler the tests are skipped with a notice, or fail under
``CI=true``, where the build is required.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from executors.node.xcuda.build import XCUDA_DIR, Artifacts, BuildError, build, missing_tools
from executors.node.xcuda.shm import GpuSample, ShmWriter

HOOKS_DEF = XCUDA_DIR / "src" / "hooks.def"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def hooked_entry_points() -> list[str]:
    """The interposed entry points, read from the one list they are generated from."""
    return re.findall(r"^XCUDA_(?:HOOK|LAUNCH)\((\w+),", HOOKS_DEF.read_text(), flags=re.M)


def resolved_only_entry_points() -> list[str]:
    return re.findall(r"^XCUDA_REAL\((\w+),", HOOKS_DEF.read_text(), flags=re.M)


@pytest.fixture(scope="session")
def xcuda() -> Artifacts:
    missing = missing_tools()
    if missing:
        message = f"xCUDA tests need {', '.join(missing)} to build the C library"
        if _in_ci():
            pytest.fail(f"CI=true: {message}")
        pytest.skip(f"SKIPPED: {message}")
    try:
        return build()
    except BuildError as exc:
        pytest.fail(str(exc))


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    def lines(self, prefix: str) -> list[str]:
        return [line for line in self.stdout.splitlines() if line.startswith(prefix)]

    def fields(self, prefix: str, index: int = 0) -> dict[str, str]:
        """key=value pairs of the index-th stdout line starting with prefix."""
        return dict(re.findall(r"(\w+)=(\S+)", self.lines(prefix)[index]))


def base_env(xcuda: Artifacts, tmp_path: Path, preload: bool = True, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XCUDA_") and k not in ("LD_PRELOAD",)}
    env["LD_LIBRARY_PATH"] = str(xcuda.fake_dir)
    # No record unless a test writes one; never a real node agent's.
    env["XCUDA_SHM_PATH"] = str(tmp_path / "no-record")
    if preload:
        # The test library, with the environment as the plan: these tests are about what xCUDA does with its
        # limits; where the limits come from (a root plan, never the job's environment) is test_limits_source.py's.
        env["LD_PRELOAD"] = str(xcuda.test_library)
        env["XCUDA_TEST_ENV_CONFIG"] = "1"
    env.update(extra)
    return env


@pytest.fixture
def harness(xcuda: Artifacts, tmp_path: Path) -> Callable[..., Run]:
    """harness(*commands, preload=True, timeout=60, **XCUDA_vars) -> Run."""

    def run(*args: str, preload: bool = True, timeout: float = 60, env_extra: dict[str, str] | None = None,
            **extra: str) -> Run:
        env = base_env(xcuda, tmp_path, preload, **extra)
        env.update(env_extra or {})
        proc = subprocess.run([str(xcuda.harness), *args], env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        return Run(proc.returncode, proc.stdout, proc.stderr)

    return run


class RecordFeeder:
    """Plays the node agent: rewrites a GPU record every few ms, as a live agent does."""

    def __init__(self, path: Path, sample: GpuSample, interval_s: float = 0.005):
        self.path = path
        self.sample = sample
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        with ShmWriter(self.path) as w:
            while not self._stop.is_set():
                w.write(self.sample)
                self._stop.wait(self.interval_s)

    def __enter__(self) -> RecordFeeder:
        ShmWriter(self.path).write(self.sample)  # there before the process starts
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def feeder(tmp_path: Path) -> Callable[[GpuSample], RecordFeeder]:
    def make(sample: GpuSample) -> RecordFeeder:
        return RecordFeeder(tmp_path / "gpu-record", sample)

    return make


def wait_for_line(stream, text: str, deadline_s: float) -> list[str]:
    """Reads lines from a pipe until one contains ``text``; fails after the deadline."""
    seen: list[str] = []
    box: dict[str, bool] = {}

    def reader() -> None:
        for line in stream:
            seen.append(line)
            if text in line:
                box["found"] = True
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(deadline_s)
    if not box.get("found"):
        raise AssertionError(f"no {text!r} within {deadline_s} s; got {seen!r}")
    return seen


@pytest.fixture
def spawn(xcuda: Artifacts, tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen]]:
    """Starts the harness in the background (killed at teardown if still running)."""
    procs: list[subprocess.Popen] = []

    def start(*args: str, preload: bool = True, **extra: str) -> subprocess.Popen:
        env = base_env(xcuda, tmp_path, preload, **extra)
        p = subprocess.Popen([str(xcuda.harness), *args], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()


def monotonic_deadline(seconds: float) -> Callable[[], bool]:
    end = time.monotonic() + seconds
    return lambda: time.monotonic() < end
