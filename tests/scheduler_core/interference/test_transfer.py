"""The transferable interference model on synthetic GPU types whose ground truth is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scheduler_core.interference.pairs import PairMeasurement, calibrate
from scheduler_core.interference.errors import TypeData, leave_one_type_out, model_interval, within_type
from scheduler_core.interference.transfer import (
    ITER,
    PROBE,
    Interval,
    JobProfile,
    TypeProfiles,
    coverage,
    fit_roofline,
    fit_transfer,
    interval_from,
    log_odds_of,
    measured_profiles,
    pair_errors,
    residual_offsets,
    synthesize_profiles,
    training_pairs,
)

STRESSOR = "stressor"
JOBS = [STRESSOR] + [f"job{i}" for i in range(24)]


def world(seed: int = 0, noise: float = 0.01,
          types: tuple[tuple[str, float, float | None, float], ...] = (("slow", 1.0, None, 0.0),
                                                                      ("fast", 4.0, None, 0.0))) -> dict[str, TypeData]:
    """GPU types (name, speed, noise or None for ``noise``, contention level); each job has fixed kernel
    traits (a, b) and a roofline (host time, GPU work).

    Truth: σ = a·u and π = b·u, u the job's GPU-busy fraction on the type, so a job's σ and π change
    between types by its own busy-fraction change: per-job values fitted on one type are wrong on
    the other, while the stressor probe sees the change. A type's level multiplies every σ·π on it
    by e^level (a GPU whose jobs contend more than the busy fractions say).
    """
    rng = np.random.default_rng(seed)
    a = dict(zip(JOBS, rng.uniform(0.6, 2.0, len(JOBS))))
    b = dict(zip(JOBS, rng.uniform(0.6, 2.0, len(JOBS))))
    host = dict(zip(JOBS, rng.uniform(0.0, 0.2, len(JOBS))))
    work = dict(zip(JOBS, rng.uniform(0.05, 0.5, len(JOBS))))
    host[STRESSOR] = 0.0
    out = {}
    for gtype, speed, type_noise, level in types:
        t = {j: host[j] + work[j] / speed for j in JOBS}
        u = {j: (work[j] / speed) / t[j] for j in JOBS}
        sd = noise if type_noise is None else type_noise
        pairs = []
        for x in JOBS:
            for y in JOBS:
                true = 1.0 / (1.0 + a[x] * u[x] * b[y] * u[y] * math.exp(level))
                pairs.append(PairMeasurement(x, y, true * math.exp(rng.normal(0.0, sd))))
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
    bare = TypeProfiles("slow", STRESSOR, 0.2, {"bare": JobProfile(iter_time_s=0.3)})
    sens, pres = model.traits(bare, "bare")
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
    s, p = model.traits(TypeProfiles("slow", STRESSOR, 0.2, {"j": JobProfile(0.3, 0.5, 0.5)}), "j")
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


def test_the_probe_anchor_finds_a_types_own_level_of_contention() -> None:
    """A GPU on which every pair contends e^0.5 more than elsewhere. Its probes carry the level twice
    (logit x(A|B) = logit x(A|R) + logit x(R|B) − logit x(R|R)), so the shared coefficients, fitted
    where the level never moved, count it twice; the type's own probes (pairs too, never targets)
    show the miss, and the anchor removes most of it."""
    data = world(types=(("slow", 1.0, None, 0.0), ("fast", 4.0, None, 0.0), ("hot", 2.0, None, 0.5)))
    model = fit_transfer([(data[g].profiles(STRESSOR), list(data[g].pairs)) for g in ("slow", "fast")], STRESSOR)
    raw = data["hot"].profiles(STRESSOR)
    anchored = model.anchor(raw)
    assert raw.log_odds_shift == 0.0 and anchored.log_odds_shift == pytest.approx(-0.5, abs=0.1)
    pairs = training_pairs(data["hot"].pairs, STRESSOR)
    true = [p.norm_tput for p in pairs]
    before = pair_errors([model.predict(raw, p.workload, p.partner) for p in pairs], true)
    after = pair_errors([model.predict(anchored, p.workload, p.partner) for p in pairs], true)
    assert after.mae < 0.6 * before.mae, (before, after)
    # Synthesized probes measure nothing: no anchor from them.
    synth = TypeProfiles("x", STRESSOR, raw.stressor_iter_time_s,
                         {j: JobProfile(p.iter_time_s, p.probe_tput, p.probe_partner_tput, {}, True)
                          for j, p in raw.jobs.items()})
    assert model.probe_residuals(synth) == [] and model.anchor(synth).log_odds_shift == 0.0
    assert model.probe_scale(synth) is None


def test_a_noisy_type_weighs_less_and_barely_moves_the_clean_ones(monkeypatch) -> None:
    """A type measured with 30 % noise joins a clean one. Weighed by its noise it counts for a few
    per cent of the fit, and the clean types' held-out error stays a fraction of what an equal-weight
    fit makes of it (its noisy probes still bend the slopes a little: errors in the features)."""
    data = world(types=(("slow", 1.0, None, 0.0), ("fast", 4.0, None, 0.0), ("noisy", 2.0, 0.3, 0.0)))
    pairs = training_pairs(data["fast"].pairs, STRESSOR)
    true = [p.norm_tput for p in pairs]

    def error_on_fast(types: tuple[str, ...]) -> tuple[float, dict[str, float]]:
        model = fit_transfer([(data[g].profiles(STRESSOR), list(data[g].pairs)) for g in types], STRESSOR)
        prof = model.anchor(data["fast"].profiles(STRESSOR))
        return pair_errors([model.predict(prof, p.workload, p.partner) for p in pairs], true).mape, model.type_weights

    alone, _ = error_on_fast(("slow",))
    weighed, weights = error_on_fast(("slow", "noisy"))
    assert weights["noisy"] < 0.1 * weights["slow"]
    monkeypatch.setattr("scheduler_core.interference.transfer.NOISE_PASSES", 0)
    equal, weights = error_on_fast(("slow", "noisy"))
    assert weights == {"slow": pytest.approx(1.0), "noisy": pytest.approx(1.0)}
    assert alone < 0.02 and weighed < 0.05 and weighed < 0.25 * equal, (alone, weighed, equal)


def test_intervals_weigh_each_held_out_type_the_same() -> None:
    many, few = [0.0] * 1000, [1.0] * 10
    iv = interval_from({"many": (many, 1.0), "few": (few, 1.0)})
    assert iv.n == 1010 and iv.types == ("few", "many")
    # Half the weight on each type: the 10th percentile lies in the big type, the 90th in the small one.
    assert iv.lo == pytest.approx(0.0) and iv.hi == pytest.approx(1.0)
    scaled = interval_from({"a": ([-2.0, 2.0] * 50, 2.0)})
    assert (scaled.lo, scaled.hi, scaled.ref_scale) == (pytest.approx(-1.0), pytest.approx(1.0), 2.0)
    assert scaled.width(4.0) == (pytest.approx(-4.0), pytest.approx(4.0))
    assert interval_from({"a": ([], 1.0)}) is None


def test_interval_bounds_factors_and_coverage() -> None:
    iv = Interval(0.8, -0.5, 0.5, 100)
    lo, hi = iv.bounds(0.0)
    assert lo == pytest.approx(1.0 / (1.0 + math.exp(0.5))) and hi == pytest.approx(1.0 / (1.0 + math.exp(-0.5)))
    # The pessimistic factor on both σ and π moves a pair to the interval's low end, the optimistic to its top.
    assert 1.0 / (1.0 + iv.factor("pessimistic") ** 2) == pytest.approx(lo)
    assert 1.0 / (1.0 + iv.factor("optimistic") ** 2) == pytest.approx(hi)
    preds = [0.0] * 4
    assert coverage(iv, preds, [0.5, lo + 1e-9, hi + 1e-3, 0.1]) == pytest.approx(0.5)
    assert math.isnan(coverage(None, preds, [0.5] * 4))
    assert log_odds_of(0.5) == 0.0 and log_odds_of(1.2) == log_odds_of(0.99)


def test_leave_one_type_out_over_every_subset_with_honest_coverage() -> None:
    data = world(types=(("slow", 1.0, None, 0.0), ("fast", 4.0, None, 0.0), ("mid", 2.0, 0.05, 0.0)))
    reports = leave_one_type_out(data, STRESSOR, subsets=True)
    assert sorted((r.train, r.test) for r in reports) == sorted(
        [(("fast",), "mid"), (("slow",), "mid"), (("fast", "slow"), "mid"),
         (("mid",), "fast"), (("slow",), "fast"), (("mid", "slow"), "fast"),
         (("fast",), "slow"), (("mid",), "slow"), (("fast", "mid"), "slow")])
    main = {r.test: r for r in leave_one_type_out(data, STRESSOR)}
    for r in reports:
        assert 0.0 <= r.after_coverage <= 1.0 and r.after.n > 100
        if len(r.train) == 2:
            assert r == main[r.test]
    # The fitted model's interval rests on every type's held-out pairs.
    iv = model_interval(data, STRESSOR)["after"]
    assert iv.types == ("fast", "mid", "slow") and iv.lo < 0.0 < iv.hi
    # With one type there is nothing to hold out: no interval, coverage unknown.
    one = {"slow": data["slow"]}
    assert model_interval(one, STRESSOR) == {"after": None, "zero_shot": None}


def test_pair_errors() -> None:
    e = pair_errors([0.5, 0.6], [0.5, 0.4])
    assert e.n == 2 and e.mae == pytest.approx(0.1) and e.mape == pytest.approx(0.25)
    assert e.overestimate_p90 == pytest.approx(0.9 * (0.2 / 0.6))


def test_per_job_fit_handles_a_pair_at_its_solo_speed() -> None:
    cal = calibrate([PairMeasurement("a", "b", 1.0), PairMeasurement("b", "a", 0.4), PairMeasurement("a", "a", 0.5)])
    assert 0.0 < cal.predict("a", "b") < 1.0
