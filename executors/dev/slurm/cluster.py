"""A real multi-node Slurm cluster on one machine, for development and the integration tests.

``up`` starts munged, slurmdbd (accounting in MariaDB; ``sacctmgr`` then sets up the
accounts, MuxFlow's as an Operator), slurmctld, one slurmd per node (each in its own network
namespace) and two slurmrestd: one on a unix socket with rest_auth/local, one
on 127.0.0.1 with rest_auth/jwt. It waits for each stage by polling with a
deadline; a second ``up`` finds everything running and changes nothing.
``down`` stops every process by its recorded PID (and everything left in the
nodes' namespaces: slurmstepd and job processes), then removes the network.
"""

from __future__ import annotations

import os
import pwd
import secrets
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from executors.dev.slurm import accounting, rootfs
from executors.dev.slurm import network as net
from executors.dev.slurm.install import (
    JOB_USERS,
    SBIN_PATH,
    ensure_job_user,
    ensure_mariadb,
    ensure_packages,
    ensure_service_user,
)
from executors.dev.slurm.layout import (
    DEFAULT_NODES,
    DEFAULT_STATE_DIR,
    DEFAULT_SUBNETS,
    MUXFLOW_USER,
    REFERENCE_USER,
    REST_USER,
    SERVICE_USER,
    DevClusterLayout,
    DevNode,
)
from executors.dev.slurm.procs import ProcRecord, ProcTable, descendants, terminate, wait_reaped
from executors.dev.slurm.state import ensure_credentials, prepare_state
from executors.slurm.client import SlurmRestClient
from executors.slurm.errors import SlurmError
from executors.slurm.jwt import mint_hs256
from executors.slurm.models import Node, Partition
from executors.slurm.scontrol import ScontrolRequeue
from executors.slurm.settings import SlurmRestSettings

POLL_S = 0.2
GOOD_SINFO_STATES = ("idle", "mixed", "allocated", "completing")


EXECUTORS = Path(__file__).resolve().parents[2]
NODE_SRC = EXECUTORS / "node" / "slurm"
PLAN_SRC = EXECUTORS / "slurm" / "plan.py"
JOB_SUBMIT_SRC = EXECUTORS / "scheduler" / "slurm" / "job_submit.lua"
HOOK_SRC = EXECUTORS / "job" / "runtime" / "hook" / "sitecustomize.py"
REPO = EXECUTORS.parent
XCUDA_LIB = EXECUTORS / "node" / "xcuda" / "build" / "libxcuda.so"
FAKE_MPS_CONTROL = Path(__file__).resolve().with_name("fake_mps_control.sh")


def node_script_values(layout: DevClusterLayout) -> dict[str, str]:
    """What the dev cluster fills into the node scripts' ``@…@`` placeholders (a site fills its own, DEPLOY.md):
    xCUDA, the plan directory, a stand-in MPS control per node (its pipes under the state directory), the nodes'
    plan key, the per-job state directory, the plan tool and the iteration hook's directory."""
    return {"@XCUDA_LIB@": str(xcuda_install_dir(layout) / "libxcuda.so"), "@PLAN_DIR@": str(layout.plan_dir),
            "@MPS_CONTROL@": str(layout.node_script_dir / "nvidia-cuda-mps-control"),
            "@MPS_PIPE_ROOT@": f"{layout.mps_pipe_root}/${{SLURMD_NODENAME}}",
            "@PLAN_KEY@": str(layout.node_plan_key_file), "@JOB_DIR@": str(layout.job_state_dir),
            "@PLAN_TOOL@": str(layout.plan_tool), "@HOOK_DIR@": str(layout.hook_dir)}


def xcuda_install_dir(layout: DevClusterLayout) -> Path:
    """Where the dev cluster installs xCUDA: a link to the tree's build/libxcuda.so beside a root ``xcuda.conf``
    naming this cluster's plan directory, so that one build serves every cluster on the machine (the library
    looks for the conf beside the path it was preloaded by; the node agent's check still finds the built file,
    by device and inode, through the link)."""
    return layout.state_dir / "xcuda"


