"""Atomic, verifiable checkpoints (docs/DESIGN.md §3 step 9).

A checkpoint is one file ``ckpt-<step:012d>.mxck``: a header (magic, format
version, step, payload length, SHA-256 of the payload) and the pickled state.
It is written to a temporary name in the same directory, flushed and fsynced,
then renamed into place and the directory fsynced: a reader sees a whole
checkpoint or none. Loading verifies the header and the checksum and never
returns a corrupt one; :meth:`CheckpointStore.latest` falls back to the newest
valid checkpoint. The newest ``keep`` valid ones are kept.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import re
import struct
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAGIC = b"MXCKPT01"
_HEADER = struct.Struct(">8sQQ32s")  # magic, step, payload length, sha256
NAME = re.compile(r"^ckpt-(\d{12})\.mxck$")


class CorruptCheckpoint(ValueError):
    """A checkpoint file that is truncated, altered or not a checkpoint."""


class CheckpointStore:
    def __init__(self, directory: str | os.PathLike[str], keep: int = 2):
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.dir = Path(directory)
        self.keep = keep

    def path(self, step: int) -> Path:
        return self.dir / f"ckpt-{int(step):012d}.mxck"

    def save(self, step: int, state: Any) -> Path:
        """Write the checkpoint of ``step`` atomically; prune older ones beyond ``keep``."""
        if step < 0:
            raise ValueError("step must be >= 0")
        self.dir.mkdir(parents=True, exist_ok=True)
        payload = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        header = _HEADER.pack(MAGIC, int(step), len(payload), hashlib.sha256(payload).digest())
        final = self.path(step)
        tmp = self.dir / f".{final.name}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self._prune()
        return final

    def load(self, path: Path) -> tuple[int, Any]:
        data = Path(path).read_bytes()
        if len(data) < _HEADER.size:
            raise CorruptCheckpoint(f"{path}: truncated header ({len(data)} bytes)")
        magic, step, length, digest = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise CorruptCheckpoint(f"{path}: not a MuxFlow checkpoint")
        payload = data[_HEADER.size:]
        if len(payload) != length:
            raise CorruptCheckpoint(f"{path}: payload is {len(payload)} bytes, header says {length}")
        if hashlib.sha256(payload).digest() != digest:
            raise CorruptCheckpoint(f"{path}: checksum mismatch")
        m = NAME.match(Path(path).name)
        if m and int(m.group(1)) != step:
            raise CorruptCheckpoint(f"{path}: file name says step {int(m.group(1))}, header {step}")
        try:
            return step, pickle.loads(payload)
        except Exception as exc:  # checksum ok but unreadable: treat as corrupt
            raise CorruptCheckpoint(f"{path}: cannot unpickle: {exc}") from exc

    def candidates(self) -> list[Path]:
        """Checkpoint files, newest step first (temporary files are never candidates)."""
        if not self.dir.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.dir.iterdir() if (m := NAME.match(p.name))]
        return [p for _, p in sorted(found, reverse=True)]

    def newest_step(self) -> int | None:
        """The step of the newest checkpoint file, by its name, without reading it (progress reports)."""
        for p in self.candidates():
            return int(NAME.match(p.name).group(1))
        return None

    def latest(self) -> tuple[int, Any] | None:
        """The newest valid checkpoint as (step, state); corrupt ones are skipped with a warning."""
        for p in self.candidates():
            try:
                return self.load(p)
            except (CorruptCheckpoint, OSError) as exc:
                log.warning("skipping corrupt checkpoint: %s", exc)
        return None

    def _prune(self) -> None:
        valid = 0
        for p in self.candidates():
            if valid >= self.keep:
                p.unlink(missing_ok=True)
                continue
            try:
                self.load(p)
                valid += 1
            except (CorruptCheckpoint, OSError):
                pass  # left for inspection; never loaded
        for p in self.dir.glob(".ckpt-*.tmp.*"):  # leftovers of writers killed mid-save
            try:
                pid = int(p.name.rsplit(".", 1)[1])
            except ValueError:
                continue
            if pid != os.getpid() and not _alive(pid):
                p.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
