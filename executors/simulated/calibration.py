"""Calibrate the simulated GPU's interference model on the measured Gavel data.

The measurements are K80 and P100 training pairs. Newer GPU types (T4, A10,
A100, H100) borrow the P100 calibration, scaled in speed by the GPU spec's
``relative_speed``: a documented modelling assumption until real co-location
samples of those types exist.
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

from scheduler_core.interference import (
    Calibration,
    HoldoutReport,
    calibrate,
    holdout_error,
    parse_gavel_colocation,
)
from scheduler_core.workloads import WorkloadCatalog, build_catalog

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "gavel"
COLOCATION_FILE = DATA_DIR / "colocation_throughputs_k80_p100.json"
SAMPLE_TRACE = DATA_DIR / "philly_vc_0e4a51.sample.trace"
REFERENCE_GPU = "p100"


@functools.lru_cache(maxsize=1)
def load_colocation_data(path: Path = COLOCATION_FILE) -> dict:
    with open(path) as fh:
        return json.load(fh)


def solo_steps_per_s(data: dict, gpu_type: str) -> dict[str, float]:
    out = {}
    for key, entry in data[gpu_type].items():
        job, scale = ast.literal_eval(key)
        if scale == 1 and entry.get("null"):
            out[job] = float(entry["null"])
    return out


@functools.lru_cache(maxsize=4)
def calibration_for(gpu_type: str = REFERENCE_GPU) -> Calibration:
    return calibrate(parse_gavel_colocation(load_colocation_data(), gpu_type))


def holdout_reports(seed: int = 0) -> list[HoldoutReport]:
    data = load_colocation_data()
    return [holdout_error(parse_gavel_colocation(data, g), g, seed=seed) for g in ("k80", "p100")]


@functools.lru_cache(maxsize=1)
def default_catalog() -> WorkloadCatalog:
    data = load_colocation_data()
    return build_catalog(calibration_for(REFERENCE_GPU), solo_steps_per_s(data, REFERENCE_GPU))
