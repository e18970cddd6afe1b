"""A host bridge plus one network namespace per dev node, joined by veth pairs (docs/DESIGN.md §4).

Debian's Slurm has no multiple-slurmd support, so each slurmd gets its own
network namespace and address. slurmd is later entered into it with
``nsenter --net=…`` rather than ``ip netns exec``, which remounts ``/sys``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from pathlib import Path

from executors.dev.slurm.layout import DevClusterLayout
from executors.dev.slurm.procs import all_pids


class NetworkError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
    return out


def _ip_json(*args: str) -> list[dict]:
    out = _ip("-j", *args, check=False)
    try:
        return json.loads(out.stdout or "[]")
    except json.JSONDecodeError:
        return []


def link_exists(name: str, netns: str | None = None) -> bool:
    args = (["-n", netns] if netns else []) + ["link", "show", name]
    return _ip(*args, check=False).returncode == 0


def used_networks(exclude_dev: str | None = None) -> list[ipaddress.IPv4Network]:
    """Networks of this host's IPv4 addresses and routes (the default route excluded)."""
    nets = []
    for link in _ip_json("-4", "addr"):
        if link.get("ifname") == exclude_dev:
            continue
        for a in link.get("addr_info", []):
            nets.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
    for r in _ip_json("-4", "route"):
        dst = r.get("dst")
        if dst and dst != "default" and r.get("dev") != exclude_dev:
            nets.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False))
    return nets


def pick_free_subnet(candidates: tuple[str, ...], bridge: str) -> str:
    used = used_networks(exclude_dev=bridge)
    for cand in candidates:
        net = ipaddress.ip_network(cand)
        if not any(net.overlaps(u) for u in used):
            return cand
    raise NetworkError(f"every candidate subnet overlaps a network of this host: {', '.join(candidates)}; "
                       "set MUXFLOW_SLURM_SUBNET to a free private /24")


def subnet_is_free(subnet: str, bridge: str) -> bool:
    net = ipaddress.ip_network(subnet)
    return not any(net.overlaps(u) for u in used_networks(exclude_dev=bridge))


def _has_addr(dev: str, addr: str, netns: str | None = None) -> bool:
    args = (["-n", netns] if netns else []) + ["-4", "addr", "show", "dev", dev]
    for link in _ip_json(*args):
        if any(a.get("local") == addr for a in link.get("addr_info", [])):
            return True
    return False


def network_up(layout: DevClusterLayout) -> None:
    """Create what is missing of the bridge, namespaces and veth pairs; existing pieces are kept."""
    br, plen = layout.bridge, layout.prefix_len
    if not link_exists(br):
        _ip("link", "add", br, "type", "bridge")
    if not _has_addr(br, layout.controller_address):
        _ip("addr", "add", f"{layout.controller_address}/{plen}", "dev", br)
    _ip("link", "set", br, "up")
    for node in layout.nodes:
        ns, veth = layout.netns(node), layout.veth(node)
        if not layout.netns_path(node).exists():
            _ip("netns", "add", ns)
        if not link_exists(veth):
            if link_exists("eth0", ns):
                _ip("-n", ns, "link", "del", "eth0")
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "master", br)
        _ip("link", "set", veth, "up")
        if not _has_addr("eth0", layout.node_address(node), ns):
            _ip("-n", ns, "addr", "add", f"{layout.node_address(node)}/{plen}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")


def network_down(layout: DevClusterLayout) -> list[str]:
    """Remove veths, namespaces and the bridge; what could not be removed."""
    problems = []
    for node in layout.nodes:
        if link_exists(layout.veth(node)):
            out = _ip("link", "del", layout.veth(node), check=False)
            if out.returncode:
                problems.append(f"veth {layout.veth(node)}: {out.stderr.strip()}")
        if layout.netns_path(node).exists():
            out = _ip("netns", "del", layout.netns(node), check=False)
            if out.returncode:
                problems.append(f"netns {layout.netns(node)}: {out.stderr.strip()}")
    if link_exists(layout.bridge):
        out = _ip("link", "del", layout.bridge, check=False)
        if out.returncode:
            problems.append(f"bridge {layout.bridge}: {out.stderr.strip()}")
    return problems


def _ns_id(path: Path) -> str | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return f"net:[{st.st_ino}]"


def pids_in_netns(netns_path: Path) -> list[int]:
    """Every process whose network namespace is the one bound at ``netns_path``.

    On a node that is slurmd, its slurmstepds and the jobs' processes: the way
    to stop them all by PID without knowing their names.
    """
    ns = _ns_id(netns_path)
    if ns is None:
        return []
    me = os.getpid()
    out = []
    for pid in all_pids():
        if pid == me:
            continue
        try:
            if os.readlink(f"/proc/{pid}/ns/net") == ns:
                out.append(pid)
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
    return out
