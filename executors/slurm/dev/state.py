"""The dev cluster's files: a fresh state directory with configuration and keys, and log tails."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from executors.slurm.dev.layout import DevClusterLayout


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no such file)"
    return "\n".join(text.splitlines()[-lines:])


def prepare_state(layout: DevClusterLayout, uid: int, gid: int, rest_ids: tuple[int, int] | None = None) -> None:
    """New configuration and empty state (keys are kept across restarts). ``rest_ids``: slurmrestd's uid and gid
    where it is not the service user's."""
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(layout.state_dir, 0o755)
    for d in (layout.ctld_dir, layout.spool_root, layout.log_dir, layout.run_dir, layout.rest_dir,
              layout.jobs_dir, layout.etc_dir, layout.gpu_dir, layout.plan_dir, layout.mps_pipe_root):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        os.chmod(d, 0o755)
    for d in (layout.ctld_dir, layout.log_dir, layout.run_dir, layout.rest_dir):
        os.chown(d, uid, gid)
    if rest_ids is not None:
        os.chown(layout.rest_dir, *rest_ids)
    os.chmod(layout.jobs_dir, 0o1777)
    for node in layout.nodes:
        (layout.spool_root / node.name).mkdir()
        for f in layout.gpu_files(node):
            f.touch()
    layout.slurm_conf.write_text(layout.render_slurm_conf())
    layout.gres_conf.write_text(layout.render_gres_conf())
    # munged insists on a key only its owner can read, in a directory others
    # can traverse (for the socket) but not write.
    layout.munge_dir.mkdir(exist_ok=True)
    os.chmod(layout.munge_dir, 0o755)
    if not layout.munge_key.exists():
        fd = os.open(layout.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(1024))
    layout.jwt_dir.mkdir(exist_ok=True)
    os.chmod(layout.jwt_dir, 0o700)
    if not layout.jwt_key.exists():
        fd = os.open(layout.jwt_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
    os.chown(layout.jwt_dir, uid, gid)
    os.chown(layout.jwt_key, uid, gid)
    layout.pid_dir.mkdir(parents=True, exist_ok=True)
    tmp = layout.layout_file.with_suffix(".tmp")
    tmp.write_text(layout.to_json())
    tmp.replace(layout.layout_file)
