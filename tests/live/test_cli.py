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
    return subprocess.run([*prefix, sys.executable, "-m", "pipelines.cli", "slurm", *args], cwd=REPO,
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
    """What an operator does for a real cluster: MUXFLOW_SLURM_URL + SLURM_JWT."""
    token = run("token", "--user", "root", "--lifespan", "300")
    assert token.returncode == 0 and token.stdout.startswith("SLURM_JWT=")
    env = {**os.environ, "MUXFLOW_SLURM_URL": dev_cluster.layout.rest_url,
           "SLURM_JWT": token.stdout.strip().split("=", 1)[1], "MUXFLOW_SLURM_API_VERSION": "v0.0.38"}
    env.pop("MUXFLOW_SETTINGS", None)
    out = run("ping", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{dev_cluster.layout.rest_url}: openapi/v0.0.38, Slurm 22.05")
    assert "UP" in out.stdout
    local = run("ping")  # no settings: the dev cluster's unix socket
    assert local.returncode == 0 and local.stdout.startswith(f"unix:{dev_cluster.layout.rest_socket}")


# -- `muxflow submit` on a Slurm setup: input refused before anything is sent ---------------------
@pytest.fixture()
def store_url(tmp_path: Path) -> str:
    """A migrated store that knows GPU type t4 (what register-nodes records for the dev cluster)."""
    from executors.store import repo
    from executors.store.db import Store
    from executors.store.migrate import upgrade
    from scheduler_core.gpu_specs import get_spec

    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    store = Store(url)
    with store.session() as s:
        repo.upsert_gpu_type(s, get_spec("t4"))
    store.dispose()
    return url


@pytest.mark.parametrize(("cluster", "args", "message"), [
    ("slurm", ("--command", "x", "--mps", "0"), "error: mps: must be within 1..100"),
    ("slurm", ("--command", "x", "--mps", "101"), "error: mps: must be within 1..100"),
    ("slurm", ("--command", "x", "--script", "/tmp/job.sh"), "error: command: give --command or --script"),
    ("slurm", ("--script", "/nonexistent/job.sh"), "error: script: cannot read /nonexistent/job.sh"),
    ("slurm", ("--trace", "executors/data/gavel/philly_vc_0e4a51.sample.trace"), "error: trace: trace jobs run on"),
    ("simulated", ("--command", "x", "--mps", "30"), "error: mps: only for a Slurm cluster"),
    ("simulated", ("--script", "/tmp/job.sh"), "error: script: only for a Slurm cluster"),
    ("slurm-without-url", ("--command", "x"), "error: settings: cluster 'slurm' needs slurm_url"),
])
def test_submit_refuses_bad_input_without_contacting_slurm(tmp_path: Path, store_url: str, cluster, args,
                                                           message) -> None:
    from click.testing import CliRunner

    from executors.store.db import Store
    from executors.store.models import OfflineJob
    from pipelines.cli import main

    url = store_url
    env = {"MUXFLOW_SETTINGS": None, "DAGSTER_HOME": None, "MUXFLOW_DATABASE_URL": url,
           "MUXFLOW_CLUSTER": cluster.split("-")[0],
           # nothing answers here: a test that got as far as Slurm would fail with "slurm: …", not the message
           "MUXFLOW_SLURM_URL": None if cluster == "slurm-without-url" else f"unix:{tmp_path / 'none.sock'}"}
    base = ["submit", "--name", "j", "--job-type", "A3C", "--mem", "1GiB", "--gpu-types", "t4",
            "--checkpoint-dir", "/ckpt/j", "--steps", "10"]
    out = CliRunner().invoke(main, [*base, *args], env=env, catch_exceptions=False)
    assert out.exit_code == 2 and out.stderr.strip().startswith(message), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    store = Store(url)
    with store.session() as s:
        assert s.query(OfflineJob).count() == 0
    store.dispose()


def test_submit_with_slurm_unreachable_says_so_and_stores_nothing(tmp_path: Path, store_url: str) -> None:
    from click.testing import CliRunner

    from pipelines.cli import main

    # A configuration Slurm's commands cannot use (empty: they fail at once; a missing file they retry for 60 s)
    (tmp_path / "no-slurm.conf").write_text("")
    env = {"MUXFLOW_SETTINGS": None, "DAGSTER_HOME": None, "MUXFLOW_DATABASE_URL": store_url,
           "MUXFLOW_CLUSTER": "slurm", "SLURM_CONF": str(tmp_path / "no-slurm.conf"),
           "MUXFLOW_SLURM_URL": f"unix:{tmp_path / 'none.sock'}"}
    out = CliRunner().invoke(main, ["submit", "--name", "j", "--command", "x", "--job-type", "A3C", "--mem", "1GiB",
                                    "--gpu-types", "t4", "--checkpoint-dir", "/ckpt/j", "--steps", "10"], env=env,
                             catch_exceptions=False)
    # the user's own sbatch submits (the job is theirs): it cannot reach Slurm here
    assert out.exit_code == 1 and out.stderr.startswith("error: slurm: sbatch: "), out.stderr
    assert "no-slurm.conf" in out.stderr
    from executors.store.db import Store
    from executors.store.models import OfflineJob

    store = Store(store_url)
    with store.session() as s:
        assert s.query(OfflineJob).count() == 0
    store.dispose()


def test_slurm_dispatch_refuses_a_store_that_is_not_there(tmp_path: Path) -> None:
    """A dispatcher whose store vanished (another pytest run with the same --basetemp removed it) says so,
    and never creates an empty one in its place."""
    gone = tmp_path / "gone" / "store.db"
    out = run("dispatch", "--db", f"sqlite:///{gone}", "--round", "1")
    assert out.returncode == 2 and out.stderr.strip() == f"error: database: no store at {gone} " \
        "(`muxflow db upgrade` creates one)"
    assert not gone.parent.exists()
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    out = run("dispatch", "--db", f"sqlite:///{empty}", "--round", "1")
    assert out.returncode == 2 and "schema is at nothing" in out.stderr


def test_slurm_dispatch_refuses_gains_xcuda_would_ignore(tmp_path: Path) -> None:
    out = run("dispatch", "--db", f"sqlite:///{tmp_path / 'x.db'}", "--round", "1", "--kd", "11")
    assert out.returncode == 2 and out.stderr.strip() == "error: xcuda gains: kd must be a number within [0, 10], got 11.0"
    assert not (tmp_path / "x.db").exists()
