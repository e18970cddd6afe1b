"""Offline processes that run without xCUDA: seen by the node agent and evicted (paper §4.1–4.2;
docs/NODE_AGENT.md, "The xCUDA check").

xCUDA paces an offline job's kernels and accounts its memory quota from inside the job's
processes, loaded by the ``LD_PRELOAD`` the TaskProlog exports. The environment is the job's
own: a script can ``unset LD_PRELOAD`` and run unpaced. The MPS caps the root Prolog sets stay
(docs/SLURM.md "Hard caps"), but the pacing the online service's latency relies on is gone, so
the agent compares what runs with the plan:

- the offline Slurm jobs placed on this node's GPUs come from the placements
  (:mod:`executors.node.placements`);
- a job's processes are those under its root ``slurmstepd: [<job>.<step>]`` (the process tree is
  what Slurm's ``proctrack/linuxproc`` follows too: a child started with a cleared or forged
  environment is still the job's), and those outside every job's tree whose ``SLURM_JOB_ID``
  (``/proc/<pid>/environ``, else an ancestor's) is the job's and that run as the job's user as Slurm
  names it (the environment is the process's own: no user passes his processes off as another
  user's job, not even before that job's own processes appear);
- each GPU's compute processes are judged: NVML's on real GPUs (a shell that loads no CUDA needs no
  xCUDA), the simulated GPU's own list on simulated ones (:func:`executors.node.simgpu.simulated_compute_pids`);
- on a *shared* GPU (an online replica, or placed offline work) every compute process is the online
  replica's (its registered user) or a placed job's; anything else is killed and, if a Slurm job's,
  that job evicted; its owner is told (:class:`Notices`). Root's processes and an MPS server (a child of
  root's control daemon) never count, its clients each do;
- Slurm's own hooks for the job never count (:func:`executors.node.attribution.in_slurm_hook`),
  nor their children; all run with the job's ``SLURM_JOB_ID`` and without xCUDA, and can take long
  on a loaded node. Each is known by what its user cannot forge, not by its name or environment:
  the Prolog and the Epilog are root's processes, children of root's slurmd (or of this agent, which
  runs the Prolog slurmd skipped), marked ``SLURM_SCRIPT_CONTEXT=prolog_slurmd|epilog_slurmd``; the
  TaskProlog is the configured script run under the job's root slurmstepd
  (:func:`executors.node.attribution.task_prolog_of`), for at most 60 s (it may wait for its plan,
  :mod:`executors.node.prolog_watch`), and on real GPUs never for a process on a GPU (it uses none);
- a process counts once it is ``grace_s`` old (a task's first moment, before its exec);
- a placed job's process that does not map the installed library — by device and inode, never by
  name (:func:`xcuda_mapping`; ``maps`` read to a bound) — is a violation: the job is
  evicted (requeue-hold, as SysMonitor's evictions; Slurm's SIGTERM makes the runtime checkpoint) with that reason,
  which the ``evictions`` row and the job's EVICTED transition carry.

It runs on a thread of its own every ``interval_s``: a scan of ``/proc`` is too slow for the
10 ms sampling loop. The agent must run as root to read other users' ``environ`` and
``maps``; a process it cannot read is skipped (and logged once), never a violation.
"""

from __future__ import annotations

import logging
import os
import pwd
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from executors.node.attribution import (
    MPS_SERVER,
    SLURMSTEPD,
    in_slurm_hook,
    proc_slurm_job,
    proc_uid,
    slurm_conf_task_prolog,
    stepd_title,
)
from executors.text import printable

log = logging.getLogger(__name__)

XCUDA_LIB = "libxcuda.so"
# The library the TaskProlog exports in LD_PRELOAD (the node scripts' @XCUDA_LIB@): this tree's build, which a
# node installs where the agent runs (docs/DEPLOY.md); --xcuda-lib names another.
DEFAULT_XCUDA_LIB = str(Path(__file__).resolve().parent / "xcuda" / "build" / XCUDA_LIB)
MPS_CONTROL = "nvidia-cuda-mps-control"

