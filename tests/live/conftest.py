"""The real dev Slurm cluster for integration tests (docs/SLURM.md).

``dev_cluster`` (session scope) uses the cluster that ``make test`` started
through ``.ci/ensure_slurm.sh``, or runs ``muxflow slurm dev-up`` itself. When
no cluster can be had (not root, no packages) the tests are skipped with the
reason, or fail under ``CI=true``, where the cluster is required. The cluster
is left running afterwards (``make test`` takes down a cluster it brought up).

The shared cluster at /tmp/muxflow-slurm may be used by several test runs at
once. A test that would disturb the others (stopping slurmctld) gets
``private_cluster``, a second cluster of its own that is taken down at its end;
live tests keep their store in ``private_tmp``, outside pytest's ``--basetemp``,
which a concurrent run given the same ``--basetemp`` empties when it starts.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from executors.dev.slurm import DevCluster, DevClusterLayout
from executors.dev.slurm import network as net
from executors.dev.slurm.layout import DEFAULT_NODES, DevNode
from executors.slurm.client import SlurmRestClient
from executors.slurm.models import Job

REPO = Path(__file__).resolve().parents[2]
POLL_S = 0.1


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str) -> None:
    if in_ci():
        pytest.fail(f"the Slurm dev cluster is required under CI=true: {reason}")
    pytest.skip(f"no Slurm dev cluster: {reason}")


def muxflow_slurm(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """``muxflow slurm <args>`` in a child process, as a user would run it."""
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "slurm", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout_s)


def wait_for(what: str, check: Callable[[], object], timeout_s: float = 30.0,
             explain: Callable[[], str] | None = None) -> object:
    """Poll ``check`` until it returns something truthy; fail with ``what`` at the deadline, and with what
    ``explain`` says then (what Slurm knew), so that a failure in CI can be read without the cluster."""
    end = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= end:
            more = f"\n{explain()}" if explain is not None else ""
            pytest.fail(f"timed out after {timeout_s}s waiting for {what} (last: {value!r}){more}")
        time.sleep(POLL_S)


@dataclass(frozen=True)
class LiveCluster:
    cluster: DevCluster
    layout: DevClusterLayout

    wait_for = staticmethod(wait_for)
    cli = staticmethod(muxflow_slurm)

    def client(self, transport: str = "local", user: str = "root") -> SlurmRestClient:
        return SlurmRestClient(self.cluster.rest_settings(self.layout, transport, user=user))

    @property
    def plan_key(self) -> bytes:
        """The key the cluster's nodes verify plans with (root's copy: tests drive MuxFlow as root)."""
        from executors.slurm.plan import read_key

        return read_key(self.layout.node_plan_key_file)

    def user_dir(self, name: str, user: str) -> Path:
        """A fresh directory only ``user`` can read (mode 0700, theirs): a user's private job files."""
        import pwd

        pw = pwd.getpwnam(user)
        d = self.layout.jobs_dir / f"{name}-{user}-{os.getpid()}-{time.monotonic_ns()}"
        d.mkdir(mode=0o700)
        os.chown(d, pw.pw_uid, pw.pw_gid)
        return d

    def job_dir(self, name: str) -> Path:
        """A fresh directory every job user can write into."""
        d = self.layout.jobs_dir / f"{name}-{os.getpid()}-{time.monotonic_ns()}"
        d.mkdir(mode=0o1777)
        os.chmod(d, 0o1777)
        return d

    def explain_job(self, job_id: int, lines: int = 12) -> str:
        """What Slurm says of ``job_id`` (``scontrol show job``) and the last lines of the controller's and the
        nodes' logs that name it: the story of a job that did not do what a test waited for."""
        env = {**os.environ, **self.cluster.slurm_env(self.layout)}
        try:
            out = subprocess.run(self.cluster.command(self.layout, ["scontrol", "show", "job", "-o", str(job_id)]),
                                 env=env, capture_output=True, text=True, timeout=15)
            parts = [f"scontrol show job {job_id}: {(out.stdout or out.stderr).strip()}"]
        except (OSError, subprocess.SubprocessError) as exc:
            parts = [f"scontrol show job {job_id}: {exc}"]
        pattern = re.compile(rf"(JobId={job_id}\b|job {job_id}\b|\[{job_id}\.|JOB {job_id}\b)")
        for log in sorted(self.layout.log_dir.glob("*.log")):
            try:
                hits = [line for line in log.read_text(errors="replace").splitlines() if pattern.search(line)]
            except OSError:
                continue
            if hits:
                parts.append(f"{log.name}:\n  " + "\n  ".join(hit[:240] for hit in hits[-lines:]))
        return "\n".join(parts)

    def wait_job(self, client: SlurmRestClient, job_id: int, done: Callable[[Job], bool], what: str,
                 timeout_s: float = 30.0) -> Job:
        def check() -> Job | None:
            job = client.get_job(job_id)
            return job if done(job) else None

        return wait_for(f"job {job_id}: {what}", check, timeout_s,  # type: ignore[return-value]
                        explain=lambda: self.explain_job(job_id))


