"""Where the dev cluster keeps everything, and its Slurm configuration (pure rendering).

All state lives under one directory (default ``/tmp/muxflow-slurm``): the
configuration, a dedicated munge key and socket (a system munged is never
touched), the JWT key, spool and state directories, logs, process records and
the slurmrestd socket. GPUs are plain files (docs/DESIGN.md §4): Slurm schedules
``gpu`` and ``mps`` GRES on them without a device behind.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from executors.slurm.hostlist import per_gpu_type

DEFAULT_STATE_DIR = Path("/tmp/muxflow-slurm")
SERVICE_USER = "muxflow-slurm"  # slurmctld (as SlurmUser) and slurmrestd run as this system user
REST_USER = "muxflow-rest"  # slurmrestd of the releases that refuse to run as SlurmUser
# MuxFlow's own identity on the cluster: a plain account with Slurm's AdminLevel=Operator (slurmdbd), neither
# SlurmUser nor root; and the unprivileged account MuxFlow's reference workloads run as.
MUXFLOW_USER = "muxflow"
REFERENCE_USER = "mxref"
SLURM_ACCOUNT = "mxdev"  # the accounting account every dev-cluster user belongs to
DEFAULT_SUBNETS = ("10.213.7.0/24", "10.213.77.0/24", "172.29.213.0/24")
NODE_HOST_OFFSET = 11  # node i gets the subnet's host number 11 + i; the bridge gets 1


@dataclass(frozen=True)
class DevNode:
    """One slurmd in its own network namespace, with ``gpus`` GPU files of one type.

    ``per_gpu_types``: each GPU gets its own gres Type ``<gpu_type>g<index>`` on its ``gpu``
    and ``mps`` lines, so a placement can name its GPU (``--gres=mps:t4g2:40``; docs/SLURM.md
    "One gres Type per GPU"); off, the node has the classic ``gpu:<type>:<n>,mps:<n*100>``
    and Slurm picks the GPU of each share itself.
    """

    name: str
    gpu_type: str
    gpus: int = 4
    mps_count: int = 400  # 100 per GPU, so --gres=mps:<pct> is a percentage of one GPU
    # One CPU slot per MPS percent: with Flags=all_sharing a node runs up to 400 one-percent
    # MPS jobs at once (100 on each GPU), so MPS, never CPUs, limits tiny concurrent jobs (test
    # runs sharing the cluster); config_overrides lets a node claim them whatever the host has.
    cpus: int = 400
    real_memory_mb: int = 4000
    per_gpu_types: bool = True

    def __post_init__(self) -> None:
        if self.gpus <= 0 or self.mps_count % self.gpus:
            raise ValueError(f"node {self.name}: mps_count {self.mps_count} must split evenly over {self.gpus} GPUs")

    def gres_types(self) -> list[str]:
        """The gres Type of each GPU, by index: ``t4g0``… with per-GPU types, else the model for all."""
        return [per_gpu_type(self.gpu_type, i) if self.per_gpu_types else self.gpu_type for i in range(self.gpus)]

    def slurm_gres(self) -> str:
        """The node's ``Gres=`` in slurm.conf."""
        if not self.per_gpu_types:
            return f"gpu:{self.gpu_type}:{self.gpus},mps:{self.mps_count}"
        per_gpu = self.mps_count // self.gpus
        types = self.gres_types()
        return ",".join([f"gpu:{t}:1" for t in types] + [f"mps:{t}:{per_gpu}" for t in types])


DEFAULT_NODES = (DevNode("mx-t4-1", "t4"), DevNode("mx-a10-1", "a10"))
DEFAULT_PARTITIONS = ("online", "offline", "profile")


