"""Building xCUDA and finding what the build produced (``make -C executors/node/xcuda``)."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

XCUDA_DIR = Path(__file__).resolve().parent
BUILD_DIR = XCUDA_DIR / "build"


class BuildError(RuntimeError):
    """The C build failed or cannot run (no compiler, no make)."""


@dataclass(frozen=True)
class Artifacts:
    """Paths of everything ``make`` builds."""

    library: Path      # libxcuda.so, the preload library
    test_library: Path  # test/libxcuda.so: the same with the test hooks (XCUDA_TEST_*; never installed)
    fake_dir: Path     # holds the fake libcuda.so.1 (put it on LD_LIBRARY_PATH)
    harness: Path
    bench: Path
    shm_dump: Path
    probe: Path
    test_config: Path
    test_control: Path
    test_memtrack: Path
    fakever_dir: Path  # the fake driver with a version node on its exports (dlvsym finds them)
    dlvsym_probe: Path

    @classmethod
    def at(cls, build_dir: Path = BUILD_DIR) -> Artifacts:
        return cls(
            library=build_dir / "libxcuda.so",
            test_library=build_dir / "test" / "libxcuda.so",
            fake_dir=build_dir / "fake",
            harness=build_dir / "xcuda_harness",
            bench=build_dir / "xcuda_bench",
            shm_dump=build_dir / "xcuda_shm_dump",
            probe=build_dir / "libxcuda_probe.so",
            test_config=build_dir / "test_config",
            test_control=build_dir / "test_control",
            test_memtrack=build_dir / "test_memtrack",
            fakever_dir=build_dir / "fakever",
            dlvsym_probe=build_dir / "xcuda_dlvsym_probe",
        )


def missing_tools() -> list[str]:
    """The build tools this machine lacks (a C compiler, make)."""
    missing = [] if shutil.which("make") else ["make"]
    if not (shutil.which("cc") or shutil.which("gcc")):
        missing.append("a C compiler (cc or gcc)")
    return missing


def build(jobs: int = 2, timeout_s: float = 600.0) -> Artifacts:
    """Builds (incrementally) and returns the artifacts; raises BuildError with the compiler's output."""
    missing = missing_tools()
    if missing:
        raise BuildError(f"cannot build xCUDA: missing {', '.join(missing)}")
    cc = "cc" if shutil.which("cc") else "gcc"
    BUILD_DIR.mkdir(exist_ok=True)
    # Several test sessions may share a checkout: one build at a time.
    with (BUILD_DIR / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(["make", "-C", str(XCUDA_DIR), f"-j{jobs}", f"CC={cc}"],
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        raise BuildError(f"make -C {XCUDA_DIR} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return Artifacts.at()