@pytest.fixture(scope="session")
def dev_cluster() -> Iterator[LiveCluster]:
    cluster = DevCluster(echo=lambda _m: None)
    if not cluster.status().ok:
        if os.geteuid() != 0:
            unavailable("it needs root (run `sudo .venv/bin/muxflow slurm dev-up` once)")
        out = muxflow_slurm("dev-up")
        if out.returncode != 0:
            unavailable(f"`muxflow slurm dev-up` failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
        st = cluster.status()
        if not st.ok:
            unavailable("dev-up returned but the cluster is not healthy: " + "; ".join(st.problems))
    layout = cluster.load_layout()
    assert layout is not None
    yield LiveCluster(cluster, layout)


@pytest.fixture()
def private_tmp() -> Iterator[Path]:
    """A directory of this test alone, outside ``--basetemp``, removed afterwards.

    A live test hands its SQLite store to child processes (the dispatcher) for minutes;
    a concurrent pytest run with the same ``--basetemp`` removes that directory when it
    starts, and the next child then met an empty new file ("no such table").
    """
    d = Path(tempfile.mkdtemp(prefix="muxflow-slurm-test-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _free_port_base(start: int) -> int:
    """A base with slurmctld's (base), slurmdbd's (base + 2) and the JWT slurmrestd's (base + 3) ports free."""
    for k in range(200):
        base = 7300 + ((start + k) % 200) * 4
        try:
            for host, port in (("0.0.0.0", base), ("0.0.0.0", base + 2), ("127.0.0.1", base + 3)):
                with socket.socket() as sk:
                    sk.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sk.bind((host, port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port pair for a private dev cluster in 7300..8100")


def _free_subnet(bridge: str, start: int) -> str:
    for k in range(250):
        subnet = f"10.214.{(start + k) % 250}.0/24"
        if net.subnet_is_free(subnet, bridge):
            return subnet
    raise RuntimeError("no free 10.214.x.0/24 subnet for a private dev cluster")


@contextmanager
def make_private_cluster(nodes: tuple[DevNode, ...] = DEFAULT_NODES, release=None) -> Iterator[LiveCluster]:
    """A dev cluster of the caller alone (own state dir, bridge, ports and subnet), taken down at the end.

    Names are derived from the pid so that concurrent test runs do not collide. ``release``: another Slurm
    release than the host's (:mod:`executors.dev.slurm.rootfs`).
    """
    pid = os.getpid() + (0 if release is None else 50)
    bridge = f"mxt{pid % 100000}"
    state = Path(tempfile.mkdtemp(prefix="muxflow-slurm-private-"))
    os.chmod(state, 0o755)  # the service user must reach its state below
    cluster = DevCluster(state, bridge=bridge, port_base=_free_port_base(pid), subnet=_free_subnet(bridge, pid),
                         echo=lambda _m: None, nodes=nodes, release=release)
    try:
        st = cluster.up(timeout_s=180, install=False)
        if not st.ok:
            pytest.fail("private dev cluster not healthy: " + "; ".join(st.problems))
        yield LiveCluster(cluster, st.layout)
    finally:
        problems = cluster.down(grace_s=5)
        shutil.rmtree(state, ignore_errors=True)
        assert not problems, f"private dev cluster {state} did not go down cleanly: {problems}"


@pytest.fixture()
def private_cluster(dev_cluster) -> Iterator[LiveCluster]:
    """A dev cluster of this test alone, taken down at its end (:func:`make_private_cluster`).

    For tests that stop or restart daemons: the shared cluster's other users never notice.
    """
    with make_private_cluster() as live:
        yield live


def cancel_quietly(dev_cluster, sids) -> None:
    """Cancel Slurm jobs at teardown; one that is already gone is not an error."""
    with dev_cluster.client() as c:
        for sid in sids:
            try:
                c.cancel(sid)
            except Exception:
                pass
