"""Error detector for the 1% of MPS error propagation that graceful exit cannot cover (paper §4.2).

Patterns: a fatal XID (31 = GPU memory page fault, and the others in ``FATAL_XIDS``), an
MPS server crash (a server process gone while its clients still run), and an MPS hang (a
probe client does not answer within its timeout). Each fault leads to: evict offline work, reset the MPS
server, hold the GPU in Init until a probe answers again, record a device error. XIDs in
``DISABLING_XIDS`` (the GPU fell off the bus) disable the GPU instead: a reset cannot help.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from executors.node.sampler import XidEvent

log = logging.getLogger(__name__)

# NVIDIA's XID catalogue: 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped
# processing, 45 preemptive cleanup, 48 double-bit ECC, 61/62 internal micro-controller, 63/64 ECC
# page retirement, 68 video processor, 69 graphics engine class error, 74 NVLink, 79 fell off the
# bus, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP.
FATAL_XIDS = frozenset({13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120})
DISABLING_XIDS = frozenset({79})


# The node scripts' @MPS_PIPE_ROOT@: one control daemon per GPU, its pipes in <root>/gpu<i> and its log in
# <root>/gpu<i>.log, both made by the Prolog, root's alone (docs/SLURM.md "Hard caps").
DEFAULT_PIPE_ROOT = "/run/muxflow/mps"
UNTRUSTED = "untrusted pipe dir"
# What root runs its MPS control commands with: the node's PATH, none of the agent's own environment (its store URL,
# tokens), which a control daemon root starts would hand on to the MPS servers it runs as the jobs' users.
MPS_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _chain(path: str) -> list[str]:
    """``path``'s ancestors, nearest first, up to ``/``."""
    out, p = [], os.path.dirname(path)
    while True:
        out.append(p)
        if p == "/":
            return out
        p = os.path.dirname(p)


def ancestors_problem(path: str | os.PathLike[str]) -> str | None:
    """Why a directory under ``path`` cannot be root's alone, or None: each ancestor, as written and as resolved,
    must be root's and not writable by group or others (a sticky ``/tmp`` included: anyone may make the missing
    directory there first, or a link in its place)."""
    p = os.path.abspath(os.fspath(path))
    for a in dict.fromkeys(_chain(p) + _chain(os.path.realpath(p))):
        try:
            st = os.lstat(a)
        except FileNotFoundError:
            continue  # made later (the Prolog makes what is missing), in the ancestors checked here
        except OSError as exc:
            return f"its parent {a}: {exc.strerror or exc}"
        if st.st_uid != 0:
            return f"its parent {a} is owned by uid {st.st_uid}, not root"
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022:
            return f"its parent {a} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def root_dir_problem(path: str | os.PathLike[str]) -> str | None:
    """Why root must not use ``path`` as a directory of its own, or None: it must be a directory (not a link), root's,
    not writable by group or others, in ancestors that are root's alone too (:func:`ancestors_problem`)."""
    p = os.path.abspath(os.fspath(path))
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid != 0:
        return f"owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return ancestors_problem(p)


def check_pipe_root(root: str | os.PathLike[str]) -> None:
    """At start-up: ValueError unless the per-GPU pipe directories under ``root`` can be root's alone (``root``
    itself, where it exists already, and every ancestor; never under ``/tmp``)."""
    p = os.path.abspath(os.fspath(root))
    why = ancestors_problem(p) if not os.path.lexists(p) else root_dir_problem(p)
    if why is not None:
        raise ValueError(f"MPS pipe root {p}: {why}; the agent runs MPS control commands as root only in a "
                         f"directory root alone can write (e.g. {DEFAULT_PIPE_ROOT}, not under /tmp)")


class MpsControl(Protocol):
    def server_alive(self) -> bool | None:
        """False when an MPS server died under live clients since the last call (a crash);
        True otherwise; None when no MPS is configured here."""
        ...

    def probe(self, timeout_s: float) -> bool:
        """A probe client talks to MPS; False when it fails or does not answer in time."""
        ...

    def reset(self, timeout_s: float) -> bool:
        """Quit and restart the MPS server; True when the control daemon accepted it."""
        ...


