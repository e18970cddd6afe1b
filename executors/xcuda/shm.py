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
     44    4 u32  flags             reserved, 0
     48    8 f64  u_sm              SM activity U_SM in [0, 1]
     56    8 f64  sm_clock_mhz      C_SM
     64    8 f64  clock_threshold_mhz  T_SM (0 = no clock information)
     72    8 f64  clock_max_mhz     C_H
     80    8 f64  target_util       target U_GPU (0 = the job's XCUDA_TARGET_UTIL)
     88    8 f64  sm_occupancy      informational
     96    8 f64  gpu_util          informational
    104    8 u64  mem_used_bytes    informational
    112   16      reserved, 0

Write protocol: seq += 1 (odd), payload, checksum, seq += 1 (even). Readers
accept a copy only when seq is even and unchanged and the checksum matches, so
a torn copy (Python gives no memory-ordering guarantee) is never used.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

MAGIC = int.from_bytes(b"MXFXCUDA", "little")
VERSION = 1
RECORD_SIZE = 128
PAYLOAD_OFFSET = 32
SEQ_OFFSET = 16

_HEADER = struct.Struct("<QII")        # magic, version, record_size at 0
_U64 = struct.Struct("<Q")             # seq at 16, checksum at 24
_PAYLOAD = struct.Struct("<QIIdddddddQ16x")  # bytes 32..127
assert _PAYLOAD.size == RECORD_SIZE - PAYLOAD_OFFSET

# Field name -> (offset, size), as in the C struct; checked against it by the tests.
LAYOUT = {
    "magic": (0, 8), "version": (8, 4), "record_size": (12, 4), "seq": (16, 8), "checksum": (24, 8),
    "timestamp_ns": (32, 8), "gpu_index": (40, 4), "flags": (44, 4), "u_sm": (48, 8),
    "sm_clock_mhz": (56, 8), "clock_threshold_mhz": (64, 8), "clock_max_mhz": (72, 8),
    "target_util": (80, 8), "sm_occupancy": (88, 8), "gpu_util": (96, 8), "mem_used_bytes": (104, 8),
    "reserved": (112, 16),
}


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


def checksum(payload: bytes) -> int:
    """FNV-1a 64 of the payload bytes (32..127)."""
    h = 0xCBF29CE484222325
    for b in payload:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def encode_payload(sample: GpuSample, gpu_index: int, timestamp_ns: int) -> bytes:
    return _PAYLOAD.pack(timestamp_ns, gpu_index, sample.flags, sample.u_sm, sample.sm_clock_mhz,
                         sample.clock_threshold_mhz, sample.clock_max_mhz, sample.target_util,
                         sample.sm_occupancy, sample.gpu_util, sample.mem_used_bytes)


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
    ts, idx, flags, u_sm, c_sm, t_sm, c_h, target, occ, util, mem = _PAYLOAD.unpack(payload)
    return Record(seq, ts, idx, GpuSample(u_sm, c_sm, t_sm, c_h, target, occ, util, mem, flags))


class ShmWriter:
    """Owns one GPU's record file and updates it with the seqlock protocol.

    One writer per file (the node agent); any number of xCUDA readers.
    """

    def __init__(self, path: str | os.PathLike[str], gpu_index: int = 0, mode: int = 0o644):
        self.path = Path(path)
        self.gpu_index = gpu_index
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
        try:
            os.fchmod(fd, mode)  # readable by the jobs' users whatever the umask
            if os.fstat(fd).st_size < RECORD_SIZE:
                os.ftruncate(fd, RECORD_SIZE)
            self._map = mmap.mmap(fd, RECORD_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        seq = _U64.unpack_from(self._map, SEQ_OFFSET)[0]
        self._seq = seq + (seq & 1)  # a writer that died mid-update left it odd
        _HEADER.pack_into(self._map, 0, MAGIC, VERSION, RECORD_SIZE)

    def write(self, sample: GpuSample, timestamp_ns: int | None = None) -> int:
        """Publishes ``sample`` (stamped now unless given); returns the new seq."""
        ts = time.monotonic_ns() if timestamp_ns is None else timestamp_ns
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
