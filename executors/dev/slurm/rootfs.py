"""A Slurm release other than the host's, in a Debian root file system the dev cluster runs its daemons in.

Debian 12 ships Slurm 22.05; sites run newer releases (Debian 13 "trixie" ships 24.11). ``ensure_rootfs``
builds a minimal trixie tree with Slurm, slurmrestd, slurmdbd and munge by ``debootstrap`` (Debian's packages,
nothing else), once: the tree is cached (``/var/cache/muxflow/slurm-<suite>``) and reused while its stamp names the
same packages. The dev cluster then starts each daemon and client command through ``chroot_exec.sh`` in a
mount namespace of its own, with the cluster's state directory and the repository bound at the same paths
(docs/SLURM.md "Slurm 24.11").
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

CACHE_ROOT = Path(os.environ.get("MUXFLOW_ROOTFS_CACHE", "/var/cache/muxflow"))
MIRROR = "http://deb.debian.org/debian"
CHROOT_EXEC = Path(__file__).resolve().with_name("chroot_exec.sh")
# What the daemons, the node scripts (bash; python3 with its standard library for the Prolog's plan verifier, which
# needs hmac and hashlib: python3-minimal has neither) and the tests' jobs need. A cached tree is rebuilt when this
# list changes (its stamp names the packages).
PACKAGES = ("slurm-wlm", "slurmrestd", "slurmdbd", "slurm-client", "slurm-wlm-jwt-plugin", "munge", "iproute2",
            "util-linux", "procps", "python3", "bash")


class RootfsError(RuntimeError):
    pass


@dataclass(frozen=True)
class SlurmRelease:
    """A Debian suite and the Slurm it ships: the REST plugins to load and where the tree lives."""

    suite: str
    slurm: str
    rest_plugins: str

    @property
    def path(self) -> Path:
        return CACHE_ROOT / f"slurm-{self.suite}"


# 24.11 loads its OpenAPI versions as data parsers behind one openapi/slurmctld plugin (v0.0.40 … v0.0.42).
TRIXIE = SlurmRelease("trixie", "24.11", "openapi/slurmctld")


def _stamp(release: SlurmRelease) -> str:
    return f"{release.suite} {' '.join(sorted(PACKAGES))}\n"


def rootfs_ready(release: SlurmRelease) -> bool:
    stamp = release.path / ".muxflow-rootfs"
    return stamp.exists() and stamp.read_text() == _stamp(release)


def ensure_rootfs(release: SlurmRelease = TRIXIE, echo: Callable[[str], None] = print) -> Path:
    """The release's root file system, built by debootstrap when missing or stale (root only; ~1 min)."""
    if rootfs_ready(release):
        return release.path
    if os.geteuid() != 0:
        raise RootfsError(f"no Slurm {release.slurm} tree at {release.path}; building it needs root")
    if shutil.which("debootstrap") is None:
        echo("installing debootstrap")
        out = subprocess.run(["apt-get", "install", "-y", "-q", "debootstrap"], capture_output=True, text=True,
                             env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if out.returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True)
            out = subprocess.run(["apt-get", "install", "-y", "-q", "debootstrap"], capture_output=True, text=True,
                                 env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if out.returncode != 0:
            raise RootfsError(f"apt-get install debootstrap: {out.stderr.strip()[-500:]}")
    release.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = release.path.with_name(f".{release.path.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    echo(f"building a Debian {release.suite} tree with Slurm {release.slurm} in {release.path} (debootstrap)")
    out = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", release.suite,
                          str(tmp), MIRROR], capture_output=True, text=True)
    if out.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RootfsError(f"debootstrap {release.suite}: {(out.stderr or out.stdout).strip()[-800:]}")
    (tmp / ".muxflow-rootfs").write_text(_stamp(release))
    if release.path.exists():
        shutil.rmtree(release.path)
    os.replace(tmp, release.path)
    return release.path


def sync_users(root: Path, names: Iterable[str]) -> None:
    """The host's users (and their primary groups) in the tree's passwd/group, same ids: jobs, SlurmUser,
    slurmrestd and munge files are owned by the host's ids."""
    passwd, group = root / "etc" / "passwd", root / "etc" / "group"
    have_users = {line.split(":", 1)[0] for line in passwd.read_text().splitlines()}
    have_groups = {line.split(":", 1)[0] for line in group.read_text().splitlines()}
    add_users, add_groups = [], []
    for name in names:
        pw = pwd.getpwnam(name)
        if name not in have_users:
            add_users.append(f"{pw.pw_name}:x:{pw.pw_uid}:{pw.pw_gid}:{pw.pw_gecos}:{pw.pw_dir}:{pw.pw_shell}")
        gr = grp.getgrgid(pw.pw_gid)
        if gr.gr_name not in have_groups:
            add_groups.append(f"{gr.gr_name}:x:{gr.gr_gid}:")
            have_groups.add(gr.gr_name)
    if add_users:
        with passwd.open("a") as f:
            f.write("".join(line + "\n" for line in add_users))
    if add_groups:
        with group.open("a") as f:
            f.write("".join(line + "\n" for line in add_groups))


def wrap(root: Path | None, binds: Iterable[Path], argv: list[str]) -> list[str]:
    """``argv`` run inside ``root`` (unchanged without one)."""
    if root is None:
        return list(argv)
    return [str(CHROOT_EXEC), str(root), *[str(b) for b in binds], "--", *argv]
