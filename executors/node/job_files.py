"""Reading what a job writes into its own directory on the node (``<job dir>/<Slurm job id>/``, made by the Prolog:
a directory of the job's user inside a root-owned one), as the root agent must read user input: the top directory
the agent's alone, the job's directory and each file the job user's own, no link followed anywhere (every open is
relative to an open directory, ``O_NOFOLLOW``), only regular files, of bounded size. Used for the iteration report
(executors.node.profile_windows) and xCUDA's counters (executors.node.xcuda.stats)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class JobFileRefused(ValueError):
    """What the job wrote, or where, is not what the agent reads; the message says why."""


@contextmanager
def job_directory(job_dir: Path, slurm_job_id: int, uid: int | None) -> Iterator[int | None]:
    """An open descriptor of the job's directory (None: there is none yet); :class:`JobFileRefused`."""
    if uid is None:
        raise JobFileRefused("the job's user is unknown on this node")
    try:
        top = os.open(job_dir, DIR_FLAGS)
    except OSError as exc:
        raise JobFileRefused(f"job directory {job_dir}: {exc.strerror}") from None
    try:
        st = os.fstat(top)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise JobFileRefused(f"job directory {job_dir} is not the agent's alone")
        try:
            d = os.open(str(int(slurm_job_id)), DIR_FLAGS, dir_fd=top)
        except FileNotFoundError:
            yield None
            return
        except OSError as exc:
            raise JobFileRefused(f"the job's directory: {exc.strerror}") from None
        try:
            if os.fstat(d).st_uid != uid:
                raise JobFileRefused("the job's directory is not its user's")
            yield d
        finally:
            os.close(d)
    finally:
        os.close(top)


def read_job_file(d: int, name: str, uid: int, max_bytes: int) -> bytes | None:
    """The whole of ``name`` in the open job directory ``d`` (None: no such file); :class:`JobFileRefused`."""
    try:
        f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=d)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JobFileRefused(f"{name}: {exc.strerror}") from None
    try:
        fs = os.fstat(f)
        if not stat.S_ISREG(fs.st_mode):
            raise JobFileRefused(f"{name} is not a regular file")
        if fs.st_uid != uid:
            raise JobFileRefused(f"{name} is not the job user's")
        if fs.st_size > max_bytes:
            raise JobFileRefused(f"{name} is {fs.st_size} bytes (at most {max_bytes})")
        return os.pread(f, max_bytes + 1, 0)
    finally:
        os.close(f)
