"""Every hooked entry point is intercepted, whichever way a program reaches the
driver: linked directly, through dlsym, or through cuGetProcAddress as the CUDA
runtime (and PyTorch through it) does. Checked by the fake driver's counters of
calls made from inside libxcuda.so."""

from __future__ import annotations

import pytest

from .conftest import hooked_entry_points, resolved_only_entry_points

PATHS = ("direct", "dlsym", "gpa")


def test_every_hooked_entry_point_is_intercepted_on_every_path(harness) -> None:
    run = harness("init", "call-all", XCUDA_FAKE_TRACE_CALLERS="1", XCUDA_MEM_QUOTA_BYTES="1GiB",
                  XCUDA_FALLBACK_LAUNCH_RATE="1000000")
    assert run.returncode == 0, run.stderr
    calls = run.lines("call ")
    assert len(calls) == len(hooked_entry_points()) * len(PATHS)
    bad = [line for line in calls if not line.endswith(" ok")]
    assert bad == []
    assert run.fields("call-all") == {"ok": str(len(calls)), "bad": "0"}


def test_the_counters_do_see_an_unintercepted_call(harness) -> None:
    # Without the preload the same calls reach the driver but not through xCUDA.
    run = harness("init", "call-all", preload=False, XCUDA_FAKE_TRACE_CALLERS="1")
    assert run.fields("call-all")["ok"] == "0"
    assert all("calls=1 via_xcuda=0" in line for line in run.lines("call "))


def test_all_three_paths_resolve_to_the_wrappers(harness) -> None:
    run = harness("resolve-all")
    assert run.returncode == 0, run.stderr
    rows = {line.split()[1]: line for line in run.lines("resolve ")}
    for name in hooked_entry_points():
        for path in PATHS:
            assert f" {path}=xcuda:{name}" in rows[name], rows[name]
    for name in resolved_only_entry_points():  # not interposed: the driver's own
        for path in PATHS:
            assert f" {path}=fake:{name}" in rows[name], rows[name]


@pytest.mark.parametrize(
    ("symbol", "version", "flags", "expected"),
    [
        ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),  # asked for itself: still hooked
        ("cuGetProcAddress", 11030, 0, "cuGetProcAddress"),
        ("cuMemAlloc", 3000, 0, "cuMemAlloc"),                  # the 32-bit ABI for old callers
        ("cuMemAlloc", 12000, 0, "cuMemAlloc_v2"),
        ("cuLaunchKernel", 12000, 0, "cuLaunchKernel"),
        ("cuLaunchKernel", 12000, 2, "cuLaunchKernel_ptsz"),    # per-thread default stream
        ("cuLaunchKernel", 6050, 2, "cuLaunchKernel"),          # before _ptsz existed
        ("cuGraphLaunch", 12000, 2, "cuGraphLaunch_ptsz"),
        ("cuMemAllocAsync", 12000, 2, "cuMemAllocAsync_ptsz"),
        ("cuCtxCreate", 11040, 0, "cuCtxCreate_v3"),
        ("cuCtxCreate", 12080, 0, "cuCtxCreate_v4"),
    ],
)
def test_cuGetProcAddress_keeps_versions_and_variants(harness, symbol, version, flags, expected) -> None:
    run = harness("gpa", symbol, str(version), str(flags))
    assert run.fields("gpa") == {"rc": "0", "status": "0", "obj": "xcuda", "sym": expected}


def test_cuGetProcAddress_passes_the_rest_through(harness) -> None:
    run = harness("gpa", "cuDriverGetVersion", "12000", "0", "gpa", "cuCtxSynchronize", "12000", "0",
                  "gpa", "cuNoSuchThing", "12000", "0", "gpa", "cuLaunchKernelEx", "11000", "0")
    unhooked, internal, unknown, too_old = (run.fields("gpa", i) for i in range(4))
    assert (unhooked["obj"], unhooked["sym"]) == ("fake", "cuDriverGetVersion")
    assert (internal["obj"], internal["sym"]) == ("fake", "cuCtxSynchronize")
    assert (unknown["rc"], unknown["status"], unknown["obj"]) == ("500", "1", "none")  # SYMBOL_NOT_FOUND
    assert (too_old["rc"], too_old["status"]) == ("500", "2")  # VERSION_NOT_SUFFICIENT


def test_dlsym_answers(harness) -> None:
    run = harness("dlsym", "libcuda", "cuLaunchKernel", "dlsym", "default", "cuMemAlloc_v2",
                  "dlsym", "libcuda", "cuNoSuchThing", "dlsym", "libcuda", "cuCtxSynchronize",
                  "dlsym", "default", "printf")
    got = [(f["obj"], f["sym"]) for f in (run.fields("dlsym", i) for i in range(5))]
    assert got[0] == ("xcuda", "cuLaunchKernel")
    assert got[1] == ("xcuda", "cuMemAlloc_v2")
    assert got[2][0] == "none"  # not in the driver: still not found
    assert got[3] == ("fake", "cuCtxSynchronize")
    assert got[4][0] == "libc.so.6"


def test_rtld_next_still_searches_from_the_caller(harness, xcuda) -> None:
    # The probe library, preloaded in front of xCUDA, defines the symbol the
    # fake driver defines too. RTLD_NEXT from the program must find the probe
    # first; it would find the driver's if glibc saw libxcuda.so as the caller.
    run = harness("probe-next", env_extra={"LD_PRELOAD": f"{xcuda.probe}:{xcuda.library}"})
    assert run.fields("probe-next") == {"value": "1"}