class SubprocessMpsControl:
    """``nvidia-cuda-mps-control`` through subprocess, every call under a timeout.

    ``pipe_dir`` selects the control daemon (``CUDA_MPS_PIPE_DIRECTORY``), ``log_dir`` its log; ``probe_cmd`` is an
    optional probe client (e.g. a tiny CUDA program); without it the probe asks the control
    daemon for its server list, which hangs when MPS does.

    Root talks to a daemon (and restarts one) only where ``trust`` finds no problem with the pipe and log
    directories (:func:`root_dir_problem`: root's alone), checked before every look: whoever made a directory
    runs a daemon there that answers as they like, so a fault seen there could evict all offline work on the GPU
    at will, and a reset would run ``-d`` as root in their directory. A directory that fails is not used (logged
    once per reason); :attr:`state` says why (``untrusted pipe dir: …``) and the GPU reads as having no MPS.
    ``env``: added to the control commands' environment (which is otherwise the node's ``PATH`` only).
    """

    def __init__(self, pipe_dir: str | None = None, log_dir: str | None = None,
                 probe_cmd: Sequence[str] | None = None, binary: str = "nvidia-cuda-mps-control", *,
                 trust: Callable[[str], str | None] = root_dir_problem, env: dict[str, str] | None = None):
        self.binary = binary
        self.probe_cmd = list(probe_cmd) if probe_cmd else None
        self.env = {"PATH": MPS_PATH, **(env or {})}
        pipe_dir = pipe_dir or "/tmp/nvidia-mps"  # MPS's own default: checked like any other (and refused)
        self.dirs = [d for d in (pipe_dir, log_dir) if d]
        self.env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir
        if log_dir:
            self.env["CUDA_MPS_LOG_DIRECTORY"] = log_dir
        self._trust = trust
        self.state = "ok"
        self._clients: dict[int, list[int]] = {}  # server pid -> its clients at the last look

    def trusted(self) -> bool:
        """Whether the daemon's directories are root's alone now (:attr:`state` says why not)."""
        problems = [(d, why) for d in self.dirs if (why := self._trust(d)) is not None]
        if not problems:
            self.state = "ok"
            return True
        d, why = problems[0]
        state = "no pipe dir" if why == "missing" else f"{UNTRUSTED}: {d} is {why}"
        if state != self.state and state != "no pipe dir":
            log.error("MPS control daemon at %s not used (no health probe, no reset): %s is %s; it must be root's "
                      "alone (docs/SECURITY.md)", self.dirs[0], d, why)
        self.state = state
        return False

    def _ctl(self, command: str | None, timeout_s: float, args: Sequence[str] = ()) -> subprocess.CompletedProcess:
        return subprocess.run([self.binary, *args], input=None if command is None else command + "\n",
                              capture_output=True, text=True, timeout=timeout_s, env=self.env, check=False)

    def _pids(self, command: str, timeout_s: float) -> list[int] | None:
        try:
            r = self._ctl(command, timeout_s)
        except (FileNotFoundError, subprocess.TimeoutExpired):
            return None
        if r.returncode != 0:
            return None
        return [int(x) for x in r.stdout.split() if x.isdigit()]

    def server_pids(self, timeout_s: float = 2.0) -> list[int] | None:
        return self._pids("get_server_list", timeout_s)

    def server_alive(self) -> bool | None:
        """A server that is gone while the clients it had are still alive has crashed.

        Servers also exit normally (the control daemon swaps a server for one of another
        user once its clients are done), so a vanished server alone is not a crash. None (no MPS here) where the
        directories are not root's alone, or not there yet."""
        if not self.trusted():
            self._clients = {}
            return None
        pids = self.server_pids()
        if pids is None:
            return None if not self._clients else True  # a hang is the probe's business
        crashed = False
        for pid, clients in self._clients.items():
            if pid not in pids or not os.path.exists(f"/proc/{pid}"):
                if any(os.path.exists(f"/proc/{c}") for c in clients):
                    log.error("MPS server %d is gone while its clients %s still run", pid, clients)
                    crashed = True
        self._clients = {p: self._pids(f"get_client_list {p}", 2.0) or [] for p in pids}
        return not crashed

    def probe(self, timeout_s: float) -> bool:
        if not self.trusted():
            return False
        try:
            if self.probe_cmd:
                r = subprocess.run(self.probe_cmd, capture_output=True, timeout=timeout_s, env=self.env, check=False)
            else:
                r = self._ctl("get_server_list", timeout_s)
            return r.returncode == 0
        except (subprocess.TimeoutExpired, OSError):
            return False

    def reset(self, timeout_s: float) -> bool:
        if not self.trusted():
            log.error("MPS reset not done: %s", self.state)
            return False
        try:
            self._ctl("quit", timeout_s)
        except (subprocess.TimeoutExpired, OSError) as exc:
            log.warning("MPS quit did not finish: %s", exc)
        try:
            r = self._ctl(None, timeout_s, ["-d"])  # start the control daemon again
            return r.returncode == 0
        except (subprocess.TimeoutExpired, OSError) as exc:
            log.error("MPS control daemon restart failed: %s", exc)
            return False


