"""The per-GPU record xCUDA reads for compute pacing (paper §4.1): writer and decoder.

The node agent writes one record per GPU, by default ``/dev/shm/muxflow-gpu-<index>``;
every offline process preloaded with xCUDA on that GPU reads it each control period.
The layout is ``src/xcuda_shm.h`` (128 bytes, little-endian)::

    off size type field
      0    8 u64  magic             b"MXFXCUDA"
      8    4 u32  version           1
     12    4 u32  record_size       128
     16    8 u64  seq               seqlock: odd while a write is in progress
     24    8 u64  checksum          FNV-1a 64 of bytes 32..127
     32    8 u64  timestamp_ns      CLOCK_MONOTONIC (time.monotonic_ns()) of the sample
     40    4 u32  gpu_index
     44    4 u32  flags             bit 0 (FLAG_INTEGRAL): u_sm_integral_s is published
     48    8 f64  u_sm              SM activity U_SM in [0, 1]
     56    8 f64  sm_clock_mhz      C_SM
     64    8 f64  clock_threshold_mhz  T_SM (0 = no clock information)
     72    8 f64  clock_max_mhz     C_H
     80    8 f64  target_util       target U_GPU (0 = the job's XCUDA_TARGET_UTIL)
     88    8 f64  sm_occupancy      informational
     96    8 f64  gpu_util          informational
    104    8 u64  mem_used_bytes    informational
    112    8 f64  u_sm_integral_s   running integral of U_SM over time, seconds (with FLAG_INTEGRAL)
    120    8      reserved, 0

The integral lets each reader take the mean U_SM over exactly the time since it last read
(xCUDA does, once per control period): the latest sample alone covers only the agent's own
sampling window, and a controller that reads one sample per period aliases with the job's
launch bursts. :class:`ShmWriter` keeps the integral itself: each sample's U_SM (the mean
over the window since the previous sample, as NVML's GPM metrics give it) times the time
since the previous write. A silence longer than ``MAX_INTEGRAL_GAP_S`` adds nothing; that is the reader's own
horizon (xCUDA's meter starts again from the latest sample after a longer one), so within it the integral is always
continuous — a stalled agent's next sample covers its stall, never reads as an idle GPU. A writer that opens a record
another wrote (a restarted agent) continues its integral.

Write protocol: seq += 1 (odd), payload, checksum, seq += 1 (even). Readers
accept a copy only when seq is even and unchanged and the checksum matches, so
a torn copy (Python gives no memory-ordering guarantee) is never used.

**Who can write it.** /dev/shm is world-writable: a user could plant the record's name
before the agent starts (a file of his, a symlink) and forge what other users' jobs pace
by. So the writer (the root agent) only ever writes a file it created itself, owned by
its uid, mode 0644, with no other name: a planted or damaged file is *replaced* (a fresh
file created under a random name with ``O_EXCL``, then renamed over it: never opened
for writing, symlinks never followed), and the directory must be one that no other user
can swap records in (:func:`check_record_dir`: not a symlink, owned by root or the
agent, not writable by group or others unless sticky, as /dev/shm is; likewise every
directory above it). In a sticky directory nobody but the owner (and root) can remove
or rename the agent's file once it is there. xCUDA's reader (``src/shm_read.c``) in turn
refuses a record that is a symlink, not a regular file, owned by anyone but root (or
the reader's own uid), or writable by group or others: it falls back as without one.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import secrets
import stat
import struct
import time
from dataclasses import dataclass, replace
from pathlib import Path

from scheduler_core.guard.xcuda_control import METER_MAX_GAP_NS

log = logging.getLogger(__name__)

MAGIC = int.from_bytes(b"MXFXCUDA", "little")
VERSION = 1
RECORD_SIZE = 128
PAYLOAD_OFFSET = 32
SEQ_OFFSET = 16

_HEADER = struct.Struct("<QII")        # magic, version, record_size at 0
_U64 = struct.Struct("<Q")             # seq at 16, checksum at 24
_PAYLOAD = struct.Struct("<QIIdddddddQd8x")  # bytes 32..127
assert _PAYLOAD.size == RECORD_SIZE - PAYLOAD_OFFSET

# Field name -> (offset, size), as in the C struct; checked against it by the tests.
LAYOUT = {
    "magic": (0, 8), "version": (8, 4), "record_size": (12, 4), "seq": (16, 8), "checksum": (24, 8),
    "timestamp_ns": (32, 8), "gpu_index": (40, 4), "flags": (44, 4), "u_sm": (48, 8),
    "sm_clock_mhz": (56, 8), "clock_threshold_mhz": (64, 8), "clock_max_mhz": (72, 8),
    "target_util": (80, 8), "sm_occupancy": (88, 8), "gpu_util": (96, 8), "mem_used_bytes": (104, 8),
    "u_sm_integral_s": (112, 8), "reserved": (120, 8),
}
FLAG_INTEGRAL = 1
MAX_INTEGRAL_GAP_S = METER_MAX_GAP_NS / 1e9


def default_path(gpu_index: int) -> Path:
    """Where xCUDA looks for GPU ``gpu_index``'s record unless XCUDA_SHM_PATH says otherwise."""
    return Path(f"/dev/shm/muxflow-gpu-{gpu_index}")


