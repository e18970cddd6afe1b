"""Which offline job sits on which GPU of this node, at which share: what the node agent attributes and evicts.

Two sources, polled on a thread of their own so that the sampling thread only reads the last view:

- :func:`slurm_reader` (a real cluster, the dev cluster): the node's running Slurm jobs whose comment carries
  a placement plan signed with the deployment's plan key (:mod:`executors.slurm.plan`; a plan the key does not
  verify, or one written for another Slurm job, is no plan). Slurm is what really runs.
- :class:`StorePlacements` (the simulated cluster, no Slurm): the latest dispatched round's
  placements of RUNNING jobs on this node's GPUs.

Each job is looked up in the feature store once (``JobInfoLoader``): its memory and the
interference traits the simulated GPU needs — the catalog's for a job type it knows, else
derived from the job's profile on this GPU type (``scheduler_core.interference.gpu_model.offline_traits``).
A Slurm job whose plan names a job this store does not know (another deployment's, a test
run's on a shared cluster) is ignored, and logged once.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from executors.slurm.models import RUNNING
from executors.slurm.plan import placed_plan
from scheduler_core.interference.gpu_model import offline_traits
from scheduler_core.interference.pairs import WorkloadTraits

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OfflineOnGpu:
    """One offline job on one GPU of this node."""

    job_id: int                     # the feature store's offline job id
    slurm_job_id: int | None
    sm_pct: int                     # its MPS share
    mem_bytes: int
    traits: WorkloadTraits | None   # None: neither a known type nor a profile (not modelled, logged)
    started_epoch_s: float | None = None
    user: str | None = None         # the user its processes run as (Slurm's; the store's run_as_user); None: unknown


@dataclass(frozen=True)
class JobInfo:
    slurm_job_id: int | None
    mem_bytes: int
    traits: WorkloadTraits | None
    user: str | None = None         # the store's run_as_user


class Placements(Protocol):
    def on_gpu(self, gpu_index: int) -> tuple[OfflineOnGpu, ...]:
        """The offline jobs on that GPU in the last view (never blocks)."""
        ...

    def refresh(self) -> None:
        """Read the source now (the eviction path wants the freshest view)."""
        ...

    def close(self) -> None:
        ...


class StaticPlacements:
    """A fixed (or test-driven) view: ``set(gpu_index, jobs)``."""

    def __init__(self, view: Mapping[int, tuple[OfflineOnGpu, ...]] | None = None):
        self._view: dict[int, tuple[OfflineOnGpu, ...]] = dict(view or {})

    def set(self, gpu_index: int, jobs: tuple[OfflineOnGpu, ...] | list[OfflineOnGpu]) -> None:
        self._view = {**self._view, gpu_index: tuple(jobs)}

    def on_gpu(self, gpu_index: int) -> tuple[OfflineOnGpu, ...]:
        return self._view.get(gpu_index, ())

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


class PolledPlacements:
    """A view rebuilt by ``read()`` every ``poll_s`` on a daemon thread; errors keep the last view."""

    def __init__(self, read: Callable[[], dict[int, tuple[OfflineOnGpu, ...]]], poll_s: float, what: str):
        self._read = read
        self.poll_s = poll_s
        self.what = what
        self._view: dict[int, tuple[OfflineOnGpu, ...]] = {}
        self._lock = threading.Lock()  # one read at a time (poller and eviction path)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_ok_s: float | None = None
        self.last_error: str | None = None

    def start(self) -> PolledPlacements:
        self.refresh()
        self._thread = threading.Thread(target=self._run, name=f"node-agent-{self.what}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.refresh()

    def refresh(self) -> None:
        with self._lock:
            try:
                view = self._read()
            except Exception as exc:  # Slurm or the store briefly away: keep the last view
                msg = f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                if msg != self.last_error:
                    log.warning("placements from %s unavailable (%s); keeping the last view", self.what, msg)
                self.last_error = msg
                return
            if self.last_error is not None:
                log.info("placements from %s available again", self.what)
            self.last_error = None
            self.last_ok_s = time.monotonic()
            self._view = view

    def on_gpu(self, gpu_index: int) -> tuple[OfflineOnGpu, ...]:
        return self._view.get(gpu_index, ())

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_s + 30.0)


@dataclass
class JobInfoLoader:
    """Store lookups of offline jobs (memory, traits on this node's GPU type), cached per job id."""

    store: object
    gpu_type: str
    catalog: object                      # scheduler_core.workloads.WorkloadCatalog
    _cache: dict[int, JobInfo | None] = field(default_factory=dict)
    _unknown_logged: set[int] = field(default_factory=set)

    def __call__(self, job_id: int) -> JobInfo | None:
        if job_id in self._cache:
            return self._cache[job_id]
        # the store's code is imported where a store is read: the agent's core runs without a database library
        from executors.store import models as m
        from executors.store.profiling import profile_on

        with self.store.session() as s:
            job = s.get(m.OfflineJob, job_id)
            if job is None:
                info = None
            else:
                prof = profile_on(s, job_id, self.gpu_type)
                profile = None if prof is None else {"sm_activity_pct": prof.sm_activity_pct,
                                                     "mem_bw_util_pct": prof.mem_bw_util_pct}
                traits = offline_traits(job.job_type, self.catalog, profile)
                if traits is None:
                    log.warning("job %d (%r) has no profile on %s and a type the catalog does not know: "
                                "its GPU use cannot be modelled", job_id, job.job_type, self.gpu_type)
                info = JobInfo(None if job.slurm_job_id is None else int(job.slurm_job_id), int(job.mem_bytes),
                               traits, job.run_as_user)
        if info is not None and info.traits is not None:
            self._cache[job_id] = info  # a job without traits yet may be profiled later: looked up again
        return info


def list_slurm_jobs(client_factory: Callable[[], object]) -> list:
    """Every job Slurm knows, through a client of its own (closed after)."""
    client = client_factory()
    try:
        return client.list_jobs()
    finally:
        close = getattr(client, "close", None)
        if close is not None:
            close()


def slurm_reader(client_factory: Callable[[], object], node: str, jobs: Callable[[int], JobInfo | None],
                 key: bytes, partition: str | None = None) -> Callable[[], dict[int, tuple[OfflineOnGpu, ...]]]:
    """Running Slurm jobs on ``node`` with a verified placement plan in their comment, by planned GPU index."""
    ignored: set[int] = set()

    def read() -> dict[int, tuple[OfflineOnGpu, ...]]:
        out: dict[int, list[OfflineOnGpu]] = {}
        for j in list_slurm_jobs(client_factory):
            if j.state != RUNNING or node not in j.nodes:
                continue
            if partition is not None and partition not in j.partition.split(","):
                continue
            plan = placed_plan(j, key)
            if plan is None:
                continue  # not a job MuxFlow placed (an online replica, a profiling window, a forged plan)
            job_id, index, pct = plan.job_id, plan.gpu_index, plan.sm_pct or j.mps_pct
            info = jobs(job_id)
            if info is None or (info.slurm_job_id is not None and info.slurm_job_id != j.job_id):
                if j.job_id not in ignored:
                    ignored.add(j.job_id)
                    log.warning("Slurm job %d on %s GPU %d carries a plan for job %d, which this store does not "
                                "know as that Slurm job: ignored", j.job_id, node, index, job_id)
                continue
            mem = plan.mem_bytes or info.mem_bytes
            started = j.start_time_utc.timestamp() if j.start_time_utc is not None else None
            out.setdefault(index, []).append(OfflineOnGpu(job_id, j.job_id, pct, mem, info.traits, started,
                                                           j.user_name or None))
        return {i: tuple(sorted(v, key=lambda o: o.job_id)) for i, v in out.items()}

    return read


def store_reader(store, gpu_index_of: Mapping[int, int],
                 jobs: Callable[[int], JobInfo | None]) -> Callable[[], dict[int, tuple[OfflineOnGpu, ...]]]:
    """RUNNING jobs the latest dispatched round placed on this node's GPUs (``gpu_index_of``: store id → index)."""
    from executors.store.rounds import running_in_latest_dispatch

    def read() -> dict[int, tuple[OfflineOnGpu, ...]]:
        with store.session() as s:
            rows = [(r.job_id, r.gpu_id, r.sm_pct, r.started_utc)
                    for r in running_in_latest_dispatch(s, list(gpu_index_of))]
        out: dict[int, list[OfflineOnGpu]] = {}
        for job_id, gpu_id, pct, started in rows:
            info = jobs(job_id)
            if info is None:
                continue
            t = started.replace(tzinfo=dt.UTC).timestamp() if started is not None and started.tzinfo is None else (
                started.timestamp() if started is not None else None)
            out.setdefault(gpu_index_of[gpu_id], []).append(
                OfflineOnGpu(job_id, info.slurm_job_id, int(pct), info.mem_bytes, info.traits, t, info.user))
        return {i: tuple(v) for i, v in out.items()}

    return read
