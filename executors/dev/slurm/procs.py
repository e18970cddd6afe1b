"""Daemons started, found and stopped by PID — never by name.

Each daemon runs in the foreground of a process we start ourselves, so the PID
we record is the daemon's. A record also keeps the process's start time (from
``/proc/<pid>/stat``) so a recycled PID is never mistaken for our daemon.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    head, _, tail = raw.rpartition(")")
    if not head:
        return None
    return tail.split()  # tail[0] is the state (field 3)


def start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def is_running(pid: int, ticks: int | None = None) -> bool:
    """Alive, not a zombie, and (when ``ticks`` is given) the same process we started."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        _reap(pid)
        return False
    return ticks is None or int(fields[19]) == ticks


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def parent_pid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for p in all_pids():
        pp = parent_pid(p)
        if pp is not None:
            children.setdefault(pp, []).append(p)
    out, todo = [], list(children.get(pid, []))
    while todo:
        c = todo.pop()
        out.append(c)
        todo += children.get(c, [])
    return out


@dataclass(frozen=True)
class ProcRecord:
    name: str
    pid: int
    start_ticks: int | None
    argv: list[str]
    log: str

    def running(self) -> bool:
        return is_running(self.pid, self.start_ticks)


class ProcTable:
    """The PID records of one dev cluster, one JSON file per daemon."""

    def __init__(self, pid_dir: Path):
        self.pid_dir = Path(pid_dir)

    def path(self, name: str) -> Path:
        return self.pid_dir / f"{name}.json"

    def get(self, name: str) -> ProcRecord | None:
        try:
            return ProcRecord(**json.loads(self.path(name).read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return None

    def all(self) -> list[ProcRecord]:
        if not self.pid_dir.is_dir():
            return []
        records = []
        for p in sorted(self.pid_dir.glob("*.json")):
            rec = self.get(p.stem)
            if rec is not None:
                records.append(rec)
        return records

    def put(self, rec: ProcRecord) -> None:
        self.pid_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path(rec.name).with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(rec), indent=1) + "\n")
        tmp.replace(self.path(rec.name))

    def drop(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)

    def start(self, name: str, argv: Sequence[str], *, log: Path, env: Mapping[str, str], cwd: Path) -> ProcRecord:
        """Start ``argv`` detached (own session, stdio to ``log``) and record its PID."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=dict(env), cwd=cwd, start_new_session=True, close_fds=True)
        rec = ProcRecord(name=name, pid=proc.pid, start_ticks=start_ticks(proc.pid), argv=list(argv), log=str(log))
        self.put(rec)
        return rec


def signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_gone(pids: Iterable[int], deadline_s: float, poll_s: float = 0.05) -> list[int]:
    """Wait until none of ``pids`` runs or the deadline passes; the ones still running."""
    pending = list(pids)
    end = time.monotonic() + deadline_s
    while True:
        pending = [p for p in pending if is_running(p)]
        if not pending or time.monotonic() >= end:
            return pending
        time.sleep(poll_s)


def wait_reaped(pids: Iterable[int], deadline_s: float, poll_s: float = 0.05) -> None:
    """Give the reaper (init, for daemons we detached) a moment to remove zombies from ``ps``."""
    pending = list(pids)
    end = time.monotonic() + deadline_s
    while pending and time.monotonic() < end:
        for pid in pending:
            _reap(pid)
        pending = [p for p in pending if Path(f"/proc/{p}").exists()]
        if pending:
            time.sleep(poll_s)


def terminate(pids: Iterable[int], grace_s: float) -> list[int]:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL what is left; the PIDs that survived even that."""
    pids = [p for p in pids if is_running(p)]
    if not pids:
        return []
    signal_pids(pids, signal.SIGTERM)
    left = wait_gone(pids, grace_s)
    if left:
        signal_pids(left, signal.SIGKILL)
        left = wait_gone(left, 5.0)
    return left