@dataclass(frozen=True)
class GpuSample:
    """One GPU's metrics as xCUDA needs them (Eq. 1-2 inputs) plus context for operators."""

    u_sm: float                      # SM activity, fraction of time SMs are busy
    sm_clock_mhz: float              # C_SM
    clock_threshold_mhz: float       # T_SM: the clock the online service gets alone
    clock_max_mhz: float             # C_H
    target_util: float = 0.0         # 0: each job's XCUDA_TARGET_UTIL
    sm_occupancy: float = 0.0
    gpu_util: float = 0.0
    mem_used_bytes: int = 0
    flags: int = 0
    u_sm_integral_s: float = 0.0     # with FLAG_INTEGRAL (the writer sets both)


def checksum(payload: bytes) -> int:
    """FNV-1a 64 of the payload bytes (32..127)."""
    h = 0xCBF29CE484222325
    for b in payload:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def encode_payload(sample: GpuSample, gpu_index: int, timestamp_ns: int) -> bytes:
    return _PAYLOAD.pack(timestamp_ns, gpu_index, sample.flags, sample.u_sm, sample.sm_clock_mhz,
                         sample.clock_threshold_mhz, sample.clock_max_mhz, sample.target_util,
                         sample.sm_occupancy, sample.gpu_util, sample.mem_used_bytes, sample.u_sm_integral_s)


def encode(sample: GpuSample, gpu_index: int, timestamp_ns: int, seq: int = 2) -> bytes:
    """A complete record as bytes (seq must be even: a finished write)."""
    payload = encode_payload(sample, gpu_index, timestamp_ns)
    return _HEADER.pack(MAGIC, VERSION, RECORD_SIZE) + _U64.pack(seq) + _U64.pack(checksum(payload)) + payload


@dataclass(frozen=True)
class Record:
    seq: int
    timestamp_ns: int
    gpu_index: int
    sample: GpuSample


def decode(buf: bytes) -> Record:
    """Parses and validates a record; ValueError says what is wrong with it."""
    if len(buf) < RECORD_SIZE:
        raise ValueError(f"record is {len(buf)} bytes, expected {RECORD_SIZE}")
    magic, version, size = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise ValueError(f"bad magic {magic:#x}")
    if version != VERSION or size < RECORD_SIZE:
        raise ValueError(f"unsupported version {version} / size {size}")
    seq = _U64.unpack_from(buf, SEQ_OFFSET)[0]
    if seq & 1:
        raise ValueError("record is mid-update (odd seq)")
    payload = bytes(buf[PAYLOAD_OFFSET:RECORD_SIZE])
    if _U64.unpack_from(buf, 24)[0] != checksum(payload):
        raise ValueError("checksum mismatch")
    ts, idx, flags, u_sm, c_sm, t_sm, c_h, target, occ, util, mem, integral = _PAYLOAD.unpack(payload)
    return Record(seq, ts, idx, GpuSample(u_sm, c_sm, t_sm, c_h, target, occ, util, mem, flags, integral))


class RecordPathError(PermissionError):
    """A record path the writer will not use: another user could swap or forge what is there."""


def _mode(st: os.stat_result) -> str:
    return oct(stat.S_IMODE(st.st_mode))


def check_record_dir(directory: str | os.PathLike[str]) -> Path:
    """The records' directory, resolved, if no other user can replace what is in it; RecordPathError says why not.

    The directory and every one above it must be owned by root or this process's uid and not writable by group or
    others — unless sticky (``/dev/shm``, ``/tmp``: there only an entry's owner can remove or rename it). The
    directory itself must not be a symbolic link (whoever controls the link controls the records)."""
    d = Path(directory)
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        raise RecordPathError(f"xCUDA record directory {d} does not exist") from None
    if stat.S_ISLNK(st.st_mode):
        raise RecordPathError(f"xCUDA record directory {d} is a symbolic link: refused (records go only in a real "
                              "directory of root's)")
    real = Path(os.path.realpath(d))
    me = os.geteuid()
    for p in (real, *real.parents):
        st = os.lstat(p)
        if not stat.S_ISDIR(st.st_mode):
            raise RecordPathError(f"xCUDA record directory {d}: {p} is not a directory")
        if st.st_uid not in (0, me):
            raise RecordPathError(f"xCUDA record directory {d}: {p} is owned by uid {st.st_uid}, not root or this "
                                  f"agent (uid {me}): its owner could replace the records")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            raise RecordPathError(f"xCUDA record directory {d}: {p} is writable by group or others without the "
                                  f"sticky bit (mode {_mode(st)}): anyone could replace the records")
    return real


def _trusted(st: os.stat_result) -> bool:
    """A record this writer may keep writing: a regular file of its uid, writable by nobody else, with one name."""
    return (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and st.st_nlink == 1)


