"""Profiling settings from the environment; window metrics through the node agent's samplers."""

from __future__ import annotations

import pytest

from executors.node.profiling.metrics import (
    MetricsUnavailable,
    WindowRecorder,
    open_sampler,
    simulated_offline_model,
    visible_gpu_index,
)
from executors.node.sampler import RawSample, SimulatedSampler
from executors.scheduler.profiling.settings import ProfilingSettings, SamplingSettings, SettingsError


def test_settings_from_the_environment_and_their_errors() -> None:
    st = ProfilingSettings.from_env({"MUXFLOW_PROFILING_BOUND_S": "300", "MUXFLOW_PROFILING_REUSE_PROFILES": "yes",
                                     "MUXFLOW_PROFILING_METRICS": "simulated"}, iterations=5)
    assert (st.bound_s, st.reuse_profiles, st.metrics, st.iterations) == (300.0, True, "simulated", 5)
    assert st.deadline_s == 270.0
    with pytest.raises(SettingsError, match="MUXFLOW_PROFILING_BOUND_S: cannot parse"):
        ProfilingSettings.from_env({"MUXFLOW_PROFILING_BOUND_S": "ten"})
    with pytest.raises(SettingsError, match="profile_seconds .* must be below bound_s"):
        ProfilingSettings(bound_s=60, profile_seconds=60)
    with pytest.raises(SettingsError, match="metrics"):
        ProfilingSettings(metrics="dcgm")
    with pytest.raises(SettingsError, match="profile_dir"):
        ProfilingSettings(profile_dir="relative/dir")
    s = SamplingSettings.from_env({"MUXFLOW_SAMPLING_SM_PCTS": "10,50", "MUXFLOW_SAMPLING_SIZE": "tiny"})
    assert s.sm_pcts == (10, 50) and s.size == "tiny"
    with pytest.raises(SettingsError, match="sm_pcts"):
        SamplingSettings(sm_pcts=(0, 50))
    with pytest.raises(SettingsError, match="size"):
        SamplingSettings(size="huge")


def test_visible_gpu_index_follows_what_slurm_sets() -> None:
    assert visible_gpu_index({"CUDA_VISIBLE_DEVICES": "2,3"}) == 2
    assert visible_gpu_index({"CUDA_VISIBLE_DEVICES": "", "SLURM_JOB_GPUS": "1"}) == 1
    assert visible_gpu_index({"CUDA_VISIBLE_DEVICES": "GPU-abc"}) == "GPU-abc"
    assert visible_gpu_index({}) == 0


def _sample(util: float, mem: float) -> RawSample:
    return RawSample(gpu_util_pct=util, sm_activity_pct=util / 2, sm_occupancy_pct=float("nan"), mem_used_bytes=mem,
                     mem_total_bytes=16e9, mem_bw_util_pct=10.0, sm_clock_mhz=1500.0, sm_clock_max_mhz=1590.0)


class MeasuredReplay(SimulatedSampler):
    source = "measured"  # stands in for NVML: the window logic is the same


def test_the_window_averages_only_the_measured_iterations_and_takes_peak_memory() -> None:
    times = iter(range(100, 200))
    rec = WindowRecorder(MeasuredReplay(replay={0: [_sample(10, 1e9)] * 3 + [_sample(90, 3e9), _sample(70, 2e9)]}),
                         0, interval_s=0.001, wall=lambda: float(next(times)))
    for _ in range(5):  # drive the sampling by hand instead of the thread
        now = rec.wall()
        rec.ring.append(now, rec.sampler.sample(0, now))
    w = rec.window(103.0, 104.0)
    assert (w.samples, w.gpu_util_pct, w.sm_activity_pct, w.mem_used_bytes) == (2, 80.0, 40.0, 3e9)
    assert w.sm_occupancy_pct == 0.0 and "no SM occupancy" in w.notes and w.source == "measured"
    everything = rec.window(500.0, 600.0)  # no sample inside: the whole run, said so
    assert everything.samples == 5 and "whole run used" in everything.notes
    with pytest.raises(MetricsUnavailable):
        WindowRecorder(SimulatedSampler(replay={0: []}), 0).window(None, None)


def test_simulated_metrics_come_from_the_job_types_model_on_a_node_without_gpu() -> None:
    opened = open_sampler("simulated", lambda: simulated_offline_model("ResNet-50 (batch size 64)", "t4", seed=3))
    assert opened.sampler.source == "simulated" and "no GPU" in opened.device
    rec = WindowRecorder(opened.sampler, opened.gpu_index, interval_s=0.005).start()
    import time

    deadline = time.monotonic() + 10
    while len(rec.ring) < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    rec.stop()
    w = rec.window(None, None)
    assert w.samples >= 20 and w.source == "simulated" and 0 < w.sm_activity_pct <= 100
    assert w.sm_clock_max_mhz == 1590.0 and w.mem_total_bytes == 15 * 1024**3
    with pytest.raises(ValueError):
        open_sampler("dcgm", lambda: None)


def test_a_label_without_a_model_is_profiled_as_a_generic_job_with_its_own_memory() -> None:
    """Any label goes on a real cluster: without a GPU, the generic job's model, with the job's memory need."""
    from executors.data.calibration import default_catalog
    from executors.node.profiling.metrics import simulated_job_model, simulated_offline_iter_time_s

    catalog = default_catalog()
    known = simulated_job_model("ResNet-50 (batch size 64)", 7 * 1024**3)
    assert not known.generic and known.catalog.offline[known.key] == catalog.offline["ResNet-50 (batch size 64)"]
    for label in ("", "my fine-tune"):
        model = simulated_job_model(label, 7 * 1024**3)
        assert model.generic and "generic" in model.note and (repr(label) in model.note or "no label" in model.note)
        wl = model.catalog.offline[model.key]
        assert wl.mem_bytes == 7 * 1024**3
        # a typical job: inside the catalog's range, trait by trait
        for trait in ("sm_need", "mem_bw", "sensitivity", "pressure"):
            values = [getattr(w.traits, trait) for w in catalog.offline.values()]
            assert min(values) <= getattr(wl.traits, trait) <= max(values)
    speeds = [w.solo_steps_per_s_p100 for w in catalog.offline.values()]
    assert min(speeds) <= model.catalog.offline[model.key].solo_steps_per_s_p100 <= max(speeds)
    assert simulated_offline_iter_time_s("", "t4", 7 * 1024**3) == simulated_offline_iter_time_s("x", "t4", 7 * 1024**3)
    reading = simulated_offline_model("", "t4", 0, 7 * 1024**3)(0.0)
    assert abs(reading.mem_used_bytes / (7 * 1024**3) - 1) < 0.2  # the job's need, with measurement noise
    assert not catalog.offline.keys() & {model.key}  # the shared catalog is left as it was
