"""Create a simulated cluster in the store, and rebuild the live model of one from the store."""

from __future__ import annotations

import datetime as dt

from executors.simulated.cluster import SimGpuSpec, SimJobSpec, SimServiceSpec, SimSettings, SimulatedCluster, rng_stream
from executors.store import inventory
from executors.store import models as m
from executors.store import repo
from executors.store.db import Session
from scheduler_core.domain import JobState
from scheduler_core.gpu_specs import get_spec
from scheduler_core.online.latency_budget import DEFAULT_SLOWDOWN_ALLOWANCE, DEFAULT_SLOWDOWN_BUDGET
from scheduler_core.online.load import peak_slo_ms
from scheduler_core.workloads import ONLINE_FAMILIES, WorkloadCatalog

FAMILY_ORDER = ("cnn", "transformer", "recommender", "lm")


def init_simulated_cluster(
    s: Session, types: dict[str, int], services: int, gpus_per_node: int = 8, seed: int = 0
) -> dict[str, int]:
    """Nodes of ``gpus_per_node`` GPUs per type, ``services`` online services spread over all GPUs.

    Request rates stay inside the paper's 20–190 QPS; peaks are spread over the day.
    """
    if not repo.cluster_is_empty(s):
        raise ValueError("the store already has a cluster; use a fresh database (or `muxflow cluster show`)")
    if services < 1:
        raise ValueError("services must be >= 1")
    total = sum(types.values())
    if total < services:
        raise ValueError(f"{services} services need at least as many GPUs, got {total}")
    rng = rng_stream(seed, "cluster-init")
    specs = [get_spec(t) for t in sorted(types)]
    svc_rows = []
    for k in range(services):
        fam = FAMILY_ORDER[k % len(FAMILY_ORDER)]
        qmin = float(rng.uniform(20, 45))
        qmax = float(rng.uniform(120, 190))
        svc = m.OnlineService(
            name=f"svc-{fam}-{k}", model_family=fam, qps_min=round(qmin, 1), qps_max=round(qmax, 1),
            peak_hour_utc=round(float((14 + 10 * k / services) % 24), 2),
            latency_slo_ms=peak_slo_ms(ONLINE_FAMILIES[fam], specs, round(qmax, 1)),
            slowdown_allowance=DEFAULT_SLOWDOWN_ALLOWANCE, slowdown_budget=DEFAULT_SLOWDOWN_BUDGET,
            mem_bytes=ONLINE_FAMILIES[fam].mem_bytes,
        )
        s.add(svc)
        svc_rows.append(svc)
    s.flush()
    gpu_no = 0
    for gtype, count in sorted(types.items()):
        spec = get_spec(gtype)
        repo.upsert_gpu_type(s, spec)
        for start in range(0, count, gpus_per_node):
            node = m.Node(name=f"sim-{gtype}-{start // gpus_per_node:03d}", simulated=True)
            s.add(node)
            s.flush()
            for idx in range(min(gpus_per_node, count - start)):
                gpu = m.Gpu(node_id=node.id, gpu_index=idx, gpu_type=spec.name, uuid=f"GPU-sim-{node.name}-{idx}")
                s.add(gpu)
                s.flush()
                s.add(m.ServiceInstance(service_id=svc_rows[gpu_no % services].id, gpu_id=gpu.id))
                gpu_no += 1
    return {"gpus": total, "services": services, "nodes": inventory.node_count(s)}


STATE_NAME = "default"


def cluster_from_store(s: Session, catalog: WorkloadCatalog, settings: SimSettings) -> SimulatedCluster:
    """The live model of the simulated cluster: GPUs and jobs from the store, node state from its last save."""
    specs = [
        SimGpuSpec(
            gpu.id, gpu.gpu_type,
            SimServiceSpec(svc.name, svc.model_family, svc.qps_min, svc.qps_max, svc.peak_hour_utc, svc.mem_bytes,
                           float(svc.latency_slo_ms)),
        )
        for gpu, _type, svc, _replica in inventory.served_gpus(s)
    ]
    cluster = SimulatedCluster(specs, catalog, settings)
    live = repo.jobs_in_states(s, [JobState.PENDING, JobState.RUNNING, JobState.PROFILING, JobState.SUBMITTED])
    for job in live:
        register_job(cluster, job)
    saved = s.get(m.SimulatedClusterState, STATE_NAME)
    if saved is not None:
        cluster.load_state(saved.state)
    return cluster


def observed_until(s: Session) -> dt.datetime | None:
    """End of the last simulated interval booked into the store (None before the first)."""
    saved = s.get(m.SimulatedClusterState, STATE_NAME)
    if saved is None:
        return None
    return saved.observed_until_utc


def save_cluster_state(s: Session, cluster: SimulatedCluster, observed_until_utc: dt.datetime | None = None) -> None:
    """Store the cluster's state in the caller's transaction (with the records it produced)."""
    row = s.get(m.SimulatedClusterState, STATE_NAME)
    if row is None:
        if observed_until_utc is None:
            raise ValueError("the first save of the simulated cluster state needs the time it was observed until")
        row = m.SimulatedClusterState(name=STATE_NAME, observed_until_utc=observed_until_utc, state={})
        s.add(row)
    row.state = cluster.export_state()
    if observed_until_utc is not None:
        row.observed_until_utc = observed_until_utc
    row.updated_utc = dt.datetime.now(dt.timezone.utc)


def register_job(cluster: SimulatedCluster, job: m.OfflineJob) -> None:
    cluster.register_job(SimJobSpec(job.id, job.job_type, job.total_steps, job.steps_done, job.mem_bytes))