def _what(st: os.stat_result | None, err: OSError | None) -> str:
    if st is None:
        return f"cannot be opened ({err.strerror if err is not None and err.strerror else err})"
    kind = "a regular file" if stat.S_ISREG(st.st_mode) else "not a regular file"
    return f"{kind} owned by uid {st.st_uid}, mode {_mode(st)}, {st.st_nlink} name(s)"


def open_record(path: str | os.PathLike[str], mode: int = 0o644) -> int:
    """A read-write descriptor of the record at ``path``, a file only this writer can write.

    The directory is checked (:func:`check_record_dir`); an existing record is kept only if it is this writer's
    own (a regular file of its uid, not writable by others, one name: readers that hold it keep reading it);
    anything else there — another user's file, a symlink, a FIFO, a second name of a file — is replaced by a
    fresh file, never written into. A directory in its place is refused."""
    path = Path(path)
    directory = check_record_dir(path.parent)
    target = directory / path.name
    mode &= ~0o022  # nobody else writes a record
    st: os.stat_result | None = None
    err: OSError | None = None
    try:
        fd = os.open(target, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        fd = -1
    except OSError as exc:  # a symlink (ELOOP), a directory, a file of root's while this agent is not root…
        fd, err = -1, exc
    else:
        st = os.fstat(fd)
        if _trusted(st):
            os.fchmod(fd, mode)
            return fd
        os.close(fd)
        fd = -1
    planted = st is not None or err is not None
    if err is not None and os.path.isdir(target) and not os.path.islink(target):
        raise RecordPathError(f"xCUDA record {target} is a directory (not this agent's record): remove it")
    for _ in range(8):
        tmp = directory / f".{path.name}.{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise RecordPathError(f"cannot create a fresh xCUDA record in {directory}")
    try:
        os.fchmod(fd, mode)  # readable by the jobs' users whatever the umask
        os.ftruncate(fd, RECORD_SIZE)
        os.rename(tmp, target)  # atomic: the name is never another's file, nor missing, for a reader
    except OSError as exc:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, IsADirectoryError | NotADirectoryError) or os.path.isdir(target):
            raise RecordPathError(f"xCUDA record {target} is a directory (not this agent's record): remove it") from exc
        if isinstance(exc, PermissionError):
            raise RecordPathError(f"xCUDA record {target} is not this agent's ({_what(st, err)}) and cannot be "
                                  f"replaced ({exc.strerror}): remove it, or run the agent as its owner") from exc
        raise
    if planted:
        log.warning("xCUDA record %s was not this agent's (%s): replaced by a fresh one", target, _what(st, err))
    return fd


class ShmWriter:
    """Owns one GPU's record file and updates it with the seqlock protocol.

    One writer per file (the node agent); any number of xCUDA readers. The file is one only this writer can write
    (:func:`open_record`): whatever another user planted at ``path`` is replaced, never written into.
    """

    def __init__(self, path: str | os.PathLike[str], gpu_index: int = 0, mode: int = 0o644):
        self.path = Path(path)
        self.gpu_index = gpu_index
        fd = open_record(self.path, mode)
        try:
            if os.fstat(fd).st_size < RECORD_SIZE:
                os.ftruncate(fd, RECORD_SIZE)
            self._map = mmap.mmap(fd, RECORD_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        seq = _U64.unpack_from(self._map, SEQ_OFFSET)[0]
        self._seq = seq + (seq & 1)  # a writer that died mid-update left it odd
        self._integral_s = 0.0
        self._last_ns: int | None = None
        try:  # a record another writer left (a restarted agent): its integral goes on from there
            prev = decode(bytes(self._map[:RECORD_SIZE]))
        except ValueError:
            prev = None
        if prev is not None and prev.sample.flags & FLAG_INTEGRAL and math.isfinite(prev.sample.u_sm_integral_s) \
                and prev.sample.u_sm_integral_s >= 0:
            self._integral_s, self._last_ns = prev.sample.u_sm_integral_s, prev.timestamp_ns
        _HEADER.pack_into(self._map, 0, MAGIC, VERSION, RECORD_SIZE)

    def write(self, sample: GpuSample, timestamp_ns: int | None = None) -> int:
        """Publishes ``sample`` (stamped now unless given); returns the new seq."""
        ts = time.monotonic_ns() if timestamp_ns is None else timestamp_ns
        if self._last_ns is not None and 0 < ts - self._last_ns <= MAX_INTEGRAL_GAP_S * 1e9 and math.isfinite(
                sample.u_sm):
            self._integral_s += min(max(sample.u_sm, 0.0), 1.0) * (ts - self._last_ns) / 1e9
        self._last_ns = ts
        sample = replace(sample, flags=sample.flags | FLAG_INTEGRAL, u_sm_integral_s=self._integral_s)
        payload = encode_payload(sample, self.gpu_index, ts)
        self._seq += 1
        _U64.pack_into(self._map, SEQ_OFFSET, self._seq)
        self._map[PAYLOAD_OFFSET:RECORD_SIZE] = payload
        _U64.pack_into(self._map, 24, checksum(payload))
        self._seq += 1
        _U64.pack_into(self._map, SEQ_OFFSET, self._seq)
        return self._seq

    def close(self) -> None:
        self._map.close()

    def __enter__(self) -> ShmWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
