"""Benchmarks (``muxflow bench …``). Figures go to docs/BENCHMARKS.md with the machine they ran on."""

from __future__ import annotations

import json
import os
import platform
import time

import click
import numpy as np


@click.group()
def bench() -> None:
    """Benchmarks that print their figures."""


@bench.command("round")
@click.option("--sizes", default="100x50,500x250,1000x500", show_default=True, help="GPUsxJOBS list.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def bench_round(sizes: str, seed: int, as_json: bool) -> None:
    """Time one scheduling round (feasibility, batched MLP prediction, matching) on synthetic clusters.

    The predictor is a real MLP trained on 400 simulated co-location samples;
    GPUs carry simulated online services, jobs simulated profiles.
    """
    import torch

    from executors.simulated.calibration import default_catalog
    from executors.simulated.cluster import rng_stream
    from executors.simulated.profiling import colocation_samples, offline_profile, online_features
    from executors.steps import training_matrix
    from scheduler_core.domain import GpuCandidate, GpuHealth, JobCandidate
    from scheduler_core.gpu_specs import get_spec
    from scheduler_core.predictor import PredictorConfig, train
    from scheduler_core.round import plan_round

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    catalog = default_catalog()
    rng = rng_stream(seed, "bench")
    services = [("svc-cnn", "cnn", 3.5e9), ("svc-rec", "recommender", 6e9), ("svc-lm", "lm", 5e9)]
    samples = colocation_samples(catalog, "t4", services, sorted(catalog.offline), 400, rng)

    class _Row:  # the shape training_matrix reads
        def __init__(self, smp):
            self.__dict__.update(smp.__dict__)

    x, yt, ys = training_matrix([_Row(smp) for smp in samples], "t4")
    model, _ = train(x, yt, ys, PredictorConfig(epochs=20, seed=seed))
    spec = get_spec("t4")
    types = sorted(catalog.offline)
    results = []
    for size in sizes.split(","):
        n, m = (int(v) for v in size.lower().split("x"))
        gpus = []
        for i in range(n):
            name, fam, mem = services[i % len(services)]
            load = float(rng.uniform(0.1, 0.9))
            f = online_features(catalog, fam, "t4", load, mem, rng)
            gpus.append(GpuCandidate(i, "t4", spec.memory_bytes, spec.max_sm_clock_mhz, GpuHealth.HEALTHY, name, f,
                                     f.sm_activity_pct, mem, 0.2))
        jobs = []
        for j in range(m):
            jt = types[int(rng.integers(len(types)))]
            jobs.append(JobCandidate(j, catalog.offline_workload(jt).mem_bytes, frozenset({"t4"}),
                                     {"t4": offline_profile(catalog, jt, "t4", rng)}))
        t0 = time.perf_counter()
        res = plan_round(gpus, jobs, {"t4": model})
        wall = time.perf_counter() - t0
        results.append({"gpus": n, "jobs": m, "pairs": n * m, "feasible_pairs": res.feasible_pairs,
                        "placements": len(res.placements), "objective": round(res.objective, 3),
                        "wall_s": round(wall, 3), **{f"{k}_s": round(v, 3) for k, v in res.timings_s.items()}})
    out = {"benchmark": "round", "machine": f"{platform.machine()} {os.cpu_count()} cores, CPU only",
           "torch_threads": torch.get_num_threads(), "results": results}
    if as_json:
        click.echo(json.dumps(out))
        return
    for r in results:
        click.echo(f"{r['gpus']:>6} GPUs x {r['jobs']:>6} jobs: total {r['wall_s']:.3f} s "
                   f"(feasibility {r['feasibility_s']:.3f}, prediction {r['prediction_s']:.3f}, matching {r['matching_s']:.3f}) "
                   f"placements {r['placements']} objective {r['objective']}")
    click.echo(json.dumps(out))
