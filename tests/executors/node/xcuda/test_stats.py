"""xCUDA's published counters (XCUDA_STATS_DIR): each preloaded process keeps xcuda-<pid>.stats up to date from its
controller thread, in the layout executors/node/xcuda/stats.py reads (launches, waits, rate, fallback, memory charged)."""

from __future__ import annotations

import os

import pytest

from executors.node.xcuda.stats import MAGIC, SIZE, StatsRefused, XcudaStats, decode, encode, job_stats

from .test_pacing import HIGH, LOW, PACING

MIB = 1 << 20


def _record(directory) -> XcudaStats:
    (name,) = os.listdir(directory)
    assert name.startswith("xcuda-") and name.endswith(".stats")
    data = (directory / name).read_bytes()
    assert len(data) == SIZE and int.from_bytes(data[:8], "little") == MAGIC
    rec = decode(data)
    assert name == f"xcuda-{rec.pid}.stats"
    return rec


def test_launches_memory_and_the_fallback_are_published(harness, tmp_path) -> None:
    stats = tmp_path / "job"
    stats.mkdir()
    run = harness("init", "alloc", "v2", str(MIB // 4), "direct", "alloc", "v2", str(MIB), "direct",
                  "launch", "150", "idle", "0.2", XCUDA_STATS_DIR=str(stats), XCUDA_MEM_QUOTA_BYTES="1MiB",
                  **PACING)
    assert run.returncode == 0, run.stderr
    rec = _record(stats)
    assert rec.pid == int(run.fields("idle")["pid"])
    assert rec.launches == 150 and rec.fallback and not rec.gate_open  # no GPU record: the fixed safe rate
    assert rec.rate == pytest.approx(1000.0) and 0 < rec.waits <= 150 and rec.waited_ns > 0
    assert (rec.mem_used_bytes, rec.mem_quota_bytes, rec.mem_refused) == (MIB // 4, MIB, 1)


def test_with_the_gpu_record_the_controller_state_is_published(harness, feeder, tmp_path) -> None:
    record = str(tmp_path / "gpu-record")
    for sample, gate_open in ((LOW, True), (HIGH, False)):
        stats = tmp_path / f"job-{gate_open}"
        stats.mkdir()
        with feeder(sample):
            run = harness("init", "launch-for", "0.3", "idle", "0.1", XCUDA_SHM_PATH=record,
                          XCUDA_STATS_DIR=str(stats), **PACING)
        assert run.returncode == 0, run.stderr
        rec = _record(stats)
        assert not rec.fallback and rec.gate_open is gate_open
        assert rec.launches == int(run.fields("launched")["n"])
        assert (rec.rate == 0.0) if gate_open else (0 < rec.rate < 1000.0), rec


def test_nothing_is_published_without_the_variable_and_a_bad_one_is_said(harness, tmp_path) -> None:
    run = harness("init", "launch", "10", "idle", "0.1", **PACING)
    assert run.returncode == 0 and not [p for p in tmp_path.rglob("xcuda-*.stats")]
    run = harness("init", "launch", "10", "idle", "0.1", XCUDA_STATS_DIR="relative/dir", **PACING)
    assert run.returncode == 0 and "XCUDA_STATS_DIR='relative/dir': expected an absolute directory" in run.stderr
    missing = tmp_path / "gone"
    run = harness("init", "launch", "10", "idle", "0.1", XCUDA_STATS_DIR=str(missing), **PACING)
    assert run.returncode == 0 and "cannot publish counters" in run.stderr  # the job runs on


def test_a_damaged_record_is_refused() -> None:
    good = encode(XcudaStats(7, 1, False, True, 10, 2, 5, 0.0, 4, 8, None, 0))
    assert decode(good).mem_quota_bytes is None
    torn = bytearray(good)
    torn[48] ^= 1
    with pytest.raises(StatsRefused, match="checksum"):
        decode(bytes(torn))
    with pytest.raises(StatsRefused, match="mid-update"):
        decode(encode(XcudaStats(7, 1, False, True, 10, 2, 5, 0.0, 4, 8, None, 0), seq=3))
    with pytest.raises(StatsRefused, match="out of range"):
        decode(encode(XcudaStats(7, 1, False, True, 10, 20, 5, 0.0, 4, 8, None, 0)))  # more waits than launches
    with pytest.raises(StatsRefused):
        decode(good[:100])


def test_the_agent_reads_only_the_jobs_own_live_processes_records(tmp_path) -> None:
    """Root reading a user's directory: the record of a pid of the job, naming that pid, in the user's own file;
    a link, another pid's record under this pid's name, or a pid not of the job are left out."""
    uid = os.geteuid()
    top = tmp_path / "jobs"
    (top / "42").mkdir(parents=True)
    top.chmod(0o755)

    def put(name: str, pid: int) -> None:
        (top / "42" / name).write_bytes(encode(XcudaStats(pid, 1, False, True, 100 + pid, 0, 0, 0.0, 1, 1, None, 0)))

    put("xcuda-100.stats", 100)
    put("xcuda-101.stats", 999)          # claims another pid
    put("xcuda-102.stats", 102)          # not a process of the job
    (top / "42" / "xcuda-103.stats").symlink_to(top / "42" / "xcuda-100.stats")
    got = job_stats(top, 42, uid, [100, 101, 103])
    assert set(got) == {100} and got[100].launches == 200
    assert job_stats(top, 43, uid, [100]) == {}  # no directory yet
    with pytest.raises(StatsRefused, match="not its user's"):
        job_stats(top, 42, uid + 1, [100])
