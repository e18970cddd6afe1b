"""GPU co-location interference model: the pair formula and the per-job calibration.

Model. Each workload w has a *sensitivity* σ_w (how much it slows down under
contention) and a *pressure* π_w (how much contention it causes). Two workloads
sharing a GPU without SM limits run at normalized throughput

    x_A = 1 / (1 + σ_A · π_B)                                        (full sharing)

so ``log(1/x_A − 1) = log σ_A + log π_B`` is linear in per-workload parameters.
``calibrate`` fits them by ridge least squares on one GPU type's measured pairs
(Gavel K80/P100); within that type it predicts held-out pairs far better than a
constant (``holdout_error``), but the per-job values do not carry over to another
GPU type. Where σ and π come from on each type — the transferable model over
what profiling measures there — is :mod:`scheduler_core.interference.transfer`.

MuxFlow's setting adds two things the public data does not cover, so they are
modelled from MPS semantics (paper §2.3, §4.3) with named constants rather than
fitted: the offline job is capped at ``sm_pct`` of the SMs (its throughput scales
sub-linearly with the cap), and the online service presses in proportion to its
load. When the two SM footprints do not overlap, only memory-system contention
remains (``mps_isolation`` of the full-sharing contention). At ``sm_pct = 100``
and full online load the model reduces exactly to the calibrated formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class WorkloadTraits:
    sensitivity: float
    pressure: float
    sm_need: float  # fraction of SMs the workload keeps busy alone at full load (0–1]
    mem_bw: float  # fraction of memory bandwidth it uses alone (0–1]


@dataclass(frozen=True)
class InterferenceParams:
    mps_isolation: float = 0.35
    capacity_exponent: float = 0.8
    oversubscription_penalty: float = 0.6


@dataclass(frozen=True)
class PairMeasurement:
    workload: str
    partner: str
    norm_tput: float  # of `workload` while sharing with `partner`


@dataclass(frozen=True)
class PairTerms:
    """The parts of one offline job's co-location with the online service, before they are combined.

    ``online_term``: the job's contribution to the online slowdown's contention factor,
    σ_on · π_off · activity · contention; ``e_off``: the SM fraction the job can use (min(share, its
    need)); ``u_on``: the online service's SM footprint at its load.
    """

    norm_tput: np.ndarray
    online_term: np.ndarray
    e_off: np.ndarray
    u_on: np.ndarray


def colocate_terms(
    online: WorkloadTraits,
    online_load: np.ndarray | float,
    offline: WorkloadTraits,
    sm_pct: np.ndarray | float,
    params: InterferenceParams = InterferenceParams(),
    corunner_pressure: np.ndarray | float = 0.0,
) -> PairTerms:
    """:func:`colocate`'s terms; ``corunner_pressure`` adds the pressure of other offline jobs on the GPU.

    Several offline jobs on one GPU (each under its own MPS share) press on each other as the
    online service presses on them: job A's throughput is divided by
    ``1 + σ_A (π_on · load · c_on + corunner_pressure)``, where the caller sums its co-runners'
    ``π_B · activity_B`` times their contention (:mod:`scheduler_core.interference.gpu_model`). 0: the pair alone.
    """
    load = np.clip(np.asarray(online_load, dtype=float), 0.0, 1.0)
    p = np.clip(np.asarray(sm_pct, dtype=float) / 100.0, 0.0, 1.0)
    u_on = online.sm_need * load
    e_off = np.minimum(p, offline.sm_need)
    capacity = (e_off / offline.sm_need) ** params.capacity_exponent
    contention = share_contention(u_on, p, params)
    norm_tput = capacity / (1.0 + offline.sensitivity * online.pressure * load * contention
                            + offline.sensitivity * corunner_pressure)
    activity = e_off / offline.sm_need
    return PairTerms(norm_tput, online.sensitivity * offline.pressure * activity * contention, e_off, u_on)


def share_contention(a, b, params: InterferenceParams = InterferenceParams()):
    """Contention between two SM footprints ``a`` and ``b`` (fractions of the SMs) under MPS.

    The share of the smaller footprint whose SMs are contended (1 where the two together need every
    SM) scales the full-sharing contention; where they do not overlap, only memory-system
    contention remains (``mps_isolation``).
    """
    smaller = np.maximum(np.minimum(a, b), 1e-9)
    overlap = np.clip((a + b - 1.0) / smaller, 0.0, 1.0)
    return params.mps_isolation + (1.0 - params.mps_isolation) * overlap


def online_slowdown(online_term, u_on, e_off, params: InterferenceParams = InterferenceParams()):
    """The online latency slowdown factor (≥ 1) from the offline contention term and SM footprints."""
    return (1.0 + online_term) * (1.0 + params.oversubscription_penalty * np.maximum(0.0, u_on + e_off - 1.0))


def colocate(
    online: WorkloadTraits,
    online_load: np.ndarray | float,
    offline: WorkloadTraits,
    sm_pct: np.ndarray | float,
    params: InterferenceParams = InterferenceParams(),
) -> tuple[np.ndarray, np.ndarray]:
    """Offline normalized throughput and online latency slowdown factor (≥ 1).

    ``online_load`` is the online service's load relative to its peak (0–1);
    ``sm_pct`` the offline job's MPS active-thread percentage.
    """
    t = colocate_terms(online, online_load, offline, sm_pct, params)
    return t.norm_tput, online_slowdown(t.online_term, t.u_on, t.e_off, params)


@dataclass(frozen=True)
class Calibration:
    sensitivity: dict[str, float]
    pressure: dict[str, float]

    def predict(self, workload: str, partner: str) -> float:
        return 1.0 / (1.0 + self.sensitivity[workload] * self.pressure[partner])


def calibrate(pairs: list[PairMeasurement], ridge: float = 0.1) -> Calibration:
    """Fit log σ and log π by ridge least squares (see module docstring)."""
    names = sorted({p.workload for p in pairs} | {p.partner for p in pairs})
    idx = {n: i for i, n in enumerate(names)}
    n = len(names)
    X = np.zeros((len(pairs), 2 * n + 1))
    y = np.empty(len(pairs))
    for row, p in enumerate(pairs):
        X[row, idx[p.workload]] = 1.0
        X[row, n + idx[p.partner]] = 1.0
        X[row, -1] = 1.0
        # A pair measured at (or, by noise, above) its solo speed has no finite logit.
        x = min(max(p.norm_tput, 0.005), 0.995)
        y[row] = math.log(1.0 / x - 1.0)
    reg = ridge * np.eye(X.shape[1])
    reg[-1, -1] = 0.0  # the shared intercept is not shrunk
    w = np.linalg.solve(X.T @ X + reg, X.T @ y)
    # Split the intercept evenly between σ and π so both stay O(1).
    half = w[-1] / 2.0
    sens = {name: math.exp(w[i] + half) for name, i in idx.items()}
    pres = {name: math.exp(w[n + i] + half) for name, i in idx.items()}
    return Calibration(sens, pres)


@dataclass(frozen=True)
class HoldoutReport:
    gpu_type: str
    n_train: int
    n_holdout: int
    mae: float
    mape: float
    baseline_mae: float  # predicting the training mean

    def as_dict(self) -> dict:
        return {
            "gpu_type": self.gpu_type,
            "n_train": self.n_train,
            "n_holdout": self.n_holdout,
            "mae": round(self.mae, 4),
            "mape": round(self.mape, 4),
            "baseline_mae": round(self.baseline_mae, 4),
        }


def holdout_error(
    pairs: list[PairMeasurement], gpu_type: str, holdout_frac: float = 0.2, seed: int = 0
) -> HoldoutReport:
    """Hold out whole unordered pairs (both directions) and score the fit on them."""
    rng = np.random.default_rng(seed)
    keys = sorted({tuple(sorted((p.workload, p.partner))) for p in pairs})
    order = rng.permutation(len(keys))
    held = {keys[i] for i in order[: max(1, int(len(keys) * holdout_frac))]}
    train = [p for p in pairs if tuple(sorted((p.workload, p.partner))) not in held]
    test = [p for p in pairs if tuple(sorted((p.workload, p.partner))) in held]
    cal = calibrate(train)
    test = [p for p in test if p.workload in cal.sensitivity and p.partner in cal.pressure]
    pred = np.array([cal.predict(p.workload, p.partner) for p in test])
    true = np.array([p.norm_tput for p in test])
    mean = float(np.mean([p.norm_tput for p in train]))
    return HoldoutReport(
        gpu_type=gpu_type,
        n_train=len(train),
        n_holdout=len(test),
        mae=float(np.mean(np.abs(pred - true))),
        mape=float(np.mean(np.abs(pred - true) / true)),
        baseline_mae=float(np.mean(np.abs(true - mean))),
    )
