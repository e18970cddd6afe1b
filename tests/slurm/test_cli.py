"""``muxflow slurm …`` as a user runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "pipelines.cli_slurm", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=env)


def test_dev_status_of_nothing_fails_and_says_why(tmp_path: Path) -> None:
    out = run("dev-status", "--state-dir", str(tmp_path))
    assert out.returncode == 1
    assert "not set up" in out.stderr and "muxflow slurm dev-up" in out.stderr


def test_dev_down_of_nothing_is_harmless(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("dev-down needs root")
    out = run("dev-down", "--state-dir", str(tmp_path))
    assert out.returncode == 0 and "down" in out.stdout


def test_dev_up_without_root_says_so(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root to drop to another user")
    os.chmod(tmp_path, 0o777)
    out = run("dev-up", "--no-install", "--state-dir", str(tmp_path / "c"),
              prefix=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"),
              env={**os.environ, "HOME": str(tmp_path)})
    if "Permission denied" in out.stderr and "dev-up failed" not in out.stderr:
        pytest.skip(f"nobody cannot run this checkout's Python: {out.stderr[-200:]}")
    assert out.returncode == 1
    assert "needs root" in out.stderr


def test_ping_and_token_point_at_a_tcp_endpoint(dev_cluster) -> None:
    """What an operator does for a real cluster: MUXFLOW_SLURM_REST_URL + SLURM_JWT."""
    token = run("token", "--user", "root", "--lifespan", "300")
    assert token.returncode == 0 and token.stdout.startswith("SLURM_JWT=")
    env = {**os.environ, "MUXFLOW_SLURM_REST_URL": dev_cluster.layout.rest_url,
           "SLURM_JWT": token.stdout.strip().split("=", 1)[1], "MUXFLOW_SLURM_API_VERSION": "v0.0.38"}
    env.pop("MUXFLOW_SLURM_REST_SOCKET", None)
    out = run("ping", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{dev_cluster.layout.rest_url}: openapi/v0.0.38, Slurm 22.05")
    assert "UP" in out.stdout
    local = run("ping")  # no settings: the dev cluster's unix socket
    assert local.returncode == 0 and local.stdout.startswith(f"unix:{dev_cluster.layout.rest_socket}")
