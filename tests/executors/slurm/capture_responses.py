"""Re-record the slurmrestd responses under data/ from a running dev cluster (not a test).

    .venv/bin/muxflow slurm dev-up
    .venv/bin/python tests/executors/slurm/capture_responses.py

Each file is ``{"request": …, "status_code": …, "body": …}`` exactly as
slurmrestd v0.0.38 (Slurm 22.05.8, Debian 12) answered; the parser and
client tests replay them without Slurm.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx

from executors.dev.slurm import DevCluster
from executors.slurm.api import api_version
from executors.slurm.spec import BatchJob, JobSignal, JobUpdate

DATA = Path(__file__).resolve().parent / "data"


def main() -> int:
    cluster = DevCluster()
    layout = cluster.load_layout()
    if layout is None:
        print("no dev cluster; run `muxflow slurm dev-up` first", file=sys.stderr)
        return 1
    api = api_version(layout.api_version)
    http = httpx.Client(transport=httpx.HTTPTransport(uds=str(layout.rest_socket)), base_url="http://slurmrestd",
                        timeout=15)

    def call(name: str | None, method: str, path: str, body: dict | None = None,
             params: dict | None = None) -> dict:
        resp = http.request(method, path, json=body, params=params)
        data = resp.json()
        if name:
            record = {"request": {"method": method, "path": path, "params": params, "body": body},
                      "status_code": resp.status_code, "body": data}
            (DATA / f"{name}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        return data

    DATA.mkdir(parents=True, exist_ok=True)
    spec = http.get("/openapi/v3").json()
    (DATA / f"openapi_{api.name}.json").write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
    call("ping", "GET", api.ping_path())
    call("diag", "GET", api.diag_path())
    call("nodes", "GET", api.nodes_path())
    call("node", "GET", api.node_path(layout.nodes[0].name))
    call("partitions", "GET", api.partitions_path())

    script = "#!/bin/sh\necho started\nsleep 60\n"
    job = BatchJob(name="capture", script=script, partition="offline", hold=True, gres_per_node="mps:30",
                  working_dir=str(layout.jobs_dir), environment={"PATH": "/usr/bin:/bin", "MUXFLOW_JOB": "capture"},
                  signal=JobSignal("USR1", 60), comment="muxflow:capture", time_limit_min=10)
    sub = call("job_submit_held", "POST", api.submit_path(), api.build_submit(job))
    job_id = int(sub["job_id"])
    call("job_held", "GET", api.job_path(job_id))
    node = layout.nodes[-1].name
    call("job_update_place", "POST", api.job_path(job_id),
         api.build_update(JobUpdate(nodelist=node, gres_per_node="mps:70")))
    call("job_release", "POST", api.job_path(job_id), api.build_update(JobUpdate(hold=False)))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        data = call(None, "GET", api.job_path(job_id))
        if data["jobs"][0]["job_state"] == "RUNNING":
            break
        time.sleep(0.2)
    call("job_running", "GET", api.job_path(job_id))
    call("nodes_busy", "GET", api.nodes_path())
    call("jobs", "GET", api.jobs_path())
    call("job_signal", "DELETE", api.job_path(job_id), params=api.cancel_params("USR1"))
    call("job_cancel", "DELETE", api.job_path(job_id))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        data = call(None, "GET", api.job_path(job_id))
        if data["jobs"][0]["job_state"] not in ("RUNNING", "COMPLETING"):
            break
        time.sleep(0.2)
    call("job_cancelled", "GET", api.job_path(job_id))

    bad = api.build_submit(BatchJob(name="bad", script=script, partition="no-such-partition"))
    call("error_unknown_partition", "POST", api.submit_path(), bad)
    call("error_unknown_job", "GET", api.job_path(999999))
    call("error_cancel_unknown_job", "DELETE", api.job_path(999999))
    call("error_disabled_key", "POST", api.job_path(job_id), {"required_nodes": node})
    call("error_unknown_key", "POST", api.job_path(job_id), {"tres_per_node": "gres:mps:60"})
    body = api.build_submit(job)
    body["job"]["signal"] = "B:USR1@60"
    call("error_bad_signal", "POST", api.submit_path(), body)
    print(f"wrote {len(list(DATA.glob('*.json')))} files to {DATA}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
