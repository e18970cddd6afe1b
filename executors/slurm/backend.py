"""The Slurm dispatcher: a :class:`executors.cluster.ClusterBackend` that carries plans out on Slurm.

Plan diff → Slurm actions (DESIGN §3 step 6), all through slurmrestd (requeue
through ``scontrol requeuehold``, which no REST version offers):

- **START**: the held job gets node list = the planned GPU's node, ``--gres=mps:<pct>``,
  a comment carrying the plan (``muxflow-job=… muxflow-gpu=<index> muxflow-pct=…
  muxflow-mem=… muxflow-kp=… muxflow-ki=… muxflow-kd=…``, read by the node scripts:
  the TaskProlog turns it into CUDA_*/XCUDA_* variables), eligible now and released —
  one update.
- **MIGRATE**: signal ``USR1`` (the runtime helper checkpoints), ``requeuehold`` (Slurm
  sends SIGTERM, then SIGKILL after KillWait), wait until it is pending again, then
  the START update for the new GPU and share.
- **EVICT**: ``USR1`` + ``requeuehold`` (a placed job not started yet is just held again).
- **KEEP**: nothing is sent.

Crash safety: ``round_runner.dispatch_round`` writes every action's intent (keyed
``r{round}:{action}:j{job}:g{gpu}:p{pct}``) before anything is sent and each result
after; this cluster marks an action ``sent`` in the log as soon as Slurm took it. An
action found ``intent`` or ``sent`` after a restart is sent again, and every action
first reads the job's state in Slurm and does only what is missing, so re-sending
never duplicates anything (jobs are never submitted by the dispatcher: each planned
job exists once, as its user submitted it).

Slurm unreachable: every call is retried with exponential backoff up to
``retry_deadline_s``; then :class:`SlurmUnavailable` is raised, the actions not
done keep their ``intent``/``sent`` rows with the error text (the plan stays
pending, ``muxflow slurm dispatch`` shows it) and the round stays ``planned``; the
next dispatch (Dagster retries, or the CLI again) completes it.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import select

from executors import round_runner
from executors.cluster import DispatchResult, IntervalReport, RunningJob
from executors.slurm.errors import SlurmError, SlurmRestError, SlurmTransportError
from executors.slurm.models import PENDING, RUNNING, Job
from executors.slurm.scontrol import ScontrolError
from executors.slurm.spec import JobUpdate
from executors.store import models as m
from scheduler_core.domain import Action, PlanAction, RoundResult

log = logging.getLogger(__name__)

SOURCE = "measured"
_FIELD = re.compile(r"muxflow-([a-z]+)=([^ ;]+)")


class SlurmUnavailable(RuntimeError):
    """slurmctld (or slurmrestd) did not answer within the retry deadline; the plan stays pending."""


class ActionFailed(RuntimeError):
    """Slurm refused an action for a reason retrying cannot fix."""


_GAIN_MAX = {"kp": 1000.0, "ki": 1000.0, "kd": 10.0}  # each gain's range is [0, max]


@dataclass(frozen=True)
class XcudaGains:
    """Gains of xCUDA's launch-rate PID (paper §4.1; ``XCUDA_KP``/``KI``/``KD``, executors/xcuda/README.md).

    The defaults are xCUDA's own; the ranges are the ones its configuration parser
    accepts (``executors/xcuda/src/config.c``), so a value the node would ignore is
    refused here, before anything is sent.
    """

    kp: float = 1.0   # 1, on ln(rate)
    ki: float = 20.0  # 1/s
    kd: float = 0.0   # s

    def __post_init__(self) -> None:
        for name, hi in _GAIN_MAX.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 <= v <= hi:
                raise ValueError(f"xcuda gains: {name} must be a number within [0, {hi:g}], got {v!r}")
            object.__setattr__(self, name, float(v))

    def comment_fields(self) -> list[str]:
        # repr: the shortest text that reads back as the same double (xCUDA parses it with strtod)
        return [f"muxflow-{name}={getattr(self, name)!r}" for name in _GAIN_MAX]


def plan_comment(job_id: int, gpu_index: int, pct: int, mem_bytes: int | None,
                 gains: XcudaGains | None = None) -> str:
    """The plan in the job's comment, for the node scripts (docs/SLURM.md "Node scripts")."""
    parts = [f"muxflow-job={job_id}", f"muxflow-gpu={gpu_index}", f"muxflow-pct={pct}"]
    if mem_bytes:
        parts.append(f"muxflow-mem={int(mem_bytes)}")
    if gains is not None:
        parts += gains.comment_fields()
    return " ".join(parts)


def parse_plan_comment(comment: str | None) -> dict[str, str]:
    return dict(_FIELD.findall(comment or ""))


