"""Workload catalog: traits of offline job types and online service families, on one GPU type.

Offline job types are the Gavel/Philly job types; their sensitivity and
pressure come from an interference calibration on the GPU type in question
(executors/data/calibration.py, docs/CALIBRATION.md), their solo
throughput from the measured solo runs. What the public data lacks (SM
footprint, memory need) is derived by documented rules so that every trait is
traceable.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler_core.gpu_specs import GIB
from scheduler_core.interference.pairs import Calibration, WorkloadTraits

# Family memory at batch 16 (GiB) and growth per doubling of the batch.
_FAMILY_MEM = {
    "ResNet-18": (1.2, 0.35),
    "ResNet-50": (2.5, 0.8),
    "Transformer": (1.8, 0.5),
    "LM": (1.5, 0.4),
    "Recommendation": (1.0, 0.2),
    "A3C": (0.8, 0.0),
    "CycleGAN": (3.0, 0.0),
}


def family_of(job_type: str) -> str:
    return job_type.split(" (")[0].strip()


def batch_of(job_type: str) -> int | None:
    m = re.search(r"batch size (\d+)", job_type)
    return int(m.group(1)) if m else None


def offline_mem_bytes(job_type: str) -> int:
    """GPU memory an offline job of this type needs (modelled, see module doc)."""
    base, per_doubling = _FAMILY_MEM.get(family_of(job_type), (2.0, 0.5))
    batch = batch_of(job_type) or 16
    gib = base + per_doubling * max(0.0, math.log2(batch / 16))
    return int(gib * GIB)


@dataclass(frozen=True)
class OfflineWorkload:
    job_type: str
    traits: WorkloadTraits
    solo_steps_per_s_p100: float
    mem_bytes: int


@dataclass(frozen=True)
class OnlineFamily:
    """An online inference service family; traits borrowed from a small-batch analogue."""

    name: str
    analogue: str  # Gavel job type whose sensitivity/pressure stand in for inference
    sm_need_at_peak: float
    gpu_util_at_peak_pct: float
    base_latency_ms_p100: float
    mem_bytes: int
    peak_qps_capacity_p100: float


ONLINE_FAMILIES: dict[str, OnlineFamily] = {
    f.name: f
    for f in (
        OnlineFamily("cnn", "ResNet-50 (batch size 16)", 0.55, 62.0, 9.0, int(3.5 * GIB), 230.0),
        OnlineFamily("transformer", "Transformer (batch size 16)", 0.5, 58.0, 14.0, int(4.0 * GIB), 210.0),
        OnlineFamily("recommender", "Recommendation (batch size 512)", 0.35, 45.0, 5.0, int(6.0 * GIB), 260.0),
        OnlineFamily("lm", "LM (batch size 5)", 0.45, 55.0, 18.0, int(5.0 * GIB), 200.0),
    )
}


@dataclass(frozen=True)
class WorkloadCatalog:
    offline: dict[str, OfflineWorkload]
    online: dict[str, WorkloadTraits]  # by family
    gpu_type: str | None = None  # the GPU type these traits hold on (None: the same on every type)
    calibration: str = ""  # which calibration they come from (executors/data/calibration.py)
    per_type: Mapping[str, WorkloadCatalog] = field(default_factory=dict, compare=False, repr=False)

    def for_gpu(self, gpu_type: str) -> WorkloadCatalog:
        """The traits on ``gpu_type``: its own catalog where one exists, these otherwise."""
        return self.per_type.get(gpu_type.lower(), self)

    def offline_workload(self, job_type: str) -> OfflineWorkload:
        try:
            return self.offline[job_type]
        except KeyError:
            raise KeyError(
                f"unknown job type {job_type!r}; known types: {', '.join(sorted(self.offline))}"
            ) from None


def build_catalog(calibration: Calibration, solo_steps_per_s: dict[str, float], gpu_type: str | None = None,
                  calibration_name: str = "") -> WorkloadCatalog:
    """Traits for every calibrated job type and online family (on ``gpu_type``, when the calibration is per type).

    SM footprint and memory-bandwidth share are monotone in the calibrated
    pressure (a job that slows others down occupies more of the GPU): ranked
    pressure maps linearly onto [0.35, 0.95] and [0.2, 0.9].
    """
    names = sorted(calibration.pressure, key=lambda n: calibration.pressure[n])
    rank = {n: i / max(1, len(names) - 1) for i, n in enumerate(names)}
    offline = {}
    for name in names:
        if name not in solo_steps_per_s:
            continue
        traits = WorkloadTraits(
            sensitivity=calibration.sensitivity[name],
            pressure=calibration.pressure[name],
            sm_need=0.35 + 0.6 * rank[name],
            mem_bw=0.2 + 0.7 * rank[name],
        )
        offline[name] = OfflineWorkload(name, traits, solo_steps_per_s[name], offline_mem_bytes(name))
    online = {}
    for fam in ONLINE_FAMILIES.values():
        online[fam.name] = WorkloadTraits(
            sensitivity=calibration.sensitivity[fam.analogue],
            pressure=calibration.pressure[fam.analogue],
            sm_need=fam.sm_need_at_peak,
            mem_bw=0.2 + 0.7 * rank[fam.analogue],
        )
    return WorkloadCatalog(offline, online, gpu_type, calibration_name)