# What a violation is (Violation.kind)
NO_XCUDA = "no xcuda"          # a placed job's process without the installed library
OTHER_LIB = "other library"    # a placed job's process mapping a file named like it that is not it
NOT_VERIFIED = "not verified"  # a placed job's process with more maps than the check reads
FOREIGN = "foreign"            # on a shared GPU, a process neither the online replica's nor a placed job's


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str
    age_s: float
    comm: str
    cpu_s: float = 0.0   # CPU time it has used (user + system), its reaped children's not included
    start_ticks: int = 0  # its start, in clock ticks since boot: with the pid, names this process and no later one


@dataclass(frozen=True)
class Violation:
    gpu_index: int
    job_id: int | None          # the store's job (None: a process of no placed job)
    slurm_job_id: int | None    # the Slurm job it is a process of (None: of no job)
    pid: int
    comm: str
    kind: str = NO_XCUDA
    uid: int | None = None
    start_ticks: int = 0
    lib: str = XCUDA_LIB        # the installed library's path (OTHER_LIB's reason names it)

    @property
    def stops_process(self) -> bool:
        """The process itself is killed (a foreign one: no plan lets it run there, nor a checkpoint to save);
        a placed job's is evicted, and Slurm's SIGTERM lets it checkpoint."""
        return self.kind == FOREIGN

    @property
    def reason(self) -> str:
        who = f"process {self.pid} ({self.comm})"
        if self.kind == NO_XCUDA:
            return (f"xCUDA not loaded: {who} of Slurm job {self.slurm_job_id} runs without {XCUDA_LIB} "
                    f"(LD_PRELOAD removed)")
        if self.kind == OTHER_LIB:
            return (f"xCUDA not loaded: {who} of Slurm job {self.slurm_job_id} maps a file named {XCUDA_LIB} that "
                    f"is not the installed library ({self.lib})")
        if self.kind == NOT_VERIFIED:
            return (f"xCUDA not verified: {who} of Slurm job {self.slurm_job_id} has more memory maps than the "
                    f"check reads ({MAPS_MAX_LINES})")
        if self.slurm_job_id is not None:
            return (f"not in the plan: {who}, uid {self.uid}, of Slurm job {self.slurm_job_id} runs on GPU "
                    f"{self.gpu_index}, which no plan gives that job (killed)")
        return (f"not in the plan: {who}, uid {self.uid}, of no Slurm job, runs on GPU {self.gpu_index}, which "
                f"an online replica or placed offline work uses (killed)")