def _transient(exc: Exception) -> bool:
    if isinstance(exc, SlurmTransportError):
        return True
    if isinstance(exc, SlurmRestError | ScontrolError):
        text = str(exc).lower()
        # slurmrestd up but slurmctld down: "Unable to contact slurm controller", connection refused…
        return any(w in text for w in ("contact", "connect", "timed out", "timeout", "unable to load",
                                       "communication", "socket", "refused", "resource temporarily"))
    return False


@dataclass
class Retry:
    deadline_s: float = 60.0
    first_wait_s: float = 0.2
    max_wait_s: float = 5.0
    sleep: Callable[[float], None] = time.sleep

    def call(self, what: str, fn: Callable[[], object]) -> object:
        end = time.monotonic() + self.deadline_s
        wait = self.first_wait_s
        while True:
            try:
                return fn()
            except SlurmError as exc:
                if not _transient(exc):
                    raise
                if time.monotonic() + wait > end:
                    raise SlurmUnavailable(f"{what}: Slurm unreachable for {self.deadline_s:.0f}s: {exc}") from exc
                log.warning("%s: %s; retrying in %.1fs", what, exc, wait)
                self.sleep(wait)
                wait = min(wait * 2, self.max_wait_s)


@dataclass
class SlurmCluster:
    """The live Slurm cluster as :class:`executors.cluster.Cluster`."""

    store: object
    client: object
    retry: Retry = field(default_factory=Retry)
    round_id: int | None = None
    partition: str = "offline"
    settle_timeout_s: float = 60.0
    simulated: bool = False
    gains: XcudaGains = field(default_factory=XcudaGains)

    # -- store lookups -------------------------------------------------------------------
    # What a plan's actions need from the store is read once per dispatch (:meth:`_lookups`),
    # not once per action: node and index of each GPU, Slurm id and memory of each job.
    _gpus: dict[int, tuple[str, int]] = field(default_factory=dict, init=False, repr=False)
    _jobs: dict[int, tuple[int | None, int]] = field(default_factory=dict, init=False, repr=False)

    def _lookups(self, job_ids: set[int], gpu_ids: set[int]) -> None:
        job_ids = sorted(job_ids - self._jobs.keys())
        gpu_ids = sorted(gpu_ids - self._gpus.keys())
        if not job_ids and not gpu_ids:
            return
        with self.store.session() as s:
            for chunk in (job_ids[i:i + 500] for i in range(0, len(job_ids), 500)):
                self._jobs.update((j, (sid, mem)) for j, sid, mem in s.execute(
                    select(m.OfflineJob.id, m.OfflineJob.slurm_job_id, m.OfflineJob.mem_bytes)
                    .where(m.OfflineJob.id.in_(chunk))))
            for chunk in (gpu_ids[i:i + 500] for i in range(0, len(gpu_ids), 500)):
                self._gpus.update((g, (node, index)) for g, node, index in s.execute(
                    select(m.Gpu.id, m.Node.name, m.Gpu.gpu_index).join(m.Node, m.Gpu.node_id == m.Node.id)
                    .where(m.Gpu.id.in_(chunk))))

    def _gpu(self, gpu_id: int) -> tuple[str, int]:
        self._lookups(set(), {gpu_id})
        if gpu_id not in self._gpus:
            raise ActionFailed(f"GPU {gpu_id} is not in the store")
        return self._gpus[gpu_id]

    def _gpu_ids(self) -> dict[tuple[str, int], int]:
        with self.store.session() as s:
            return {(g.node.name, g.gpu_index): g.id for g in s.scalars(select(m.Gpu))}

    def _job(self, job_id: int) -> tuple[int, int]:
        self._lookups({job_id}, set())
        sid, mem = self._jobs.get(job_id, (None, 0))
        if sid is None:
            raise ActionFailed(f"job {job_id} has no Slurm job")
        return int(sid), int(mem)

    def _get(self, sid: int) -> Job:
        return self.retry.call(f"read Slurm job {sid}", lambda: self.client.get_job(sid))  # type: ignore[return-value]

    # -- Cluster ---------------------------------------------------------------------------
    def running(self) -> dict[int, RunningJob]:
        """Offline jobs MuxFlow placed and Slurm has not held again: running, or released and about to."""
        gpus = self._gpu_ids()
        out: dict[int, RunningJob] = {}
        jobs = self.retry.call("list Slurm jobs", self.client.list_jobs)
        for j in jobs:  # type: ignore[union-attr]
            if self.partition not in j.partition.split(",") or j.held:
                continue
            if j.state not in (RUNNING, PENDING, "CONFIGURING", "REQUEUED"):
                continue
            plan = parse_plan_comment(j.comment)
            if "job" not in plan or "gpu" not in plan:
                continue
            node = j.nodes[0] if j.nodes else (j.required_nodes[0] if j.required_nodes else None)
            gpu_id = gpus.get((node, int(plan["gpu"]))) if node else None
            if gpu_id is None:
                continue
            out[int(plan["job"])] = RunningJob(int(plan["job"]), gpu_id, j.mps_pct)
        return out

    def dispatch(self, actions: list[PlanAction], now_utc: dt.datetime) -> list[DispatchResult]:
        self._lookups({a.job_id for a in actions if a.action != Action.KEEP},
                      {a.gpu_id for a in actions if a.gpu_id is not None})
        results = []
        for act in actions:
            try:
                detail = self._one(act)
                results.append(DispatchResult(act, True, detail))
                self._mark_sent(act, detail)
            except (ActionFailed, SlurmError) as exc:
                if isinstance(exc, SlurmError) and _transient(exc):
                    raise SlurmUnavailable(str(exc)) from exc
                log.warning("action %s failed: %s", act, exc)
                results.append(DispatchResult(act, False, str(exc)))
        return results

    def _mark_sent(self, act: PlanAction, detail: str) -> None:
        if self.round_id is None:
            return
        key = round_runner._action_key(self.round_id, act)
        with self.store.session() as s:
            row = s.scalars(select(m.DispatchLog).where(m.DispatchLog.action_key == key)).first()
            if row is not None and row.status == "intent":
                row.status, row.error = "sent", None

    # -- actions ----------------------------------------------------------------------------
    def _one(self, act: PlanAction) -> str:
        if act.action == Action.KEEP:
            return "kept"
        sid, mem = self._job(act.job_id)
        if act.action == Action.EVICT:
            return self._evict(sid)
        node, index = self._gpu(act.gpu_id)
        pct = int(act.sm_pct or 0)
        if act.action == Action.START:
            return self._place(act.job_id, sid, node, index, pct, mem, migrate=False)
        if act.action == Action.MIGRATE:
            return self._place(act.job_id, sid, node, index, pct, mem, migrate=True)
        raise ActionFailed(f"unknown action {act.action}")

    @staticmethod
    def _placed_as_planned(j: Job, node: str, pct: int, comment: str) -> bool:
        """Released on the planned node with the planned share and exactly the planned comment (GPU, gains…)."""
        where = j.nodes if j.state == RUNNING else j.required_nodes
        return (not j.held and not j.finished and tuple(where) == (node,) and j.mps_pct == pct
                and parse_plan_comment(j.comment) == parse_plan_comment(comment))

    def _place(self, job_id: int, sid: int, node: str, index: int, pct: int, mem: int, *, migrate: bool) -> str:
        comment = plan_comment(job_id, index, pct, mem, self.gains)
        j = self._get(sid)
        if self._placed_as_planned(j, node, pct, comment):
            return f"slurm job {sid} already on {node} GPU {index} at mps:{pct} (reconciled)"
        if j.finished:
            raise ActionFailed(f"slurm job {sid} is {j.state}; nothing to place")
        if j.state != PENDING:
            # Running (elsewhere, or with another share): checkpoint, requeue held, then place.
            # A pending job, held or released by an earlier try, is simply re-pinned by the update.
            self._checkpoint_and_requeue(sid)
            self._wait_pending(sid)
        update = JobUpdate(nodelist=node, gres_per_node=f"mps:{pct}", hold=False, eligible_now=True,
                           comment=comment)
        self.retry.call(f"place Slurm job {sid}", lambda: self.client.update_job(sid, update))
        return f"slurm job {sid} placed on {node} GPU {index} at mps:{pct}"

    def _evict(self, sid: int) -> str:
        j = self._get(sid)
        if j.finished:
            return f"slurm job {sid} already {j.state}"
        if j.state == PENDING:
            if j.held:
                return f"slurm job {sid} already held (reconciled)"
            self.retry.call(f"hold Slurm job {sid}", lambda: self.client.hold(sid))
            return f"slurm job {sid} held again before it started"
        self._checkpoint_and_requeue(sid)
        return f"slurm job {sid} signalled USR1 and requeued held"

    def _checkpoint_and_requeue(self, sid: int) -> None:
        try:
            self.retry.call(f"signal Slurm job {sid}", lambda: self.client.cancel(sid, signal="USR1"))
        except SlurmRestError as exc:  # it may have just finished; the requeue decides
            log.info("signal USR1 to %s: %s", sid, exc)
        j = self._get(sid)
        if j.state == PENDING and j.held:
            return
        self.retry.call(f"requeue Slurm job {sid}", lambda: self.client.requeue(sid, True))

    def _wait_pending(self, sid: int) -> Job:
        end = time.monotonic() + self.settle_timeout_s
        wait = 0.1
        while True:
            j = self._get(sid)
            if j.state == PENDING:
                return j
            if time.monotonic() > end:
                raise ActionFailed(f"slurm job {sid} still {j.state} {self.settle_timeout_s:.0f}s after requeue")
            time.sleep(wait)
            wait = min(wait * 2, 1.0)


