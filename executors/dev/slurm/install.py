"""Debian's Slurm, munge and MariaDB packages and the dev cluster's users, installed when missing."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

PACKAGES = ("slurm-wlm", "slurmrestd", "slurmdbd", "munge")
# Each binary the dev cluster runs, and the package that brings it.
BINARIES = {
    "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sinfo": "slurm-wlm", "scontrol": "slurm-wlm",
    "slurmrestd": "slurmrestd", "munged": "munge", "munge": "munge", "nsenter": "util-linux", "ip": "iproute2",
    "slurmdbd": "slurmdbd", "sacctmgr": "slurm-client",
}
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class InstallError(RuntimeError):
    pass


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b, path=SBIN_PATH) is None]


def _apt_install(pkgs: list[str], missing: list[str], echo: Callable[[str], None]) -> None:
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


def ensure_packages(echo: Callable[[str], None] = print) -> None:
    """Install Debian's ``slurm-wlm slurmrestd slurmdbd munge`` when a binary is missing (root and apt-get only)."""
    missing = missing_binaries()
    if not missing:
        return
    _apt_install(sorted({BINARIES[b] for b in missing}), missing, echo)
    still = missing_binaries()
    if still:
        raise InstallError(f"still missing after install: {', '.join(still)}")


# slurmdbd keeps the dev clusters' accounting in the host's MariaDB (one database per cluster); root reaches it on
# its unix socket without a password (Debian's default).
MARIADBD = Path("/usr/sbin/mariadbd")
MYSQL_RUN_DIR = Path("/run/mysqld")


def mariadb_up() -> bool:
    if shutil.which("mysqladmin", path=SBIN_PATH) is None:
        return False
    try:
        out = subprocess.run(["mysqladmin", "-uroot", "--connect-timeout=2", "ping"], capture_output=True,
                             text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0


def ensure_mariadb(echo: Callable[[str], None] = print, *, install: bool = True, timeout_s: float = 60.0) -> None:
    """The host's MariaDB answering ``mysqladmin ping``: installed (``mariadb-server``, with ``install``) and started
    (there is no systemd: ``start-stop-daemon``) when it is not."""
    if mariadb_up():
        return
    if not MARIADBD.exists() or shutil.which("mysqladmin", path=SBIN_PATH) is None:
        if not install:
            raise InstallError("MariaDB is not installed (slurmdbd keeps the dev cluster's accounting there); "
                               "as root run `apt-get install -y mariadb-server`")
        _apt_install(["mariadb-server"], ["mariadbd"], echo)
        if mariadb_up():  # the package's scripts may have started it
            return
    if os.geteuid() != 0:
        raise InstallError("MariaDB is not running and only root can start it")
    echo("starting MariaDB")
    try:
        mysql = pwd.getpwnam("mysql")
        MYSQL_RUN_DIR.mkdir(parents=True, exist_ok=True)
        os.chown(MYSQL_RUN_DIR, mysql.pw_uid, mysql.pw_gid)
    except KeyError:
        pass
    out = subprocess.run(["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", str(MARIADBD),
                          "--", "--user=mysql"], capture_output=True, text=True)
    if out.returncode != 0:
        raise InstallError(f"start-stop-daemon {MARIADBD}: {(out.stderr or out.stdout).strip()[-500:]}")
    deadline = time.monotonic() + timeout_s
    while not mariadb_up():
        if time.monotonic() >= deadline:
            raise InstallError(f"MariaDB did not answer `mysqladmin ping` within {timeout_s:.0f}s "
                               "(see /var/log/mysql/error.log)")
        time.sleep(0.2)


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
