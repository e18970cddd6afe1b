"""Each policy on a hand-built one-GPU cluster with constant online load, against answers worked out by hand.

The online service (CNN family) sees 100 QPS all day on a T4; the trace holds
one Recommendation job (slowdown well inside the 20 % allowance) whose solo duration is scaled to 30 minutes on the
reference P100 (so 1800 / 0.85 s on a T4). A round at minute 0 places it; it
pays the 60 s start-up; then it progresses at the sharing mechanism's
normalized throughput.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from scheduler_core.gpu_specs import get_spec
from scheduler_core.interference.pairs import colocate
from scheduler_core.online.load import load_of, solo_gpu_util_pct, solo_sm_activity_pct
from scheduler_core.simulator import get_policy, run_simulation
from scheduler_core.workloads import ONLINE_FAMILIES
from tests.scheduler_core.simulator.conftest import flat_config, trace_job

JOB_TYPE = "Recommendation (batch size 512)"

CNN = ONLINE_FAMILIES["cnn"]
T4 = get_spec("t4")
LOAD = float(load_of(100.0, CNN, T4))
U = float(solo_gpu_util_pct(LOAD, CNN)) / 100.0
SOLO_T4_S = 1800.0 / T4.relative_speed


def finish_time(tput: float) -> float:
    return 60.0 + SOLO_T4_S / tput


def only_job(inputs, policy: str, **cfg):
    res = run_simulation([trace_job(1, 5000, job_type=JOB_TYPE)], inputs, flat_config(**cfg), get_policy(policy))
    return res, res.metrics["offline"]


def test_online_only_runs_no_offline_work_and_has_no_slowdown(inputs) -> None:
    res, off = only_job(inputs, "online-only")
    assert off["finished"] == 0 and off["executions"] == 0
    assert res.metrics["online"]["avg_latency_norm"] == 1.0
    assert res.metrics["online"]["p99_latency_norm"] == 1.0
    assert res.invariants["accounted"]["queued"] == 1


def test_time_sharing_gets_the_time_the_online_service_leaves_minus_its_waits(inputs) -> None:
    res, off = only_job(inputs, "time-sharing")
    sh = flat_config().sharing
    tput = (1.0 - min(0.95, U * (1.0 + sh.ts_online_wait))) * (1.0 - sh.ts_switch_overhead)
    assert off["avg_jct_s"] == pytest.approx(finish_time(tput), abs=0.01)
    # While the job runs every request waits for the offline slices: +45 % latency.
    assert res.metrics["online"]["avg_latency_norm"] > 1.0


def test_pb_time_sharing_only_gets_idle_time(inputs) -> None:
    res, off = only_job(inputs, "pb-time-sharing")
    sh = flat_config().sharing
    tput = (1.0 - U) * sh.pb_offline_efficiency
    assert off["avg_jct_s"] == pytest.approx(finish_time(tput), abs=0.01)
    assert 1.0 < res.metrics["online"]["avg_latency_norm"] < 1.0 + sh.pb_online_wait + 1e-9


@pytest.mark.parametrize("policy,expected_pct", [("muxflow", None), ("muxflow-s", 50), ("muxflow-m", None),
                                                 ("muxflow-s-m", 50)])
def test_muxflow_family_runs_at_the_planned_share_and_the_model_speed(inputs, policy, expected_pct) -> None:
    cfg = flat_config()
    on_sm = float(solo_sm_activity_pct(LOAD, CNN))
    pct = expected_pct if expected_pct is not None else int(min(90, max(10, math.floor(100.0 - on_sm - 10.0))))
    catalog = inputs.catalog
    tput, _ = colocate(catalog.online["cnn"], LOAD, catalog.offline[JOB_TYPE].traits, pct, cfg.interference)
    res, off = only_job(inputs, policy)
    assert off["executions"] == 1 and off["migrations"] == 0 and off["evictions"] == 0
    assert off["avg_jct_s"] == pytest.approx(finish_time(float(tput)), abs=0.01)


def test_salus_runs_the_shortest_remaining_job_first(inputs) -> None:
    # Two jobs of one type arrive together; solo durations 15 and 45 minutes on the P100 (mean 30).
    jobs = [trace_job(1, 3000, job_type=JOB_TYPE), trace_job(2, 1000, job_type=JOB_TYPE)]
    res = run_simulation(jobs, inputs, flat_config(hours=4.0), get_policy("salus"))
    sh = flat_config().sharing
    tput = (1.0 - U) * sh.salus_offline_efficiency
    short = 60.0 + 900.0 / T4.relative_speed / tput
    # The long job runs from the first whole minute after the short one is done.
    long_ = 60.0 * math.ceil(short / 60.0) + 2700.0 / T4.relative_speed / tput
    off = res.metrics["offline"]
    assert off["finished"] == 2
    assert off["avg_jct_s"] == pytest.approx((short + long_) / 2.0, abs=0.01)
    assert res.invariants["max_offline_jobs_per_gpu"] == 2 and res.invariants["max_active_jobs_per_gpu"] == 1


# -- between rounds -----------------------------------------------------------------------


def _spy(policy: str, calls: list):
    """``policy``, its planner recording each call: (minute, between rounds, queued jobs, running jobs)."""
    base = get_policy(policy)

    def make(cfg, inputs):
        planner = base.make_planner(cfg, inputs)

        def plan(view):
            f = view.fleet
            calls.append((int(view.now_s // 60), view.between_rounds, f.queued().tolist(), f.running().tolist()))
            return planner(view)

        return plan

    return replace(base, make_planner=make)


@pytest.mark.parametrize("policy", ["muxflow", "salus", "pb-time-sharing"])
def test_between_rounds_a_job_arriving_mid_interval_starts_in_its_minute(inputs, policy) -> None:
    # Two GPUs, three jobs arriving at minutes 0, 7 and 60 (arrivals compressed into the hour): with a GPU free,
    # the minute-7 job waits 8 minutes for the round at minute 15, or none between rounds (and a later job queued
    # behind it may gain more).
    jobs = [trace_job(1, 3000, 0.0, JOB_TYPE), trace_job(2, 3000, 7.0, JOB_TYPE), trace_job(3, 3000, 60.0, JOB_TYPE)]
    calls: list = []
    rounds = run_simulation(jobs, inputs, flat_config(gpus=2, hours=4.0, between_rounds=False),
                            get_policy(policy)).metrics
    between = run_simulation(jobs, inputs, flat_config(gpus=2, hours=4.0, between_rounds=True),
                             _spy(policy, calls)).metrics
    assert rounds["offline"]["finished"] == between["offline"]["finished"] == 3
    assert between["offline"]["avg_jct_s"] <= rounds["offline"]["avg_jct_s"] - 8 * 60 / 3 + 0.01
    at = calls.index((7, True, [1], [0]))
    assert 1 in calls[at + 1][3]  # running at the next call
    assert all(minute % 15 == 0 for minute, mid, _q, _r in calls if not mid)
    assert between["between_rounds"]["started"] >= 1 and "between_rounds" not in rounds
    assert between["offline"]["migrations"] == 0


def test_between_rounds_a_freed_gpu_takes_the_waiting_job_in_the_next_minute(inputs) -> None:
    # One GPU: the minute-1 job waits behind the first; between rounds it starts in the minute after the first
    # finishes (a call no arrival triggered), not at the next round.
    jobs = [trace_job(1, 1000, 0.0, JOB_TYPE), trace_job(2, 3000, 1.0, JOB_TYPE), trace_job(3, 3000, 60.0, JOB_TYPE)]
    calls: list = []
    res = run_simulation(jobs, inputs, flat_config(hours=6.0, between_rounds=True), _spy("muxflow", calls))
    freed = [c for c in calls if c[1] and c[0] not in (1, 60)]
    assert freed and freed[0][2] == [1] and freed[0][3] == [], calls
    assert freed[0][0] % 15 != 0
    rounds = run_simulation(jobs, inputs, flat_config(hours=6.0, between_rounds=False),
                            get_policy("muxflow")).metrics["offline"]
    gap = 15 - freed[0][0] % 15  # minutes the job would wait for the round (the job behind it may gain more)
    assert res.metrics["offline"]["avg_jct_s"] <= rounds["avg_jct_s"] - gap * 60 / 3 + 0.01


def test_the_shortest_quarter_reports_the_wait_of_a_short_job_queued_behind_a_long_one(inputs) -> None:
    # One GPU, four jobs at minute 0; the short one (a quarter of the steps) is second in line, so it
    # waits for the first to finish; put first in line it starts at once.
    def quarter(short_line: int) -> dict:
        jobs = [trace_job(line, 1000 if line == short_line else 4000, 0.0, JOB_TYPE) for line in (1, 2, 3, 4)]
        res = run_simulation(jobs, inputs, flat_config(hours=12.0, arrival_hours=0.01), get_policy("pb-time-sharing"))
        return res.metrics["offline"]["shortest_quarter"]

    behind, first = quarter(2), quarter(1)
    assert behind["jobs"] == first["jobs"] == 1
    assert behind["solo_s_max"] == first["solo_s_max"] > 0
    assert first["wait_p90_s"] < 60.0
    # It waited for the long job: at least that job's solo time on the T4 (4x its own work).
    assert behind["wait_p90_s"] >= 4 * behind["solo_s_max"] / T4.relative_speed
    assert behind["jct_mean_s"] > behind["wait_p90_s"]
    assert behind["jct_mean_s"] - behind["wait_p90_s"] < first["jct_mean_s"] + 60
