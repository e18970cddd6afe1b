"""From a probe report to a profile or to the reason profiling failed (hand-built reports)."""

from __future__ import annotations

import pytest

from executors.scheduler.profiling.outcome import classify

METRICS = {"source": "simulated", "gpu_util_pct": 90.0, "sm_activity_pct": 60.0, "sm_occupancy_pct": 30.0,
           "mem_used_bytes": 2e9, "mem_total_bytes": 16e9, "mem_bw_util_pct": 40.0, "sm_clock_mhz": 1500.0}


def it_report(n=10, final=True, mean=0.02):
    return {"iterations": n, "total_iterations": n + 2, "final": final, "mean_s": mean, "p50_s": mean,
            "p95_s": 1.5 * mean, "stopped_by": "iterations" if final else None}


def probe(**over):
    base = {"exit_code": 0, "killed_at_deadline": False, "terminated": False, "elapsed_s": 12.0,
            "iteration_report": it_report(), "metrics": METRICS, "metrics_source": "simulated",
            "model_iter_time_s": 0.12, "device": "cpu (x86_64; no GPU)", "stderr_tail": ""}
    base.update(over)
    return base


def test_a_good_run_on_a_node_without_gpu_gives_the_models_features_and_the_measured_times() -> None:
    out = classify(probe(), bound_s=600)
    assert out.ok and out.source == "simulated" and out.method == "simulated-metrics"
    assert out.features.iter_time_s == 0.12  # the simulated GPU's, not the CPU's 0.02
    assert out.measured["measured_iter_time_s"] == 0.02 and out.measured["iterations"] == 10
    assert out.measured["iter_time_p95_s"] == pytest.approx(0.03) and out.measured["profiling_s"] == 12.0
    assert "simulated GPU metrics" in out.reason


def test_a_good_run_on_a_gpu_is_measured_throughout() -> None:
    out = classify(probe(metrics={**METRICS, "source": "measured"}, metrics_source="measured",
                         model_iter_time_s=None, device="NVIDIA H100 (driver 560)"), bound_s=600)
    assert out.ok and out.source == "measured" and out.method == "nvml"
    assert out.features.iter_time_s == 0.02 and out.measured["device"] == "NVIDIA H100 (driver 560)"


@pytest.mark.parametrize("over,reason", [
    (dict(exit_code=3, iteration_report=None, stderr_tail="Traceback\nValueError: boom\n"),
     "crashed (exit code 3) after 0 iteration(s): ValueError: boom"),
    (dict(exit_code=-9, iteration_report=it_report(4, final=False)), "crashed (killed by signal 9) after 6"),
    (dict(killed_at_deadline=True, exit_code=-15, iteration_report=None, elapsed_s=571.0),
     "reported no iterations within 571 s"),
    (dict(killed_at_deadline=True, exit_code=-9, iteration_report=it_report(3, final=False)),
     "exceeded the profiling bound: still running after 12 s with 5 iteration(s)"),
    (dict(iteration_report=None), "reported no iterations: the job exited 0 without a profiling report"),
    (dict(iteration_report=it_report(0)), "reported no iterations"),
    (dict(terminated=True, exit_code=0), "stopped by Slurm"),
    (dict(metrics=None, metrics_error="metrics=nvml but NVML is unusable here"), "no GPU metrics for the window: "
                                                                                  "metrics=nvml"),
    (dict(start_error="cannot start job.sh: Permission denied"), "could not start the job: cannot start job.sh"),
])
def test_failures_get_a_reason(over, reason) -> None:
    out = classify(probe(**over), bound_s=600)
    assert not out.ok and out.features is None
    assert reason in out.reason


def test_a_run_without_a_report_says_how_the_job_ended() -> None:
    assert "exceeded the profiling bound of 600 s (Slurm time limit)" in classify(None, bound_s=600,
                                                                                 slurm_state="TIMEOUT").reason
    out = classify(None, bound_s=600, slurm_state="FAILED", slurm_exit=126, log_tail="/x/python: Permission denied")
    assert out.reason == ("the profiling job ended FAILED (exit code 126) without a report: /x/python: "
                          "Permission denied")