def read_procs(proc_root: Path, only: Iterable[int] | None = None) -> dict[int, Proc]:
    """Every process of ``proc_root`` (or those of ``only``) with its parent, state, age, name, CPU time and start
    (gone ones skipped)."""
    try:
        uptime_s = float((proc_root / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        uptime_s = float("inf")  # no uptime: every process counts as old
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    names = [d.name for d in proc_root.iterdir()] if only is None else [str(p) for p in only]
    for name in names:
        if not name.isdigit():
            continue
        try:
            stat = (proc_root / name / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid …": comm may hold spaces and parentheses; the fields follow the last ')'.
        close = stat.rfind(")")
        fields = stat[close + 2:].split()
        try:
            ppid, start_ticks = int(fields[1]), int(fields[19])
            cpu_ticks = int(fields[11]) + int(fields[12])  # utime + stime
        except (IndexError, ValueError):
            continue
        out[int(name)] = Proc(int(name), ppid, fields[0], uptime_s - start_ticks / hz,
                              stat[stat.find("(") + 1:close], cpu_ticks / hz, start_ticks)
    return out


def step_jobs(procs: dict[int, Proc], proc_root: Path) -> dict[int, int]:
    """pid → Slurm job for the processes under a root ``slurmstepd: [<job>.<step>]`` (the tree Slurm's
    ``proctrack/linuxproc`` follows), the step daemons themselves left out, and the extern step's (its ``sleep``
    holds the job's cgroup; what pam_slurm_adopt puts there is not in its tree anyway)."""
    roots: dict[int, int] = {}
    for pid, p in procs.items():
        if p.comm == SLURMSTEPD:
            title = stepd_title(pid, procs, proc_root)
            if title is not None and title[1] != "extern" and proc_uid(pid, proc_root) == 0:
                roots[pid] = title[0]
    if not roots:
        return {}
    memo: dict[int, int | None] = {}

    def find(pid: int) -> int | None:
        chain = []
        while pid in procs and pid not in memo and pid not in roots and len(chain) < 256:
            chain.append(pid)
            pid = procs[pid].ppid
        found = roots[pid] if pid in roots else memo.get(pid)
        for c in chain:
            memo[c] = found
        return found

    return {pid: j for pid in procs if pid not in roots and (j := find(pid)) is not None}


def job_of_processes(procs: dict[int, Proc], wanted: set[int], proc_root: Path,
                     job_uids: Mapping[int, int] | None = None, tree: dict[int, int] | None = None) -> dict[int, int]:
    """pid → Slurm job id for the processes of the ``wanted`` jobs.

    A process under a job's root slurmstepd is that job's, whatever its environment says. Any other process (one
    that left the tree: a double fork to init) is the job of its ``SLURM_JOB_ID`` (else its nearest ancestor's)
    only if it runs as the job's user: ``job_uids`` (the user Slurm or the store names for the job), else the uid
    of the job's processes under its slurmstepd. A job whose user is known neither way claims no process through
    the environment: ``SLURM_JOB_ID`` is the process's own to set, and a user must not pass his processes off as
    another user's job (to have it evicted, or to escape the check of his own) — not even before that job's own
    processes appear. ``tree``: :func:`step_jobs` of ``procs``, when the caller has it."""
    tree = step_jobs(procs, proc_root) if tree is None else tree
    users: dict[int, set[int]] = {}
    for j, uid in (job_uids or {}).items():
        if j in wanted:
            users[j] = {uid}
    for pid, j in tree.items():
        if j in wanted and j not in users:
            uid = proc_uid(pid, proc_root)
            if uid is not None and uid != 0:
                users.setdefault(j, set()).add(uid)
    own: dict[int, int | None] = {}

    def job(pid: int) -> int | None:
        chain = []
        while pid in procs and pid not in own:
            chain.append(pid)
            j = proc_slurm_job(pid, proc_root)
            if j is not None:
                own[pid] = j
                break
            pid = procs[pid].ppid
        found = own.get(pid)
        for p in chain:
            own.setdefault(p, found)
        return found

    out = {}
    for pid in procs:
        if pid in tree:
            j: int | None = tree[pid]
        else:
            j = job(pid)
            if j is not None and proc_uid(pid, proc_root) not in users.get(j, ()):
                j = None  # claims a job whose user it is not (or whose user nobody can tell): not that job's
        if j in wanted:
            out[pid] = j
    return out


def user_pids_of_jobs(procs: dict[int, Proc], wanted: set[int], proc_root: Path,
                      job_uids: Mapping[int, int] | None = None) -> dict[int, set[int]]:
    """Slurm job id → its processes that run as its user (slurmstepd and anything else of root's left out), for
    the ``wanted`` jobs, in one walk of the process tree (``job_uids``: as :func:`job_of_processes`)."""
    out: dict[int, set[int]] = {}
    for pid, j in job_of_processes(procs, wanted, proc_root, job_uids).items():
        if j in wanted and proc_uid(pid, proc_root) not in (None, 0):
            out.setdefault(j, set()).add(pid)
    return out


# What a process's memory maps say about xCUDA (:func:`xcuda_mapping`).
INSTALLED = "installed"        # maps the installed library: the very file (device and inode), whatever its name
IMPOSTOR = "impostor"          # maps a file named like it that is another file (the user's copy, an empty file)
ABSENT = "absent"              # maps neither
TOO_MANY_MAPS = "too many maps"  # more maps than the check reads, the library not among those read
UNREADABLE = "unreadable"      # its maps cannot be read, or it has none (a zombie, a kernel thread)

# Lines of /proc/<pid>/maps read at most (one per mapping): the kernel's default vm.max_map_count is 65530, so a
# process holds more only on a node that raised it. Past the cut nothing is known, and a process could map files
# by the thousand to push the library (mapped last at start-up: high addresses, the end of the file) out of
# reach: a process with more maps and the library not among those read is not verified (a violation).
MAPS_MAX_LINES = 1 << 17
MAPS_MAX_BYTES = 32 << 20


def lib_identity(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the installed library (None: not there)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def xcuda_mapping(pid: int, proc_root: Path, lib: str | os.PathLike[str], identity: tuple[int, int] | None = None,
                  max_lines: int = MAPS_MAX_LINES, max_bytes: int = MAPS_MAX_BYTES) -> str:
    """Whether the process maps the installed library ``lib`` by identity: a mapping whose device and inode (the
    kernel's columns of ``/proc/<pid>/maps``, or the file behind ``/proc/<pid>/map_files/<range>``) are the
    library's. Its name proves nothing: any user can make a file called ``libxcuda.so``. Reads at most
    ``max_lines`` lines and ``max_bytes`` bytes of maps (:data:`MAPS_MAX_LINES`)."""
    identity = identity if identity is not None else lib_identity(lib)
    name = os.path.basename(os.fspath(lib))
    if identity is None:
        return ABSENT  # no installed library on this node: nothing a process maps is xCUDA
    dev, ino = identity
    want_dev = f"{os.major(dev):02x}:{os.minor(dev):02x}"
    named = False
    lines = read = 0
    try:
        with open(proc_root / str(pid) / "maps", "rb") as f:
            for raw in f:
                lines, read = lines + 1, read + len(raw)
                if lines > max_lines or read > max_bytes:
                    return TOO_MANY_MAPS
                # "start-end perms offset major:minor inode path" (the path may hold spaces)
                fields = raw.split(None, 5)
                if len(fields) < 6:
                    continue
                path = fields[5].rstrip(b"\n").decode(errors="replace")
                try:
                    inode = int(fields[4])
                except ValueError:
                    continue
                if inode == ino and fields[3].decode(errors="replace") == want_dev:
                    return INSTALLED
                if inode == ino or path.rsplit("/", 1)[-1] == name:
                    # The columns name the file's underlying device (overlayfs, btrfs subvolumes show another
                    # st_dev than stat): the mapped file itself, through map_files, decides.
                    if lib_identity(proc_root / str(pid) / "map_files" / fields[0].decode()) == identity:
                        return INSTALLED
                    named = named or path.rsplit("/", 1)[-1] == name
    except OSError:
        return UNREADABLE
    if lines == 0:
        return UNREADABLE
    return IMPOSTOR if named else ABSENT


def loads_xcuda(pid: int, proc_root: Path, lib: str | os.PathLike[str] | None = None) -> bool | None:
    """Whether the process maps the installed library (:func:`xcuda_mapping`; None: its maps cannot be read)."""
    got = xcuda_mapping(pid, proc_root, lib if lib is not None else DEFAULT_XCUDA_LIB)
    return None if got == UNREADABLE else got == INSTALLED


def is_mps_server(pid: int, procs: dict[int, Proc], proc_root: Path) -> bool:
    """Whether ``pid`` is an MPS server: named ``nvidia-cuda-mps-server`` and a child of root's
    ``nvidia-cuda-mps-control`` (the control daemon the root Prolog starts spawns one server per client uid, as
    that uid; NVML lists it on the GPU while it has clients). A user's process may take the name, not the parent."""
    p = procs.get(pid)
    parent = procs.get(p.ppid) if p is not None else None
    return (p is not None and p.comm == MPS_SERVER and parent is not None and parent.comm == MPS_CONTROL
            and proc_uid(p.ppid, proc_root) == 0)


def kill_process(pid: int, start_ticks: int, proc_root: Path = Path("/proc")) -> bool:
    """SIGKILL ``pid`` if it still is the process that started at ``start_ticks`` (a pid is reused once its
    process is gone: the pidfd pins it, then its start time, read again, proves it is the one judged). Only on
    the real ``/proc``: a pid of another tree (a test's) names no process of this machine."""
    if Path(proc_root) != Path("/proc"):
        log.warning("process %d of %s not killed: not this machine's /proc", pid, proc_root)
        return False
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False  # gone
    try:
        procs = read_procs(proc_root, only=(pid,))
        if pid not in procs or procs[pid].start_ticks != start_ticks:
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def pw_uid(user: str) -> int | None:
    """The uid of a user of this node (None: unknown here)."""
    try:
        return pwd.getpwnam(user).pw_uid
    except (KeyError, TypeError):
        return None


class Notices:
    """Lines for a user about what the agent did to their processes: ``<dir>/<uid>``, a file of that user's
    (mode 0400: theirs to read) in a directory of root's alone (they cannot replace it, nor plant a link), cut
    once it holds :attr:`MAX_BYTES`. None as ``directory``: the agent's log only."""

    MAX_BYTES = 64 << 10

    def __init__(self, directory: str | os.PathLike[str] | None):
        self.directory = None if directory is None else Path(directory)
        self._warned = False

    def _dir_fd(self) -> int | None:
        assert self.directory is not None
        try:
            self.directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            why = str(exc)
        else:
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and not st.st_mode & 0o022:
                return fd
            os.close(fd)
            why = "not the agent's alone (its owner, or group or others may write)"
        if not self._warned:
            self._warned = True
            log.warning("notice directory %s: %s; notices go to this log only", self.directory, why)
        return None

    def tell(self, uid: int, text: str) -> None:
        if self.directory is None:
            return
        dfd = self._dir_fd()
        if dfd is None:
            return
        try:
            fd = os.open(str(uid), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400,
                         dir_fd=dfd)
            try:
                st = os.fstat(fd)
                if st.st_size > self.MAX_BYTES:
                    os.ftruncate(fd, 0)
                if st.st_uid != uid and os.geteuid() == 0:
                    os.fchown(fd, uid, -1)
                    os.fchmod(fd, 0o400)
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                os.write(fd, f"{stamp} {printable(text)}\n".encode())
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("notice for uid %d not written: %s", uid, exc)
        finally:
            os.close(dfd)


class XcudaCheck:
    """Which processes on this node's GPUs break the plan, from ``/proc`` and each GPU's compute processes."""

    def __init__(self, placements, gpu_indices: Iterable[int],
                 gpu_pids: Callable[[], Mapping[int, set[int]]] | None = None,
                 proc_root: Path | str = "/proc", grace_s: float = 5.0, lib: str | os.PathLike[str] | None = None,
                 task_prolog: str | None = None, agent_pid: int | None = None,
                 replicas: Mapping[int, str | None] | None = None,
                 uid_of: Callable[[str], int | None] | None = None, node: str | None = None):
        """``gpu_pids``: GPU index → the processes with a context on it (NVML's compute processes); None: the
        simulated GPUs' (:func:`executors.node.simgpu.simulated_compute_pids`). ``lib``: the installed xCUDA
        library (default :data:`DEFAULT_XCUDA_LIB`). ``task_prolog``: the TaskProlog script Slurm runs (default:
        slurm.conf's ``TaskProlog=``; None found: a script named ``task_prolog.sh``). ``agent_pid``: the process
        whose Prolog runs count as slurmd's (default: this one, on the real ``/proc``). ``replicas``: GPU index →
        the user the online replica there runs as (None: not registered); ``uid_of``: a user's uid here
        (default :func:`pw_uid`); ``node``: this node's Slurm name (simulated GPUs: only processes of this node
        count, see :func:`executors.node.simgpu.simulated_compute_pids`)."""
        self.placements = placements
        self.gpu_indices = list(gpu_indices)
        self.gpu_pids = gpu_pids
        self.proc_root = Path(proc_root)
        self.grace_s = grace_s
        self.lib = str(lib if lib is not None else DEFAULT_XCUDA_LIB)
        self.task_prolog = task_prolog if task_prolog is not None else slurm_conf_task_prolog()
        self.agent_pid = agent_pid if agent_pid is not None else (
            os.getpid() if self.proc_root == Path("/proc") else None)
        self.replicas = dict(replicas or {})
        self.uid_of = uid_of if uid_of is not None else (lambda user: pw_uid(user))  # looked up at each use
        self.node = node
        self._unreadable: set[int] = set()
        self._warned: set[tuple] = set()

    def _warn_once(self, key: tuple, msg: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    def _uid(self, user: str | None) -> int | None:
        return None if not user else self.uid_of(user)

    def violations(self) -> list[Violation]:
        """Per GPU, each compute process that is

        - a placed offline job's (placed on that GPU): judged by its xCUDA — the installed library mapped, by
          identity — one violation per job;
        - else, on a *shared* GPU (an online replica, or placed offline work), the online replica's when it runs
          as the replica's user, else a violation of its own (FOREIGN; the process is killed);

        root's processes, a genuine MPS server (its clients are judged each) and Slurm's own hooks never count."""
        on_gpu = {i: tuple(self.placements.on_gpu(i)) for i in self.gpu_indices}
        placed: dict[int, dict[int, object]] = {}  # Slurm job → GPU → its placement there
        for i, jobs in on_gpu.items():
            for o in jobs:
                if o.slurm_job_id is not None:
                    placed.setdefault(o.slurm_job_id, {})[i] = o
        shared = {i for i in self.gpu_indices if on_gpu[i] or i in self.replicas}
        if not shared:
            return []
        job_uids = {sid: uid for sid, on in placed.items()
                    if (uid := self._uid(getattr(next(iter(on.values())), "user", None))) is not None}
        procs = read_procs(self.proc_root)
        tree = step_jobs(procs, self.proc_root)
        job_of = job_of_processes(procs, set(placed), self.proc_root, job_uids, tree)
        if self.gpu_pids is not None:
            listed = self.gpu_pids()
        else:
            from executors.node.simgpu import simulated_compute_pids  # the simulated model (numpy): only there

            listed = simulated_compute_pids(procs, self.proc_root, self.gpu_indices,
                                            {i: {o.slurm_job_id for o in jobs} for i, jobs in on_gpu.items()}, job_of,
                                            self.node)
        identity = lib_identity(self.lib)
        if identity is None:
            self._warn_once(("lib",), "xCUDA check: the installed library %s is not there; no process can prove "
                            "it loads xCUDA", self.lib)
        found: dict[tuple, Violation] = {}
        for gpu in self.gpu_indices:
            for pid in sorted(listed.get(gpu, ())):
                v = self._judge(gpu, pid, procs, placed, job_of, tree, gpu in shared, identity)
                if v is not None:
                    # one per placed job (its eviction stops all its processes); every foreign process its own
                    key = (v.slurm_job_id,) if v.kind != FOREIGN else (FOREIGN, v.pid)
                    found.setdefault(key, v)
        self._unreadable &= set(procs)
        return list(found.values())

    def _judge(self, gpu: int, pid: int, procs: dict[int, Proc], placed: dict, job_of: dict[int, int],
               tree: dict[int, int], shared: bool, identity: tuple[int, int] | None) -> Violation | None:
        p = procs.get(pid)
        if p is None or p.state in ("Z", "X") or p.age_s < self.grace_s:
            return None
        uid = proc_uid(pid, self.proc_root)
        if uid is None:
            self._warn_once(("uid", pid, p.start_ticks), "GPU %d: process %d (%s) has no single uid (between "
                            "identities, or gone): not judged", gpu, pid, printable(p.comm))
            return None
        # the Prolog, TaskProlog, Epilog: not the job's code (a TaskProlog uses no GPU: on real GPUs, not exempt)
        if in_slurm_hook(pid, procs, self.proc_root, task_prolog=self.task_prolog, agent_pid=self.agent_pid,
                         task_prolog_exempt=self.gpu_pids is None):
            return None
        sid = job_of.get(pid)
        if sid is not None and gpu in placed[sid]:
            return self._xcuda(gpu, pid, p, sid, placed[sid][gpu].job_id, uid, identity)
        if not shared or uid == 0 or is_mps_server(pid, procs, self.proc_root):
            return None  # root's own (the MPS daemons, the agent's tools); an MPS server's clients are judged each
        if sid is None and gpu in self.replicas:
            user = self.replicas[gpu]
            if not user or self.uid_of(user) is None:
                self._warn_once(("replica", gpu), "GPU %d: the online replica's user is not known here (%r): its "
                                "GPU's processes outside the placed jobs are taken for the replica's", gpu, user)
                return None
            if uid == self.uid_of(user):
                return None  # the online replica's
        owner = sid if sid is not None else tree.get(pid)
        job_id = next(iter(placed[owner].values())).job_id if owner in placed else None
        return Violation(gpu, job_id, owner, pid, p.comm, FOREIGN, uid, p.start_ticks, self.lib)

    def _xcuda(self, gpu: int, pid: int, p: Proc, sid: int, job_id: int, uid: int,
               identity: tuple[int, int] | None) -> Violation | None:
        got = xcuda_mapping(pid, self.proc_root, self.lib, identity)
        if got == INSTALLED:
            return None
        if got == UNREADABLE:
            if pid not in self._unreadable:
                self._unreadable.add(pid)
                log.warning("process %d of Slurm job %d: its memory maps cannot be read; xCUDA not checked", pid,
                            sid)
            return None
        kind = {IMPOSTOR: OTHER_LIB, TOO_MANY_MAPS: NOT_VERIFIED}.get(got, NO_XCUDA)
        return Violation(gpu, job_id, sid, pid, p.comm, kind, uid, p.start_ticks, self.lib)


class XcudaWatch:
    """Runs an :class:`XcudaCheck` every ``interval_s`` on a thread and acts on each violation.

    ``evict(violation)`` does the eviction and records it (the agent's evictor and store sink), once per job: a
    job stays "already evicted" while the placements still show it (Slurm takes a moment to requeue it), or while
    its processes are still seen breaking the plan, and is checked again once it is placed anew. A foreign
    process is killed (``kill(violation)``; default :func:`kill_process`), its owner told in ``notices``
    (:class:`Notices`) and, when it is a Slurm job's, that job evicted too. ``stopped``: processes killed so far.
    """

    def __init__(self, check: XcudaCheck, evict: Callable[[Violation], None], interval_s: float = 5.0,
                 kill: Callable[[Violation], bool] | None = None, notices: Notices | None = None):
        self.check = check
        self.evict = evict
        self.interval_s = interval_s
        self.kill = kill if kill is not None else (
            lambda v: kill_process(v.pid, v.start_ticks, check.proc_root))
        self.notices = notices if notices is not None else Notices(None)
        self.stopped = 0
        self._evicted: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def once(self) -> list[Violation]:
        """One check; the violations acted on."""
        try:
            found = self.check.violations()
        except Exception:  # /proc or NVML briefly unreadable: next time
            log.exception("xCUDA check failed")
            return []
        placed = {o.slurm_job_id for i in self.check.gpu_indices for o in self.check.placements.on_gpu(i)}
        self._evicted &= placed | {v.slurm_job_id for v in found}
        acted = []
        for v in found:
            if v.stops_process:
                if self._stop_process(v):
                    acted.append(v)
                continue
            if v.slurm_job_id in self._evicted:
                continue
            log.warning("GPU %d: job %s — %s", v.gpu_index, v.job_id, v.reason)
            if self._evict(v):
                acted.append(v)
        return acted

    def _evict(self, v: Violation) -> bool:
        try:
            self.evict(v)
        except Exception:
            log.exception("eviction of job %s (Slurm job %s) failed", v.job_id, v.slurm_job_id)
            return False
        self._evicted.add(v.slurm_job_id)
        return True

    def _stop_process(self, v: Violation) -> bool:
        log.warning("GPU %d: uid %s pid %d (%s) — %s", v.gpu_index, v.uid, v.pid, printable(v.comm), v.reason)
        try:
            killed = self.kill(v)
        except Exception:
            log.exception("kill of process %d failed", v.pid)
            killed = False
        if killed:
            self.stopped += 1
        evicted = v.slurm_job_id is not None and v.slurm_job_id not in self._evicted and self._evict(v)
        if (killed or evicted) and v.uid is not None:
            self.notices.tell(v.uid, f"muxflow node agent: {v.reason}")
        return killed or evicted

    def start(self) -> XcudaWatch:
        self._thread = threading.Thread(target=self._run, name="node-agent-xcuda-check", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.once()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 30.0)

