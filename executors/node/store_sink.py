"""The node agent's store writer: health changes, evictions, device errors and minute rows go to the feature store
from a thread of its own, so a slow database never delays sampling (``executors.node.agent`` hands it the events).

Kept apart from the agent's core so that the core imports no database code (a GPU check runs the agent where no
database library is installed).
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading

from executors.node.agent import DeviceErrorEvent, EvictionEvent, HealthChange
from executors.store import models as m
from executors.store import repo
from executors.store.jobs import transition
from scheduler_core.domain import IllegalTransition, JobState

log = logging.getLogger(__name__)


class StoreSink:
    """Writes events to the feature store from its own thread; ``close`` drains and joins."""

    def __init__(self, store, source: str):
        self.store = store
        self.source = source
        self._own: dict[tuple[int, dt.datetime], None] = {}  # minute rows this agent wrote (oldest first)
        self._q: queue.Queue = queue.Queue()
        self._t = threading.Thread(target=self._run, name="node-agent-store", daemon=True)
        self.errors = 0
        self._t.start()

    def health(self, ev: HealthChange) -> None:
        self._q.put(("health", ev))

    def eviction(self, ev: EvictionEvent) -> None:
        self._q.put(("eviction", ev))

    def device_error(self, ev: DeviceErrorEvent) -> None:
        self._q.put(("error", ev))

    def metrics(self, rows: list, source: str) -> None:
        if rows:
            self._q.put(("metrics", (rows, source)))

    def close(self) -> None:
        self._q.put(None)
        self._t.join()

    BATCH = 256  # events written in one transaction when the writer has fallen behind
    OWN_KEPT = 4096  # (GPU, minute) keys remembered as this agent's own rows

    def _run(self) -> None:
        done = False
        while not done:
            batch = [self._q.get()]
            while len(batch) < self.BATCH:
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            if None in batch:
                batch, done = batch[: batch.index(None)], True
            if not batch:
                continue
            try:
                with self.store.session() as s:
                    for item in batch:
                        self._apply(s, *item)
            except Exception:
                if len(batch) == 1:
                    self.errors += 1
                    log.exception("store write failed (%s)", batch[0][0])
                    continue
                # One bad event must not cost the others: write them one by one.
                for item in batch:
                    try:
                        self._write(*item)
                    except Exception:
                        self.errors += 1
                        log.exception("store write failed (%s)", item[0])

    def _write(self, kind: str, payload) -> None:
        with self.store.session() as s:
            self._apply(s, kind, payload)

    def _apply(self, s, kind: str, payload) -> None:
        if kind == "health":
            repo.set_gpu_health(s, {payload.gpu_id: payload.health}, payload.at_utc)
            gpu = s.get(m.Gpu, payload.gpu_id)
            if gpu is not None:
                gpu.overlimit_entries = [t.isoformat() for t in payload.overlimit_entries_utc]
        elif kind == "eviction":
            if payload.job_id is not None:
                s.add(m.Eviction(job_id=payload.job_id, gpu_id=payload.gpu_id, at_utc=payload.at_utc,
                                 reason=payload.reason, health=payload.health, source=self.source))
                if payload.ok and payload.slurm_job_id is not None:
                    _mark_evicted(s, payload)
        elif kind == "error":
            s.add(m.DeviceError(gpu_id=payload.gpu_id, at_utc=payload.at_utc, kind=payload.kind,
                                xid=payload.xid, detail=payload.detail, source=self.source))
        elif kind == "metrics":
            rows, source = payload
            skipped = repo.write_agent_metrics(s, rows, source, own=self._own)
            if skipped:
                log.warning("%d minute row(s) already in the store (agent restarted within a minute?): kept",
                            skipped)
            while len(self._own) > self.OWN_KEPT:  # only the last minutes are ever written again
                self._own.pop(next(iter(self._own)))


def _mark_evicted(s, ev: EvictionEvent) -> None:
    """The evicted job is EVICTED in the transaction that records the eviction (the job-state sync takes
    it from there: requeue-hold → PENDING). A job that moved meanwhile is logged, not fatal."""
    job = s.get(m.OfflineJob, ev.job_id)
    if job is None:
        return
    seen = JobState(job.state)
    if seen not in (JobState.RUNNING, JobState.PLACED):
        log.warning("job %d evicted from GPU %d while %s in the store: state left as it is", ev.job_id, ev.gpu_id,
                    seen.value)
        return
    try:
        transition(s, ev.job_id, JobState.EVICTED, f"node agent: {ev.reason}"[:2000], expected=seen,
                   at_utc=ev.at_utc)
    except IllegalTransition as exc:  # ConcurrentTransition included: another writer moved it first
        log.warning("job %d: EVICTED not recorded: %s", ev.job_id, exc)
