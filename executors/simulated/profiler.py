"""The simulated cluster's profiler: solo profiles of new jobs and co-location samples, from the simulated GPU
model, written to the feature store labelled ``simulated`` (the profile partition measures them on a real cluster).
"""

from __future__ import annotations

from executors.simulated.cluster import rng_stream
from executors.simulated.profiling import colocation_samples, offline_profile
from executors.store import inventory, repo
from executors.store.db import Store
from executors.store.jobs import transition
from scheduler_core.domain import JobState
from scheduler_core.workloads import WorkloadCatalog


def profile_new_jobs(store: Store, catalog: WorkloadCatalog, seed: int = 0) -> int:
    """SUBMITTED → PROFILING → PENDING with a solo profile per allowed GPU type (simulated)."""
    done = 0
    with store.session() as s:
        ids = [j.id for j in repo.jobs_in_states(s, [JobState.SUBMITTED])]
    for job_id in ids:
        with store.session() as s:
            job = transition(s, job_id, JobState.PROFILING, "simulated solo profiling")
            rng = rng_stream(seed, f"profiling-job-{job_id}")  # per job: the same profile whichever run takes it
            try:
                for gtype in job.allowed_gpu_types:
                    repo.save_profile(s, job.id, gtype, offline_profile(catalog, job.job_type, gtype, rng), "simulated")
            except KeyError as exc:
                transition(s, job_id, JobState.FAILED, f"profiling failed: {exc}")
                continue
            transition(s, job_id, JobState.PENDING, "profiled")
            done += 1
    return done


def collect_samples(
    store: Store, catalog: WorkloadCatalog, per_type: int, seed: int = 0, top_up: bool = False
) -> dict[str, int]:
    """Simulated co-location samples per GPU type: ``per_type`` more, or (``top_up``) up to ``per_type`` in all."""
    counts = {}
    with store.session() as s:
        services = [(v.name, v.model_family, float(v.mem_bytes)) for v in inventory.online_services(s, by="id")]
        gtypes = sorted(repo.gpu_type_names(s))
        for gtype in gtypes:
            have = repo.sample_count(s, gtype)
            want = max(0, per_type - have) if top_up else per_type
            if want == 0 or not services:
                counts[gtype] = 0
                continue
            # A new stream per batch (named by how many samples exist), so top-ups add new samples.
            rng = rng_stream(seed, f"samples-{gtype}" if have == 0 else f"samples-{gtype}-{have}")
            samples = colocation_samples(catalog, gtype, services, sorted(catalog.offline), want, rng)
            counts[gtype] = repo.add_samples(s, samples)
    return counts
