"""xCUDA's build: only the hooks are exported, and the C unit tests pass."""

from __future__ import annotations

import shutil
import subprocess

from executors.node.xcuda.build import XCUDA_DIR, Artifacts

from .conftest import hooked_entry_points, resolved_only_entry_points

INTERPOSED_LIBC = {"dlsym", "dlvsym", "sigaction", "signal"}


def _exports(path) -> set[str]:
    nm = shutil.which("nm")
    assert nm, "nm (binutils) is needed to check the exported symbols"
    out = subprocess.run([nm, "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True)
    return {line.split()[-1].split("@")[0] for line in out.stdout.splitlines() if line.strip()}


def test_only_the_hooks_are_exported(xcuda: Artifacts) -> None:
    assert _exports(xcuda.library) == set(hooked_entry_points()) | INTERPOSED_LIBC


def test_hook_list_is_the_single_source(xcuda: Artifacts) -> None:
    hooks = hooked_entry_points()
    assert len(hooks) == len(set(hooks)) >= 40
    # The fake driver implements every entry point of the list, hooked or not.
    assert set(hooks) | set(resolved_only_entry_points()) <= _exports(xcuda.fake_dir / "libcuda.so.1")
    for launch in ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
                   "cuGraphLaunch", "cuGetProcAddress", "cuGetProcAddress_v2", "cuMemCreate", "cuMemAllocAsync"):
        assert launch in hooks


def test_strict_warnings_and_hidden_visibility() -> None:
    makefile = (XCUDA_DIR / "Makefile").read_text()
    for flag in ("-Wall", "-Wextra", "-Werror", "-fvisibility=hidden"):
        assert flag in makefile


def test_c_unit_tests_pass(xcuda: Artifacts) -> None:
    for binary in (xcuda.test_config, xcuda.test_memtrack):
        unit = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
        assert unit.returncode == 0, unit.stderr
    vectors = XCUDA_DIR / "tests" / "control_vectors.csv"
    control = subprocess.run([str(xcuda.test_control), str(vectors)], capture_output=True, text=True, timeout=60)
    assert control.returncode == 0, control.stderr
