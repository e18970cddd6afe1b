"""One user per GPU in the simulator (scheduler_core.simulator.users, docs/EVALUATION.md "Several users").

The documented distribution, that MuxFlow rounds never put a job next to a replica of another user
when users are declared, that a simulation without users is the one it was, and `muxflow simulate users`.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
from click.testing import CliRunner

from executors.data.calibration import SAMPLE_TRACE
from pipelines.cli import main
from scheduler_core.simulator import SimConfig, get_policy, run_simulation
from scheduler_core.simulator.users import assign_users, user_name, user_weights
from tests.scheduler_core.simulator.test_cli import TINY, in_tmp  # noqa: F401

SMALL = dict(gpus=24, hours=3.0, jobs=90, arrival_hours=2.0, mean_job_hours=0.5, seed=3)


def test_users_follow_the_documented_distribution() -> None:
    w = user_weights(4, 1.0)
    assert np.allclose(w, np.array([1, 1 / 2, 1 / 3, 1 / 4]) / (25 / 12))
    assert np.allclose(user_weights(5, 0.0), 0.2)
    gpus, jobs = assign_users(7, 4, 1.0, 20_000, 20_000)
    for share in (np.bincount(gpus, minlength=4) / gpus.size, np.bincount(jobs, minlength=4) / jobs.size):
        assert np.allclose(share, w, atol=0.01)
    again = assign_users(7, 4, 1.0, 20_000, 20_000)
    assert np.array_equal(gpus, again[0]) and np.array_equal(jobs, again[1])
    assert not np.array_equal(gpus, jobs)  # independent streams
    none = assign_users(7, 0, 1.0, 5, 6)
    assert (none[0] == -1).all() and (none[1] == -1).all() and none[1].size == 6
    assert user_name(-1) is None and user_name(0) == "team1"


def test_muxflow_places_jobs_only_next_to_their_teams_replicas(inputs, sample_trace) -> None:
    cfg = SimConfig(**SMALL, users=3)
    res = run_simulation(sample_trace, inputs, cfg, get_policy("muxflow"))
    assert res.invariants["jobs_next_to_another_user"] == 0
    assert res.invariants["all_accounted"] and res.metrics["offline"]["finished"] > 0
    free = run_simulation(sample_trace, inputs, SimConfig(**SMALL), get_policy("muxflow"))
    assert free.invariants["jobs_next_to_another_user"] == 0  # nobody declared a user


def test_the_rule_costs_placements_when_teams_do_not_line_up(inputs, sample_trace) -> None:
    """Many small teams on few GPUs: some jobs find no GPU of their team, the rounds place fewer."""
    free = run_simulation(sample_trace, inputs, SimConfig(**SMALL), get_policy("muxflow"))
    tight = run_simulation(sample_trace, inputs, SimConfig(**SMALL, users=12, users_zipf_s=0.0),
                           get_policy("muxflow"))
    assert tight.invariants["jobs_next_to_another_user"] == 0
    assert tight.metrics["rounds"]["placements_mean"] < free.metrics["rounds"]["placements_mean"]
    assert tight.metrics["offline"]["jct_censored_s"] > free.metrics["offline"]["jct_censored_s"]


def test_baselines_share_gpus_between_users(inputs, sample_trace) -> None:
    """Time slices need no MPS server: the time-sharing baselines ignore users and so place jobs anywhere."""
    cfg = SimConfig(**SMALL, users=3)
    res = run_simulation(sample_trace, inputs, cfg, get_policy("time-sharing"))
    base = run_simulation(sample_trace, inputs, replace(cfg, users=0), get_policy("time-sharing"))
    assert res.metrics["offline"] == base.metrics["offline"]


def test_simulate_users_prints_the_cost_against_no_constraint(in_tmp) -> None:  # noqa: F811
    res = CliRunner().invoke(main, ["simulate", "users", "--trace", str(SAMPLE_TRACE), *TINY, "--users-list", "2",
                                    "--quiet", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["simulated"] is True and [r["users"] for r in doc["table"]] == [0, 2]
    assert doc["table"][0]["jct_vs_none"] == 1.0
    res = CliRunner().invoke(main, ["simulate", "users", "--trace", str(SAMPLE_TRACE), *TINY, "--users-list", "0,2",
                                    "--quiet"], catch_exceptions=False)
    assert "SIMULATED" in res.stdout and "JCT/none" in res.stdout
    assert [ln.split()[0] for ln in res.stdout.splitlines()[3:]] == ["0", "2"]
    bad = CliRunner().invoke(main, ["simulate", "users", "--trace", str(SAMPLE_TRACE), "--users-list", "x"])
    assert bad.exit_code != 0 and "users-list" in bad.output
