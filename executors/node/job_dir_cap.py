"""A bound on what a job writes into its own directory on the node (``<job dir>/<Slurm job id>/``, made by the Prolog,
the job user's): the job-state directory sits on a tmpfs (``/run``, or the small one a site mounts for it,
docs/DEPLOY.md), and a job that fills it would take the node's ``/run`` with it. The job needs a few small files
there (its iteration report, xCUDA's counters: kilobytes); a placed job or profiling window whose directory holds more
than ``cap_bytes`` (allocated blocks, every file below it; or more than ``max_entries`` entries) is evicted (requeued
and held, as any eviction), once, with the reason. The Epilog removes the directory when the job ends.

Only names are listed and ``lstat``-ed (no link followed, nothing read), at most ``max_entries`` per job."""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CAP_BYTES = 8 * 1024**2
MAX_ENTRIES = 1000


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def dir_usage(path: Path, max_entries: int = MAX_ENTRIES) -> tuple[int, int]:
    """(allocated bytes, entries) below ``path``, links not followed; counting stops past ``max_entries``.

    Every directory is opened relative to its parent's descriptor with ``O_NOFOLLOW``: the job may swap a
    subdirectory for a link to one of root's between the listing and the descent, and root's walk must not follow
    it there (its sizes would then show in the eviction reason)."""
    used, entries = 0, 0
    try:
        todo = [os.open(os.fspath(path), _DIR_FLAGS)]
    except OSError:
        return 0, 0
    try:
        while todo and entries <= max_entries:
            fd = todo.pop()
            try:
                names = []
                with os.scandir(fd) as it:
                    for e in it:
                        entries += 1
                        if entries > max_entries:
                            break
                        try:
                            st = e.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        used += st.st_blocks * 512
                        if stat.S_ISDIR(st.st_mode):
                            names.append(e.name)
                for name in names:
                    try:
                        todo.append(os.open(name, _DIR_FLAGS, dir_fd=fd))
                    except OSError:  # gone, or swapped for a link: not followed
                        continue
            finally:
                os.close(fd)
    finally:
        for fd in todo:
            os.close(fd)
    return used, entries


@dataclass(frozen=True)
class OverCap:
    gpu_index: int
    job_id: int | None
    slurm_job_id: int
    reason: str


class JobDirCap:
    """``jobs()``: (GPU index, store job id, Slurm job id) of each job placed on the node now."""

    def __init__(self, job_dir: Path | str, jobs: Callable[[], list[tuple[int, int | None, int]]],
                 cap_bytes: int = CAP_BYTES, max_entries: int = MAX_ENTRIES):
        self.job_dir = Path(job_dir)
        self.jobs = jobs
        self.cap_bytes = cap_bytes
        self.max_entries = max_entries
        self._done: set[int] = set()

    def once(self) -> list[OverCap]:
        out = []
        running = self.jobs()
        for gpu, job_id, sid in running:
            if sid in self._done:
                continue
            d = self.job_dir / str(sid)
            if not d.is_dir() or d.is_symlink():
                continue
            used, entries = dir_usage(d, self.max_entries)
            if used > self.cap_bytes or entries > self.max_entries:
                self._done.add(sid)
                what = f"more than {self.max_entries} entries" if entries > self.max_entries else \
                    f"{used / 1024**2:.1f} MiB"
                out.append(OverCap(gpu, job_id, sid, f"job directory {d} holds {what} (at most "
                                                     f"{self.cap_bytes / 1024**2:g} MiB): it would fill the node's "
                                                     "job-state file system"))
        self._done &= {sid for _, _, sid in running}
        return out


class JobDirCapThread:
    """:meth:`JobDirCap.once` every ``interval_s``, each job over the cap handed to ``evict``."""

    def __init__(self, cap: JobDirCap, evict: Callable[[OverCap], None], interval_s: float = 5.0):
        self.cap, self.evict, self.interval_s = cap, evict, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="job-dir-cap", daemon=True)

    def start(self) -> JobDirCapThread:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                for over in self.cap.once():
                    log.error("Slurm job %d on GPU %d: %s: evicting it", over.slurm_job_id, over.gpu_index,
                              over.reason)
                    self.evict(over)
            except Exception:  # a bad directory read must not end the bound
                log.exception("job directory check failed; trying again")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