def install_xcuda(layout: DevClusterLayout) -> None:
    """The link and the conf of :func:`xcuda_install_dir`, root's and not group/other-writable (xCUDA ignores a conf
    that is not), each replaced atomically."""
    d = xcuda_install_dir(layout)
    d.mkdir(exist_ok=True)
    os.chmod(d, 0o755)
    link = d / "libxcuda.so"
    if not (link.is_symlink() and os.readlink(link) == str(XCUDA_LIB)):
        tmp = d / f".libxcuda.so.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(XCUDA_LIB)
        os.replace(tmp, link)
    text = f"# this dev cluster's plan directory (executors/node/xcuda/README.md)\nplan_dir={layout.plan_dir}\n"
    conf = d / "xcuda.conf"
    if conf.is_file() and not conf.is_symlink() and conf.read_text() == text and \
            (os.stat(conf).st_mode & 0o7777) == 0o644:
        return
    tmp = d / f".xcuda.conf.{os.getpid()}.tmp"
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, conf)


def releaser_uids(slurm_user_uid: int, muxflow_uid: int | None) -> str:
    """job_submit.lua's ``@RELEASER_UIDS@``: root, SlurmUser and MuxFlow's account may change MuxFlow's jobs."""
    uids = [0, int(slurm_user_uid), *([] if muxflow_uid is None else [int(muxflow_uid)])]
    return ", ".join(f"[{u}] = true" for u in dict.fromkeys(uids))


def _fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace(key, value)
    return text


def install_node_scripts(layout: DevClusterLayout, slurm_user_uid: int, muxflow_uid: int | None = None) -> None:
    """Install ``job_submit.lua`` next to slurm.conf, xCUDA (:func:`install_xcuda`), the Prolog/TaskProlog/Epilog,
    the plan tool (a copy of ``executors/slurm/plan.py``), the iteration hook (a copy of
    ``executors/job/runtime/hook/sitecustomize.py``) and the stand-in MPS control (docs/SLURM.md).

    Each file is replaced atomically (temp file + rename): slurmd reads the scripts at
    every job start and slurmctld reloads the Lua script when it changes, so a running
    cluster picks up new versions without a restart, and never half a file.
    """
    layout.node_script_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(layout.node_script_dir, 0o755)
    install_xcuda(layout)
    values = node_script_values(layout)
    files = {layout.node_script_dir / name: (_fill((NODE_SRC / name).read_text(), values), 0o755)
             for name in ("prolog.sh", "task_prolog.sh", "epilog.sh")}
    files[layout.node_script_dir / "nvidia-cuda-mps-control"] = (FAKE_MPS_CONTROL.read_text(), 0o755)
    files[layout.plan_tool] = (PLAN_SRC.read_text(), 0o644)
    layout.hook_dir.mkdir(exist_ok=True)
    os.chmod(layout.hook_dir, 0o755)
    files[layout.hook_dir / "sitecustomize.py"] = (HOOK_SRC.read_text(), 0o644)
    files[layout.job_submit_lua] = (JOB_SUBMIT_SRC.read_text()
                                    .replace("@RELEASER_UIDS@", releaser_uids(slurm_user_uid, muxflow_uid)), 0o644)
    for dst, (text, mode) in files.items():
        if dst.exists() and dst.read_text() == text and (os.stat(dst).st_mode & 0o7777) == mode:
            continue
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.chmod(tmp, mode)
        os.replace(tmp, dst)


class DevClusterError(RuntimeError):
    """dev-up could not bring the cluster up; ``logs`` are the files worth reading."""

    def __init__(self, message: str, logs: list[Path] | tuple[Path, ...] = ()):
        super().__init__(message)
        self.logs = list(logs)


