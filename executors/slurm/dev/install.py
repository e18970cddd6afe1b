"""Debian's Slurm and munge packages and the dev cluster's service user, installed when missing."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Callable

PACKAGES = ("slurm-wlm", "slurmrestd", "munge")
# Each binary the dev cluster runs, and the package that brings it.
BINARIES = {
    "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sinfo": "slurm-wlm", "scontrol": "slurm-wlm",
    "slurmrestd": "slurmrestd", "munged": "munge", "munge": "munge", "nsenter": "util-linux", "ip": "iproute2",
}
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class InstallError(RuntimeError):
    pass


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b, path=SBIN_PATH) is None]


def ensure_packages(echo: Callable[[str], None] = print) -> None:
    """Install Debian's ``slurm-wlm slurmrestd munge`` when a binary is missing (root and apt-get only)."""
    missing = missing_binaries()
    if not missing:
        return
    pkgs = sorted({BINARIES[b] for b in missing})
    hint = f"apt-get install -y {' '.join(pkgs)}"
    if os.geteuid() != 0:
        raise InstallError(f"missing {', '.join(missing)}; as root run `{hint}` (the dev cluster needs root)")
    if shutil.which("apt-get") is None:
        raise InstallError(f"missing {', '.join(missing)} and there is no apt-get; install {', '.join(pkgs)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    echo(f"installing {' '.join(pkgs)}")
    cmd = ["apt-get", "install", "-y", "-q", *pkgs]
    if subprocess.run(cmd, env=env, capture_output=True, text=True).returncode != 0:
        # The package lists may be missing or stale: refresh once and retry.
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True)
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise InstallError(f"`{' '.join(cmd)}` failed: {out.stderr.strip()[-500:]}")
    still = missing_binaries()
    if still:
        raise InstallError(f"still missing after install: {', '.join(still)}")


# Real non-root users for the tests of what a user can and cannot do to MuxFlow's jobs (two of them: the
# multi-user tests run an offline job and an online replica under different users).
JOB_USERS = ("mxuser1", "mxuser2")


def _ensure_user(name: str, useradd_flags: list[str]) -> pwd.struct_passwd:
    """User ``name``, created with ``useradd <flags>`` (no home directory) when missing; only root can create."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    if os.geteuid() != 0:
        raise InstallError(f"user {name!r} does not exist and only root can create it")
    out = subprocess.run(["useradd", *useradd_flags, "--no-create-home", "--home-dir", "/nonexistent", name],
                         capture_output=True, text=True)
    if out.returncode != 0 and "already exists" not in out.stderr:
        raise InstallError(f"useradd {name}: {out.stderr.strip()}")
    return pwd.getpwnam(name)


def ensure_job_user(name: str) -> pwd.struct_passwd:
    """A regular login user (own group, no home directory) that submits jobs like a site's users do."""
    return _ensure_user(name, ["--user-group", "--shell", "/bin/sh"])


def ensure_service_user(name: str) -> pwd.struct_passwd:
    """The unprivileged system user slurmctld and slurmrestd run as (created when missing)."""
    return _ensure_user(name, ["--system", "--shell", "/usr/sbin/nologin"])
