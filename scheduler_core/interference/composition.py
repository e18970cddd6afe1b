"""How far the round's rule for several jobs per GPU is from the simulated GPU with several jobs.

A round that opens ``b`` slots on a GPU (:mod:`scheduler_core.round.slots`) predicts each job from the
*pair* model alone: its throughput as the pair's at ``⌊P / b⌋`` times ``corunner_efficiency`` per
other slot, and its share of the online slowdown as the pair's at the whole offline share ``P``,
held to ``allowance / b``. The simulated GPU (:func:`scheduler_core.interference.gpu_model.with_offline_jobs`)
runs the ``b`` jobs together: each presses on the others as well as on the replica. This module
puts the two side by side over every combination of the catalog's workloads, so the rule's error
is a measured number (``muxflow simulate composition``; docs/EVALUATION.md):

- throughput: the rule's per-job estimate against the job's throughput beside its co-runners
  (mean absolute error, mean signed error: > 0 means the rule promises more than it gets);
- online slowdown: the rule's bound, ``1 + Σ (pair slowdown at P − 1)``, against the slowdown
  of the jobs together; the fraction of GPUs where the bound is below the truth (the rule
  is not conservative there) and by how much at worst;
- the co-runner efficiency the model implies (the median of true / pair at ``⌊P / b⌋``), to set
  against the round's constant.

Both sides use the same interference model (no prediction error): only the composition is scored.
Every job runs the whole time and xCUDA does not pace it, so the co-runners' pressure is at its
largest.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from scheduler_core.interference.gpu_model import OnlineModel, online_alone, with_offline_jobs
from scheduler_core.gpu_specs import get_spec
from scheduler_core.interference.pairs import InterferenceParams, WorkloadTraits
from scheduler_core.workloads import ONLINE_FAMILIES, WorkloadCatalog

LOADS = (0.2, 0.5, 0.8)          # online load relative to the replica's capacity
OFFLINE_SHARES = (40, 60, 80)    # the GPU's offline share P (%) split between the slots


@dataclass(frozen=True)
class CompositionError:
    slots: int                   # jobs per GPU (b)
    cases: int                   # GPU configurations scored
    tput_mae: float
    tput_bias: float             # mean (rule − true): > 0 promises more than the jobs get
    tput_mape: float
    implied_efficiency: float    # median true / pair at ⌊P / b⌋, per other slot
    slowdown_under_frac: float   # fraction of GPUs where the rule's bound is below the true slowdown
    slowdown_worst_excess: float  # largest (true − bound) in slowdown units (0: always conservative)

    def as_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def composition_errors(catalog: WorkloadCatalog, gpu_type: str = "t4", slots=(2, 3),
                       corunner_efficiency: float = 0.75, params: InterferenceParams = InterferenceParams(),
                       loads=LOADS, shares=OFFLINE_SHARES) -> list[CompositionError]:
    """The rule against the k-job model for each ``b`` in ``slots``, over the catalog's workloads."""
    spec = get_spec(gpu_type)
    offline = sorted(catalog.offline)
    out = []
    for b in slots:
        combos = list(itertools.combinations_with_replacement(offline, b))
        rows = [(fam, load, share, combo) for fam in sorted(catalog.online) for load in loads for share in shares
                for combo in combos if share // b >= 1]
        n = len(rows)
        # One simulated GPU per row: its replica at the load, its b jobs at ⌊P / b⌋ each.
        models = OnlineModel.stack([OnlineModel.of(ONLINE_FAMILIES[f], catalog.online[f], spec) for f, *_ in rows])
        qps = np.array([load for _, load, _, _ in rows]) * np.asarray(models.capacity_qps)
        on = online_alone(models, qps)
        names = [name for *_, combo in rows for name in combo]
        g = np.repeat(np.arange(n), b)
        traits = _traits(catalog, names)
        slot = np.repeat([share // b for _, _, share, _ in rows], b).astype(float)
        whole = np.repeat([share for _, _, share, _ in rows], b).astype(float)
        ones = np.ones(g.size)
        together = with_offline_jobs(on, models, g, traits, slot, ones, 0.0, params)
        # The pair model, each job alone beside the replica: at its slot share and at the whole share.
        alone = np.arange(g.size)
        on_job, model_job = on.take(g), models.take(g)
        pair_slot = with_offline_jobs(on_job, model_job, alone, traits, slot, ones, 0.0, params)
        pair_whole = with_offline_jobs(on_job, model_job, alone, traits, whole, ones, 0.0, params)
        rule = pair_slot.norm_tput * corunner_efficiency ** (b - 1)
        true = together.norm_tput
        bound = 1.0 + np.bincount(g, weights=pair_whole.slowdown - 1.0, minlength=n)
        excess = together.slowdown - bound
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = true / pair_slot.norm_tput
        out.append(CompositionError(
            slots=b, cases=n, tput_mae=float(np.mean(np.abs(rule - true))),
            tput_bias=float(np.mean(rule - true)), tput_mape=float(np.mean(np.abs(rule - true) / true)),
            implied_efficiency=float(np.median(ratio[np.isfinite(ratio)]) ** (1.0 / (b - 1))) if b > 1 else 1.0,
            slowdown_under_frac=float(np.mean(excess > 1e-9)),
            slowdown_worst_excess=float(max(0.0, np.max(excess))),
        ))
    return out


def _traits(catalog: WorkloadCatalog, names: list[str]) -> WorkloadTraits:
    t = [catalog.offline[n].traits for n in names]
    return WorkloadTraits(*(np.array([getattr(x, f) for x in t]) for f in ("sensitivity", "pressure", "sm_need",
                                                                           "mem_bw")))

