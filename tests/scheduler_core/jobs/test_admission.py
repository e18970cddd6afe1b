"""Admission under overload: the jobs with the least work left compete; a running job yields only to much shorter ones."""

from __future__ import annotations

import dataclasses
import json

import pytest

from scheduler_core.jobs.admission import AdmissionPolicy, admit, capacity
from scheduler_core.domain import Action, GpuHealth
from scheduler_core.round.plan import RoundConfig, plan_round
from scheduler_core.jobs.unplaced import DEFERRED_SRPT, groups
from tests.scheduler_core.round.test_plan import PREDICTORS, gpu, job


def _with(j, remaining_s):
    return dataclasses.replace(j, remaining_s=remaining_s)


def ids(jobs) -> list[int]:
    return [j.job_id for j in jobs]


def test_nothing_is_trimmed_while_every_job_fits_or_no_remaining_time_is_known() -> None:
    jobs = [_with(job(i), 100.0 * (5 - i)) for i in range(4)]
    competing, deferred = admit(jobs, 4, AdmissionPolicy())
    assert ids(competing) == [0, 1, 2, 3] and deferred == []
    unknown = [job(i) for i in range(6)]
    competing, deferred = admit(unknown, 2, AdmissionPolicy())
    assert ids(competing) == list(range(6)) and deferred == []
    competing, deferred = admit(jobs, 1, AdmissionPolicy(order="all"))
    assert ids(competing) == [0, 1, 2, 3]


def test_under_overload_the_shortest_compete_and_slack_widens_the_field() -> None:
    jobs = [_with(job(i), r) for i, r in enumerate([900.0, 100.0, 500.0, 300.0, 700.0])]
    competing, deferred = admit(jobs, 2, AdmissionPolicy(slack=0.0))
    assert ids(competing) == [1, 3] and ids(deferred) == [0, 2, 4]  # queue order kept within each part
    competing, _ = admit(jobs, 2, AdmissionPolicy(slack=0.5))
    assert ids(competing) == [1, 2, 3]


def test_a_running_job_keeps_its_place_unless_a_waiting_job_is_clearly_shorter() -> None:
    running = _with(job(0, current_gpu_id=7, current_sm_pct=50), 400.0)
    slightly_shorter = _with(job(1), 300.0)
    competing, deferred = admit([running, slightly_shorter], 1, AdmissionPolicy(slack=0.0, preempt_ratio=0.5))
    assert ids(competing) == [0] and ids(deferred) == [1]
    much_shorter = _with(job(2), 150.0)
    competing, deferred = admit([running, much_shorter], 1, AdmissionPolicy(slack=0.0, preempt_ratio=0.5))
    assert ids(competing) == [2] and ids(deferred) == [0]


def test_unknown_remaining_counts_as_the_median_of_the_known() -> None:
    jobs = [_with(job(0), 100.0), _with(job(1), 900.0), job(2), _with(job(3), 500.0)]
    competing, _ = admit(jobs, 2, AdmissionPolicy(slack=0.0))
    # job 2 counts as 500 s (the median of 100, 900, 500) and ties with job 3: ties keep queue order
    assert ids(competing) == [0, 2]


def test_capacity_counts_the_slots_a_round_can_fill() -> None:
    gpus = [gpu(0), gpu(1, health=GpuHealth.UNHEALTHY), gpu(2, health=GpuHealth.UNHEALTHY, current_job_id=5),
            gpu(3, health=GpuHealth.OVERLIMIT), gpu(4, gpu_type="v100")]
    assert capacity(gpus, {"t4"}, 1) == 2
    assert capacity(gpus, {"t4"}, 3) == 6


def test_policy_rejects_nonsense() -> None:
    for bad in ({"order": "fifo"}, {"slack": -0.1}, {"slack": float("nan")}, {"preempt_ratio": 0.0},
                {"preempt_ratio": 1.5}):
        with pytest.raises(ValueError):
            AdmissionPolicy(**bad)


def test_an_overloaded_round_places_the_shortest_and_checkpoints_a_long_running_job() -> None:
    gpus = [gpu(0, current_job_id=10, current_sm_pct=70), gpu(1)]
    jobs = [_with(job(10, current_gpu_id=0, current_sm_pct=70), 10_000.0),
            _with(job(11), 600.0), _with(job(12), 50.0), _with(job(13), 5_000.0)]
    res = plan_round(gpus, jobs, PREDICTORS, RoundConfig(admission=AdmissionPolicy(slack=0.0)))
    assert sorted(p.job_id for p in res.placements) == [11, 12]
    evicted = [a for a in res.actions if a.action == Action.EVICT]
    assert [(a.job_id, a.from_gpu_id) for a in evicted] == [(10, 0)]
    assert res.stats["admission"] == {"slots": 2, "competing": 2, "deferred": 2, "preempted": 1}
    assert res.jobs_considered == 4
    why = {reason: got for reason, _detail, got in groups(res.stats["unplaced"])}
    assert sorted(why[DEFERRED_SRPT]) == [10, 13]
    # The paper's round (every job competes) keeps the running job where it is.
    paper = plan_round(gpus, jobs, PREDICTORS, RoundConfig(admission=AdmissionPolicy(order="all")))
    assert 10 in {p.job_id for p in paper.placements}
    assert not any(a.action == Action.EVICT for a in paper.actions)


def test_round_config_with_admission_survives_its_json_form() -> None:
    cfg = RoundConfig(admission=AdmissionPolicy(slack=0.3, preempt_ratio=0.7))
    again = RoundConfig(**json.loads(json.dumps(dataclasses.asdict(cfg))))
    assert again.admission == cfg.admission


def test_remaining_solo_time_from_declared_steps_progress_and_the_fastest_profile() -> None:
    from scheduler_core.jobs.admission import remaining_solo_s
    from scheduler_core.domain import OfflineFeatures

    def prof(it):
        return OfflineFeatures(90.0, 60.0, 40.0, 1e9, 30.0, it, 1400.0)

    assert remaining_solo_s(100, 40.0, {"t4": prof(0.3), "a10": prof(0.2)}) == pytest.approx(12.0)
    assert remaining_solo_s(100, 150.0, {"t4": prof(0.3)}) == 0.0  # past its declared steps: nothing left
    assert remaining_solo_s(100, float("nan"), {"t4": prof(0.3)}) == pytest.approx(30.0)  # no progress known
    assert remaining_solo_s(100, 0.0, {"t4": prof(float("nan")), "a10": prof(0.0)}) is None  # no usable profile
    assert remaining_solo_s(None, 0.0, {"t4": prof(0.3)}) is None and remaining_solo_s(100, 0.0, {}) is None
