"""The co-location harness on a tiny config, on this machine's CPU (no GPU: method 'cpu'), through the
sampling controller: plan within the budget, run, samples stored — never as training data."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from executors.node.profiling.colocate import latency_stats
from executors.node.profiling.colocate import main as colocate_main
from executors.scheduler.profiling.local import LocalProfileExecutor
from executors.scheduler.profiling.sampling import ColocationSampler, samples_from_report
from executors.scheduler.profiling.settings import SamplingSettings
from executors.store import models as m
from executors.store import repo
from executors.store.db import Store
from executors.store.migrate import upgrade
from tests.executors.scheduler.profiling.helpers import add_gpu_types


def test_harness_on_cpu_writes_cpu_samples_that_never_train(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    store = Store(url)
    add_gpu_types(store, "t4")
    with store.session() as s:
        s.add(m.OnlineService(name="img", model_family="cnn", qps_min=20, qps_max=40, latency_slo_ms=100,
                              mem_bytes=2 * 10**9))
        s.add(m.OnlineService(name="chat", model_family="lm", qps_min=5, qps_max=10, latency_slo_ms=100,
                              mem_bytes=2 * 10**9))
    # point = 3 + 2 s, baseline = 10 s: the budget fits one run of two points
    settings = SamplingSettings(budget_gpu_s=20, window_s=3, setup_s=2, sm_pcts=(10, 90), size="tiny",
                                profile_dir=str(tmp_path / "runs"), poll_s=0.2)
    ex = LocalProfileExecutor()
    try:
        sampler = ColocationSampler(store, ex, settings, seed=2)
        summary = sampler.run(["t4"])
    finally:
        ex.close()
    assert summary.skipped_services == ["chat (lm)"]
    (planned,) = summary.plan.runs
    assert planned.sm_pcts == (10, 90) and planned.opens_job_type and planned.cost_s == 20
    assert summary.failed == {} and summary.samples == {"cpu": 2}
    with store.session() as s:
        rows = list(s.scalars(select(m.ColocationSample)))
        run = s.scalars(select(m.SamplingRun)).one()
        assert run.state == "done" and run.method == "cpu" and run.samples == 2 and run.used_gpu_s > 0
        rep = run.report
        assert repo.sample_count(s, "t4") == 0 and repo.sample_counts_by_method(s) == {("t4", "cpu"): 2}
        assert repo.samples_for(s, "t4") == []  # not a GPU type's training data
        for r in rows:
            assert (r.gpu_type, r.service_name, r.method, r.qps) == ("t4", "img", "cpu", 30.0)
            assert r.job_type == planned.job_type and r.sampling_run_id == run.id and "no GPU" in r.device
            assert 0 < r.offline_norm_tput < 3 and r.online_slowdown > 0 and r.online_slowdown_p99 > 0
            assert r.online_features["qps"] > 0 and r.offline_features["iter_time_s"] > 0
    assert rep["method"] == "cpu" and "both workloads on the CPU" in rep["method_note"]
    assert rep["solo_service"]["latency"]["requests"] > 0 and rep["solo_job"]["iterations"]["iterations"] > 0
    for p in rep["points"]:
        assert p["latency"]["requests"] > 0 and p["iterations"]["iterations"] > 0
        assert p["norm_tput"] == rep["solo_job"]["iterations"]["mean_s"] / p["iterations"]["mean_s"]
    # what was measured is re-derivable from the stored report
    again, why = samples_from_report(rep, run.id, "img", planned.job_type, 2e9)
    assert why is None and sorted(x.offline_norm_tput for x in again) == sorted(r.offline_norm_tput for r in rows)
    # the next plan knows these points were measured
    plan, _ = sampler.plan(["t4"], budget_s=20)
    assert all(r.job_type != planned.job_type for r in plan.runs)


def test_latency_stats_and_harness_input_errors(tmp_path, capsys) -> None:
    st = latency_stats([0.001 * k for k in range(1, 101)])
    assert st["requests"] == 100 and st["avg_ms"] == pytest.approx(50.5) and st["p99_ms"] == pytest.approx(99.01)
    assert latency_stats([])["avg_ms"] is None
    base = ["--run-dir", str(tmp_path), "--gpu-type", "t4", "--qps", "10", "--job", "cnn", "--size", "tiny"]
    assert colocate_main(base + ["--service", "lm"]) == 2
    assert "unknown workload 'lm'" in capsys.readouterr().err
    assert colocate_main(base + ["--service", "cnn", "--sm", "0,50"]) == 2
    assert "sm: percentages within 1..100" in capsys.readouterr().err
