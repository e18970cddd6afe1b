"""MuxFlow's own account on the dev cluster: ``muxflow``, a Slurm **Operator** in slurmdbd — neither SlurmUser nor
root (docs/SLURM.md "Accounts"). With the REST settings of that identity (``DevCluster.service_rest_settings``:
JWT over TCP, the token ``dev-up`` keeps in ``<state>/muxflow/slurm.jwt``) it holds and releases another user's
job; as that account it can neither drain a node nor mint a token for another user nor write an admin comment;
its credential files are its own and no job user can read them.

``MUXFLOW_SLURM_RELEASES`` picks the releases (tests/live/site_helpers.py): 22.05 checks the shared dev cluster,
24.11 a private cluster of Debian 13's Slurm.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
from collections.abc import Iterator

import pytest

from executors.dev.slurm.layout import MUXFLOW_USER, REFERENCE_USER
from executors.slurm.jwt import unverified_claims
from tests.live.conftest import REPO, LiveCluster, make_private_cluster
from tests.live.muxflow_helpers import sbatch, write_script
from tests.live.site_helpers import RELEASES, releases, run_as

USER = "mxuser1"


@pytest.fixture(scope="module", params=releases())
def live(request, dev_cluster) -> Iterator[LiveCluster]:
    """The shared dev cluster (the host's Slurm), or a private cluster of another release."""
    release = RELEASES[request.param]
    if release is None:
        yield dev_cluster
        return
    with make_private_cluster(release=release) as cluster:
        yield cluster


def _ok(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 0, (out.stdout + out.stderr).strip()
    return out.stdout


def test_muxflow_is_an_operator_and_the_reference_account_a_plain_user(live) -> None:
    rows = _ok(run_as(live, None, "sacctmgr", "-n", "-P", "show", "user", "format=user,adminlevel"))
    levels = dict(line.split("|", 1) for line in rows.splitlines() if "|" in line)
    assert levels[MUXFLOW_USER] == "Operator"
    assert levels[REFERENCE_USER] == "None" and levels[USER] == "None"
    assert live.layout.service_user != MUXFLOW_USER, "MuxFlow's account is not SlurmUser"


# Run as MuxFlow's account, as MuxFlow runs: the token file is its own (0600), and the client refuses a token file
# of another user (root's processes included).
AS_MUXFLOW = """
import json, sys, time
from executors.slurm.client import SlurmRestClient
from executors.dev.slurm import DevCluster

cluster = DevCluster(sys.argv[1])
layout = cluster.load_layout()
sid = int(sys.argv[2])
seen = []

def wait(c, done):
    end = time.monotonic() + 30
    while True:
        job = c.get_job(sid)
        if done(job) or time.monotonic() > end:
            seen.append([job.state, job.state_reason, job.priority, job.user_name])
            return
        time.sleep(0.1)

with SlurmRestClient(cluster.service_rest_settings(layout)) as c:
    wait(c, lambda j: j.held)
    c.release(sid)
    wait(c, lambda j: not j.held)
    c.hold(sid)
    wait(c, lambda j: j.held)
print(json.dumps(seen))
"""


def test_muxflow_holds_and_releases_another_users_job_over_rest(live) -> None:
    settings = live.cluster.service_rest_settings(live.layout)
    assert (settings.url, settings.user_name, settings.token) == (live.layout.rest_url, MUXFLOW_USER, None)
    assert settings.token_file == str(live.layout.muxflow_jwt_file)
    d = live.job_dir("operator")
    script = write_script(d, "sleep 300\n")
    # Held at submission by job_submit.lua (offline partition); not startable for an hour once released.
    sid = sbatch(live, script, "-p", "offline", "--begin=now+3600", "-J", f"mx-operator-{os.getpid()}",
                 f"--output={d}/%j.out", user=USER)
    try:
        out = subprocess.run(["runuser", "-u", MUXFLOW_USER, "--", sys.executable, "-B", "-c", AS_MUXFLOW,
                              str(live.layout.state_dir), str(sid)], cwd=REPO, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        held, released, held_again = json.loads(out.stdout.strip().splitlines()[-1])
        assert held[0] == "PENDING" and held[2] == 0 and held[3] == USER, held
        assert released[0] == "PENDING" and released[2] != 0, f"muxflow could not release {USER}'s job: {released}"
        assert held_again[0] == "PENDING" and held_again[2] == 0, f"muxflow could not hold it again: {held_again}"
    finally:
        run_as(live, None, "scancel", str(sid))


def test_muxflow_cannot_drain_a_node_mint_tokens_for_others_or_write_admin_comments(live) -> None:
    node = live.layout.nodes[0].name
    drain = run_as(live, MUXFLOW_USER, "scontrol", "update", f"nodename={node}", "state=drain", "reason=x")
    try:
        assert drain.returncode != 0, drain.stdout + drain.stderr
        with live.client() as c:
            n = c.get_node(node)
            assert n.usable and "DRAIN" not in n.state_flags, (n.state, n.state_flags)
    finally:
        if drain.returncode == 0:  # leave the shared cluster usable whatever the test found
            run_as(live, None, "scontrol", "update", f"nodename={node}", "state=resume")
    token = run_as(live, MUXFLOW_USER, "scontrol", "token", f"username={USER}")
    assert token.returncode != 0 and "SLURM_JWT=" not in token.stdout, token.stdout + token.stderr
    d = live.job_dir("operator-admin")
    sid = sbatch(live, write_script(d, "sleep 300\n"), "-p", "offline", f"--output={d}/%j.out", user=USER)
    try:
        out = run_as(live, MUXFLOW_USER, "scontrol", "update", f"JobId={sid}", "AdminComment=muxflow:by-operator")
        assert out.returncode != 0, out.stdout + out.stderr
        with live.client() as c:
            assert c.get_job(sid).admin_comment != "muxflow:by-operator"
    finally:
        run_as(live, None, "scancel", str(sid))


def test_muxflow_credential_files_are_its_own(live) -> None:
    layout = live.layout
    mx = pwd.getpwnam(MUXFLOW_USER)
    st = os.stat(layout.muxflow_dir)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (mx.pw_uid, 0o700)
    for path, uid in ((layout.muxflow_jwt_file, mx.pw_uid), (layout.reference_jwt_file, mx.pw_uid),
                      (layout.plan_key_file, mx.pw_uid), (layout.node_plan_key_file, 0)):
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) and (st.st_uid, stat.S_IMODE(st.st_mode)) == (uid, 0o600), path
        denied = run_as(live, USER, "cat", str(path))
        assert denied.returncode != 0 and not denied.stdout, f"{USER} read {path}"
    assert layout.plan_key_file.read_text() == layout.node_plan_key_file.read_text()
    assert unverified_claims(layout.muxflow_jwt_file.read_text())["sun"] == MUXFLOW_USER
    assert unverified_claims(layout.reference_jwt_file.read_text())["sun"] == REFERENCE_USER
    # The nodes' side: the plan tool and the per-job state directory, root's.
    st = os.stat(layout.job_state_dir)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    assert layout.plan_tool.is_file() and os.stat(layout.plan_tool).st_uid == 0
    # MuxFlow's account reads its own token (what MuxFlow, running as that account, does).
    own = run_as(live, MUXFLOW_USER, "cat", str(layout.muxflow_jwt_file))
    assert own.returncode == 0 and own.stdout.strip() == layout.muxflow_jwt_file.read_text().strip()
