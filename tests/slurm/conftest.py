"""The real dev Slurm cluster for integration tests (docs/SLURM.md).

``dev_cluster`` (session scope) uses the cluster that ``make test`` started
through ``.ci/ensure_slurm.sh``, or runs ``muxflow slurm dev-up`` itself. When
no cluster can be had (not root, no packages) the tests are skipped with the
reason, or fail under ``CI=true``, where the cluster is required. The cluster
is left running afterwards, like the PostgreSQL server the suite uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from executors.slurm.client import SlurmRestClient
from executors.slurm.dev import DevCluster, DevClusterLayout
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
    return subprocess.run([sys.executable, "-m", "pipelines.cli_slurm", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout_s)


def wait_for(what: str, check: Callable[[], object], timeout_s: float = 30.0) -> object:
    """Poll ``check`` until it returns something truthy; fail with ``what`` at the deadline."""
    end = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= end:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what} (last: {value!r})")
        time.sleep(POLL_S)


@dataclass(frozen=True)
class LiveCluster:
    cluster: DevCluster
    layout: DevClusterLayout

    wait_for = staticmethod(wait_for)
    cli = staticmethod(muxflow_slurm)

    def client(self, transport: str = "local", user: str = "root") -> SlurmRestClient:
        return SlurmRestClient(self.cluster.rest_settings(self.layout, transport, user=user))

    def job_dir(self, name: str) -> Path:
        """A fresh directory every job user can write into."""
        d = self.layout.jobs_dir / f"{name}-{os.getpid()}-{time.monotonic_ns()}"
        d.mkdir(mode=0o1777)
        os.chmod(d, 0o1777)
        return d

    def wait_job(self, client: SlurmRestClient, job_id: int, done: Callable[[Job], bool], what: str,
                 timeout_s: float = 30.0) -> Job:
        last: list[Job] = []

        def check() -> Job | None:
            job = client.get_job(job_id)
            last[:] = [job]
            return job if done(job) else None

        try:
            return wait_for(what, check, timeout_s)  # type: ignore[return-value]
        except pytest.fail.Exception:
            j = last[0] if last else None
            pytest.fail(f"job {job_id}: timed out waiting for {what}; last state "
                        f"{j and (j.state, j.state_reason, j.nodes)}")


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
