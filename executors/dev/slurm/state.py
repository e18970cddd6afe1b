"""The dev cluster's files: a fresh state directory with configuration and keys, MuxFlow's credentials, log tails."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import shutil
import stat
import time
from pathlib import Path

from executors.dev.slurm.layout import DevClusterLayout
from executors.slurm.jwt import mint_hs256, unverified_claims
from executors.slurm.plan import KEY_BYTES, new_key, write_key

TOKEN_LIFESPAN_S = 30 * 24 * 3600
TOKEN_RENEW_S = 24 * 3600  # a token with less than this left is replaced


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no such file)"
    return "\n".join(text.splitlines()[-lines:])


def prepare_state(layout: DevClusterLayout, uid: int, gid: int, rest_ids: tuple[int, int] | None = None,
                  storage_pass: str | None = None) -> None:
    """New configuration and empty state (keys are kept across restarts). ``rest_ids``: slurmrestd's uid and gid
    where it is not the service user's; ``storage_pass``: the password of the cluster's database user, which goes
    into slurmdbd.conf (SlurmUser's, 0600), for a layout with slurmdbd."""
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(layout.state_dir, 0o755)
    for d in (layout.ctld_dir, layout.spool_root, layout.log_dir, layout.run_dir, layout.rest_dir,
              layout.jobs_dir, layout.etc_dir, layout.gpu_dir, layout.plan_dir, layout.mps_pipe_root,
              layout.job_state_dir):
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
    if layout.accounting:
        if not storage_pass:
            raise ValueError("a layout with slurmdbd needs the database password")
        fd = os.open(layout.slurmdbd_conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchown(f.fileno(), uid, gid)  # slurmdbd refuses a file not SlurmUser's or open to others
            f.write(layout.render_slurmdbd_conf(storage_pass))
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


# -- MuxFlow's credentials ----------------------------------------------------------------------------------------

def _token_ok(path: Path, key: bytes, user: str, now: float) -> bool:
    """A token in ``path`` for ``user``, signed with ``key`` and valid for more than a day."""
    try:
        text = _read_nofollow(path).decode("ascii").strip()
        claims = unverified_claims(text)
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    head, _, sig = text.rpartition(".")
    good = base64.urlsafe_b64encode(hmac.new(key, head.encode("ascii"), hashlib.sha256).digest()).rstrip(b"=")
    return (hmac.compare_digest(good, sig.encode("ascii")) and claims.get("sun") == user
            and isinstance(claims.get("exp"), int) and claims["exp"] - now > TOKEN_RENEW_S)


def _read_nofollow(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a regular file")
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def _owned_private(path: Path, uid: int, gid: int) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == uid and st.st_gid == gid and stat.S_IMODE(st.st_mode) == 0o600


def _write_private(path: Path, text: str, uid: int, gid: int) -> None:
    """``text`` into ``path`` (0600, ``uid``:``gid``), replaced atomically; links planted there are replaced, not
    followed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchown(fd, uid, gid)
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _key_in(path: Path) -> bytes | None:
    """The plan key in ``path`` whoever owns it (root reads MuxFlow's copy), or None when missing or unusable."""
    try:
        key = bytes.fromhex(_read_nofollow(path).decode("ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return key if len(key) >= KEY_BYTES else None


def ensure_credentials(layout: DevClusterLayout, muxflow_ids: tuple[int, int], users: tuple[str, str],
                       now: float | None = None, node_ids: tuple[int, int] = (0, 0)) -> list[str]:
    """MuxFlow's files under ``<state>/muxflow`` (its account's, 0700), each written only when missing, expiring
    within a day, or not owned and moded as it should be; what was written.

    - ``slurm.jwt``: a token for MuxFlow's account (``users[0]``), 30 days;
    - ``reference.jwt``: a token for the reference workloads' account (``users[1]``);
    - ``plan.key``: the plan-signing key, and the nodes' copy ``etc/plan.key`` (root's): the same key, the one
      already there when either exists (the nodes' copy wins when both do and differ); ``node_ids``: its owner.
    """
    uid, gid = muxflow_ids
    now = time.time() if now is None else now
    written: list[str] = []
    d = layout.muxflow_dir
    try:
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode):
            d.unlink()
            raise FileNotFoundError
    except FileNotFoundError:
        d.mkdir(mode=0o700)
        st = os.lstat(d)
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(d, uid, gid, follow_symlinks=False)
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(d, 0o700)
    jwt_key = layout.jwt_key.read_bytes()
    for path, user in ((layout.muxflow_jwt_file, users[0]), (layout.reference_jwt_file, users[1])):
        if _token_ok(path, jwt_key, user, now) and _owned_private(path, uid, gid):
            continue
        token = mint_hs256(jwt_key, user, issued_at_s=int(now), lifespan_s=TOKEN_LIFESPAN_S)
        _write_private(path, token + "\n", uid, gid)
        written.append(str(path))
    node_key, own_key = _key_in(layout.node_plan_key_file), _key_in(layout.plan_key_file)
    key = node_key or own_key or new_key()
    for path, have, ids in ((layout.plan_key_file, own_key, (uid, gid)),
                            (layout.node_plan_key_file, node_key, node_ids)):
        if have != key or not _owned_private(path, *ids):
            Path(f"{path}.{os.getpid()}.tmp").unlink(missing_ok=True)  # write_key's temporary file, left by a crash
            write_key(path, key, *ids)
            written.append(str(path))
    return written
