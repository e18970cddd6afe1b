"""The dev cluster's pure parts: configuration rendering (golden), layout, PID bookkeeping, MuxFlow's credential
files, the accounts' set-up."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from executors.dev.slurm import accounting
from executors.dev.slurm.cluster import (
    XCUDA_LIB,
    DevCluster,
    install_node_scripts,
    node_script_values,
    releaser_uids,
)
from executors.dev.slurm.layout import DevClusterLayout, DevNode
from executors.dev.slurm.procs import ProcTable, descendants, is_running, start_ticks, terminate
from executors.dev.slurm.state import ensure_credentials
from executors.slurm.jwt import mint_hs256, unverified_claims
from executors.slurm.plan import read_key

GOLDEN = Path(__file__).resolve().parent / "golden" / "dev"
LAYOUT = DevClusterLayout(state_dir=Path("/tmp/muxflow-slurm"), controller_host="devhost")
STORAGE_PASS = "STORAGE-PASS-PINNED"  # slurmdbd.conf's database password: random on a cluster, pinned here


@pytest.mark.parametrize("name, render", [("slurm.conf", LAYOUT.render_slurm_conf),
                                          ("gres.conf", LAYOUT.render_gres_conf),
                                          ("slurmdbd.conf", lambda: LAYOUT.render_slurmdbd_conf(STORAGE_PASS))])
def test_config_matches_golden(name, render) -> None:
    path = GOLDEN / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render())
        pytest.fail(f"recorded missing golden file {path.name}; review it and run again")
    assert render() == path.read_text(), f"{path.name} differs; delete it to re-record"


def test_config_has_what_the_issue_asks() -> None:
    conf = LAYOUT.render_slurm_conf()
    for line in ("GresTypes=gpu,mps", "SelectType=select/cons_tres", "AuthAltTypes=auth/jwt",
                 "SlurmctldHost=devhost(10.213.7.1)", "SlurmUser=muxflow-slurm",
                 # slurmdbd (admin levels: MuxFlow's account is an Operator), reached with the cluster's own munge
                 "AccountingStorageType=accounting_storage/slurmdbd", "AccountingStoragePort=6919",
                 "AccountingStoragePass=/tmp/muxflow-slurm/munge/munge.socket"):
        assert line in conf.splitlines()
    # one gres Type per GPU, so a placement can name its GPU (docs/SLURM.md)
    assert ("Gres=gpu:t4g0:1,gpu:t4g1:1,gpu:t4g2:1,gpu:t4g3:1,mps:t4g0:100,mps:t4g1:100,mps:t4g2:100,mps:t4g3:100"
            in conf)
    assert "NodeAddr=10.213.7.11" in conf and "NodeAddr=10.213.7.12" in conf
    for part in ("online", "offline", "profile"):
        assert f"PartitionName={part} Nodes=mx-t4-1,mx-a10-1" in conf
    gres = LAYOUT.render_gres_conf().splitlines()
    assert "NodeName=mx-a10-1 Name=gpu Type=a10g2 File=/tmp/muxflow-slurm/gpu/mx-a10-1-gpu2" in gres
    assert ("NodeName=mx-a10-1 Name=mps Type=a10g2 Count=100 File=/tmp/muxflow-slurm/gpu/mx-a10-1-gpu2 "
            "Flags=all_sharing") in gres
    # without all_sharing Slurm 22.05 runs MPS jobs on one GPU of a node at a time (docs/DESIGN.md §4)
    assert all(line.endswith("Flags=all_sharing") for line in gres if "Name=mps" in line)


def test_a_node_without_per_gpu_types_has_the_classic_gres_with_all_sharing() -> None:
    layout = DevClusterLayout(state_dir=Path("/s"), controller_host="h",
                              nodes=(DevNode("a", "t4"), DevNode("b", "a10", gpus=2, mps_count=200,
                                                                 per_gpu_types=False)))
    conf = layout.render_slurm_conf()
    assert "Gres=gpu:a10:2,mps:200 " in conf and "Gres=gpu:t4g0:1," in conf
    gres = layout.render_gres_conf().splitlines()
    assert "NodeName=b Name=gpu Type=a10 File=/s/gpu/b-gpu[0-1]" in gres
    assert "NodeName=b Name=mps Count=200 File=/s/gpu/b-gpu[0-1] Flags=all_sharing" in gres
    assert sum("NodeName=a Name=mps Type=t4g" in line for line in gres) == 4


def test_mps_must_split_evenly_over_the_gpus() -> None:
    with pytest.raises(ValueError, match="split evenly"):
        DevNode("a", "t4", gpus=3, mps_count=400)


def test_network_names_fit_linux_limits() -> None:
    for node in LAYOUT.nodes:
        assert len(LAYOUT.veth(node)) <= 15
    assert LAYOUT.netns(LAYOUT.nodes[0]) == "mxslurm0-mx-t4-1"
    assert LAYOUT.node_address(LAYOUT.nodes[1]) == "10.213.7.12"


def test_layout_json_roundtrip() -> None:
    layout = DevClusterLayout(state_dir=Path("/x"), controller_host="h", subnet="172.29.213.0/24",
                              nodes=(DevNode("a", "t4", gpus=2), DevNode("b", "a10")))
    assert DevClusterLayout.from_json(layout.to_json()) == layout


@pytest.mark.parametrize("kwargs", [
    {"nodes": (DevNode("a", "t4"), DevNode("a", "a10"))},
    {"nodes": ()},
    {"subnet": "10.0.0.0/29"},
    {"default_partition": "batch"},
    {"bridge": "a-very-long-bridge"},
])
def test_layout_validation(kwargs) -> None:
    with pytest.raises(ValueError):
        DevClusterLayout(state_dir=Path("/x"), controller_host="h", **kwargs)


def test_proc_table_records_and_liveness(tmp_path: Path) -> None:
    table = ProcTable(tmp_path / "pids")
    rec = table.start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                      log=tmp_path / "log" / "sleeper.out", env=dict(os.environ), cwd=tmp_path)
    try:
        assert table.get("sleeper") == rec and rec.running()
        assert rec.start_ticks == start_ticks(rec.pid)
        assert not is_running(rec.pid, (rec.start_ticks or 0) + 1), "a different start time is another process"
        assert terminate([rec.pid], 5.0) == []
        assert not rec.running()  # a zombie child counts as gone (and is reaped)
    finally:
        terminate([rec.pid], 1.0)
    table.drop("sleeper")
    assert table.all() == []


def test_descendants() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess,sys,time; "
                             "p=subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); "
                             "print(p.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        child = int(proc.stdout.readline())
        assert child in descendants(proc.pid)
    finally:
        terminate([child, proc.pid], 2.0)
        proc.wait(5)


def test_slurmdbd_conf_names_the_cluster_database_and_the_password_it_is_given() -> None:
    conf = LAYOUT.render_slurmdbd_conf("s3cret").splitlines()
    for line in ("DbdPort=6919", "SlurmUser=muxflow-slurm", "StorageType=accounting_storage/mysql",
                 "StorageLoc=muxflow_mxslurm0", "StorageUser=muxflow_mxslurm0", "StoragePass=s3cret",
                 "AuthInfo=socket=/tmp/muxflow-slurm/munge/munge.socket"):
        assert line in conf
    assert LAYOUT.slurmdbd_conf == LAYOUT.slurm_conf.with_name("slurmdbd.conf"), "slurmdbd reads it next to slurm.conf"
    assert "s3cret" not in LAYOUT.to_json() and "s3cret" not in LAYOUT.render_slurm_conf()


def test_each_bridge_has_its_own_database() -> None:
    other = DevClusterLayout(state_dir=Path("/x"), controller_host="h", bridge="mxt1234-x")
    assert other.storage_loc == "muxflow_mxt1234_x" != LAYOUT.storage_loc


def test_a_layout_from_before_slurmdbd_keeps_running_without_accounting() -> None:
    d = json.loads(LAYOUT.to_json())
    del d["dbd_port"]
    old = DevClusterLayout.from_json(json.dumps(d))
    assert not old.accounting and "AccountingStorageType=accounting_storage/none" in old.render_slurm_conf()
    assert "slurmdbd" not in DevCluster("/x").component_names(old)
    assert DevCluster("/x").component_names(LAYOUT)[:3] == ["munged", "slurmdbd", "slurmctld"]
    with pytest.raises(ValueError):
        old.render_slurmdbd_conf("x")


def test_muxflow_paths() -> None:
    s = Path("/tmp/muxflow-slurm")
    assert (LAYOUT.muxflow_dir, LAYOUT.muxflow_jwt_file, LAYOUT.reference_jwt_file, LAYOUT.plan_key_file) == \
        (s / "muxflow", s / "muxflow/slurm.jwt", s / "muxflow/reference.jwt", s / "muxflow/plan.key")
    assert (LAYOUT.node_plan_key_file, LAYOUT.job_state_dir, LAYOUT.plan_tool) == \
        (s / "etc/plan.key", s / "jobstate", s / "node/muxflow_plan.py")
    settings = DevCluster("/tmp/muxflow-slurm").service_rest_settings(LAYOUT)
    assert (settings.url, settings.user_name, settings.token_file, settings.token) == \
        ("http://127.0.0.1:6920", "muxflow", str(s / "muxflow/slurm.jwt"), None)
    assert DevCluster("/tmp/muxflow-slurm").rest_settings(LAYOUT, "service") == settings


def test_node_scripts_get_the_plan_tool_key_job_dir_and_releasers(tmp_path: Path) -> None:
    layout = DevClusterLayout(state_dir=tmp_path, controller_host="h")
    layout.etc_dir.mkdir()
    values = node_script_values(layout)
    assert values["@PLAN_KEY@"] == str(tmp_path / "etc/plan.key")
    assert values["@JOB_DIR@"] == str(tmp_path / "jobstate")
    assert values["@PLAN_TOOL@"] == str(tmp_path / "node/muxflow_plan.py")
    assert releaser_uids(999, 995) == "[0] = true, [999] = true, [995] = true"
    install_node_scripts(layout, 999, 995)
    lua = layout.job_submit_lua.read_text()
    assert "local RELEASERS = { [0] = true, [999] = true, [995] = true }" in lua
    assert "@" not in lua.split("RELEASERS")[1]
    tool = layout.plan_tool
    assert tool.read_text() == (Path(__file__).resolve().parents[3] / "executors/slurm/plan.py").read_text()
    assert stat.S_IMODE(tool.stat().st_mode) == 0o644
    hook = layout.hook_dir / "sitecustomize.py"
    assert hook.read_text() == (Path(__file__).resolve().parents[3] / "executors/job/runtime/hook/sitecustomize.py"
                                ).read_text()
    assert stat.S_IMODE(hook.stat().st_mode) == 0o644 and stat.S_IMODE(layout.hook_dir.stat().st_mode) == 0o755
    assert "@" not in "".join(line for line in (layout.node_script_dir / "task_prolog.sh").read_text().splitlines()
                              if not line.lstrip().startswith("#"))


def test_xcuda_is_installed_as_a_link_beside_a_conf_naming_the_clusters_plan_directory(tmp_path: Path) -> None:
    layout = DevClusterLayout(state_dir=tmp_path, controller_host="h")
    layout.etc_dir.mkdir()
    install_node_scripts(layout, 999, 995)
    lib = tmp_path / "xcuda/libxcuda.so"
    assert node_script_values(layout)["@XCUDA_LIB@"] == str(lib)
    # The link: the node agent's check finds the built file (its device and inode) through it.
    assert lib.is_symlink() and lib.resolve() == XCUDA_LIB.resolve()
    conf = tmp_path / "xcuda/xcuda.conf"
    assert f"\nplan_dir={layout.plan_dir}\n" in conf.read_text() and not conf.is_symlink()
    # What xCUDA requires of the directory and the file (src/plan.c xc_conf_plan_dir).
    assert stat.S_IMODE(conf.stat().st_mode) == 0o644 and stat.S_IMODE(conf.parent.stat().st_mode) == 0o755
    assert conf.stat().st_uid == conf.parent.stat().st_uid == os.getuid()
    install_node_scripts(layout, 999, 995)  # again: unchanged
    assert lib.resolve() == XCUDA_LIB.resolve() and conf.read_text().count("plan_dir=") == 1


def _ids() -> tuple[int, int]:
    return os.getuid(), os.getgid()


def test_credentials_are_written_once_and_renewed_when_they_expire(tmp_path: Path) -> None:
    layout = DevClusterLayout(state_dir=tmp_path, controller_host="h")
    layout.jwt_dir.mkdir()
    layout.etc_dir.mkdir()
    layout.jwt_key.write_bytes(b"k" * 32)
    now = time.time()
    written = ensure_credentials(layout, _ids(), ("muxflow", "mxref"), now=now, node_ids=_ids())
    assert set(written) == {str(p) for p in (layout.muxflow_jwt_file, layout.reference_jwt_file,
                                             layout.plan_key_file, layout.node_plan_key_file)}
    assert stat.S_IMODE(layout.muxflow_dir.stat().st_mode) == 0o700
    for p in (layout.muxflow_jwt_file, layout.reference_jwt_file, layout.plan_key_file, layout.node_plan_key_file):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    claims = unverified_claims(layout.muxflow_jwt_file.read_text())
    assert claims["sun"] == "muxflow" and claims["exp"] == int(now) + 30 * 24 * 3600
    assert unverified_claims(layout.reference_jwt_file.read_text())["sun"] == "mxref"
    assert read_key(layout.plan_key_file) == read_key(layout.node_plan_key_file)
    # a second call changes nothing; one 29.5 days later renews the tokens (less than a day left), not the key
    assert ensure_credentials(layout, _ids(), ("muxflow", "mxref"), now=now + 3600, node_ids=_ids()) == []
    later = ensure_credentials(layout, _ids(), ("muxflow", "mxref"), now=now + 29.5 * 86400, node_ids=_ids())
    assert set(later) == {str(layout.muxflow_jwt_file), str(layout.reference_jwt_file)}


def test_credentials_reuse_a_plan_key_and_replace_bad_files(tmp_path: Path) -> None:
    layout = DevClusterLayout(state_dir=tmp_path, controller_host="h")
    layout.jwt_dir.mkdir()
    layout.etc_dir.mkdir()
    layout.jwt_key.write_bytes(b"k" * 32)
    layout.muxflow_dir.mkdir(mode=0o755)
    key = bytes(range(32))
    layout.plan_key_file.write_text(key.hex() + "\n")  # MuxFlow's copy only (a fresh start wipes etc/)
    os.chmod(layout.plan_key_file, 0o644)
    # a token signed with another key, and a link planted where a token goes
    layout.muxflow_jwt_file.write_text(mint_hs256(b"x" * 32, "muxflow", issued_at_s=int(time.time()),
                                                  lifespan_s=30 * 86400))
    layout.reference_jwt_file.symlink_to(tmp_path / "elsewhere")
    ensure_credentials(layout, _ids(), ("muxflow", "mxref"), node_ids=_ids())
    assert read_key(layout.node_plan_key_file) == key == read_key(layout.plan_key_file)
    assert stat.S_IMODE(layout.muxflow_dir.stat().st_mode) == 0o700
    assert not layout.reference_jwt_file.is_symlink() and not (tmp_path / "elsewhere").exists()
    token = layout.muxflow_jwt_file.read_text().strip()
    assert token == mint_hs256(layout.jwt_key.read_bytes(), "muxflow", issued_at_s=unverified_claims(token)["iat"],
                               lifespan_s=30 * 86400)


class FakeSacctmgr:
    """sacctmgr against an in-memory database: what the bootstrap asks and adds."""

    def __init__(self, load_ok: bool = True):
        self.clusters: set[str] = set()
        self.accounts: set[str] = set()
        self.users: dict[str, str] = {}
        self.calls: list[tuple[str, ...]] = []
        self.load_ok = load_ok

    def __call__(self, *argv: str) -> subprocess.CompletedProcess:
        self.calls.append(argv)
        args = list(argv[1:])
        out = ""
        if args[:3] == ["-n", "-P", "show"]:
            what = args[3]
            rows = {"cluster": sorted(self.clusters), "account": sorted(self.accounts),
                    "user": [f"{u}|{lv}" for u, lv in sorted(self.users.items())]}[what]
            out = "".join(r + "\n" for r in rows)
        elif args[:2] == ["-i", "load"]:
            if not self.load_ok:
                return subprocess.CompletedProcess(argv, 1, "", "load failed")
            self.clusters.add("c")
        elif args[:3] == ["-i", "add", "cluster"]:
            self.clusters.add(args[3])
            self.accounts.add("root")
            self.users.setdefault("root", "Administrator")
        elif args[:3] == ["-i", "add", "account"]:
            self.accounts.add(args[3])
        elif args[:3] == ["-i", "add", "user"]:
            level = next(a for a in args if a.startswith("adminlevel=")).split("=", 1)[1]
            for u in args[3].split(","):
                self.users[u] = level
        elif args[:3] == ["-i", "modify", "user"]:
            name = next(a for a in args if a.startswith("name=")).split("=", 1)[1]
            self.users[name] = next(a for a in args if a.startswith("adminlevel=")).split("=", 1)[1]
        else:
            raise AssertionError(argv)
        return subprocess.CompletedProcess(argv, 0, out, "")


def test_the_accounts_bootstrap_is_idempotent_and_fixes_admin_levels() -> None:
    fake = FakeSacctmgr()
    done = accounting.bootstrap(fake, LAYOUT)
    assert fake.users == {"root": "Administrator", "mxuser1": "None", "mxuser2": "None", "muxflow": "Operator",
                          "mxref": "None"}
    assert fake.clusters == {"muxflowdev"} and "mxdev" in fake.accounts and done
    fake.calls.clear()
    assert accounting.bootstrap(fake, LAYOUT) == []
    assert all(c[1] == "-n" for c in fake.calls), "a second bootstrap only looks"
    fake.users["muxflow"] = "Administrator"
    assert accounting.bootstrap(fake, LAYOUT) == ["user muxflow: adminlevel Administrator -> Operator"]


def test_a_fresh_database_is_loaded_at_once_and_looked_at_when_that_fails(tmp_path: Path) -> None:
    text = accounting.render_load_file(LAYOUT)
    assert "Cluster - 'muxflowdev'" in text.splitlines()[0]
    assert "User - 'muxflow':DefaultAccount='mxdev':AdminLevel='Operator'" in text.splitlines()
    fake = FakeSacctmgr()
    accounting.bootstrap(fake, LAYOUT, load_file=tmp_path / "accounts.cfg")
    assert [c[2] for c in fake.calls] == ["load"] and (tmp_path / "accounts.cfg").read_text() == text
    failing = FakeSacctmgr(load_ok=False)
    accounting.bootstrap(failing, LAYOUT, load_file=tmp_path / "accounts.cfg")
    assert failing.users["muxflow"] == "Operator"


def test_templates_differ_by_slurm_version_and_accounts() -> None:
    a = accounting.template_name("slurm-wlm 22.05.8", cluster_name="muxflowdev")
    assert a == accounting.template_name("slurm-wlm 22.05.8", cluster_name="muxflowdev")
    assert a != accounting.template_name("slurm 24.11.5", cluster_name="muxflowdev")
    assert a != accounting.template_name("slurm-wlm 22.05.8", {"root": None}, cluster_name="muxflowdev")
    assert len(a) <= 64


def test_a_slurm_tree_cached_before_slurmdbd_is_rebuilt(tmp_path: Path, monkeypatch) -> None:
    from executors.dev.slurm import rootfs

    assert "slurmdbd" in rootfs.PACKAGES
    release = rootfs.SlurmRelease("trixie", "24.11", "openapi/slurmctld")
    monkeypatch.setattr(rootfs, "CACHE_ROOT", tmp_path)
    release.path.mkdir()
    stamp = release.path / ".muxflow-rootfs"
    stamp.write_text(rootfs._stamp(release).replace(" slurmdbd", ""))  # the stamp of a tree from before
    assert not rootfs.rootfs_ready(release)
    stamp.write_text(rootfs._stamp(release))
    assert rootfs.rootfs_ready(release)
