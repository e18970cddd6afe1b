"""Long-running child processes for live tests: each in its own session, its output in a log file, and stopped
with its whole process group (SIGTERM, then SIGKILL after a grace period)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else "(no log)"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(proc: Proc, grace_s: float = 10.0) -> int | None:
    """SIGTERM to the process group, SIGKILL after ``grace_s``; the exit status of the leader."""
    pgid = proc.popen.pid  # start_new_session: the child leads its group
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return proc.popen.wait()
    deadline = time.monotonic() + grace_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        proc.popen.poll()  # reap the leader so that a zombie does not keep the group alive
        time.sleep(0.1)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
    return proc.popen.wait(timeout=30)


@dataclass
class Processes:
    """Processes started for one test, stopped (in reverse order) when the test ends."""

    log_dir: Path
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], *, env: dict | None = None, cwd: Path | None = None,
              user: str | None = None) -> Proc:
        """``user``: run as that account (its own uid and group, no other groups), as a service would."""
        log = self.log_dir / f"{name}.log"
        creds = {}
        if user is not None:
            import pwd

            pw = pwd.getpwnam(user)
            creds = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        with open(log, "wb") as fh:
            p = subprocess.Popen(list(argv), cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True, **creds)
        proc = Proc(name, p, log)
        self.procs.append(proc)
        return proc

    def dead(self) -> list[str]:
        """Names of processes that exited, with their status and log tail (for failure messages)."""
        return [f"{p.name} exited {p.popen.returncode}:\n{p.log_tail(1500)}" for p in self.procs if not p.alive()]

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            stop(p)


@contextmanager
def processes(log_dir: Path) -> Iterator[Processes]:
    ps = Processes(log_dir)
    try:
        yield ps
    finally:
        ps.stop_all()