@dataclass
class SlurmBackend:
    """Plans carried out on Slurm; profiling and sampling on its profile partition (executors.profiling)."""

    client_factory: Callable[[], object]
    retry_deadline_s: float = 60.0
    partition: str = "offline"
    simulated: bool = False
    source: str = SOURCE
    gains: XcudaGains = field(default_factory=XcudaGains)  # xCUDA's PID gains, sent with every placement

    def _client(self):
        return self.client_factory()

    def cluster(self, store, round_id: int | None = None) -> SlurmCluster:
        return SlurmCluster(store, self._client(), Retry(self.retry_deadline_s), round_id=round_id,
                            partition=self.partition, gains=self.gains)

    def profile_new_jobs(self, store, seed: int) -> int:
        """Solo-profile new jobs on the profile partition (executors.profiling; docs/PROFILING.md); jobs profiled."""
        from executors.profiling.backend import profile_on_slurm

        return len(profile_on_slurm(self, store, seed).profiled)

    def collect_samples(self, store, per_type: int, seed: int) -> dict[str, int]:
        """Co-location samples measured on the profile partition within the GPU-time budget, topped up with
        simulated ones while a GPU type has fewer than ``per_type`` (executors.profiling; docs/PROFILING.md)."""
        from executors.profiling.backend import sample_on_slurm

        return sample_on_slurm(self, store, per_type, seed)[0]

    def ensure_history(self, store, window_start: dt.datetime) -> int:
        """Online load history comes from the node agents (not yet): nothing is recorded here."""
        return 0

    def dispatch(self, store, round_id: int, result: RoundResult, now: dt.datetime) -> tuple[int, int]:
        cluster = self.cluster(store, round_id)
        try:
            return round_runner.dispatch_round(store, cluster, round_id, result, now)
        except SlurmUnavailable as exc:
            mark_pending(store, round_id, f"pending: {exc}")
            raise

    def observe(self, store, window_start: dt.datetime, minutes: int, round_id: int | None) -> IntervalReport | None:
        """Nothing is booked yet: the node agents will report executions and metrics.

        Refuses a window that has not passed; returns None (nothing booked) otherwise.
        """
        end = window_start + dt.timedelta(minutes=minutes)
        now = dt.datetime.now(dt.UTC)
        if end.tzinfo is None:
            end = end.replace(tzinfo=dt.UTC)
        if end > now:
            raise ValueError(f"window {window_start.isoformat()}+{minutes}min has not passed yet")
        log.info("Slurm backend: observation of %s is booked by the node agents (not yet available)", window_start)
        return None


