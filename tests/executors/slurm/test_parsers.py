"""Response parsers: v0.0.38 on responses captured from a live slurmrestd, v0.0.40 on schema-shaped samples."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from executors.slurm.api import api_version
from executors.slurm.errors import SlurmErrorEntry
from executors.slurm.hostlist import Gres

DATA = Path(__file__).resolve().parent / "data"
V38 = api_version("v0.0.38")
V40 = api_version("v0.0.40")


def body(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text())["body"]


def test_held_job() -> None:
    [job] = V38.parse_jobs(body("job_held"))
    assert job.state == "PENDING" and job.state_reason == "JobHeldUser"
    assert job.held and job.priority == 0
    assert job.partition == "offline" and job.gres_per_node == "gres:mps:30" and job.mps_pct == 30
    assert job.nodes == () and job.requeue and not job.finished
    assert job.comment == "muxflow:capture" and job.user_name == "muxflow-slurm"
    assert job.start_time_utc is None and isinstance(job.submit_time_utc, datetime)
    assert job.submit_time_utc.tzinfo is UTC


def test_running_job_after_place_and_release() -> None:
    [job] = V38.parse_jobs(body("job_running"))
    assert job.state == "RUNNING" and not job.held
    assert job.nodes == ("mx-a10-1",) and job.required_nodes == ("mx-a10-1",)
    assert job.mps_pct == 70
    assert job.start_time_utc is not None and job.end_time_utc is not None  # end = start + time limit


def test_cancelled_job_is_finished() -> None:
    [job] = V38.parse_jobs(body("job_cancelled"))
    assert job.state == "CANCELLED" and job.finished and job.exit_code is not None


def test_jobs_list() -> None:
    jobs = V38.parse_jobs(body("jobs"))
    assert jobs and all(j.job_id > 0 for j in jobs)


def test_submit_keeps_the_held_notice_as_a_note() -> None:
    res = V38.parse_submit(body("job_submit_held"))
    assert res.job_id > 0
    assert any("held state" in n for n in res.notes)
    assert all(e.informational for e in V38.parse_errors(body("job_submit_held")))


def test_nodes() -> None:
    nodes = {n.name: n for n in V38.parse_nodes(body("nodes"))}
    assert set(nodes) == {"mx-t4-1", "mx-a10-1"}
    t4 = nodes["mx-t4-1"]
    assert t4.state == "IDLE" and t4.usable and t4.gpu_type == "t4"
    assert t4.gres_total("gpu") == 4 and t4.gres_total("mps") == 400
    assert t4.gres_in_use("gpu") == 0
    assert t4.partitions == ("online", "offline", "profile")
    assert t4.address.count(".") == 3 and t4.cpus == 8
    busy = {n.name: n for n in V38.parse_nodes(body("nodes_busy"))}["mx-a10-1"]
    assert busy.state == "MIXED" and busy.usable and busy.alloc_cpus == 1


def test_single_node() -> None:
    [node] = V38.parse_nodes(body("node"))
    assert node.name == "mx-t4-1"


def test_partitions() -> None:
    parts = {p.name: p for p in V38.parse_partitions(body("partitions"))}
    assert set(parts) == {"online", "offline", "profile"}
    assert all(p.state == "UP" and set(p.nodes) == {"mx-t4-1", "mx-a10-1"} and p.total_nodes == 2
               for p in parts.values())


def test_ping_and_version() -> None:
    [ping] = V38.parse_pings(body("ping"))
    assert ping.up and ping.mode == "primary"
    v = V38.parse_version(body("ping"))
    assert v.plugin == "openapi/v0.0.38" and v.release.startswith("22.05")


@pytest.mark.parametrize("name, number, text", [
    ("error_unknown_partition", 2000, "Invalid partition name specified"),
    ("error_unknown_job", 2017, "Invalid job id specified"),
    ("error_cancel_unknown_job", 2017, "unable to kill JobId=999999"),
    ("error_disabled_key", 1, 'Disabled key: "required_nodes"'),
    ("error_unknown_key", 9001, 'Unknown key "tres_per_node"'),
    ("error_bad_signal", -1, "Invalid SIGNAL specification"),
])
def test_errors_keep_slurm_messages(name: str, number: int, text: str) -> None:
    errors = V38.parse_errors(body(name))
    assert errors and not all(e.informational for e in errors)
    assert any(e.number == number for e in errors)
    assert any(text in str(e) for e in errors)


def test_error_entry_text() -> None:
    e = SlurmErrorEntry.parse({"error": "Invalid job id specified", "error_number": 2017,
                               "description": "Unable to find JobId=5", "source": "slurm_load_job"})
    assert str(e) == "Invalid job id specified: Unable to find JobId=5 (slurm error 2017)"
    assert str(SlurmErrorEntry.parse("plain")) == "plain"


# -- v0.0.40: samples shaped after Slurm 23.11's published schema (not captured live) ------
def _nv(n: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": n}


V40_JOB = {
    "job_id": 42, "name": "muxflow-offline-17", "job_state": ["PENDING", "REQUEUED"],
    "state_reason": "JobHeldUser", "partition": "offline", "user_name": "alice",
    "nodes": "", "required_nodes": "mx-a10-[1-2]", "tres_per_node": "gres/mps:30",
    "priority": _nv(0), "requeue": True, "restart_cnt": 2, "comment": "muxflow:job=17",
    "current_working_directory": "/srv/jobs/17",
    "exit_code": {"status": ["SUCCESS"], "return_code": _nv(0)},
    "submit_time": _nv(1_700_000_000), "start_time": _nv(0), "end_time": {"set": False, "infinite": False,
                                                                           "number": 0},
}
V40_NODE = {"name": "mx-t4-1", "address": "10.0.0.11", "hostname": "mx-t4-1", "state": ["IDLE", "DRAIN"],
            "partitions": ["online", "offline"], "gres": "gpu:t4:4,mps:400", "gres_used": "gpu:t4:1(IDX:0),mps:0",
            "cpus": 8, "alloc_cpus": 2, "reason": "maintenance"}
V40_PART = {"name": "offline", "nodes": {"configured": "mx-t4-1,mx-a10-1", "total": 2},
            "cpus": {"total": 16}, "partition": {"state": ["UP"]}}


def test_v0040_job() -> None:
    job = V40.parse_job(V40_JOB)
    assert job.state == "PENDING" and job.state_flags == ("REQUEUED",) and job.held
    assert job.required_nodes == ("mx-a10-1", "mx-a10-2") and job.mps_pct == 30
    assert job.restart_count == 2 and job.exit_code == 0
    assert job.submit_time_utc == datetime.fromtimestamp(1_700_000_000, tz=UTC)
    assert job.start_time_utc is None and job.end_time_utc is None


def test_v0040_node_partition_ping() -> None:
    node = V40.parse_node(V40_NODE)
    assert node.state == "IDLE" and node.state_flags == ("DRAIN",) and not node.usable
    assert node.gres == (Gres("gpu", "t4", 4), Gres("mps", None, 400)) and node.gres_in_use("gpu") == 1
    part = V40.parse_partition(V40_PART)
    assert part.nodes == ("mx-t4-1", "mx-a10-1") and part.state == "UP" and part.total_cpus == 16
    assert V40.parse_ping({"hostname": "ctl", "pinged": "UP", "mode": "primary"}).up
    assert not V40.parse_ping({"hostname": "ctl", "responding": False}).up


def test_array_heterogeneous_and_node_count_fields() -> None:
    """A pending array is one record with its task string; a het component names its leader (v0.0.38, live)."""
    raw = {**body("job_held")["jobs"][0], "array_job_id": 16, "array_task_id": None, "array_task_string": "0-2",
           "het_job_id": 0, "node_count": 1}
    job = V38.parse_job(raw)
    assert (job.array_job_id, job.array_tasks, job.het_job_id, job.node_count) == (16, "0-2", 0, 1)
    task = V38.parse_job({**raw, "job_id": 17, "array_task_id": 0, "array_task_string": ""})
    assert (task.array_job_id, task.array_tasks) == (16, "0")
    plain = V38.parse_job(body("job_held")["jobs"][0])
    assert (plain.array_job_id, plain.het_job_id) == (0, 0)
    v40 = V40.parse_job({**V40_JOB, "array_job_id": _nv(0), "array_task_id": {"set": False, "infinite": False,
                                                                               "number": 0},
                         "het_job_id": _nv(41), "node_count": _nv(2)})
    assert (v40.array_job_id, v40.array_tasks, v40.het_job_id, v40.node_count) == (0, "", 41, 2)


@pytest.mark.parametrize(("status", "code"), [(0, 0), (1024, 4), (256 * 127, 127), (9, -9), (15, -15), (None, None)])
def test_v0038_exit_code_is_decoded_from_slurms_wait_status(status, code) -> None:
    """slurmrestd 22.05 serves the wait status (checked live: a script's ``exit 4`` reads 1024)."""
    assert api_version("v0.0.38").exit_code(status) == code
