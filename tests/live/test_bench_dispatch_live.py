"""``muxflow bench dispatch`` on the live dev cluster: figures present, every job placed exactly once, cleaned up."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy import func, select

from executors.store import models as m
from executors.store.db import Store
from tests.live.conftest import REPO


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "bench", "dispatch", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def test_bench_dispatch_places_every_job_once_and_cleans_up(dev_cluster, private_tmp) -> None:
    n = 20
    url = f"sqlite:///{private_tmp / 'bench.db'}"
    out = _bench("--placements", str(n), "--db", url, "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    d, v = r["dispatch"], r["verified"]
    assert r["benchmark"] == "dispatch" and r["placements"] == n and r["cluster"]["gpus"] == 8
    assert d["done"] == n and d["failed"] == 0 and d["wall_s"] > 0
    assert d["placements_per_s"] == pytest.approx(n / d["wall_s"], rel=0.01)  # both rounded in the output
    # one read and one place+release update per job, plus the dispatcher's one listing of Slurm's jobs
    assert d["rest_requests_by_method"] == {"GET": n + 1, "POST": n}
    assert d["rest_requests"] == 2 * n + 1 and d["rest_requests_per_placement"] == round((2 * n + 1) / n, 3)
    assert (d["intent_writes"], d["result_writes"]) == (n, 2 * n)  # intent; sent, then done
    assert r["redispatch"]["actions_sent"] == 0 and r["redispatch"]["rest_requests"] == 1
    assert v["placed_as_planned"] == n and v["wrong_count"] == 0 and v["slurm_jobs"] == n
    assert v["slurm_job_ids_repeated"] == 0 and v["actions_logged_twice"] == 0 and v["dispatch_log"] == {"done": n}
    assert set(v["pending_reasons"]) <= {"Dependency", "None"}, v  # released, waiting on the gate: none started
    assert "placing + releasing" in r["measured"] and "jobs starting" in r["not_measured"]

    # the store, read independently: one done action per job, each job once, all cleaned up
    store = Store(url)
    try:
        with store.session() as s:
            rows = s.scalars(select(m.DispatchLog)).all()
            assert len(rows) == n and {x.status for x in rows} == {"done"} and len({x.job_id for x in rows}) == n
            jobs = s.scalars(select(m.OfflineJob)).all()
            sids = [j.slurm_job_id for j in jobs]
            assert len(jobs) == n and len(set(sids)) == n
            assert {j.state for j in jobs} == {"FAILED"}
            assert all("cancelled in Slurm after the measurement" in j.state_reason for j in jobs)
            assert s.scalar(select(func.count()).select_from(m.JobTransition)
                            .where(m.JobTransition.to_state == "PLACED")) == n
    finally:
        store.dispose()
    with dev_cluster.client() as c:
        left = [j for j in c.list_jobs() if j.job_id in set(sids) and not j.finished]
    assert left == [], [(j.job_id, j.state) for j in left]


def test_bench_dispatch_prints_its_figures_and_refuses_a_missing_cluster(dev_cluster, tmp_path) -> None:
    out = _bench("--placements", "3")
    assert out.returncode == 0, out.stderr[-3000:]
    for text in ("placements/s", "ms per placement", "REST requests", "per placement", "intents 3", "results 6",
                 "3/3 released once", "not measured: jobs starting"):
        assert text in out.stdout, (text, out.stdout)
    missing = _bench("--placements", "3", "--state-dir", str(tmp_path / "no-cluster"))
    assert missing.returncode == 1 and missing.stderr.startswith("error: the dev Slurm cluster is not up")
