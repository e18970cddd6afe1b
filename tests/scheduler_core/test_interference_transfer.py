"""The transferable interference model on synthetic GPU types whose ground truth is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scheduler_core.interference import PairMeasurement, calibrate
from scheduler_core.interference_errors import TypeData, leave_one_type_out, within_type
from scheduler_core.interference_transfer import (
    ITER,
    PROBE,
    JobProfile,
    TypeProfiles,
    fit_roofline,
    fit_transfer,
    measured_profiles,
    pair_errors,
    pessimistic_factor,
    residual_offsets,
    synthesize_profiles,
    training_pairs,
)

STRESSOR = "stressor"
JOBS = [STRESSOR] + [f"job{i}" for i in range(24)]


def world(seed: int = 0, noise: float = 0.01) -> dict[str, TypeData]:
    """Two GPU types; each job has fixed kernel traits (a, b) and a roofline (host time, GPU work).

    Truth: σ = a·u and π = b·u, u the job's GPU-busy fraction on the type, so a job's σ and π change
    between types by its own busy-fraction change: per-job values fitted on one type are wrong on
    the other, while the stressor probe sees the change.
    """
    rng = np.random.default_rng(seed)
    a = dict(zip(JOBS, rng.uniform(0.6, 2.0, len(JOBS))))
    b = dict(zip(JOBS, rng.uniform(0.6, 2.0, len(JOBS))))
    host = dict(zip(JOBS, rng.uniform(0.0, 0.2, len(JOBS))))
    work = dict(zip(JOBS, rng.uniform(0.05, 0.5, len(JOBS))))
    host[STRESSOR] = 0.0
    out = {}
    for gtype, speed in (("slow", 1.0), ("fast", 4.0)):
        t = {j: host[j] + work[j] / speed for j in JOBS}
        u = {j: (work[j] / speed) / t[j] for j in JOBS}
        pairs = []
        for x in JOBS:
            for y in JOBS:
                true = 1.0 / (1.0 + a[x] * u[x] * b[y] * u[y])
                pairs.append(PairMeasurement(x, y, true * (1.0 + rng.normal(0.0, noise))))
        out[gtype] = TypeData(gtype, t, tuple(pairs), speed)
    return out


def test_the_model_transfers_where_per_job_values_do_not() -> None:
    reports = {r.test: r for r in leave_one_type_out(world(), STRESSOR)}
    assert set(reports) == {"slow", "fast"}
    for r in reports.values():
        assert r.after.n == r.before.n == r.constant.n > 100
        assert r.after.mape < 0.06, r.as_dict()
        assert r.after.mape < r.before.mape / 2 and r.after.mape < r.constant.mape / 2, r.as_dict()


def test_zero_shot_profiles_follow_the_busy_fraction() -> None:
    """Without any measurement on the test type, the roofline carries the probes over."""
    reports = {r.test: r for r in leave_one_type_out(world(noise=0.0), STRESSOR)}
    for r in reports.values():
        assert r.zero_shot.mape < r.before.mape, r.as_dict()


def test_within_type_residuals_recover_what_features_miss() -> None:
    data = world(seed=3)["slow"]
    rep = within_type(data, STRESSOR)
    assert rep.refined.n == rep.before.n > 0
    assert rep.refined.mape <= rep.after.mape + 1e-9
    assert rep.refined.mape < rep.constant.mape / 2


def test_pairs_with_the_stressor_are_probes_never_targets() -> None:
    pairs = [PairMeasurement("a", STRESSOR, 0.5), PairMeasurement(STRESSOR, "a", 0.5), PairMeasurement("a", "b", 0.5)]
    assert training_pairs(pairs, STRESSOR) == [pairs[2]]
    prof = measured_profiles("g", {"a": 1.0, "b": 2.0, STRESSOR: 0.5}, pairs, STRESSOR)
    assert prof.jobs["a"].probe_tput == 0.5 and prof.jobs["a"].probe_partner_tput == 0.5
    assert prof.jobs["b"].probe_tput is None and prof.stressor_iter_time_s == 0.5


def test_a_job_without_a_probe_falls_back_to_its_iteration_time() -> None:
    data = world()
    model = fit_transfer([(data["slow"].profiles(STRESSOR), list(data["slow"].pairs))], STRESSOR)
    assert [sm.keys for sm in model.submodels] == [(PROBE, ITER), (ITER,)]
    bare = JobProfile(iter_time_s=0.3)
    sens, pres = model.traits(bare, 0.2)
    solo = model.submodels[-1]
    assert sens == pytest.approx(math.exp(solo.intercept / 2 + solo.sens_coef[0] * math.log(1.5)))
    assert pres == pytest.approx(math.exp(solo.intercept / 2 + solo.pres_coef[0] * math.log(1.5)))


def test_counters_present_for_every_job_give_a_richer_sub_model() -> None:
    data = world()["slow"]
    counters = {j: {"sm_activity_pct": 100.0 * (i + 1) / len(JOBS)} for i, j in enumerate(JOBS)}
    prof = measured_profiles("slow", data.iter_times_s, data.pairs, STRESSOR, counters)
    model = fit_transfer([(prof, list(data.pairs))], STRESSOR)
    assert model.submodels[0].keys == (PROBE, ITER, "sm_activity_pct")
    assert model.submodels[-1].keys == (ITER,)
    # A profile without the counter is still served, by the sub-model that does not need it.
    s, p = model.traits(JobProfile(0.3, 0.5, 0.5), 0.2)
    assert s > 0 and p > 0


def test_too_few_pairs_is_a_clear_error() -> None:
    data = world()["slow"]
    few = [p for p in data.pairs if p.workload in (STRESSOR, "job0")][:10]
    with pytest.raises(ValueError, match="too few measured pairs"):
        fit_transfer([(data.profiles(STRESSOR), few)], STRESSOR)


def test_residual_offsets_shrink_towards_zero_with_few_pairs() -> None:
    data = world(noise=0.0)["slow"]
    prof = data.profiles(STRESSOR)
    model = fit_transfer([(prof, list(data.pairs))], STRESSOR)
    # job0 is 30 % more sensitive in these pairs than the features say.
    bumped = [PairMeasurement(p.workload, p.partner,
                              1.0 / (1.0 + (1.0 / model.predict(prof, p.workload, p.partner) - 1.0)
                                     * (1.3 if p.workload == "job0" else 1.0)))
              for p in data.pairs]
    loose = residual_offsets(model, prof, bumped, shrink=0.01)
    tight = residual_offsets(model, prof, bumped, shrink=1e4)
    assert loose["job0"][0] == pytest.approx(math.log(1.3), abs=0.02)
    assert abs(loose["job1"][0]) < 0.02
    assert abs(tight["job0"][0]) < 0.01
    assert residual_offsets(model, prof, []) == {}


def test_roofline_splits_host_time_from_gpu_work() -> None:
    roof = fit_roofline({"slow": {"j": 0.1 + 0.4 / 1.0}, "fast": {"j": 0.1 + 0.4 / 4.0}}, {"slow": 1.0, "fast": 4.0})
    assert roof.host_s["j"] == pytest.approx(0.1) and roof.work["j"] == pytest.approx(0.4)
    assert roof.iter_time_s("j", 2.0) == pytest.approx(0.3)
    assert roof.busy_frac("j", 1.0) > roof.busy_frac("j", 4.0) > roof.busy_frac("j", 100.0)
    only_one = fit_roofline({"slow": {"k": 0.2}}, {"slow": 1.0})
    assert only_one.busy_frac("k", 3.0) == pytest.approx(1.0)


def test_synthesized_probes_relax_as_a_job_becomes_host_bound() -> None:
    roof = fit_roofline({"a": {"host-bound": 0.3, STRESSOR: 0.4}, "b": {"host-bound": 0.2, STRESSOR: 0.1}},
                        {"a": 1.0, "b": 4.0})
    src = TypeProfiles("a", STRESSOR, 0.4, {"host-bound": JobProfile(0.3, 0.5, 0.6),
                                            STRESSOR: JobProfile(0.4, 0.5, 0.5)})
    same = synthesize_profiles(src, "a2", 1.0, 1.0, roof)
    assert same.jobs["host-bound"].probe_tput == pytest.approx(0.5)
    faster = synthesize_profiles(src, "c", 1.0, 8.0, roof)
    assert faster.jobs["host-bound"].synthesized
    assert faster.jobs["host-bound"].probe_tput > 0.5 and faster.jobs["host-bound"].probe_partner_tput > 0.6
    assert faster.stressor_iter_time_s == pytest.approx(roof.iter_time_s(STRESSOR, 8.0))


@pytest.mark.parametrize("e", [0.0, 0.1, 0.3])
def test_pessimistic_factor_lowers_a_typical_pair_by_the_error(e: float) -> None:
    f = pessimistic_factor(e)
    assert 1.0 / (1.0 + f * f) == pytest.approx(0.5 * (1.0 - e))


def test_pair_errors() -> None:
    e = pair_errors([0.5, 0.6], [0.5, 0.4])
    assert e.n == 2 and e.mae == pytest.approx(0.1) and e.mape == pytest.approx(0.25)
    assert e.overestimate_p90 == pytest.approx(0.9 * (0.2 / 0.6))


def test_per_job_fit_handles_a_pair_at_its_solo_speed() -> None:
    cal = calibrate([PairMeasurement("a", "b", 1.0), PairMeasurement("b", "a", 0.4), PairMeasurement("a", "a", 0.5)])
    assert 0.0 < cal.predict("a", "b") < 1.0