@dataclass(frozen=True)
class DevClusterLayout:
    state_dir: Path
    controller_host: str
    subnet: str = DEFAULT_SUBNETS[0]
    nodes: tuple[DevNode, ...] = DEFAULT_NODES
    partitions: tuple[str, ...] = DEFAULT_PARTITIONS
    default_partition: str = "offline"
    cluster_name: str = "muxflowdev"
    bridge: str = "mxslurm0"
    slurmctld_port: int = 6917
    slurmd_port: int = 6918
    rest_port: int = 6920
    # slurmdbd's port (accounting in MariaDB, so that MuxFlow's account can be an Operator); 0: a cluster
    # started before the dev cluster ran slurmdbd (no accounting).
    dbd_port: int = 6919
    service_user: str = SERVICE_USER
    # slurmrestd's user: SlurmUser on 22.05 (its unix socket then acts with SlurmUser's rights); from 23.11 on
    # slurmrestd refuses to run as SlurmUser, so another unprivileged user ("" = service_user).
    rest_user: str = ""
    rest_plugins: str = "openapi/v0.0.38"
    # "auto": the client takes the newest version the server's OpenAPI document offers (24.11 serves three).
    api_version: str = "v0.0.38"
    # A Debian tree with another Slurm release the daemons and commands run in ("" = the host's Slurm;
    # executors.dev.slurm.rootfs), and the host's directories bound into it at the same paths.
    root_fs: str = ""
    binds: tuple[str, ...] = ()
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "state_dir", Path(self.state_dir))
        net = ipaddress.ip_network(self.subnet)
        if net.num_addresses < NODE_HOST_OFFSET + len(self.nodes) + 2:
            raise ValueError(f"subnet {self.subnet} is too small for {len(self.nodes)} nodes")
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"node names must be unique and non-empty: {names}")
        if self.default_partition not in self.partitions:
            raise ValueError(f"default partition {self.default_partition!r} not in {self.partitions}")
        if len(self.bridge) + 3 > 15:
            raise ValueError(f"bridge name {self.bridge!r} too long for veth names")

    # -- network ---------------------------------------------------------------
    @property
    def prefix_len(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    @property
    def controller_address(self) -> str:
        return str(ipaddress.ip_network(self.subnet).network_address + 1)

    def node_address(self, node: DevNode) -> str:
        i = self.nodes.index(node)
        return str(ipaddress.ip_network(self.subnet).network_address + NODE_HOST_OFFSET + i)

    def netns(self, node: DevNode) -> str:
        return f"{self.bridge}-{node.name}"

    def netns_path(self, node: DevNode) -> Path:
        return Path("/var/run/netns") / self.netns(node)

    def veth(self, node: DevNode) -> str:
        return f"{self.bridge}v{self.nodes.index(node)}"

    def node(self, name: str) -> DevNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no dev node {name!r}")

    # -- paths -----------------------------------------------------------------
    @property
    def etc_dir(self) -> Path:
        return self.state_dir / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc_dir / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.etc_dir / "gres.conf"

    @property
    def munge_dir(self) -> Path:
        return self.state_dir / "munge"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def jwt_dir(self) -> Path:
        return self.state_dir / "jwt"

    @property
    def jwt_key(self) -> Path:
        return self.jwt_dir / "jwt_hs256.key"

    @property
    def ctld_dir(self) -> Path:
        return self.state_dir / "ctld"

    @property
    def spool_root(self) -> Path:
        return self.state_dir / "spool"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def pid_dir(self) -> Path:
        return self.state_dir / "pids"

    @property
    def rest_dir(self) -> Path:
        return self.state_dir / "rest"

    @property
    def rest_socket(self) -> Path:
        return self.rest_dir / "slurmrestd.sock"

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def gpu_dir(self) -> Path:
        return self.state_dir / "gpu"

    @property
    def jobs_dir(self) -> Path:
        """World-writable (sticky) directory for job scripts' output and test artefacts."""
        return self.state_dir / "jobs"

    @property
    def node_script_dir(self) -> Path:
        """Copies of ``executors/node/slurm/*.sh`` the slurmds run (installed by ``dev-up``)."""
        return self.state_dir / "node"

    @property
    def plan_dir(self) -> Path:
        """Root-owned per-job plan files the Prolog writes and the TaskProlog reads (docs/SLURM.md)."""
        return self.state_dir / "plans"

    @property
    def mps_pipe_root(self) -> Path:
        """Per node and GPU MPS pipe directories (``<root>/<node>/gpu<i>``), where the stand-in control logs."""
        return self.state_dir / "mps"

    @property
    def job_submit_lua(self) -> Path:
        """Slurm looks for ``job_submit.lua`` next to ``slurm.conf``."""
        return self.etc_dir / "job_submit.lua"

    @property
    def layout_file(self) -> Path:
        return self.state_dir / "cluster.json"

    @property
    def job_state_dir(self) -> Path:
        """Root-owned (0755): the per-job directories the Prolog creates."""
        return self.state_dir / "jobstate"

    @property
    def hook_dir(self) -> Path:
        """The directory of the iteration hook (a copy of ``executors/job/runtime/hook/sitecustomize.py``), which the
        TaskProlog puts first on a profiled job's ``PYTHONPATH``."""
        return self.node_script_dir / "python-hook"

    @property
    def plan_tool(self) -> Path:
        """The copy of ``executors/slurm/plan.py`` the Prolog runs (``python3 muxflow_plan.py prolog …``)."""
        return self.node_script_dir / "muxflow_plan.py"

    @property
    def node_plan_key_file(self) -> Path:
        """The nodes' copy of the plan-signing key (root, 0600), for the Prolog to verify plans."""
        return self.etc_dir / "plan.key"

    # -- MuxFlow's credentials (owned by MuxFlow's account, docs/SLURM.md "Accounts") --------------------
    @property
    def muxflow_dir(self) -> Path:
        """MuxFlow's credentials, owned by its account (0700)."""
        return self.state_dir / "muxflow"

    @property
    def muxflow_jwt_file(self) -> Path:
        """A token for MuxFlow's account (an Operator): what MuxFlow talks to slurmrestd with."""
        return self.muxflow_dir / "slurm.jwt"

    @property
    def reference_jwt_file(self) -> Path:
        """A token for the reference workloads' account, with which MuxFlow submits them."""
        return self.muxflow_dir / "reference.jwt"

    @property
    def plan_key_file(self) -> Path:
        """MuxFlow's copy of the plan-signing key (its account, 0600)."""
        return self.muxflow_dir / "plan.key"

    # -- accounting (slurmdbd) -------------------------------------------------
    @property
    def accounting(self) -> bool:
        return self.dbd_port != 0

    @property
    def slurmdbd_conf(self) -> Path:
        """slurmdbd has no ``-f``: it reads ``slurmdbd.conf`` next to ``$SLURM_CONF``."""
        return self.etc_dir / "slurmdbd.conf"

    @property
    def storage_loc(self) -> str:
        """The MariaDB database (and its user's name) of this cluster: one per bridge, so clusters run side by side."""
        return "muxflow_" + re.sub(r"[^A-Za-z0-9_]", "_", self.bridge)

    @property
    def storage_user(self) -> str:
        return self.storage_loc

    def gpu_files(self, node: DevNode) -> list[Path]:
        return [self.gpu_dir / f"{node.name}-gpu{i}" for i in range(node.gpus)]

    # -- configuration ---------------------------------------------------------
    def render_slurm_conf(self) -> str:
        s = self.state_dir
        node_names = ",".join(n.name for n in self.nodes)
        lines = [
            "# Generated by `muxflow slurm dev-up`; rewritten on every fresh start.",
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={self.controller_host}({self.controller_address})",
            f"SlurmctldPort={self.slurmctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            # slurmctld runs as the service user; slurmrestd (same user) thereby
            # acts with SlurmUser rights for clients it admits (root and itself).
            f"SlurmUser={self.service_user}",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            "AuthAltTypes=auth/jwt",
            f"AuthAltParameters=jwt_key={self.jwt_key}",
            f"StateSaveLocation={self.ctld_dir}",
            f"SlurmdSpoolDir={s / 'spool' / '%n'}",
            f"SlurmctldPidFile={self.run_dir / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.run_dir / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}",
            f"SlurmdLogFile={self.log_dir / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # No cgroup plugins: several slurmds share one host's cgroup tree.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            *self._accounting_lines(),
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu,mps",
            # Nodes claim the CPUs and memory configured here, not the host's.
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "MinJobAge=300",
            "KillWait=5",
            "JobRequeue=1",
            # MuxFlow hooks (docs/SLURM.md "Offline pick-up", "Node scripts"): job_submit.lua holds every
            # offline-partition job for placement; the node scripts configure MPS and xCUDA.
            "JobSubmitPlugins=lua",
            f"Prolog={self.node_script_dir / 'prolog.sh'}",
            f"Epilog={self.node_script_dir / 'epilog.sh'}",
            f"TaskProlog={self.node_script_dir / 'task_prolog.sh'}",
        ]
        lines += [f"{k}={v}" for k, v in sorted(self.extra.items())]
        for n in self.nodes:
            lines.append(
                f"NodeName={n.name} NodeAddr={self.node_address(n)} NodeHostname={n.name} CPUs={n.cpus} "
                f"RealMemory={n.real_memory_mb} Gres={n.slurm_gres()} State=UNKNOWN")
        for p in self.partitions:
            default = "YES" if p == self.default_partition else "NO"
            lines.append(f"PartitionName={p} Nodes={node_names} Default={default} MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _accounting_lines(self) -> list[str]:
        if not self.accounting:
            return ["AccountingStorageType=accounting_storage/none"]
        # AccountingStoragePass names the munge socket the controller and the clients (sacctmgr) sign their
        # messages to slurmdbd with; without it they use the system's socket and slurmdbd refuses them.
        return ["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=127.0.0.1",
                f"AccountingStoragePort={self.dbd_port}", f"AccountingStoragePass={self.munge_socket}"]

    def render_slurmdbd_conf(self, storage_pass: str) -> str:
        """slurmdbd.conf (SlurmUser's, mode 0600: it holds ``storage_pass``, the database user's password)."""
        if not self.accounting:
            raise ValueError("this layout has no slurmdbd (dbd_port=0)")
        lines = [
            "# Generated by `muxflow slurm dev-up`; rewritten on every fresh start.",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "AuthAltTypes=auth/jwt",
            f"AuthAltParameters=jwt_key={self.jwt_key}",
            "DbdHost=localhost",
            "DbdAddr=127.0.0.1",
            f"DbdPort={self.dbd_port}",
            f"SlurmUser={self.service_user}",
            f"LogFile={self.log_dir / 'slurmdbd.log'}",
            f"PidFile={self.run_dir / 'slurmdbd.pid'}",
            "DebugLevel=info",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            "StoragePort=3306",
            f"StorageUser={self.storage_user}",
            f"StoragePass={storage_pass}",
            f"StorageLoc={self.storage_loc}",
        ]
        return "\n".join(lines) + "\n"

    def render_gres_conf(self) -> str:
        """Plain files stand in for GPUs; ``Flags=all_sharing`` on every mps line (docs/DESIGN.md §4).

        Slurm 22.05's default for mps is one_sharing: once an MPS job runs on a node, later
        ones must use that same GPU. all_sharing lets MPS jobs use every GPU of a node at once.
        """
        lines = ["# Generated by `muxflow slurm dev-up`: plain files stand in for GPUs.", "AutoDetect=off"]
        for n in self.nodes:
            if not n.per_gpu_types:
                files = f"{self.gpu_dir}/{n.name}-gpu[0-{n.gpus - 1}]"
                lines.append(f"NodeName={n.name} Name=gpu Type={n.gpu_type} File={files}")
                lines.append(f"NodeName={n.name} Name=mps Count={n.mps_count} File={files} Flags=all_sharing")
                continue
            for gtype, path in zip(n.gres_types(), self.gpu_files(n)):
                lines.append(f"NodeName={n.name} Name=gpu Type={gtype} File={path}")
                lines.append(f"NodeName={n.name} Name=mps Type={gtype} Count={n.mps_count // n.gpus} File={path} "
                             "Flags=all_sharing")
        return "\n".join(lines) + "\n"

    # -- persistence -----------------------------------------------------------
    def to_json(self) -> str:
        d = asdict(self)
        d["state_dir"] = str(self.state_dir)
        return json.dumps(d, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> DevClusterLayout:
        d = json.loads(text)
        d["nodes"] = tuple(DevNode(**n) for n in d["nodes"])
        d["partitions"] = tuple(d["partitions"])
        d["binds"] = tuple(d.get("binds") or ())
        d.setdefault("dbd_port", 0)  # written before the dev cluster ran slurmdbd
        d["state_dir"] = Path(d["state_dir"])
        return cls(**d)