def mark_pending(store, round_id: int, error: str) -> None:
    """Actions not done stay ``intent``/``sent``, with why they are pending."""
    with store.session() as s:
        for row in s.scalars(select(m.DispatchLog).where(m.DispatchLog.round_id == round_id,
                                                         m.DispatchLog.status.in_(["intent", "sent"]))):
            row.error = error[:2000]


def dispatch_status(store, round_id: int) -> dict[str, int]:
    with store.session() as s:
        out: dict[str, int] = {}
        for row in s.scalars(select(m.DispatchLog).where(m.DispatchLog.round_id == round_id)):
            out[row.status] = out.get(row.status, 0) + 1
        return out


def register_slurm_nodes(store, client) -> int:
    """Make the store's nodes and GPUs those of Slurm (``gpu:<type>:<n>`` per node); return GPUs added."""
    from executors.store import repo
    from scheduler_core.gpu_specs import get_spec

    added = 0
    nodes = client.list_nodes()
    with store.session() as s:
        for n in nodes:
            gtype = n.gpu_type
            count = n.gres_total("gpu")
            if not gtype or not count:
                continue
            repo.upsert_gpu_type(s, get_spec(gtype))
            row = s.scalars(select(m.Node).where(m.Node.name == n.name)).first()
            if row is None:
                row = m.Node(name=n.name, simulated=False)
                s.add(row)
                s.flush()
            have = {g.gpu_index for g in row.gpus}
            for i in range(count):
                if i not in have:
                    s.add(m.Gpu(node_id=row.id, gpu_index=i, gpu_type=gtype, uuid=f"slurm-{n.name}-gpu{i}"))
                    added += 1
    return added
