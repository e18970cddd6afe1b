"""The per-process counters xCUDA publishes (``XCUDA_STATS_DIR``), read by the node agent for its Prometheus endpoint.

Each process preloaded with xCUDA whose environment names ``XCUDA_STATS_DIR`` (the TaskProlog sets the job's own
directory, ``<job dir>/<Slurm job id>``) keeps ``xcuda-<pid>.stats`` there: 128 bytes, little-endian, rewritten by
its pacing controller thread once per control period (``src/xcuda_stats.h``; the launch path writes nothing more
than before)::

    off size type field
      0    8 u64  magic            b"MXFXSTAT"
      8    4 u32  version          1
     12    4 u32  record_size      128
     16    8 u64  seq              seqlock: odd while a write is in progress
     24    8 u64  checksum         FNV-1a 64 of bytes 32..127
     32    8 u64  timestamp_ns     CLOCK_MONOTONIC of the update
     40    4 u32  pid
     44    4 u32  flags            bit 0: fallback pacing (no usable GPU record); bit 1: gate open
     48    8 u64  launches         launches through the gate
     56    8 u64  waits            launches that waited at the gate
     64    8 u64  waited_ns        total time launches waited
     72    8 f64  rate             paced launch rate, launches/s (0: the gate is open)
     80    8 u64  mem_used_bytes   memory charged to the quota now
     88    8 u64  mem_peak_bytes
     96    8 u64  mem_quota_bytes  (2**64-1: none; 0: not resolved yet)
    104    8 u64  mem_refused      allocations the quota refused
    112   16      reserved

**It is user input.** The job's user can write anything there. The agent reads a record only through
:mod:`executors.node.job_files` (the job user's own regular file in the job user's own directory, no link), only
for a pid that is a live process of that job running as its user, and only when the record names that same pid,
is whole (even seq, matching checksum) and its numbers are in range. What a user can forge this way is what their
own job's series show, nothing else.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from executors.node.job_files import JobFileRefused, job_directory, read_job_file
from executors.node.xcuda.shm import checksum  # the GPU record's FNV-1a 64

MAGIC = int.from_bytes(b"MXFXSTAT", "little")
VERSION = 1
SIZE = 128
_LAYOUT = struct.Struct("<QIIQQQIIQQQdQQQQ16s")
assert _LAYOUT.size == SIZE
FLAG_FALLBACK, FLAG_OPEN = 1, 2
NO_QUOTA = 2**64 - 1


class StatsRefused(ValueError):
    """A record the agent does not use; the message says why."""


@dataclass(frozen=True)
class XcudaStats:
    pid: int
    timestamp_ns: int
    fallback: bool
    gate_open: bool
    launches: int
    waits: int
    waited_ns: int
    rate: float
    mem_used_bytes: int
    mem_peak_bytes: int
    mem_quota_bytes: int | None     # None: no quota
    mem_refused: int


def decode(buf: bytes) -> XcudaStats:
    if len(buf) != SIZE:
        raise StatsRefused(f"{len(buf)} bytes, not {SIZE}")
    (magic, version, size, seq, chk, ts, pid, flags, launches, waits, waited, rate, used, peak, quota,
     refused, _) = _LAYOUT.unpack(buf)
    if magic != MAGIC:
        raise StatsRefused("bad magic")
    if version != VERSION or size != SIZE:
        raise StatsRefused(f"unsupported version {version} (size {size})")
    if seq & 1:
        raise StatsRefused("mid-update")
    if chk != checksum(buf[32:]):
        raise StatsRefused("checksum mismatch")
    if not (math.isfinite(rate) and 0.0 <= rate <= 1e12) or flags & ~(FLAG_FALLBACK | FLAG_OPEN) or \
            used > peak or waits > launches:
        raise StatsRefused("values out of range")
    return XcudaStats(pid, ts, bool(flags & FLAG_FALLBACK), bool(flags & FLAG_OPEN), launches, waits, waited, rate,
                      used, peak, None if quota == NO_QUOTA else quota, refused)


def job_stats(job_dir: Path, slurm_job_id: int, uid: int | None, pids: Iterable[int],
              attempts: int = 4) -> dict[int, XcudaStats]:
    """pid → the record of each of ``pids`` (the job's live processes, as its user) that publishes one; a record
    mid-update is read again (``attempts`` times). :class:`StatsRefused` for a job directory the agent does not
    read; a single bad record is left out."""
    out: dict[int, XcudaStats] = {}
    try:
        with job_directory(job_dir, slurm_job_id, uid) as d:
            if d is None:
                return out
            for pid in sorted(set(pids)):
                name = f"xcuda-{int(pid)}.stats"
                for _ in range(attempts):
                    try:
                        data = read_job_file(d, name, uid, SIZE)
                    except JobFileRefused:
                        break  # a link, another user's file, too large: reading it again changes nothing
                    if data is None:
                        break
                    try:
                        rec = decode(data)
                    except StatsRefused:
                        continue  # torn or mid-update: read again
                    if rec.pid == pid:
                        out[pid] = rec
                    break
    except JobFileRefused as exc:
        raise StatsRefused(str(exc)) from None
    return out


def encode(rec: XcudaStats, seq: int = 2) -> bytes:
    """A record as xCUDA writes it (tests, and tools that fake a process)."""
    quota = NO_QUOTA if rec.mem_quota_bytes is None else rec.mem_quota_bytes
    flags = (FLAG_FALLBACK if rec.fallback else 0) | (FLAG_OPEN if rec.gate_open else 0)
    body = _LAYOUT.pack(MAGIC, VERSION, SIZE, seq, 0, rec.timestamp_ns, rec.pid, flags, rec.launches, rec.waits,
                        rec.waited_ns, rec.rate, rec.mem_used_bytes, rec.mem_peak_bytes, quota, rec.mem_refused,
                        bytes(16))
    return body[:24] + struct.pack("<Q", checksum(body[32:])) + body[32:]
