"""dlvsym is interposed like dlsym: a program that asks it for a driver function by name and version gets xCUDA's
wrapper, so it is still charged and paced (against a driver whose exports carry a version node, which dlvsym needs to
find anything); other names, missing versions and RTLD_NEXT keep glibc's answers. xCUDA finds glibc's own dlsym and
dlvsym from libc's symbol table, without calling either by name."""

from __future__ import annotations

import subprocess

from .conftest import base_env

VERSION = "libcuda.so.1"


def probe(xcuda, tmp_path, *args: str, preload: bool = True, **extra: str) -> subprocess.CompletedProcess:
    env = base_env(xcuda, tmp_path, preload, **extra)
    env["LD_LIBRARY_PATH"] = str(xcuda.fakever_dir)
    return subprocess.run([str(xcuda.dlvsym_probe), *args], env=env, capture_output=True, text=True, timeout=60,
                          check=False)


def lines(run: subprocess.CompletedProcess, prefix: str) -> list[str]:
    return [line for line in run.stdout.splitlines() if line.startswith(prefix)]


def test_without_xcuda_dlvsym_reaches_the_driver(xcuda, tmp_path) -> None:
    # The bypass the hook closes: the driver's own function, no quota.
    run = probe(xcuda, tmp_path, "dlvsym", "cuMemAlloc_v2", VERSION, "alloc", str(2 << 20), preload=False,
                XCUDA_MEM_QUOTA_BYTES="1MiB")
    assert run.returncode == 0, run.stderr
    assert lines(run, "dlvsym") == ["dlvsym cuMemAlloc_v2 obj=fake"]
    assert lines(run, "alloc") == ["alloc rc=0 obj=fake"]


def test_an_allocation_through_dlvsym_is_charged(xcuda, tmp_path) -> None:
    run = probe(xcuda, tmp_path, "alloc", str(2 << 20), "alloc", str(512 << 10), XCUDA_MEM_QUOTA_BYTES="1MiB")
    assert run.returncode == 0, run.stderr
    assert lines(run, "alloc") == ["alloc rc=2 obj=xcuda", "alloc rc=0 obj=xcuda"]
    assert "refused" in run.stderr


def test_a_launch_through_dlvsym_is_paced(xcuda, tmp_path) -> None:
    # 100 launches at 50/s take about 2 s (less the bucket's start); the driver's own would take microseconds.
    run = probe(xcuda, tmp_path, "launch", "100", XCUDA_FALLBACK_LAUNCH_RATE="50")
    assert run.returncode == 0, run.stderr
    (line,) = lines(run, "launched")
    fields = dict(part.split("=") for part in line.split()[1:])
    assert fields["obj"] == "xcuda"
    assert float(fields["seconds"]) > 1.0


def test_other_answers_stay_glibcs(xcuda, tmp_path) -> None:
    run = probe(xcuda, tmp_path, "dlvsym", "cuDriverGetVersion", VERSION,   # not hooked: the driver's
                "dlvsym", "cuLaunchKernel", "NO_SUCH_VERSION",             # hooked, no such version: none
                "dlvsym", "cuNoSuchThing", VERSION,                         # not in the driver: none
                "next", "printf", "GLIBC_2.2.5")                            # RTLD_NEXT from the program: libc
    assert run.returncode == 0, run.stderr
    assert lines(run, "dlvsym") == ["dlvsym cuDriverGetVersion obj=fake", "dlvsym cuLaunchKernel obj=none",
                                    "dlvsym cuNoSuchThing obj=none"]
    assert lines(run, "next") == ["next printf obj=libc.so.6"]


def test_the_installed_library_interposes_dlvsym_too(xcuda, tmp_path) -> None:
    env = base_env(xcuda, tmp_path, True)
    env["LD_PRELOAD"] = str(xcuda.library)
    env["LD_LIBRARY_PATH"] = str(xcuda.fakever_dir)
    run = subprocess.run([str(xcuda.dlvsym_probe), "dlvsym", "cuLaunchKernel", VERSION, "next", "printf",
                          "GLIBC_2.2.5"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert lines(run, "dlvsym") == ["dlvsym cuLaunchKernel obj=xcuda"]
    assert lines(run, "next") == ["next printf obj=libc.so.6"]
