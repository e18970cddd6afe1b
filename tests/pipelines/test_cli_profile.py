"""``muxflow profile`` / ``muxflow sample``: the simulated default unchanged, real runs here (--local),
the sampling plan, the runs' listing, and one-line errors that write nothing."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from tests.pipelines.test_cli import assert_usage_error, ok, row_counts

REPO = Path(__file__).resolve().parents[2]


def usage_error(url: str, args: list[str], starts: str) -> None:
    assert_usage_error(url, args, "^error: " + re.escape(starts))


def test_profile_and_sample_commands(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    ok(url, "db", "upgrade")
    ok(url, "cluster", "init", "--simulated", "--gpus", "4", "--types", "t4:4", "--services", "2")
    train = (f"cd {REPO} && exec {shlex.quote(sys.executable)} -m executors.job.workloads.train --family cnn "
             f"--size tiny --ckpt {tmp_path}/ck --steps 100000")
    for name, command in (("real", train), ("broken", "exit 7")):
        ok(url, "submit", "--name", name, "--command", command, "--job-type", "ResNet-18 (batch size 16)",
           "--mem", "1GiB", "--gpu-types", "t4", "--checkpoint-dir", f"/ckpt/{name}", "--steps", "100")
    usage_error(url, ["profile", "--real", "--local"], "real: give --real or --local, not both")
    usage_error(url, ["profile", "--local", "--seconds", "700"], "profiling: profile_seconds (700.0) must be below")
    res = ok(url, "profile", "--local", "--bound", "20", "--seconds", "5", "--iterations", "4",
             "--profile-dir", str(tmp_path / "runs"))
    assert "profiled 1 job(s) (0 by reuse), 1 failed, 0 still profiling" in res.output
    assert "SIMULATED where no GPU" in res.output
    listing = ok(url, "profile", "--runs").output
    assert "done" in listing and "failed" in listing and "crashed (exit code 7)" in listing
    jobs = ok(url, "jobs", "list").output
    assert "PENDING" in jobs and "profiling failed on t4: crashed (exit code 7)" in jobs
    # the simulated default is what it was
    assert "profiled 0 job(s) (simulated)" in ok(url, "profile").output

    usage_error(url, ["sample", "--plan", "--gpu-type", "h100"], "gpu-type: unknown h100")
    plan = ok(url, "sample", "--plan", "--budget", "3", "--window", "5", "--size", "tiny").output
    assert "new_job_type" in plan and "GPU minutes" in plan and "t4" in plan
    assert row_counts(url)["sampling_runs"] == 0  # --plan runs nothing
    assert "co-location samples (simulated)" in ok(url, "sample", "--per-type", "10").output
    assert ok(url, "sample", "--runs").output.strip() == "none"
