"""Payload builders per slurmrestd API version, against golden files (delete one to re-record it).

v0.0.38 bodies are also checked against the OpenAPI description a live
slurmrestd 22.05 served (data/openapi_v0.0.38.json). Every golden file of every
version is sent to a live slurmrestd that serves its version by
tests/live/test_rest_versions_live.py (22.05: v0.0.38; 24.11: v0.0.40 – v0.0.42),
which must accept it (golden/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from executors.slurm.api import API_VERSIONS, api_version
from executors.slurm.errors import PayloadError
from executors.slurm.spec import JobSignal, BatchJob, JobUpdate

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden"
SCHEMA_038 = HERE / "data" / "openapi_v0.0.38.json"
# Keys v0.0.38 accepts although its schema does not list them, and keys whose
# schema type the server refuses (begin_time: "integer", but only time strings
# such as "now" parse). Both verified on the dev cluster.
LIVE_ONLY_KEYS_038 = {"nodelist"}
LIVE_TYPES_038 = {"begin_time": str}

FULL = BatchJob(
    name="muxflow-offline-17",
    script="#!/bin/sh\nexec python -m train --resume\n",
    partition="offline",
    environment={"PATH": "/usr/bin:/bin", "MUXFLOW_JOB_ID": "17"},
    working_dir="/srv/muxflow/jobs/17",
    hold=True,
    gres_per_node="mps:30",
    requeue=True,
    signal=JobSignal("SIGUSR1", 120),
    stdout_path="/srv/muxflow/jobs/17/out.log",
    stderr_path="/srv/muxflow/jobs/17/err.log",
    time_limit_min=600,
    comment="muxflow:job=17",
)
MINIMAL = BatchJob(name="probe", script="#!/bin/sh\ntrue\n", partition="profile")
GATED = BatchJob(name="bench-1", script="#!/bin/sh\nsleep 600\n", partition="offline", hold=True,
                gres_per_node="mps:1", dependency="afterok:1")  # the live test's first job is job 1
PINNED = BatchJob(name="online-svc", script="#!/bin/sh\nexec serve\n", partition="online", nodelist="mx-t4-1",
                 gres_per_node="mps:100")

REQUESTS: dict[str, Any] = {
    "submit_full": ("submit", FULL),
    "submit_minimal": ("submit", MINIMAL),
    "submit_pinned": ("submit", PINNED),
    "submit_gated": ("submit", GATED),
    "update_place": ("update", JobUpdate(nodelist="mx-a10-1", gres_per_node="mps:70")),
    "update_release": ("update", JobUpdate(hold=False)),
    "update_hold": ("update", JobUpdate(hold=True)),
    "update_place_release": ("update", JobUpdate(nodelist="mx-a10-1", gres_per_node="mps:70", hold=False,
                                                 eligible_now=True)),
    "update_eligible_now": ("update", JobUpdate(eligible_now=True)),
    # MuxFlow's placement: the signed plan in the comment (executors.slurm.plan), in the same update
    "update_place_plan": ("update", JobUpdate(nodelist="mx-a10-1", gres_per_node="mps:35", hold=False,
                                              eligible_now=True, comment="muxflow-plan=1 slurm=17 job=5 kind=place "
                                              "gpu=2 pct=35 mem=2147483648 sig=" + "0" * 64)),
    # a profiling window opens in the profile partition; it closes back in the offline one
    "update_window_open": ("update", JobUpdate(partition="profile", nodelist="mx-t4-1", gres_per_node="mps:100",
                                               comment="muxflow-plan=1 slurm=17 job=5 kind=profile gpu=1 run=3 sig="
                                               + "0" * 64, eligible_now=True, hold=False)),
    "update_window_close": ("update", JobUpdate(partition="offline", comment="")),
    "cancel_signal": ("cancel", "SIGUSR1"),
    "cancel_kill": ("cancel", None),
}


NOW_S = 1_700_000_000


def build(version: str, kind: str, arg: Any) -> Any:
    api = api_version(version, clock=lambda: NOW_S)
    if kind == "submit":
        return api.build_submit(arg)
    if kind == "update":
        return api.build_update(arg)
    return api.cancel_params(arg)


def check_golden(path: Path, value: Any) -> None:
    text = json.dumps(value, indent=2, sort_keys=True) + "\n"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        pytest.fail(f"recorded missing golden file {path.relative_to(HERE)}; review it and run again")
    assert json.loads(path.read_text()) == value, f"{path.relative_to(HERE)} differs; delete it to re-record"


def requests_of(version: str) -> list[str]:
    """The golden requests of a version: all of them."""
    return sorted(REQUESTS)


@pytest.mark.parametrize("version, name", [(v, n) for v in sorted(API_VERSIONS) for n in requests_of(v)])
def test_payload_matches_golden(version: str, name: str) -> None:
    kind, arg = REQUESTS[name]
    check_golden(GOLDEN / version / f"{name}.json", build(version, kind, arg))


def test_v0040_batch_only_signal_golden() -> None:
    spec = BatchJob(name="ckpt", script="#!/bin/sh\n", partition="offline", signal=JobSignal("USR1", 60, True))
    check_golden(GOLDEN / "v0.0.40" / "submit_batch_signal.json", api_version("v0.0.40").build_submit(spec))


def test_v0038_refuses_batch_only_signal() -> None:
    spec = BatchJob(name="ckpt", script="#!/bin/sh\n", partition="offline", signal=JobSignal("USR1", 60, True))
    with pytest.raises(PayloadError, match="batch shell"):
        api_version("v0.0.38").build_submit(spec)


# -- v0.0.38 against the schema the live slurmrestd served ------------------------------
def _schemas() -> dict[str, Any]:
    return json.loads(SCHEMA_038.read_text())["components"]["schemas"]


_JSON_TYPES = {"string": str, "integer": int, "boolean": bool, "object": dict, "array": list}


def _check_against(props: dict[str, Any], body: dict[str, Any], where: str) -> None:
    for key, value in body.items():
        if key in LIVE_ONLY_KEYS_038:
            continue
        assert key in props, f"{where}: {key!r} is not in the served v0.0.38 schema"
        spec = props[key]
        expected = LIVE_TYPES_038.get(key) or _JSON_TYPES.get(spec.get("type", ""))
        if expected is not None:
            assert isinstance(value, expected) and not (expected is int and isinstance(value, bool)), \
                f"{where}.{key}: {value!r} is not {expected.__name__}"
        if "enum" in spec and key != "signal":  # `signal` is a pattern; the enum is its names
            assert value in spec["enum"], f"{where}.{key}: {value!r} not in {spec['enum']}"


@pytest.mark.parametrize("name", [n for n in requests_of("v0.0.38") if REQUESTS[n][0] in ("submit", "update")])
def test_v0038_bodies_use_served_schema_fields(name: str) -> None:
    schemas = _schemas()
    props = schemas["v0.0.38_job_properties"]["properties"]
    kind, arg = REQUESTS[name]
    body = build("v0.0.38", kind, arg)
    if kind == "submit":
        sub = schemas["v0.0.38_job_submission"]
        assert set(sub["required"]) <= set(body)
        assert set(body) <= set(sub["properties"])
        _check_against(props, body["job"], "job")
    else:
        _check_against(props, body, "update")


def test_v0038_served_paths_match_the_builders() -> None:
    paths = json.loads(SCHEMA_038.read_text())["paths"]
    api = api_version("v0.0.38")
    for path, method in [(api.submit_path(), "post"), (api.job_path(1), "post"), (api.job_path(1), "delete"),
                         (api.job_path(1), "get"), (api.jobs_path(), "get"), (api.nodes_path(), "get"),
                         (api.partitions_path(), "get"), (api.ping_path(), "get"), (api.diag_path(), "get")]:
        templ = path.replace("/job/1", "/job/{job_id}")
        assert method in paths[templ], f"{method.upper()} {templ} not served"
    cancel = paths["/slurm/v0.0.38/job/{job_id}"]["delete"]
    assert {"signal"} <= {p["name"] for p in cancel["parameters"]}
    assert not any("requeue" in p for p in paths), "v0.0.38 grew a requeue endpoint: use it"


# -- specs refuse what Slurm would refuse later -----------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({"name": ""}, "name"),
    ({"name": "a\nb"}, "name"),
    ({"script": "echo hi"}, "script"),
    ({"partition": ""}, "partition"),
    ({"gres_per_node": "mps:"}, "gres_per_node"),
    ({"gres_per_node": "mps:0"}, "gres_per_node"),
    ({"gres_per_node": "mps:x:y:z"}, "gres_per_node"),
    ({"nodelist": "n[1-"}, "nodelist"),
    ({"environment": {"1BAD": "x"}}, "environment"),
    ({"time_limit_min": 0}, "time_limit_min"),
    ({"working_dir": "relative/dir"}, "working_dir"),
    ({"dependency": "afterok"}, "dependency"),
    ({"dependency": "afterok:41;rm -rf /"}, "dependency"),
])
def test_job_spec_validation(kwargs: dict[str, Any], match: str) -> None:
    base = {"name": "j", "script": "#!/bin/sh\n", "partition": "offline"}
    with pytest.raises(PayloadError, match=match):
        BatchJob(**{**base, **kwargs})


def test_signal_names_normalised_and_checked() -> None:
    assert JobSignal("sigterm").name == "TERM"
    with pytest.raises(PayloadError, match="unknown signal"):
        JobSignal("SIGFOO")
    with pytest.raises(PayloadError):
        api_version("v0.0.38").cancel_params("NOPE")


def test_empty_update_refused() -> None:
    with pytest.raises(PayloadError, match="nothing to change"):
        JobUpdate()


def test_unknown_api_version() -> None:
    with pytest.raises(ValueError, match="v0.0.38"):
        api_version("v0.0.1")
    assert api_version("0.0.40").name == "v0.0.40"
