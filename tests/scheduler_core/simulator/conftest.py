"""Shared pieces of the simulator tests: a small trained predictor and hand-built traces."""

from __future__ import annotations

import pytest

from executors.data.calibration import SAMPLE_TRACE
from executors.simulated.evaluation import load_trace, simulation_catalog, simulation_predictors
from executors.simulated.profiling import offline_profile
from scheduler_core.simulator import ServiceSpec, SimConfig, SimInputs
from scheduler_core.trace import TraceJob

JOB_TYPE = "ResNet-50 (batch size 64)"


@pytest.fixture(scope="session")
def small_predictors(tmp_path_factory):
    """A T4 predictor trained on 600 simulated samples (enough to plan; the benchmark uses 2,000)."""
    models, _ = simulation_predictors(SimConfig(gpus=1), tmp_path_factory.mktemp("sim-cache"), samples=600,
                                      epochs=80)
    return models


@pytest.fixture(scope="session")
def inputs(small_predictors) -> SimInputs:
    catalog = simulation_catalog(SimConfig(gpus=1))  # the T4 traits the predictors were trained on
    return SimInputs(catalog, {(j, "t4"): offline_profile(catalog, j, "t4") for j in catalog.offline},
                     small_predictors)


@pytest.fixture(scope="session")
def sample_trace() -> list[TraceJob]:
    return load_trace(SAMPLE_TRACE)


def trace_job(line: int, steps: int, arrival_s: float = 0.0, job_type: str = JOB_TYPE, scale: int = 1) -> TraceJob:
    return TraceJob(line, job_type, "python train.py", "--steps", False, steps, arrival_s, scale)


def flat_config(**kw) -> SimConfig:
    """One T4 whose online service sees a constant 100 QPS: no noise, no bursts."""
    base = dict(gpus=1, hours=2.0, qps_noise_frac=0.0, burst_prob_per_min=0.0, mean_job_hours=0.5,
                arrival_hours=1.0, services=(ServiceSpec("flat-cnn", "cnn", 100.0, 100.0, 20.0),))
    base.update(kw)
    return SimConfig(**base)
