"""From a profiling run's probe report to the job's solo profile, or to why profiling failed.

The profile holds the solo features of `scheduler_core/prediction/features.py`. Where the GPU metrics are
real (NVML) every feature is measured, the iteration time included. Where they
come from the simulated model (a node without a GPU), the features are the
model's — *including its iteration time*, because the predictor's features
describe a GPU run — and what the run really measured (iterations, mean/p50/p95
iteration time on the node's device) is kept next to them; the profile is then
``source='simulated'``, ``method='simulated-metrics'``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from scheduler_core.domain import OfflineFeatures


@dataclass(frozen=True)
class ProfileOutcome:
    ok: bool
    reason: str                              # why it failed, or a one-line summary when ok
    features: OfflineFeatures | None = None
    source: str = "simulated"                # job_profiles.source
    method: str = "simulated-metrics"        # job_profiles.method
    measured: dict[str, Any] = field(default_factory=dict)  # job_profiles measurement columns


def _last_line(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _iterations(rep: dict[str, Any] | None) -> int:
    it = (rep or {}).get("iteration_report") or {}
    n = it.get("total_iterations") or it.get("iterations") or 0
    return int(n) if isinstance(n, int | float) else 0


def classify(probe: dict[str, Any] | None, *, bound_s: float, slurm_state: str | None = None,
             slurm_exit: int | None = None, device: str | None = None, log_tail: str = "") -> ProfileOutcome:
    """Decide a finished run. ``probe`` is the probe report (None if the run left none; ``log_tail``
    is then the last line of the job's log)."""
    if probe is None:
        if slurm_state == "TIMEOUT":
            return ProfileOutcome(False, f"exceeded the profiling bound of {bound_s:.0f} s (Slurm time limit)")
        what = f"ended {slurm_state}" if slurm_state else "ended"
        code = f" (exit code {slurm_exit})" if slurm_exit not in (None, 0) else ""
        return ProfileOutcome(False, f"the profiling job {what}{code} without a report"
                              + (f": {log_tail}" if log_tail else ""))
    if probe.get("start_error"):
        return ProfileOutcome(False, f"could not start the job: {probe['start_error']}")
    it = probe.get("iteration_report") or {}
    n = _iterations(probe)
    rc = probe.get("exit_code")
    elapsed = float(probe.get("elapsed_s") or 0.0)
    if probe.get("killed_at_deadline"):
        if n == 0:
            return ProfileOutcome(False, f"reported no iterations within {elapsed:.0f} s (stopped at the "
                                         f"profiling deadline; bound {bound_s:.0f} s)")
        return ProfileOutcome(False, f"exceeded the profiling bound: still running after {elapsed:.0f} s with "
                                     f"{n} iteration(s) reported (bound {bound_s:.0f} s)")
    if probe.get("terminated"):
        return ProfileOutcome(False, f"stopped by Slurm (time limit or cancel) after {elapsed:.0f} s and "
                                     f"{n} iteration(s)")
    if rc != 0:
        how = f"exit code {rc}" if isinstance(rc, int) and rc >= 0 else f"killed by signal {-rc}" if isinstance(
            rc, int) else "no exit status"
        tail = _last_line(probe.get("stderr_tail"))
        return ProfileOutcome(False, f"crashed ({how}) after {n} iteration(s)" + (f": {tail}" if tail else ""))
    if n == 0 or not it.get("iterations") or not it.get("final") or not it.get("mean_s"):
        return ProfileOutcome(False, "reported no iterations: the job exited 0 without a profiling report "
                                     "(does it use executors.job.runtime.Runtime?)")
    if probe.get("metrics_error") or not probe.get("metrics"):
        return ProfileOutcome(False, f"no GPU metrics for the window: {probe.get('metrics_error') or 'none taken'}")
    return features_from(probe, device)


def features_from(probe: dict[str, Any], device: str | None = None) -> ProfileOutcome:
    it = probe["iteration_report"]
    mt = probe["metrics"]
    measured_gpu = probe.get("metrics_source") == "measured"
    iter_time = float(it["mean_s"]) if measured_gpu else float(probe.get("model_iter_time_s") or math.nan)
    if not (math.isfinite(iter_time) and iter_time > 0):
        return ProfileOutcome(False, "no usable iteration time in the report")
    f = OfflineFeatures(
        gpu_util_pct=float(mt["gpu_util_pct"]), sm_activity_pct=float(mt["sm_activity_pct"]),
        sm_occupancy_pct=float(mt["sm_occupancy_pct"]), mem_used_bytes=float(mt["mem_used_bytes"]),
        mem_bw_util_pct=float(mt["mem_bw_util_pct"]), iter_time_s=iter_time, sm_clock_mhz=float(mt["sm_clock_mhz"]),
    )
    measured = {
        "iterations": int(it["iterations"]), "measured_iter_time_s": float(it["mean_s"]),
        "iter_time_p50_s": it.get("p50_s"), "iter_time_p95_s": it.get("p95_s"),
        "profiling_s": float(probe.get("elapsed_s") or 0.0), "device": (device or probe.get("device") or
                                                                         probe.get("metrics_note") or "")[:128],
    }
    label = "NVML" if measured_gpu else ("simulated GPU metrics of a generic job" if probe.get("metrics_generic")
                                         else "simulated GPU metrics")
    summary = (f"{it['iterations']} iterations, mean {1000 * float(it['mean_s']):.2f} ms "
               f"(p95 {1000 * float(it.get('p95_s') or 0):.2f} ms), {label}")
    return ProfileOutcome(True, summary, f, "measured" if measured_gpu else "simulated",
                          "nvml" if measured_gpu else "simulated-metrics", measured)


def classify_window(report: dict[str, Any] | None, *, slurm_state: str | None, exit_code: int | None,
                    node: str | None, started: bool) -> ProfileOutcome:
    """Decide a closed profiling window (:mod:`executors.scheduler.profiling.windows`) from the node agent's report of it and
    how the job's window ended in Slurm (``HELD``: MuxFlow closed it; an end state: the job itself ended)."""
    ended = slurm_state not in (None, "HELD", "PENDING")
    crashed = ended and (slurm_state != "COMPLETED" or exit_code not in (None, 0))
    n = _iterations(report)
    if crashed:
        code = f", exit code {exit_code}" if exit_code not in (None, 0) else ""
        return ProfileOutcome(False, f"the job ended {slurm_state}{code} in its profiling window after {n} "
                                     "iteration(s)")
    if report is None:
        if not started:
            return ProfileOutcome(False, f"the job did not start in its profiling window (Slurm: {slurm_state})")
        return ProfileOutcome(False, f"no measurements of the window from the node agent on {node or 'its node'} "
                                     "(is `muxflow node-agent` running there?)")
    if report.get("report_error") and not n:
        return ProfileOutcome(False, f"its iteration report was refused: {report['report_error']}")
    it = report.get("iteration_report") or {}
    elapsed = float(report.get("elapsed_s") or 0.0)
    if report.get("metrics_error") or not report.get("metrics"):
        return ProfileOutcome(False, f"no GPU metrics for the window: {report.get('metrics_error') or 'none taken'}")
    if not it.get("iterations") or not it.get("mean_s"):
        return gpu_activity_profile(report, elapsed)
    out = features_from(report)
    if out.ok:
        out.measured["progress_signal"] = str(it.get("signal") or "runtime")[:32]
    return out


ACTIVITY_QUANTUM_S = 1.0  # a job with no iteration signal: its "iteration" is one second of its solo GPU work
MIN_ACTIVE_UTIL_PCT = 5.0  # below this the GPU was idle: nothing to profile
# Simulated GPU metrics model a job that works; whether it does is what its processes' CPU time says: one that ran
# less than this share of one core over its window (it sleeps, or waits on something) would not have kept a GPU busy.
MIN_ACTIVE_CPU_FRACTION = 0.05


def gpu_activity_profile(report: dict[str, Any], elapsed_s: float) -> ProfileOutcome:
    """The profile of a job that reported no iterations (not Python, or no optimizer step the hook sees): its GPU
    metrics over the window, with one second of solo GPU work as its unit of progress (``progress_signal``
    ``gpu-activity``). A GPU left idle all window long means the job did not use it: no profile; so does, on a
    simulated GPU, a job whose processes used (almost) no CPU."""
    mt = report["metrics"]
    util = float(mt.get("gpu_util_pct") or 0.0)
    if not math.isfinite(util) or util < MIN_ACTIVE_UTIL_PCT:
        return ProfileOutcome(False, f"reported no iterations and kept its GPU idle (utilisation {util:.1f} %) in "
                                     f"its {elapsed_s:.0f} s profiling window: is it using the GPU?")
    measured_gpu = report.get("metrics_source") == "measured"
    if not measured_gpu:
        cpu_s = report.get("job_cpu_s")
        cpu_s = float(cpu_s) if isinstance(cpu_s, (int, float)) and math.isfinite(cpu_s) else 0.0
        if elapsed_s <= 0 or cpu_s < MIN_ACTIVE_CPU_FRACTION * elapsed_s:
            return ProfileOutcome(False, f"reported no iterations in its {elapsed_s:.0f} s profiling window and its "
                                         f"processes stayed idle ({cpu_s:.1f} s of CPU; the GPU is simulated, so "
                                         "a job's work is what it does): is it waiting on something?")
    unit = ACTIVITY_QUANTUM_S if measured_gpu else float(report.get("model_iter_time_s") or ACTIVITY_QUANTUM_S)
    n = max(1, int(elapsed_s / unit)) if unit > 0 else 1
    synthetic = {**report, "iteration_report": {"iterations": n, "mean_s": unit, "final": True}}
    out = features_from(synthetic)
    if not out.ok:
        return out
    out.measured.update(progress_signal="gpu-activity", measured_iter_time_s=None, iter_time_p50_s=None,
                        iter_time_p95_s=None, iterations=0)
    return ProfileOutcome(True, f"no iteration signal: {elapsed_s:.0f} s of GPU activity (utilisation {util:.0f} %), "
                                f"{'NVML' if measured_gpu else 'simulated GPU metrics'}", out.features, out.source,
                          out.method, out.measured)
