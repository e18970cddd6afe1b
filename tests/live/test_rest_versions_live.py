"""Every slurmrestd API version a release serves, live (docs/SLURM.md "API versions").

For each release under test (``MUXFLOW_SLURM_RELEASES``) and each API version its slurmrestd offers that this
client speaks: the client's discovery picks the newest; every golden request body of that version
(tests/executors/slurm/golden/<version>/) is sent as it is and accepted; and the client of that version
submits held, places with the plan in the admin comment, sees the job run on its node at its share, reads
nodes, partitions and pings, signals and cancels. The matrix (release × version → checks passed) is written
to test-artifacts/slurm_api_matrix_<release>.json.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from executors.scheduler.slurm.backend import placement_plan
from executors.slurm import plan as plans
from executors.slurm.api import API_VERSIONS, api_version, offered_versions
from executors.slurm.client import SlurmRestClient
from executors.slurm.spec import BatchJob, JobUpdate
from tests.live.site_helpers import release_of, site_cluster, write_artifact  # noqa: F401

GOLDEN = Path(__file__).resolve().parents[1] / "executors" / "slurm" / "golden"


def _client(live, version: str) -> SlurmRestClient:
    settings = dataclasses.replace(live.cluster.rest_settings(live.layout, "local"), api_version=version)
    return SlurmRestClient(settings, requeue_fallback=live.cluster.scontrol_fallback(live.layout))


def _golden(version: str) -> dict[str, object]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((GOLDEN / version).glob("*.json"))}


def test_every_offered_version_live(site_cluster) -> None:
    live = site_cluster
    release = release_of(live)
    with live.client() as c:
        offered = offered_versions(c.openapi_spec())
    spoken = [v for v in offered if v in API_VERSIONS]
    assert spoken, f"Slurm {release} offers {offered}; the client speaks none"
    with live.client() as auto:
        if live.layout.api_version == "auto":
            assert auto.api.name == spoken[-1]  # discovery takes the newest both speak
    d = live.job_dir("versions")
    matrix: dict[str, dict[str, object]] = {}
    for version in spoken:
        checks: list[str] = []
        with _client(live, version) as c:
            api = c.api
            # job 1 exists before the gated body (afterok:1) is sent
            first = c.submit(BatchJob(name="first", script="#!/bin/sh\ntrue\n", partition="profile",
                                     stdout_path="/dev/null")).job_id
            # the golden updates go to a job that cannot start (its dependency waits on a held job): each finds it
            # pending, whatever the one before released
            gate = c.submit(BatchJob(name="gate", script="#!/bin/sh\ntrue\n", partition="offline", hold=True,
                                    stdout_path="/dev/null")).job_id
            target = c.submit(BatchJob(name="target", script="#!/bin/sh\nsleep 300\n", partition="offline",
                                      hold=True, gres_per_node="mps:30", stdout_path="/dev/null",
                                      dependency=f"afterok:{gate}")).job_id
            # it takes the USR1 below as a MuxFlow job does (a checkpoint request), so only the cancel ends it
            # ("ready" once the trap is set: a USR1 sent before it would end the job FAILED)
            loop = "#!/bin/sh\ntrap 'echo usr1' USR1\necho ready\nwhile :; do sleep 1; done\n"
            held = c.submit(BatchJob(name="placed", script=loop, partition="offline", hold=True,
                                    gres_per_node="mps:30", stdout_path=f"{d}/%j.out")).job_id
            submitted = [first, gate, target, held]
            for name, body in _golden(version).items():
                kind = name.split("_", 1)[0]
                if kind == "submit":
                    body = json.loads(json.dumps(body).replace('"afterok:1"', f'"afterok:{first}"'))
                    data = c.request("POST", api.submit_path(), body=body)
                    submitted.append(int(data["job_id"]))
                elif kind == "update":
                    c.request("POST", api.job_path(target), body=body)
                    assert c.get_job(target).state == "PENDING"
                else:
                    sid = c.submit(BatchJob(name="cancel", script="#!/bin/sh\nsleep 300\n", partition="profile",
                                           stdout_path="/dev/null")).job_id
                    submitted.append(sid)
                    if body:  # a signal reaches a running job only
                        live.wait_job(c, sid, lambda j: j.state == "RUNNING", "the job to signal to run")
                    c.request("DELETE", api.job_path(sid), params=body)
                checks.append(f"golden {name} accepted")
            # the dispatcher's placement, read back through this version's parsers
            plan = plans.encode(placement_plan(9, held, 1, 40, 1 << 30), live.plan_key)
            c.update_job(held, JobUpdate(nodelist="mx-t4-1", gres_per_node="mps:40", hold=False, eligible_now=True,
                                         comment=plan))
            j = live.wait_job(c, held, lambda j: j.state == "RUNNING", "the placed job to run", timeout_s=60)
            assert j.nodes == ("mx-t4-1",) and j.mps_pct == 40 and plans.decode(j.comment, live.plan_key, held).sm_pct == 40
            assert j.start_time_utc is not None and not j.held and j.user_name == live.layout.service_user
            checks.append("place with the signed plan in the comment, run on the node at the share")
            out = d / f"{held}.out"
            live.wait_for(f"job {held}'s script to set its USR1 trap",
                          lambda: out.exists() and "ready" in out.read_text(errors="replace"),
                          explain=lambda: live.explain_job(held))
            c.cancel(held, signal="USR1")
            checks.append("signal")
            nodes = {n.name: n for n in c.list_nodes()}
            assert nodes["mx-t4-1"].usable and [g.index for g in nodes["mx-t4-1"].gpus] == [0, 1, 2, 3]
            assert nodes["mx-a10-1"].gpu_type == "a10"
            assert {p.name for p in c.list_partitions()} >= {"online", "offline", "profile"}
            assert any(p.up for p in c.ping())
            checks.append("nodes, GPUs, partitions, ping")
            for sid in submitted:
                c.cancel(sid)
            done = live.wait_job(c, held, lambda j: j.finished, "the cancelled job to finish", timeout_s=60)
            assert done.state == "CANCELLED" and done.end_time_utc is not None
            checks.append("cancel, read the finished job")
            assert api_version(version).verified_live, f"{version} passed live: mark it verified_live"
        matrix[version] = {"checks_passed": len(checks), "checks": checks}
    write_artifact(f"slurm_api_matrix_{release}.json", {"release": release, "offered": offered, "matrix": matrix})
