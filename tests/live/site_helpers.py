"""Live tests of Slurm as sites run it: several Slurm releases, real non-root users (docs/SLURM.md).

``MUXFLOW_SLURM_RELEASES`` (comma-separated, default ``22.05``) picks the releases the ``site_cluster`` tests
run on: ``22.05`` is the host's Slurm (Debian 12), ``24.11`` Debian 13's in a debootstrap tree
(``make test-slurm-compat`` runs those).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from executors.dev.slurm.rootfs import TRIXIE
from tests.live.conftest import LiveCluster, make_private_cluster

RELEASES = {"22.05": None, "24.11": TRIXIE}
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def releases() -> list[str]:
    names = [r.strip() for r in os.environ.get("MUXFLOW_SLURM_RELEASES", "22.05").split(",") if r.strip()]
    unknown = [r for r in names if r not in RELEASES]
    if unknown:
        raise ValueError(f"MUXFLOW_SLURM_RELEASES: unknown {unknown}; known: {', '.join(RELEASES)}")
    return names


@pytest.fixture(scope="module", params=releases())
def site_cluster(request, dev_cluster) -> Iterator[LiveCluster]:
    """A private dev cluster of each release under test (the host's Slurm, or another release's tree)."""
    with make_private_cluster(release=RELEASES[request.param]) as live:
        yield live


def release_of(live: LiveCluster) -> str:
    return next(name for name, rel in RELEASES.items()
                if (rel.path if rel else "") == (live.layout.root_fs and Path(live.layout.root_fs)))


def run_as(live: LiveCluster, user: str | None, *argv: str, timeout_s: float = 30) -> subprocess.CompletedProcess:
    """A Slurm client command of the cluster's release, as ``user`` (a real non-root user) or root."""
    cmd = list(argv) if user is None else ["runuser", "-u", user, "--", *argv]
    env = {**os.environ, **live.cluster.slurm_env(live.layout)}
    return subprocess.run(live.cluster.command(live.layout, cmd), env=env, capture_output=True, text=True,
                          timeout=timeout_s, cwd="/tmp")


def write_artifact(name: str, data: object) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path
