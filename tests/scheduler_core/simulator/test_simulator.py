"""Simulator invariants, determinism, golden result, trace shaping and metrics."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from executors.data.calibration import default_catalog
from scheduler_core.rng import rng_stream
from scheduler_core.simulator import POLICIES, SimConfig, get_policy, run_simulation
from scheduler_core.simulator.metrics import (compare_table, mixture_p99, mixture_p99_rows, service_metrics,
                                              slo_metrics)
from scheduler_core.simulator.workload import build_jobs, scale_durations
from scheduler_core.trace import TraceError
from tests.scheduler_core.simulator.conftest import trace_job

GOLDEN = Path(__file__).with_name("golden_pb_time_sharing_small.json")
GOLDEN_MUXFLOW = Path(__file__).with_name("golden_muxflow_stub_small.json")
SMALL = dict(gpus=24, hours=3.0, jobs=90, arrival_hours=2.0, mean_job_hours=0.5, seed=3)


@pytest.fixture(scope="module")
def all_results(inputs, sample_trace):
    cfg = SimConfig(**SMALL)
    return {name: run_simulation(sample_trace, inputs, cfg, p) for name, p in POLICIES.items()}


@pytest.mark.parametrize("name", list(POLICIES))
def test_invariants_hold_for_every_policy(all_results, name) -> None:
    res = all_results[name]
    inv = res.invariants
    assert inv["max_active_jobs_per_gpu"] <= 1
    if name != "salus":
        assert inv["max_offline_jobs_per_gpu"] <= 1
    assert inv["sm_pct_out_of_bounds"] == 0
    assert inv["refused_actions"] == 0
    assert inv["all_accounted"] and sum(inv["accounted"].values()) == inv["jobs"] == SMALL["jobs"]
    on = res.metrics["online"]
    # No policy makes the online service faster than running alone.
    assert on["avg_latency_norm"] >= 1.0 and on["p99_latency_norm"] >= 1.0
    off = res.metrics["offline"]
    assert 0.0 <= off["oversold_gpu"] <= 1.0
    assert off["finished"] + off["unfinished"] == off["arrived"]
    if name in ("time-sharing", "pb-time-sharing", "salus", "online-only"):
        assert off["evictions"] == 0  # no SysMonitor behind the baselines
    cl = res.metrics["cluster"]
    if name != "online-only":
        assert cl["gpu_util_pct"] > cl["online_only_gpu_util_pct"]
        assert off["finished"] > 0


def test_online_only_is_the_latency_reference(all_results) -> None:
    m = all_results["online-only"].metrics
    assert m["online"]["avg_latency_norm"] == 1.0 and m["online"]["p99_latency_norm"] == 1.0
    assert m["offline"]["executions"] == 0
    assert m["cluster"]["gpu_util_pct"] == m["cluster"]["online_only_gpu_util_pct"]


def test_time_sharing_slows_online_work_more_than_priority_and_space_sharing(all_results) -> None:
    lat = {n: r.metrics["online"]["avg_latency_norm"] for n, r in all_results.items()}
    assert lat["time-sharing"] > lat["muxflow"] > 1.0
    assert lat["time-sharing"] > lat["pb-time-sharing"] > 1.0


def test_the_online_load_does_not_depend_on_the_policy(all_results) -> None:
    ref = {r.metrics["online"]["online_only_avg_latency_ms"] for r in all_results.values()}
    assert len(ref) == 1


def test_same_seed_same_metrics_other_seed_other_metrics(inputs, sample_trace) -> None:
    cfg = SimConfig(**SMALL)
    a = run_simulation(sample_trace, inputs, cfg, get_policy("muxflow")).metrics
    b = run_simulation(sample_trace, inputs, cfg, get_policy("muxflow")).metrics
    c = run_simulation(sample_trace, inputs, SimConfig(**{**SMALL, "seed": 4}), get_policy("muxflow")).metrics
    for m in (a, b, c):
        m.pop("timing")
        m["rounds"].pop("plan_s_mean")
        m["rounds"].pop("plan_s_max")
    assert a == b
    assert a != c


def _golden(metrics: dict, path: Path) -> None:
    metrics.pop("timing")
    rounds = metrics.get("rounds", {})
    for k in [k for k, v in rounds.items() if k.startswith("plan_s_") and v is not None]:  # wall-clock seconds
        rounds.pop(k)
    got = json.loads(json.dumps(metrics))
    if not path.exists():  # pragma: no cover - written once, reviewed, committed
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
        pytest.fail(f"golden file {path.name} was missing and has been written; review and commit it")
    assert got == json.loads(path.read_text())


def test_golden_result_of_a_small_trace(inputs, sample_trace) -> None:
    """PB-time-sharing needs no trained model, so its metrics are exact on every machine."""
    _golden(run_simulation(sample_trace, inputs, SimConfig(**SMALL), get_policy("pb-time-sharing")).metrics, GOLDEN)


class StubPredictor:
    """A closed-form stand-in for the trained MLP, so MuxFlow's plans are the same on every machine.

    Throughput grows with the offline share and shrinks with the online service's SM activity;
    the online slowdown grows with the share and with both sides' SM activity (feature columns
    of :data:`scheduler_core.prediction.features.FEATURE_NAMES`: 1 on_sm_activity_pct, 9 off_sm_activity_pct,
    15 the offline job's MPS share). Values are rounded to 1e-6 so that last-bit differences
    between BLAS builds cannot change a plan.
    """

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        on_sm, off_sm, share = x[:, 1] / 100.0, x[:, 9] / 100.0, x[:, 15] / 100.0
        tput = np.clip(share * (1.0 - 0.5 * on_sm) * (0.7 + 0.3 * off_sm), 0.0, 1.0)
        slowdown = 1.0 + 0.25 * share * (on_sm + off_sm)
        return np.round(tput, 6), np.round(slowdown, 6)


def test_golden_muxflow_with_a_stub_predictor(inputs, sample_trace) -> None:
    """MuxFlow end to end (forecast, dynamic share, matching, SysMonitor, evictions) on a small trace, with
    the trained predictor replaced by a closed form: its metrics are exact, so any change in MuxFlow's
    planning or in the simulated cluster shows up here."""
    stub = replace(inputs, predictors={t: StubPredictor() for t in inputs.predictors})
    res = run_simulation(sample_trace, stub, SimConfig(**SMALL), get_policy("muxflow"))
    assert res.metrics["offline"]["executions"] > 0  # the stub lets MuxFlow place jobs
    _golden(res.metrics, GOLDEN_MUXFLOW)


def test_scale_factor_split_repetition_and_compression() -> None:
    catalog = default_catalog()
    trace = [trace_job(1, 800, 0.0, scale=4), trace_job(2, 300, 5000.0), trace_job(3, 100, 10000.0)]
    cfg = SimConfig(gpus=1, jobs=18, arrival_hours=2.0, mean_job_hours=1.0, max_job_hours=8.0)
    jobs = build_jobs(trace, catalog, cfg, rng_stream(0, "trace-repeat"))
    assert jobs.size == 18 and sorted(np.bincount(jobs.copy).tolist()) == [6, 6, 6]  # 6 workers per copy
    cut = build_jobs(trace, catalog, SimConfig(gpus=1, jobs=14, arrival_hours=2.0), rng_stream(0, "trace-repeat"))
    assert cut.size == 14 and 3 not in cut.trace_line.tolist()  # the latest arrivals are cut
    first = (jobs.copy == 0)
    assert sorted(jobs.worker[first & (jobs.trace_line == 1)].tolist()) == [0, 1, 2, 3]
    # The four workers of line 1 share its steps; relative sizes survive the scaling.
    w = jobs.total_steps[first & (jobs.trace_line == 1)]
    assert np.allclose(w, w[0]) and w[0] == pytest.approx(2 * jobs.total_steps[first & (jobs.trace_line == 3)][0])
    assert jobs.arrival_s.min() == 0.0 and jobs.arrival_s.max() == pytest.approx(2 * 3600.0)
    assert np.all(np.diff(jobs.arrival_s) >= 0)
    solo = jobs.total_steps / np.array([catalog.offline[jobs.types[t]].solo_steps_per_s_p100 for t in jobs.job_type])
    assert solo.max() <= 8 * 3600.0 + 1e-6


def test_durations_are_scaled_so_that_their_mean_after_the_clips_is_the_one_asked_for() -> None:
    """A heavy-tailed trace (most jobs short, a few very long): scaling the mean first and clipping after puts
    the short ones on the floor and the long ones on the cap, and the mean falls short of the target."""
    solo = np.random.default_rng(5).lognormal(mean=0.0, sigma=2.5, size=5000)
    naive = np.clip(solo * (3600.0 / solo.mean()), 60.0, 8 * 3600.0)
    assert naive.mean() < 0.8 * 3600.0  # what the one-factor-then-clip scaling gave
    out = scale_durations(solo, 3600.0, 60.0, 8 * 3600.0)
    assert out.mean() == pytest.approx(3600.0, rel=1e-9)
    assert out.min() >= 60.0 and out.max() <= 8 * 3600.0
    inside = (out > 60.0) & (out < 8 * 3600.0)
    ratio = out[inside] / solo[inside]
    assert inside.sum() > 3000 and np.allclose(ratio, ratio[0])  # one factor between the clips
    assert np.all(np.diff(out[np.argsort(solo, kind="stable")]) >= 0)  # order kept
    # A mean at or beyond a clip puts every job there; a uniform trace is plain scaling.
    assert np.all(scale_durations(solo, 30.0, 60.0, 600.0) == 60.0)
    assert np.all(scale_durations(solo, 600.0, 60.0, 600.0) == 600.0)
    assert np.allclose(scale_durations(np.array([1.0, 2.0, 3.0]), 200.0, 60.0, 1000.0), [100.0, 200.0, 300.0])
    for bad in (np.array([]), np.array([1.0, np.nan]), np.array([-1.0, 2.0]), np.zeros(3)):
        with pytest.raises(ValueError):
            scale_durations(bad, 100.0, 60.0, 600.0)


def test_an_unknown_job_type_names_its_trace_line() -> None:
    with pytest.raises(TraceError, match="trace line 2: job type 'NoSuchNet"):
        build_jobs([trace_job(1, 10), trace_job(2, 10, job_type="NoSuchNet (batch size 1)")], default_catalog(),
                   SimConfig(gpus=1), rng_stream(0, "x"))


def test_mixture_p99_of_one_exponential_is_its_closed_form() -> None:
    assert mixture_p99(np.array([10.0]), np.array([1.0])) == pytest.approx(10.0 * math.log(100.0), rel=1e-9)
    # Weights matter: a rarely hit slow minute moves the p99 less than a common one.
    rare = mixture_p99(np.array([10.0, 100.0]), np.array([99.0, 1.0]))
    common = mixture_p99(np.array([10.0, 100.0]), np.array([1.0, 99.0]))
    assert 10.0 * math.log(100.0) < rare < common < 100.0 * math.log(100.0)


def test_mixture_p99_of_many_rows_is_each_row_alone() -> None:
    rng = np.random.default_rng(0)
    mean, w = rng.uniform(1.0, 200.0, (6, 9)), rng.uniform(0.0, 50.0, (6, 9))
    w[2] = 0.0  # a minute without requests has no p99
    got = mixture_p99_rows(mean, w)
    assert np.isnan(got[2])
    for r in (0, 1, 3, 4, 5):
        assert got[r] == pytest.approx(mixture_p99(mean[r], w[r]), rel=1e-9)


def test_slo_violations_are_counted_per_service_minute_against_the_replicas_alone() -> None:
    class _Fleet:
        service_index = np.array([0, 1, 0, 1])

    from scheduler_core.simulator import ServiceSpec

    cfg = SimConfig(gpus=4, services=(ServiceSpec("a", "cnn", 20.0, 100.0, 1.0, slo_p99_ms=50.0),
                                      ServiceSpec("b", "transformer", 20.0, 100.0, 1.0)))  # b declares no SLO
    ln100 = math.log(100.0)
    solo = np.full((3, 4), 9.0 / ln100 * 5.0, dtype=np.float32)  # p99 45 ms alone everywhere
    lat = solo.copy()
    lat[1, 0] = lat[1, 2] = 12.0  # minute 1: both replicas of "a" at p99 ≈ 55 ms
    lat[2, 0] = 12.0  # minute 2: one of two replicas slower, the service p99 over both above 50 ms too
    lat[:, 1] = 1000.0  # "b" is slow, but has no SLO
    qps = np.ones((3, 4), dtype=np.float32)
    got = slo_metrics(cfg, _Fleet(), lat, solo, qps)
    assert got["services_with_slo"] == 1 and got["service_minutes"] == 3
    assert got["violations"] == 2 and got["online_only_violations"] == 0
    assert got["per_service"]["a"]["replica_minute_violation_frac"] == pytest.approx(3 / 6)
    assert slo_metrics(SimConfig(gpus=4, services=(ServiceSpec("a", "cnn", 20.0, 100.0, 1.0),)), _Fleet(),
                       lat, solo, qps) == {"services_with_slo": 0}


def test_each_service_is_judged_over_all_its_requests_each_minute_and_against_its_slo() -> None:
    class _Fleet:
        service_index = np.array([0, 0, 1, 1])

    from scheduler_core.simulator import ServiceSpec

    cfg = SimConfig(gpus=4, services=(ServiceSpec("a", "cnn", 20.0, 100.0, 1.0, slo_p99_ms=100.0),
                                      ServiceSpec("b", "transformer", 20.0, 100.0, 1.0)))
    solo = np.full((4, 4), 10.0, dtype=np.float32)
    lat = solo.copy()
    qps = np.ones((4, 4), dtype=np.float32)
    qps[0, :2] = 3.0  # minute 0 carries 3× the requests of "a"
    lat[0, 0] = 13.0  # minute 0: one replica of "a" 30 % slower, its requests 3 of "a"'s 6 that minute: +15 %
    lat[1, 0] = lat[1, 1] = 14.0  # minute 1: all of "a" +40 %, over the 30 % cap
    lat[:, 3] = 11.0  # "b": one replica +10 % all day
    qps[3, 2] = 0.0  # minute 3 of "b": only its slow replica has requests
    got = {s["name"]: s for s in service_metrics(cfg, _Fleet(), lat, solo, qps)}
    a, b = got["a"], got["b"]
    # All of a's requests: minute 0 weighs 6 requests, minutes 1–3 two each (12 in all), each by its latency.
    assert a["all_avg_norm"] == pytest.approx((3 * 13 + 3 * 10 + 14 + 14 + 20 + 20) / (6 * 10 + 6 * 10), abs=1e-4)
    assert a["shared_minutes_frac"] == pytest.approx(3 / 8)
    assert a["worst_minute_norm"] == pytest.approx(1.4) and a["minutes_over_cap"] == 1 and a["cap"] == 0.3
    # SLO 100 ms: alone, p99 = 10 ln 100 ≈ 46 ms; at +40 % ≈ 64 ms: every minute within.
    assert a["slo_attainment"] == 1.0 and a["service_minutes"] == 4
    assert b["slo_attainment"] is None and b["slo_p99_ms"] is None
    assert b["all_avg_norm"] == pytest.approx((3 * (10 + 11) + 11) / (3 * 20 + 10), abs=1e-4)  # minute 3: one replica
    assert b["worst_minute_norm"] == pytest.approx(1.1) and b["minutes_over_cap"] == 0
    assert b["shared_avg_norm"] == pytest.approx(1.1)
    tight = SimConfig(gpus=4, services=(ServiceSpec("a", "cnn", 20.0, 100.0, 1.0, slo_p99_ms=50.0),
                                        ServiceSpec("b", "transformer", 20.0, 100.0, 1.0)))
    # SLO 50 ms: minutes 0 (one replica at 13 ms of mean) and 1 (14 ms) are over it, minutes 2 and 3 are not.
    a_tight = service_metrics(tight, _Fleet(), lat, solo, qps)[0]
    assert a_tight["slo_attainment"] == pytest.approx(0.5) and a_tight["slo_attainment_alone"] == 1.0
    assert a_tight["slo_kept_where_alone_keeps"] == pytest.approx(0.5)
    # SLO 40 ms: alone (≈ 46 ms) the service misses it every minute; sharing cannot be blamed for any.
    missed = SimConfig(gpus=4, services=(ServiceSpec("a", "cnn", 20.0, 100.0, 1.0, slo_p99_ms=40.0),
                                         ServiceSpec("b", "transformer", 20.0, 100.0, 1.0)))
    a_missed = service_metrics(missed, _Fleet(), lat, solo, qps)[0]
    assert a_missed["slo_attainment"] == a_missed["slo_attainment_alone"] == 0.0
    assert a_missed["slo_kept_where_alone_keeps"] is None


def test_comparison_is_normalized_to_muxflow_and_online_only(all_results) -> None:
    rows = {r["policy"]: r for r in compare_table({n: r.metrics for n, r in all_results.items()})}
    assert rows["muxflow"]["jct_vs_muxflow"] == 1.0 and rows["muxflow"]["oversold_vs_muxflow"] == 1.0
    assert "jct_vs_muxflow" not in rows["online-only"]
    assert rows["online-only"]["avg_latency_vs_online_only"] == 1.0


def test_services_get_slos_only_when_declared_or_scaled() -> None:
    from scheduler_core.gpu_specs import get_spec
    from scheduler_core.online.load import peak_slo_ms
    from scheduler_core.simulator import ServiceSpec
    from scheduler_core.workloads import ONLINE_FAMILIES

    assert SimConfig().service_slos_ms() == (None, None, None)  # the paper's flat allowance
    own = ServiceSpec("own", "cnn", 20.0, 100.0, 1.0, slo_p99_ms=77.0)
    other = ServiceSpec("other", "recommender", 20.0, 190.0, 1.0)
    cfg = SimConfig(gpus=4, gpu_types=(("t4", 2), ("a10", 2)), services=(own, other), slo_scale=1.5)
    got = cfg.service_slos_ms()
    rec = ONLINE_FAMILIES["recommender"]
    assert got[0] == 77.0 and got[1] == peak_slo_ms(rec, [get_spec("t4"), get_spec("a10")], 190.0, 1.5)
    # 1.5 × the p99 alone at the peak on the slower type (T4 here), rounded up to 10 ms
    assert got[1] == math.ceil(1.5 * peak_slo_ms(rec, [get_spec("t4")], 190.0, 1.0, step_ms=1e-9) / 10.0) * 10.0
    assert peak_slo_ms(rec, [get_spec("t4")], 190.0, 2.0) > peak_slo_ms(rec, [get_spec("t4")], 190.0, 1.0)
    with pytest.raises(ValueError, match="slo_scale"):
        SimConfig(slo_scale=0.0)
    with pytest.raises(ValueError, match="slo_p99_ms"):
        ServiceSpec("bad", "cnn", 20.0, 100.0, 1.0, slo_p99_ms=-1.0)


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="add up"):
        SimConfig(gpus=10, gpu_types=(("t4", 4),))
    with pytest.raises(ValueError, match="unknown GPU type"):
        SimConfig(gpus=4, gpu_types=(("v100x", 4),))
    with pytest.raises(ValueError, match="unknown policy"):
        get_policy("fifo")
    assert asdict(SimConfig())["gpus"] == 1000


class SmallJobsStub(StubPredictor):
    """Jobs that reach full speed at 40 % of the SMs: two per GPU pay where the share allows."""

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tput, slowdown = super().predict(x)
        return np.round(np.clip(2.5 * tput, 0.0, 1.0), 6), slowdown


@pytest.mark.parametrize("stub, split", [(SmallJobsStub(), True), (StubPredictor(), False)])
def test_several_jobs_per_gpu_where_they_pay_within_the_gpu(inputs, sample_trace, stub, split) -> None:
    cfg = SimConfig(**{**SMALL, "gpus": 6, "max_jobs_per_gpu": 2})  # 90 jobs on 6 GPUs: overloaded
    res = run_simulation(sample_trace, replace(inputs, predictors={t: stub for t in inputs.predictors}), cfg,
                         get_policy("muxflow"))
    inv = res.invariants
    assert inv["allowed_offline_jobs_per_gpu"] == inv["allowed_active_jobs_per_gpu"] == 2
    # Where splitting pays, GPUs run two jobs at once; with throughput linear in the share (two half shares
    # times the co-runner factor make less than one whole), the round never splits.
    assert inv["max_offline_jobs_per_gpu"] == inv["max_active_jobs_per_gpu"] == (2 if split else 1)
    assert inv["gpus_over_100_pct_shares"] == 0 and inv["refused_actions"] == 0 and inv["sm_pct_out_of_bounds"] == 0
    assert inv["all_accounted"] and res.metrics["offline"]["finished"] > 0
    from pipelines.cli.simulate import _violations

    assert _violations(res) == []
