"""Solo profiling end to end with real processes on this machine (the local executor; no GPU here):
a reference training job is profiled; a crashing job, a job that never reports an iteration, one
that exits without profiling and one that stops reporting are failed with their reasons."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from sqlalchemy import select

from executors.scheduler.profiling.local import LocalProfileExecutor
from executors.scheduler.profiling.settings import ProfilingSettings
from executors.scheduler.profiling.solo import SoloProfiler
from executors.store import models as m
from executors.store.db import Store
from executors.store.migrate import upgrade
from tests.executors.scheduler.profiling.helpers import add_gpu_types, add_job, job_state, runs_of

REPO = Path(__file__).resolve().parents[4]
PY = shlex.quote(sys.executable)
HANGS_AFTER_ONE = ("from executors.job.runtime import Runtime\nimport time\nrt = Runtime('/tmp/unused-ckpt')\n"
                   "rt.step_done(1, dict)\ntime.sleep(600)\n")


def test_local_profiling_of_good_and_bad_jobs(tmp_path) -> None:
    # processes, not the database, are under test here: SQLite only (test_solo_controller covers Postgres)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    store = Store(url)
    add_gpu_types(store, "t4", "a10")
    good = add_job(store, "good", f"cd {REPO} && exec {PY} -m executors.job.workloads.train --family recommender "
                                  f"--size tiny --ckpt {tmp_path}/ckpt --steps 100000", gpu_types=("t4", "a10"))
    crash = add_job(store, "crash", f"{PY} -c \"import sys; sys.stderr.write('ValueError: bad shape\\\\n'); "
                                    "sys.exit(3)\"")
    silent = add_job(store, "silent", "sleep 300")
    no_runtime = add_job(store, "no-runtime", "echo trained without the runtime")
    (tmp_path / "hang.py").write_text(HANGS_AFTER_ONE)
    stuck = add_job(store, "stuck", f"cd {REPO} && exec {PY} {tmp_path}/hang.py")
    ex = LocalProfileExecutor(slots=3)  # three "profile GPUs"
    settings = ProfilingSettings(bound_s=12, profile_seconds=6, iterations=5, warmup_iterations=1, poll_s=0.2,
                                 profile_dir=str(tmp_path / "runs"), metrics="auto")
    try:
        summary = SoloProfiler(store, ex, settings, seed=1).run()
    finally:
        ex.close()
    assert summary.in_progress == [] and summary.profiled == [good]
    assert job_state(store, good)[0] == "PENDING"
    with store.session() as s:
        prof = {p.gpu_type: p for p in s.scalars(select(m.JobProfile).where(m.JobProfile.job_id == good))}
        s.expunge_all()
    assert set(prof) == {"t4", "a10"}
    for p in prof.values():
        # no GPU on this machine: GPU metrics from the simulated model, iterations really measured
        assert (p.source, p.method, p.iterations) == ("simulated", "simulated-metrics", 5)
        assert 0 < p.measured_iter_time_s < 5 and p.iter_time_p95_s >= p.iter_time_p50_s > 0
        assert "no GPU" in p.device and 0 < p.profiling_s < 12
    assert prof["a10"].iter_time_s < prof["t4"].iter_time_s  # the model's GPU iteration times
    reasons = {j: job_state(store, j) for j in (crash, silent, no_runtime, stuck)}
    assert reasons[crash] == ("FAILED", "profiling failed on t4: crashed (exit code 3) after 0 iteration(s): "
                                        "ValueError: bad shape")
    assert reasons[silent][0] == "FAILED" and "reported no iterations within" in reasons[silent][1]
    assert reasons[no_runtime][0] == "FAILED" and "exited 0 without a profiling report" in reasons[no_runtime][1]
    assert reasons[stuck][0] == "FAILED" and "exceeded the profiling bound" in reasons[stuck][1] \
        and "1 iteration(s) reported" in reasons[stuck][1]
    run = runs_of(store, silent)[0]
    assert run.state == "failed" and run.report["killed_at_deadline"] and run.finished_utc is not None
