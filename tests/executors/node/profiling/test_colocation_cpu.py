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
    # windows of 0.5 + 2 s; a run of k points takes 3 + 2k of them: the budget fits one run of two points (17.5 s)
    settings = SamplingSettings(budget_gpu_s=18, window_s=0.5, setup_s=2, sm_pcts=(10, 90), size="tiny",
                                profile_dir=str(tmp_path / "runs"), poll_s=0.2)
    ex = LocalProfileExecutor()
    try:
        sampler = ColocationSampler(store, ex, settings, seed=2)
        summary = sampler.run(["t4"])
    finally:
        ex.close()
    assert summary.skipped_services == ["chat (lm)"]
    (planned,) = summary.plan.runs
    assert planned.sm_pcts == (10, 90) and planned.opens_job_type and planned.cost_s == 17.5
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
    assert rep["format"] == "muxflow-colocation-report/2" and rep["complete"] and rep["repeat"] == 1  # sampling's plan
    assert rep["solo_service"]["latency"]["requests"] > 0 and rep["solo_job"]["iterations"]["iterations"] > 0
    assert rep["qps_selection"]["mode"] == "fixed" and rep["max_batch"] == 32
    for p in rep["points"]:
        assert p["latency"]["requests"] > 0 and p["iterations"]["iterations"] > 0
        assert p["repetitions_measured"] == 1 and len(p["stats"]["norm_tput"]["values"]) == 1
        # each repetition against the job's solo iteration time before and after its round
        ratios = [r["baseline"]["job_mean_s"] / r["iterations"]["mean_s"] for r in p["repetitions"]]
        assert p["norm_tput"] == pytest.approx(ratios[0])
    # what was measured is re-derivable from the stored report
    again, why = samples_from_report(rep, run.id, "img", planned.job_type, 2e9)
    assert why is None and sorted(x.offline_norm_tput for x in again) == sorted(r.offline_norm_tput for r in rows)
    # the next plan knows these points were measured
    plan, _ = sampler.plan(["t4"], budget_s=20)
    assert all(r.job_type != planned.job_type for r in plan.runs)


def _one_error_line(err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]


def test_latency_stats_and_harness_input_errors(tmp_path, capsys) -> None:
    st = latency_stats([0.001 * k for k in range(1, 101)])
    assert st["requests"] == 100 and st["avg_ms"] == pytest.approx(50.5) and st["p99_ms"] == pytest.approx(99.01)
    assert st["p50_ms"] == pytest.approx(50.5) and st["max_ms"] == pytest.approx(100.0)
    assert latency_stats([])["avg_ms"] is None
    base = ["--run-dir", str(tmp_path), "--qps", "10", "--job", "cnn", "--size", "tiny"]
    for args, words in [
        (["--gpu-type", "t4", "--service", "lm"], ["'lm'", "not an online service family"]),
        (["--gpu-type", "t4", "--service", "cnn", "--sm", "0,50"], ["sm: percentages within 1..100"]),
        (["--gpu-type", "t4", "--service", "cnn", "--repeat", "0"], ["repeat: must be >= 1"]),
        (["--gpu-type", "t4", "--service", "cnn", "--qps", "fast"], ["qps: a positive number or auto"]),
        (["--gpu-type", "t4", "--service", "cnn", "--auto-target", "0.6,0.3"], ["auto-target"]),
        # the GPU type: an unknown name, and auto on a machine without a GPU (the H200 run died on a KeyError)
        (["--gpu-type", "h900", "--service", "cnn"], ["unknown GPU type 'h900'"]),
        (["--gpu-type", "auto", "--service", "cnn"], ["gpu-type auto", "no GPU"]),
        (["--service", "cnn"], ["--gpu-type"]),
    ]:
        assert _exit_code(colocate_main, base + args) == 2, args
        _one_error_line(capsys.readouterr().err, *words)
    assert not list(tmp_path.iterdir())  # nothing started


def _exit_code(main, argv: list[str]) -> int:
    """A command's exit status, whether it returns it or (argparse) raises SystemExit."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


def test_samples_come_from_reports_of_both_formats() -> None:
    """The sampling controller reads /1 reports (stored runs) and /2 ones alike: a point's values, the solo runs'
    measured features."""
    from executors.node.profiling.colocate import build_report

    gpu = {"source": "measured", "gpu_util_pct": 50.0, "sm_activity_pct": 40.0, "sm_occupancy_pct": 20.0,
           "mem_used_bytes": 2e9, "mem_bw_util_pct": 10.0, "sm_clock_mhz": 1900.0, "samples": 10}
    v1 = {"format": "muxflow-colocation-report/1", "gpu_type": "h100", "method": "mps", "service_family": "cnn",
          "qps": 200.0, "device": "NVIDIA H100 (driver 1)",
          "solo_service": {"latency": {"avg_ms": 2.0, "achieved_qps": 199.0}, "metrics": gpu},
          "solo_job": {"iterations": {"mean_s": 0.1}, "metrics": gpu},
          "points": [{"sm_pct": 20, "norm_tput": 0.3, "slowdown_avg": 1.2, "slowdown_p99": 1.5}]}

    def svc(i: int, avg: float) -> dict:
        return {"index": i, "kind": "service_solo", "start_unix": i, "end_unix": i + 1, "metrics": gpu,
                "latency": {"avg_ms": avg, "p99_ms": 2 * avg, "achieved_qps": 199.0, "requests": 200}}

    def job(i: int) -> dict:
        return {"index": i, "kind": "job_solo", "start_unix": i, "end_unix": i + 1, "metrics": gpu,
                "iterations": {"mean_s": 0.1, "iterations": 10}}

    def colo(i: int, rep: int, mean_s: float, avg: float) -> dict:
        return {"index": i, "kind": "colocated", "sm_pct": 20, "rep": rep, "start_unix": i, "end_unix": i + 1,
                "iterations": {"mean_s": mean_s}, "latency": {"avg_ms": avg, "p99_ms": 3 * avg}}

    windows = [job(0), svc(1, 2.0), colo(2, 0, 0.4, 3.0), svc(3, 2.0), colo(4, 1, 0.25, 2.0), svc(5, 2.0), job(6)]
    v2 = build_report({k: v1[k] for k in ("gpu_type", "method", "service_family", "qps", "device")}, windows,
                      sm_pcts=[20], repeat=2)
    for rep, tput, slow in ((v1, 0.3, 1.2), (v2, (0.25 + 0.4) / 2, (1.5 + 1.0) / 2)):
        (s,), why = samples_from_report(rep, 7, "img", "ResNet-18 (batch size 64)", 2e9)
        assert why is None and s.offline_norm_tput == pytest.approx(tput) and s.online_slowdown == pytest.approx(slow)
        assert s.online_features["latency_ms"] == 2.0 and s.offline_features["iter_time_s"] == pytest.approx(0.1)
        assert s.method == "mps" and s.qps == 200.0 and s.device == "NVIDIA H100 (driver 1)"
