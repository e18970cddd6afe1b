"""Memory quota (paper §4.1): every allocation entry point is charged against
XCUDA_MEM_QUOTA_BYTES, frees return the budget, over quota is
CUDA_ERROR_OUT_OF_MEMORY, and cuMemGetInfo reports the quota as total and what
is left of it as free."""

from __future__ import annotations

import pytest

OOM = "2"
MIB = 1 << 20
KINDS = ["v1", "v2", "pitch_v1", "pitch", "managed", "async", "async_ptsz", "pool", "pool_ptsz", "create",
         "array_v1", "array", "array3d_v1", "array3d", "mipmap"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("path", ["direct", "gpa"])
def test_every_allocation_entry_point_is_charged(harness, kind, path) -> None:
    half = str(MIB // 2)
    run = harness("init",
                  "alloc", kind, half, path,            # slot 0
                  "alloc", kind, half, path,            # slot 1: quota now full
                  "alloc", kind, "4096", path,          # refused
                  "meminfo",
                  "free", "0",
                  "alloc", kind, "4096", path,          # fits again: slot 2
                  "meminfo",
                  "free", "1", "free", "2",
                  "meminfo", "fake-used",
                  XCUDA_MEM_QUOTA_BYTES="1MiB")
    assert run.returncode == 0, run.stderr
    allocs = [run.fields("alloc", i)["rc"] for i in range(4)]
    assert allocs == ["0", "0", OOM, "0"]
    full, partial, empty = (run.fields("meminfo", i) for i in range(3))
    assert (full["free"], full["total"]) == ("0", str(MIB))
    assert (partial["free"], partial["total"]) == (str(MIB // 2 - 4096), str(MIB))
    assert (empty["free"], empty["total"]) == (str(MIB), str(MIB))
    assert (empty["free_v1"], empty["total_v1"]) == (str(MIB), str(MIB))
    assert all(run.fields("free", i)["rc"] == "0" for i in range(3))
    assert run.fields("fake-used") == {"bytes": "0"}  # the refused call never reached the driver
    assert "refused" in run.stderr


def test_pitch_padding_counts(harness) -> None:
    # 8 rows of 600 bytes are padded to a 1024-byte pitch by the driver: 8 KiB.
    run = harness("init", "alloc", "pitch", "4800", "meminfo", XCUDA_MEM_QUOTA_BYTES="64KiB")
    assert run.fields("alloc")["rc"] == "0"
    assert run.fields("meminfo")["free"] == str(64 * 1024 - 8 * 1024)


def test_padding_over_the_quota_is_undone(harness) -> None:
    run = harness("init", "alloc", "pitch", "4800", "meminfo", "fake-used", XCUDA_MEM_QUOTA_BYTES="6000")
    assert run.fields("alloc")["rc"] == OOM
    assert run.fields("meminfo")["free"] == "6000"
    assert run.fields("fake-used") == {"bytes": "0"}


def test_a_failed_driver_allocation_gives_the_budget_back(harness) -> None:
    run = harness("init", "fail-next", "cuMemAlloc_v2", "2", "alloc", "v2", "4096", "meminfo",
                  XCUDA_MEM_QUOTA_BYTES="1MiB")
    assert run.fields("alloc")["rc"] == OOM
    assert run.fields("meminfo")["free"] == str(MIB)


def test_a_failed_free_keeps_the_charge(harness) -> None:
    run = harness("init", "alloc", "v2", "4096", "fail-next", "cuMemFree_v2", "1", "free", "0", "meminfo",
                  "free", "0", "meminfo", XCUDA_MEM_QUOTA_BYTES="1MiB")
    assert run.fields("free", 0)["rc"] == "1"
    assert run.fields("meminfo", 0)["free"] == str(MIB - 4096)
    assert run.fields("free", 1)["rc"] == "0"
    assert run.fields("meminfo", 1)["free"] == str(MIB)


def test_quota_as_a_share_of_device_memory(harness) -> None:
    run = harness("init", "meminfo", "totalmem", "alloc", "v2", "300000000", "alloc", "v2", "200000001",
                  XCUDA_MEM_QUOTA_BYTES="25%", XCUDA_FAKE_TOTAL_MEM="2000000000")
    assert run.fields("meminfo")["total"] == "500000000"
    assert run.fields("totalmem")["bytes"] == "500000000"
    assert [run.fields("alloc", i)["rc"] for i in range(2)] == ["0", OOM]


def test_default_quota_is_forty_percent(harness) -> None:
    run = harness("init", "meminfo", XCUDA_FAKE_TOTAL_MEM="1000000000")
    assert run.fields("meminfo")["total"] == "400000000"


def test_no_quota_reports_the_device(harness) -> None:
    run = harness("init", "alloc", "v2", "900000000", "meminfo",
                  XCUDA_MEM_QUOTA_BYTES="none", XCUDA_FAKE_TOTAL_MEM="1000000000")
    assert run.fields("alloc")["rc"] == "0"
    info = run.fields("meminfo")
    assert (info["free"], info["total"]) == ("100000000", "1000000000")


def test_free_memory_is_never_more_than_the_device_has(harness) -> None:
    # Quota above what the device has left (the online service uses the rest).
    run = harness("init", "meminfo", XCUDA_MEM_QUOTA_BYTES="8GiB", XCUDA_FAKE_TOTAL_MEM=str(4 << 30))
    assert run.fields("meminfo")["total"] == str(4 << 30)
    assert run.fields("meminfo")["free"] == str(4 << 30)


def test_concurrent_allocations_never_exceed_the_quota(harness) -> None:
    quota = 10 * MIB
    run = harness("init", "stress-mem", "4", "20000", str(3 * MIB), "meminfo", "fake-used",
                  XCUDA_MEM_QUOTA_BYTES=str(quota), timeout=120)
    assert run.returncode == 0, run.stderr
    stress = run.fields("stress")
    assert stress["errors"] == "0"
    assert 0 < int(stress["max_live"]) <= quota
    assert run.fields("meminfo")["free"] == str(quota)  # every free returned exactly what was charged
    assert run.fields("fake-used") == {"bytes": "0"}