@dataclass
class _Component:
    name: str
    argv: list[str]
    logs: list[Path]
    ready: Callable[[], str | None]  # None when ready, else why not yet
    env: dict[str, str] = field(default_factory=dict)
    before_start: Callable[[], None] | None = None
    # once the component is ready, on every up; the argument: whether this up started it
    after_ready: Callable[[bool], None] | None = None


@dataclass(frozen=True)
class ProcState:
    name: str
    pid: int | None
    alive: bool


@dataclass(frozen=True)
class DevStatus:
    state_dir: Path
    layout: DevClusterLayout | None
    procs: tuple[ProcState, ...]
    nodes: tuple[Node, ...]
    partitions: tuple[Partition, ...]
    rest: dict[str, str | None]  # endpoint -> None when it answers, else the error
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


class DevCluster:
    def __init__(self, state_dir: Path | str | None = None, *, subnet: str | None = None,
                 bridge: str = "mxslurm0", port_base: int = 6917, echo: Callable[[str], None] = print,
                 nodes: tuple[DevNode, ...] = DEFAULT_NODES, release: rootfs.SlurmRelease | None = None):
        """``bridge`` names the network pieces and ``port_base`` the ports (slurmctld, slurmd = +1,
        slurmdbd = +2, REST = +3): a second cluster with other values and state dir runs beside the first.
        ``nodes`` is the layout of a fresh start (a running cluster keeps its own). ``release``: run
        another Slurm release than the host's, from its Debian tree (:mod:`executors.dev.slurm.rootfs`)."""
        self.state_dir = Path(state_dir or os.environ.get("MUXFLOW_SLURM_DIR") or DEFAULT_STATE_DIR)
        self.subnet = subnet
        self.bridge = bridge
        self.port_base = port_base
        self.nodes = tuple(nodes)
        self.release = release
        self.echo = echo
        self.procs = ProcTable(self.state_dir / "pids")

    # -- layout ------------------------------------------------------------------
    def load_layout(self) -> DevClusterLayout | None:
        try:
            return DevClusterLayout.from_json((self.state_dir / "cluster.json").read_text())
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def _new_layout(self, previous: DevClusterLayout | None) -> DevClusterLayout:
        host = socket.gethostname().split(".")[0]
        base = DevClusterLayout(state_dir=self.state_dir, controller_host=host, bridge=self.bridge,
                                slurmctld_port=self.port_base, slurmd_port=self.port_base + 1,
                                dbd_port=self.port_base + 2, rest_port=self.port_base + 3, nodes=self.nodes)
        if self.release is not None:
            base = replace(base, root_fs=str(self.release.path), rest_plugins=self.release.rest_plugins,
                           rest_user=REST_USER,
                           api_version="auto", binds=(str(self.state_dir), str(REPO)))
        if self.subnet:
            if not net.subnet_is_free(self.subnet, base.bridge):
                raise DevClusterError(f"subnet {self.subnet} overlaps a network of this host")
            return replace(base, subnet=self.subnet)
        if previous is not None and net.subnet_is_free(previous.subnet, base.bridge):
            return replace(base, subnet=previous.subnet)
        return replace(base, subnet=net.pick_free_subnet(DEFAULT_SUBNETS, base.bridge))

    def slurm_env(self, layout: DevClusterLayout) -> dict[str, str]:
        return {"PATH": SBIN_PATH, "SLURM_CONF": str(layout.slurm_conf), "LANG": "C.UTF-8"}

    def command(self, layout: DevClusterLayout, argv: list[str]) -> list[str]:
        """``argv`` (a Slurm daemon or client command) as it runs for this cluster: in its release's tree."""
        return rootfs.wrap(Path(layout.root_fs) if layout.root_fs else None, [Path(b) for b in layout.binds], argv)

    def component_names(self, layout: DevClusterLayout) -> list[str]:
        return ["munged", *(["slurmdbd"] if layout.accounting else []), "slurmctld",
                *[f"slurmd-{n.name}" for n in layout.nodes], "slurmrestd-local", "slurmrestd-jwt"]

    def scontrol_fallback(self, layout: DevClusterLayout):
        """The REST client's ``scontrol`` fallback (requeue; GRES and admin comment on v0.0.38) for this cluster."""
        return ScontrolRequeue(str(layout.slurm_conf), prefix=self.command(layout, []))

    # -- clients -----------------------------------------------------------------
    def mint_token(self, layout: DevClusterLayout, user: str = "root", lifespan_s: int = 3600) -> str:
        return mint_hs256(layout.jwt_key.read_bytes(), user, issued_at_s=int(time.time()), lifespan_s=lifespan_s)

    def service_rest_settings(self, layout: DevClusterLayout, *, timeout_s: float = 15.0) -> SlurmRestSettings:
        """How MuxFlow's own account (``muxflow``, an Operator; not SlurmUser, not root) talks to the cluster: TCP
        with the token ``dev-up`` keeps in ``<state>/muxflow/slurm.jwt`` (re-read on every request). That file is
        ``muxflow``'s (0600) and the client refuses a token file another user owns: for processes running as
        ``muxflow``, as MuxFlow's do."""
        return SlurmRestSettings(api_version=layout.api_version, url=layout.rest_url, user_name=MUXFLOW_USER,
                                 token_file=str(layout.muxflow_jwt_file), timeout_s=timeout_s)

    def rest_settings(self, layout: DevClusterLayout, transport: str = "local", *, user: str = "root",
                      timeout_s: float = 15.0) -> SlurmRestSettings:
        """``local``: the unix socket (acts as the service user, SlurmUser); ``jwt``: TCP with a fresh token for
        ``user``; ``service``: MuxFlow's Operator account (:meth:`service_rest_settings`)."""
        if transport == "service":
            return self.service_rest_settings(layout, timeout_s=timeout_s)
        if transport == "local" and self._socket_needs_token(layout):
            # slurmrestd cannot act as SlurmUser on its socket: the socket takes SlurmUser's tokens instead.
            return SlurmRestSettings(api_version=layout.api_version, unix_socket=str(layout.rest_socket),
                                     user_name=layout.service_user, token=self.mint_token(layout, layout.service_user),
                                     timeout_s=timeout_s)
        if transport == "local":
            return SlurmRestSettings(api_version=layout.api_version, unix_socket=str(layout.rest_socket),
                                     timeout_s=timeout_s)
        if transport == "jwt":
            return SlurmRestSettings(api_version=layout.api_version, url=layout.rest_url, user_name=user,
                                     token=self.mint_token(layout, user), timeout_s=timeout_s)
        raise ValueError(f"transport must be 'local', 'jwt' or 'service', got {transport!r}")

    @staticmethod
    def _socket_needs_token(layout: DevClusterLayout) -> bool:
        """From 23.11 on slurmrestd refuses to run as SlurmUser, so rest_auth/local on its socket acts as an
        unprivileged user; the dev cluster's socket then uses rest_auth/jwt (docs/SLURM.md "Slurm 24.11")."""
        return bool(layout.rest_user) and layout.rest_user != layout.service_user

    # -- readiness checks ----------------------------------------------------------
    def _run(self, layout: DevClusterLayout, *argv: str, timeout_s: float = 10.0) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(self.command(layout, list(argv)), env=self.slurm_env(layout), capture_output=True,
                                  text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(list(argv), 124, "", f"timed out after {timeout_s}s")

    def node_states(self, layout: DevClusterLayout) -> dict[str, str]:
        out = self._run(layout, "sinfo", "-h", "-N", "-o", "%N|%T")
        states = {}
        for line in out.stdout.splitlines():
            name, _, state = line.partition("|")
            states[name.strip()] = state.strip()
        return states

    def _nodes_ready(self, layout: DevClusterLayout, names: list[str]) -> str | None:
        states = self.node_states(layout)
        bad = {n: states.get(n, "missing") for n in names if states.get(n) not in GOOD_SINFO_STATES}
        return None if not bad else "node states " + ", ".join(f"{k}={v}" for k, v in sorted(bad.items()))

    def _rest_ready(self, layout: DevClusterLayout, transport: str) -> str | None:
        try:
            with SlurmRestClient(self.rest_settings(layout, transport, timeout_s=5.0)) as client:
                pings = client.ping()
        except (SlurmError, OSError) as exc:
            return str(exc)
        return None if any(p.up for p in pings) else f"controller not up: {pings}"

    # -- components ----------------------------------------------------------------
    def _components(self, layout: DevClusterLayout, db: str = "kept", template: str | None = None
                    ) -> list[list[_Component]]:
        """The stages of ``up``. ``db``: how this start found the accounting database: ``kept`` (a running
        cluster's), ``template`` (copied, set up already) or ``empty`` (then kept as ``template`` once set up)."""
        env = self.slurm_env(layout)
        conf = str(layout.slurm_conf)
        logs = layout.log_dir
        user = layout.rest_user or layout.service_user

        def munge_ready() -> str | None:
            out = self._run(layout, "munge", "-n", "-S", str(layout.munge_socket), timeout_s=5)
            return None if out.returncode == 0 else (out.stderr.strip() or "munge -n failed")

        def dbd_ready() -> str | None:
            out = self._run(layout, "sacctmgr", "-n", "show", "cluster", timeout_s=5)
            return None if out.returncode == 0 else ((out.stdout + out.stderr).strip() or "sacctmgr failed")

        def ctld_ready() -> str | None:
            out = self._run(layout, "scontrol", "ping")
            return None if " is UP" in out.stdout else (out.stdout + out.stderr).strip()

        def rm_socket(path: Path) -> Callable[[], None]:
            return lambda: path.unlink(missing_ok=True)

        wrap = lambda argv: self.command(layout, argv)  # noqa: E731
        munged = _Component(
            "munged",
            wrap(["munged", "-F", f"--socket={layout.munge_socket}", f"--key-file={layout.munge_key}",
             f"--log-file={layout.munge_dir / 'munged.log'}", f"--pid-file={layout.munge_dir / 'munged.pid'}",
             f"--seed-file={layout.munge_dir / 'munged.seed'}"]),
            [logs / "munged.out", layout.munge_dir / "munged.log"], munge_ready, env,
            rm_socket(layout.munge_socket))
        # slurmdbd has no -f: it reads slurmdbd.conf next to $SLURM_CONF; started by root, it becomes SlurmUser
        # itself once it has read it. Once it answers, sacctmgr sets up the cluster and its accounts (before
        # slurmctld starts, so that slurmctld registers with its cluster already there).
        dbd = _Component("slurmdbd", wrap(["slurmdbd", "-D"]),
                         [logs / "slurmdbd.out", logs / "slurmdbd.log"], dbd_ready, env,
                         after_ready=lambda started: self._bootstrap_accounting(layout, db, template, started))
        ctld = _Component("slurmctld", wrap(["slurmctld", "-D", "-f", conf]),
                          [logs / "slurmctld.out", logs / "slurmctld.log"], ctld_ready, env)
        slurmds = []
        for node in layout.nodes:
            slurmds.append(_Component(
                f"slurmd-{node.name}",
                # nsenter, not `ip netns exec`: the latter remounts /sys and
                # slurmd then cannot initialize its cgroup plugin (docs/DESIGN.md §4).
                ["nsenter", f"--net={layout.netns_path(node)}", *wrap(["slurmd", "-D", "-f", conf, "-N", node.name])],
                [logs / f"slurmd-{node.name}.out", logs / f"slurmd-{node.name}.log", logs / "slurmctld.log"],
                lambda n=node.name: self._nodes_ready(layout, [n]), env))
        rest_args = ["slurmrestd", "-f", conf, "-u", user, "-s", layout.rest_plugins]
        socket_jwt = self._socket_needs_token(layout)
        rest_local = _Component(
            "slurmrestd-local", wrap([*rest_args, "-a", "rest_auth/jwt" if socket_jwt else "rest_auth/local",
                                      f"unix:{layout.rest_socket}"]),
            [logs / "slurmrestd-local.out"], lambda: self._rest_ready(layout, "local"),
            {**env, "SLURM_JWT": "daemon"} if socket_jwt else env, rm_socket(layout.rest_socket))
        # A slurmrestd that takes JWTs must itself use auth/jwt toward slurmctld
        # (SLURM_JWT=daemon), which rest_auth/local cannot share: hence two.
        rest_jwt = _Component(
            "slurmrestd-jwt", wrap([*rest_args, "-a", "rest_auth/jwt", f"127.0.0.1:{layout.rest_port}"]),
            [logs / "slurmrestd-jwt.out"], lambda: self._rest_ready(layout, "jwt"),
            {**env, "SLURM_JWT": "daemon"})
        return [[munged], *([[dbd]] if layout.accounting else []), [ctld], slurmds, [rest_local, rest_jwt]]

    def _bootstrap_accounting(self, layout: DevClusterLayout, db: str, template: str | None, started: bool) -> None:
        """The cluster and its accounts in slurmdbd, when this up started slurmdbd (a database copied from the
        template has them already)."""
        if not started or db == "template":
            return
        run = lambda *argv: self._run(layout, *argv, timeout_s=30)  # noqa: E731
        try:
            load_file = layout.etc_dir / "accounts.cfg" if db == "empty" else None
            done = accounting.bootstrap(run, layout, load_file=load_file)
        except accounting.AccountingError as exc:
            raise DevClusterError(f"setting up the accounts: {exc}", [layout.log_dir / "slurmdbd.log"]) from exc
        if done:
            self.echo("  accounting: added " + ", ".join(done))
        if db == "empty" and template:
            accounting.save_template(layout, template)

    def _dbd_version(self, layout: DevClusterLayout) -> str | None:
        """The release's Slurm version (``sacctmgr -V``: the same package version as slurmdbd's)."""
        out = self._run(layout, "sacctmgr", "-V")
        return (out.stdout.strip() or None) if out.returncode == 0 else None

    # -- up --------------------------------------------------------------------------
    def up(self, *, timeout_s: float = 120.0, install: bool = True) -> DevStatus:
        if os.geteuid() != 0:
            raise DevClusterError("the dev cluster needs root (network namespaces, munged, slurmd); "
                                  "run `sudo muxflow slurm dev-up`")
        if install and self.release is None:
            ensure_packages(self.echo)
        if self.release is not None:
            rootfs.ensure_rootfs(self.release, self.echo)
        pw = ensure_service_user(SERVICE_USER)
        muxflow_pw = ensure_service_user(MUXFLOW_USER)
        ensure_service_user(REFERENCE_USER)
        for name in JOB_USERS:
            ensure_job_user(name)
        if self.release is not None:
            ensure_service_user(REST_USER)
            rootfs.sync_users(self.release.path, (SERVICE_USER, REST_USER, MUXFLOW_USER, REFERENCE_USER, *JOB_USERS))
        previous = self.load_layout()
        running = [r for r in self.procs.all() if r.running()]
        storage_pass = None  # set when the accounting database is created anew
        db, template = "kept", None
        if previous is None or not running:
            if previous is not None or self.procs.all():
                self.down(quiet=True)  # leftovers of a crashed cluster: stray processes, stale network
            layout = self._new_layout(previous)
            self._check_ports(layout)
            if layout.accounting:
                ensure_mariadb(self.echo, install=install)
                storage_pass = secrets.token_hex(24)
            rest_pw = pwd.getpwnam(layout.rest_user) if layout.rest_user else None
            prepare_state(layout, pw.pw_uid, pw.pw_gid, (rest_pw.pw_uid, rest_pw.pw_gid) if rest_pw else None,
                          storage_pass)
            if storage_pass is not None:
                version = self._dbd_version(layout)  # the client reads slurm.conf even for -V
                template = accounting.template_name(version, cluster_name=layout.cluster_name) if version else None
                db = "template" if accounting.create_database(layout, storage_pass, template) else "empty"
            self._forget_records()
            self.echo(f"starting the dev Slurm cluster in {self.state_dir} (subnet {layout.subnet})")
        else:
            layout = previous
            if layout.accounting and not self._running(["slurmdbd"]):
                ensure_mariadb(self.echo, install=install)  # slurmdbd is to be restarted: its database must answer
        # A running cluster gets the current scripts too, and MuxFlow's credentials are renewed when they expire.
        install_node_scripts(layout, pw.pw_uid, muxflow_pw.pw_uid)
        for path in ensure_credentials(layout, (muxflow_pw.pw_uid, muxflow_pw.pw_gid), (MUXFLOW_USER, REFERENCE_USER)):
            self.echo(f"  wrote {path}")
        net.network_up(layout)
        deadline = time.monotonic() + timeout_s
        started = 0
        for stage in self._components(layout, db, template):
            fresh = []
            for comp in stage:
                rec = self.procs.get(comp.name)
                if rec is not None and rec.running():
                    continue
                if comp.before_start:
                    comp.before_start()
                rec = self.procs.start(comp.name, comp.argv, log=layout.log_dir / f"{comp.name}.out",
                                       env=comp.env, cwd=layout.state_dir)
                self.echo(f"  started {comp.name} (pid {rec.pid})")
                fresh.append((comp, rec))
                started += 1
            for comp in stage:  # wait for the whole stage, the already-running ones included
                self._wait(comp, deadline, [r for c, r in fresh])
                if comp.after_ready:
                    comp.after_ready(any(c is comp for c, _ in fresh))
        if started == 0:
            self.echo(f"the dev Slurm cluster is already up ({self.state_dir}); nothing started")
        return self.status()

    def _wait(self, comp: _Component, deadline: float, watch: list[ProcRecord]) -> None:
        while True:
            reason = comp.ready()
            if reason is None:
                return
            for rec in watch:
                if not rec.running():
                    raise DevClusterError(f"{rec.name} (pid {rec.pid}) exited while waiting for {comp.name}",
                                          comp.logs + [Path(rec.log)])
            if time.monotonic() >= deadline:
                raise DevClusterError(f"timed out waiting for {comp.name}: {reason}", comp.logs)
            time.sleep(POLL_S)

    def _running(self, names: list[str]) -> bool:
        return all((rec := self.procs.get(n)) is not None and rec.running() for n in names)

    def _check_ports(self, layout: DevClusterLayout) -> None:
        ports = [("0.0.0.0", layout.slurmctld_port, "slurmctld"), ("127.0.0.1", layout.rest_port, "slurmrestd (JWT)")]
        if layout.accounting:
            ports.append(("0.0.0.0", layout.dbd_port, "slurmdbd"))
        for host, port, what in ports:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((host, port))
                except OSError as exc:
                    raise DevClusterError(f"port {port} for {what} is taken on {host}: {exc}") from exc

    def _forget_records(self) -> None:
        for rec in self.procs.all():
            self.procs.drop(rec.name)

    # -- down ------------------------------------------------------------------------
    def down(self, *, grace_s: float = 10.0, quiet: bool = False) -> list[str]:
        """Stop every recorded process and whatever else runs in the nodes' namespaces; problems left."""
        say = (lambda _m: None) if quiet else self.echo
        layout = self.load_layout()
        records = {r.name: r for r in self.procs.all()}
        slurmds = sorted(n for n in records if n.startswith("slurmd-"))
        # slurmctld before slurmdbd (it sends what it still holds for accounting), munged last.
        stages = [["slurmrestd-jwt", "slurmrestd-local"], slurmds, ["slurmctld", "slurmdbd", "munged"]]
        stages.append(sorted(set(records) - {n for st in stages for n in st}))
        problems: list[str] = []
        stopped: list[int] = []
        for i, stage in enumerate(stages):
            for name in stage:
                rec = records.get(name)
                if rec is None:
                    continue
                if rec.running():
                    family = [rec.pid, *descendants(rec.pid)]
                    stopped += family
                    left = terminate(family, grace_s)
                    say(f"  stopped {name} (pid {rec.pid})")
                    problems += [f"{name}: pid {p} survived SIGKILL" for p in left]
                self.procs.drop(name)
            if i == 1 and layout is not None:
                for node in layout.nodes:  # slurmstepd and job processes outlive slurmd
                    strays = net.pids_in_netns(layout.netns_path(node))
                    if strays:
                        say(f"  stopping {len(strays)} process(es) left in {layout.netns(node)}: {strays}")
                        stopped += strays
                        left = terminate(strays, 2.0)
                        problems += [f"{layout.netns(node)}: pid {p} survived SIGKILL" for p in left]
        if layout is not None:
            problems += net.network_down(layout)
            for sock in (layout.rest_socket, layout.munge_socket):
                sock.unlink(missing_ok=True)
            if layout.accounting and "slurmdbd" in records:
                # The accounting database goes with the cluster (a fresh start creates a new one).
                why = accounting.drop_database(layout)
                if why is not None:
                    say(f"  note: {why}")
        wait_reaped(stopped, 3.0)
        return problems

    # -- status ----------------------------------------------------------------------
    def status(self) -> DevStatus:
        layout = self.load_layout()
        problems: list[str] = []
        if layout is None:
            recs = self.procs.all()
            procs = tuple(ProcState(r.name, r.pid, r.running()) for r in recs)
            problems.append(f"not set up: no {self.state_dir / 'cluster.json'} (run `muxflow slurm dev-up`)")
            problems += [f"{p.name} (pid {p.pid}) runs without a layout" for p in procs if p.alive]
            return DevStatus(self.state_dir, None, procs, (), (), {}, tuple(problems))
        states = []
        for name in self.component_names(layout):
            rec = self.procs.get(name)
            alive = rec is not None and rec.running()
            states.append(ProcState(name, rec.pid if rec else None, alive))
            if not alive:
                problems.append(f"{name} is not running")
        rest: dict[str, str | None] = {}
        nodes: tuple[Node, ...] = ()
        parts: tuple[Partition, ...] = ()
        for transport, label in (("local", f"unix:{layout.rest_socket}"), ("jwt", layout.rest_url)):
            try:
                with SlurmRestClient(self.rest_settings(layout, transport, timeout_s=5.0)) as client:
                    client.ping()
                    if transport == "local":
                        nodes = tuple(client.list_nodes())
                        parts = tuple(client.list_partitions())
                rest[label] = None
            except (SlurmError, OSError) as exc:
                rest[label] = str(exc)
                problems.append(f"REST {label}: {exc}")
        if rest.get(f"unix:{layout.rest_socket}") is None:
            seen = {n.name: n for n in nodes}
            for dn in layout.nodes:
                n = seen.get(dn.name)
                if n is None:
                    problems.append(f"node {dn.name} unknown to slurmctld")
                elif not n.usable:
                    problems.append(f"node {dn.name} is {'+'.join((n.state, *n.state_flags))}")
            missing = set(layout.partitions) - {p.name for p in parts}
            problems += [f"partition {p} missing" for p in sorted(missing)]
        return DevStatus(self.state_dir, layout, tuple(states), nodes, parts, rest, tuple(problems))