@dataclass
class FakeMpsControl:
    """Scripted MPS for tests: ``alive=False`` is a crashed server, ``hung`` a hang; counts
    resets and probes; a reset revives it (unless ``revive_on_reset`` is off)."""

    alive: bool | None = True
    hung: bool = False
    resets: int = 0
    probes: int = 0
    reset_ok: bool = True
    revive_on_reset: bool = True

    def server_alive(self) -> bool | None:
        return self.alive

    def probe(self, timeout_s: float) -> bool:
        self.probes += 1
        return bool(self.alive) and not self.hung

    def reset(self, timeout_s: float) -> bool:
        self.resets += 1
        if self.reset_ok and self.revive_on_reset:
            self.alive, self.hung = True, False
        return self.reset_ok


@dataclass(frozen=True)
class Fault:
    kind: str                 # 'xid' | 'mps_server_crash' | 'mps_hang'
    xid: int | None = None
    detail: str = ""
    disable: bool = False     # the GPU is gone: Disabled rather than Init


@dataclass
class ErrorDetector:
    """Per GPU. ``check`` is called every sample with the XIDs that arrived; it probes MPS at most
    every ``probe_interval_s``. While ``recovering`` (after a fault) it only watches for recovery."""

    mps: MpsControl
    probe_interval_s: float = 1.0
    probe_timeout_s: float = 2.0
    fatal_xids: frozenset[int] = FATAL_XIDS
    disabling_xids: frozenset[int] = DISABLING_XIDS
    recovering: bool = False
    _last_probe_s: float | None = None
    history: list[Fault] = field(default_factory=list)

    def check(self, now_s: float, xids: list[XidEvent]) -> list[Fault]:
        faults = [
            Fault("xid", e.xid, e.detail or f"XID {e.xid}", disable=e.xid in self.disabling_xids)
            for e in xids if e.xid in self.fatal_xids
        ]
        if not faults and self.recovering:
            return []
        if self._last_probe_s is None or now_s - self._last_probe_s >= self.probe_interval_s:
            self._last_probe_s = now_s
            alive = self.mps.server_alive()
            if alive is not None and not self.recovering:
                if alive is False:
                    faults.append(Fault("mps_server_crash", detail="MPS server process is gone under its clients"))
                elif not self.mps.probe(self.probe_timeout_s):
                    faults.append(Fault("mps_hang", detail=f"probe client did not answer in {self.probe_timeout_s:g} s"))
        self.history.extend(faults)
        return faults

    @property
    def mps_state(self) -> str:
        """``ok``, ``no pipe dir`` (no daemon set up yet), ``untrusted pipe dir: …`` (not used), or ``simulated``."""
        return getattr(self.mps, "state", "simulated")

    def recovered(self, now_s: float) -> bool:
        """While recovering: True (and recovery ends) once MPS answers a probe again."""
        if not self.recovering:
            return True
        if self._last_probe_s is not None and now_s - self._last_probe_s < self.probe_interval_s:
            return False
        self._last_probe_s = now_s
        alive = self.mps.server_alive()
        ok = alive is None or (alive and self.mps.probe(self.probe_timeout_s))
        if ok:
            self.recovering = False
        return bool(ok)
