"""The Slurm dispatcher: a :class:`executors.cluster.ClusterBackend` that carries plans out on Slurm.

Plan diff → Slurm actions (docs/DESIGN.md §3 step 6), all through slurmrestd (requeue
through ``scontrol requeuehold``, which no REST version offers):

- **START**: the held job gets node list = the planned GPU's node, ``--gres=mps:<pct>`` (with
  ``name_gpus``, ``mps:<type>:<pct>`` naming the planned GPU where the node has one gres Type per GPU),
  the signed plan in its comment (:mod:`executors.slurm.plan`: GPU, share, memory quota, xCUDA's gains;
  the root Prolog verifies it, sets the MPS caps from it and hands it to the TaskProlog, which turns it
  into CUDA_*/XCUDA_* variables), eligible now and released — one update.
- **MIGRATE**: signal ``USR1`` (the runtime helper checkpoints), ``requeuehold`` (Slurm
  sends SIGTERM, then SIGKILL after KillWait), wait until it is pending again, then
  the START update for the new GPU and share, sent no earlier than the second after the requeue (slurmd
  refuses a launch in the second of the kill: :meth:`SlurmCluster._past_requeue_second`).
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
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from executors.cluster import DispatchResult, IntervalReport, RunningJob
from executors.scheduler import round_runner
from executors.scheduler.slurm.sync import sync_jobs
from executors.slurm import plan as plans
from executors.slurm.errors import SlurmError, SlurmRestError
from executors.slurm.hostlist import parse_gres, split_per_gpu_type
from executors.slurm.models import PENDING, RUNNING, Job, Node
from executors.slurm.retry import Retry, SlurmUnavailable, transient
from executors.slurm.spec import JobUpdate
from executors.store import dispatch as dispatch_log
from executors.store import inventory, repo
from executors.store import jobs as jobstore
from executors.store import models as m
from executors.store import rounds as rounds_db
from scheduler_core.domain import Action, PlanAction, RoundResult
from scheduler_core.gpu_specs import get_spec

log = logging.getLogger(__name__)

SOURCE = "measured"
REQUEUE_MARGIN_S = 0.1  # the wall clock's skew against Slurm's allowed for when releasing a requeued job


class ActionFailed(RuntimeError):
    """Slurm refused an action for a reason retrying cannot fix."""


_GAIN_MAX = {"kp": 1000.0, "ki": 1000.0, "kd": 10.0}  # each gain's range is [0, max]


@dataclass(frozen=True)
class XcudaGains:
    """Gains of xCUDA's launch-rate PID (paper §4.1; ``XCUDA_KP``/``KI``/``KD``, executors/node/xcuda/README.md).

    The defaults are xCUDA's own; the ranges are the ones its configuration parser
    accepts (``executors/node/xcuda/src/config.c``), so a value the node would ignore is
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


def placement_plan(job_id: int, slurm_job_id: int, gpu_index: int, pct: int, mem_bytes: int | None,
                   gains: XcudaGains | None = None) -> plans.Plan:
    """What a placement tells the node (executors.slurm.plan; docs/SLURM.md "Node scripts")."""
    g = gains or XcudaGains()
    # A quota below the plans' floor (a tiny profiled peak) is raised to it: the node never gets a quota near 0.
    return plans.Plan(slurm_job_id=slurm_job_id, job_id=job_id, kind="place", gpu_index=gpu_index, sm_pct=pct,
                      mem_bytes=max(int(mem_bytes), plans.MIN_MEM_BYTES) if mem_bytes else None, kp=g.kp, ki=g.ki,
                      kd=g.kd)


def _mps_gres(text: str | None) -> set[tuple[str | None, int]]:
    """The (Type, count) of each MPS entry of a GRES string: ``gres:mps:t4g2:40`` → {("t4g2", 40)}."""
    return {(g.type, g.count) for g in parse_gres(text) if g.name == "mps"}


@dataclass
class SlurmCluster:
    """The live Slurm cluster as :class:`executors.cluster.Cluster`."""

    starts_jobs_at_once = False  # released jobs are PLACED until Slurm starts them (executors.scheduler.slurm.sync)
    store: object
    client: object
    retry: Retry = field(default_factory=Retry)
    round_id: int | None = None
    partition: str = "offline"
    settle_timeout_s: float = 60.0
    simulated: bool = False
    gains: XcudaGains = field(default_factory=XcudaGains)
    # This host's wall clock, against Slurm's job times (a requeued job is released in a later second than
    # its requeue: :meth:`_past_requeue_second`), with a margin for the two clocks' skew.
    wall_clock: Callable[[], float] = time.time
    requeue_margin_s: float = REQUEUE_MARGIN_S
    # The key that signs the plans this cluster writes and reads back (executors.slurm.plan), or what reads it
    # (the deployment's key file, read when a plan is first written or read).
    plan_key: bytes | Callable[[], bytes] = b""

    # -- store lookups -------------------------------------------------------------------
    # What a plan's actions need from the store is read once per dispatch (:meth:`_lookups`),
    # not once per action: node and index of each GPU, Slurm id and memory of each job.
    _gpus: dict[int, tuple[str, int]] = field(default_factory=dict, init=False, repr=False)
    _jobs: dict[int, tuple[int | None, int]] = field(default_factory=dict, init=False, repr=False)
    _nodes: dict[str, Node] | None = field(default=None, init=False, repr=False)  # Slurm's, read once per dispatch
    # Name the planned GPU in the share where the node has one gres Type per GPU (docs/SLURM.md "One gres
    # Type per GPU"). On Slurm 22.05 a job placed so can only be placed again on the same GPU.
    name_gpus: bool = False

    def _lookups(self, job_ids: set[int], gpu_ids: set[int]) -> None:
        job_ids = sorted(job_ids - self._jobs.keys())
        gpu_ids = sorted(gpu_ids - self._gpus.keys())
        if not job_ids and not gpu_ids:
            return
        with self.store.session() as s:
            for chunk in (job_ids[i:i + 500] for i in range(0, len(job_ids), 500)):
                self._jobs.update(jobstore.slurm_ids_and_memory(s, chunk))
                if self.round_id is not None:
                    # xCUDA enforces the plan's memory quota (paper §4.1: up to 40 % of the device, within
                    # the forecast free memory), which is at least what the job declared.
                    for j, quota in rounds_db.planned_mem_quotas(s, self.round_id, chunk).items():
                        self._jobs[j] = (self._jobs[j][0], quota)
            for chunk in (gpu_ids[i:i + 500] for i in range(0, len(gpu_ids), 500)):
                self._gpus.update(inventory.gpu_locations(s, chunk))

    def _gpu(self, gpu_id: int) -> tuple[str, int]:
        self._lookups(set(), {gpu_id})
        if gpu_id not in self._gpus:
            raise ActionFailed(f"GPU {gpu_id} is not in the store")
        return self._gpus[gpu_id]

    def _gpu_ids(self) -> dict[tuple[str, int], int]:
        with self.store.session() as s:
            return {where: g for g, where in inventory.gpu_locations(s).items()}

    def _job(self, job_id: int) -> tuple[int, int]:
        self._lookups({job_id}, set())
        sid, mem = self._jobs.get(job_id, (None, 0))
        if sid is None:
            raise ActionFailed(f"job {job_id} has no Slurm job")
        return int(sid), int(mem)

    def _share(self, node: str, index: int, pct: int, job: Job) -> str:
        """``mps:<pct>`` (Slurm picks the GPU it accounts the share on), or with ``name_gpus`` on a node with one
        gres Type per GPU ``mps:<type>:<pct>`` naming the planned GPU (docs/SLURM.md)."""
        named = None
        if self.name_gpus:
            if self._nodes is None:
                nodes = self.retry.call("list Slurm nodes", self.client.list_nodes)
                self._nodes = {n.name: n for n in nodes}  # type: ignore[union-attr]
            gpu = self._nodes[node].gpu(index) if node in self._nodes else None
            named = gpu.share_type if gpu is not None else None
        held = job.mps_share_type
        if held is not None and held != named:
            # Slurm 22.05 adds a new Type next to a pending job's old one (the job would hold both
            # GPUs, or never start on another node), refuses an untyped share after a typed one,
            # and clearing a typed request crashes slurmctld: nothing can move this job.
            raise ActionFailed(f"slurm job {job.job_id} holds the MPS share Type {held} of an earlier placement; "
                               f"Slurm cannot change it to {named or 'an untyped share'} (docs/SLURM.md, "
                               "\"One gres Type per GPU\")")
        return f"mps:{named}:{pct}" if named else f"mps:{pct}"

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
            plan = plans.placed_plan(j, self._key())
            if plan is None:
                continue
            node = j.nodes[0] if j.nodes else (j.required_nodes[0] if j.required_nodes else None)
            # A typed share names the GPU Slurm accounts it on; an untyped one only the comment does.
            named = split_per_gpu_type(j.mps_share_type)
            gpu_id = gpus.get((node, named[1] if named else plan.gpu_index)) if node else None
            if gpu_id is None:
                continue
            out[plan.job_id] = RunningJob(plan.job_id, gpu_id, j.mps_pct)
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
                if isinstance(exc, SlurmError) and transient(exc):
                    raise SlurmUnavailable(str(exc)) from exc
                log.warning("action %s failed: %s", act, exc)
                results.append(DispatchResult(act, False, str(exc)))
        return results

    def _mark_sent(self, act: PlanAction, detail: str) -> None:
        if self.round_id is None:
            return
        key = round_runner._action_key(self.round_id, act)
        with self.store.session() as s:
            dispatch_log.mark_sent(s, key)

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

    def _key(self) -> bytes:
        if callable(self.plan_key):
            try:
                self.plan_key = self.plan_key()
            except ValueError as exc:  # SlurmConfigError: no key file, or one open to others
                raise ActionFailed(str(exc)) from exc
        if not self.plan_key:
            raise ActionFailed("no plan key: set slurm_plan_key_file (MUXFLOW_SLURM_PLAN_KEY_FILE; docs/SECURITY.md)")
        return self.plan_key

    def _placed_as_planned(self, j: Job, node: str, share: str, plan: plans.Plan) -> bool:
        """Released on the planned node with the planned share (GPU and percentage) and exactly the planned
        plan in its comment (GPU, gains…)."""
        where = j.nodes if j.state == RUNNING else j.required_nodes
        return (not j.held and not j.finished and tuple(where) == (node,)
                and _mps_gres(j.gres_per_node) == _mps_gres(share)
                and plans.placed_plan(j, self._key()) == plan)

    def _place(self, job_id: int, sid: int, node: str, index: int, pct: int, mem: int, *, migrate: bool) -> str:
        plan = placement_plan(job_id, sid, index, pct, mem, self.gains)
        comment = plans.encode(plan, self._key())
        j = self._get(sid)
        share = self._share(node, index, pct, j)
        if self._placed_as_planned(j, node, share, plan):
            return f"slurm job {sid} already on {node} GPU {index} at {share} (reconciled)"
        if j.finished:
            raise ActionFailed(f"slurm job {sid} is {j.state}; nothing to place")
        if j.state != PENDING:
            # Running (elsewhere, or with another share): checkpoint, requeue held, then place.
            # A pending job, held or released by an earlier try, is simply re-pinned by the update.
            self._checkpoint_and_requeue(sid)
            j = self._wait_pending(sid)
        if _mps_gres(j.gres_per_node) and j.mps_share_type is None and any(t for t, _ in _mps_gres(share)):
            # Slurm 22.05 turns an untyped share (plain sbatch --gres=mps:N) into a typed one only
            # from an empty request, which slurmrestd cannot send (docs/SLURM.md).
            self.retry.call(f"clear the GRES of Slurm job {sid}", lambda: self.client.clear_gres(sid))
        self._past_requeue_second(j)
        update = JobUpdate(nodelist=node, gres_per_node=share, hold=False, eligible_now=True, comment=comment)
        self.retry.call(f"place Slurm job {sid}", lambda: self.client.update_job(sid, update))
        return f"slurm job {sid} placed on {node} GPU {index} at {share}"

    def _past_requeue_second(self, j: Job) -> None:
        """Wait, if need be, until the wall-clock second after the job's last requeue.

        slurmd refuses to launch a job whose credential is not newer, in whole seconds, than the kill of its
        previous run ("Job N already killed, do not launch batch job"), and Slurm then ends the job FAILED.
        A job released within the second of its requeue can be started in that second (reproduced on Slurm
        22.05, the node free at once). A requeued job's submit time is its requeue (Slurm's clock, on or after
        the kill), so the release waits for the next second of it: never more than a second, and only for a
        job requeued just now (a migration, or an eviction the round before). A job never requeued (Slurm's
        restart count 0) was never killed, and is released at once, however recently it was submitted. A
        begin time in the next second would do the same but leaves the job to Slurm's next periodic
        scheduling pass (tens of seconds).
        """
        wait = requeue_second_wait_s(j, self.wall_clock(), self.requeue_margin_s)
        if wait > 0:
            self.retry.sleep(wait)

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
        clock, sleep = self.retry.clock, self.retry.sleep  # the retry's clock: fake in tests
        end = clock() + self.settle_timeout_s
        wait = 0.1
        while True:
            j = self._get(sid)
            if j.state == PENDING:
                return j
            if clock() > end:
                raise ActionFailed(f"slurm job {sid} still {j.state} {self.settle_timeout_s:.0f}s after requeue")
            sleep(wait)
            wait = min(wait * 2, 1.0)


@dataclass
class SlurmBackend:
    """Plans carried out on Slurm, and what Slurm did followed (profiling is executors.scheduler.profiling.backend.SlurmProfiler)."""

    client_factory: Callable[[], object]
    retry_deadline_s: float = 60.0
    partition: str = "offline"
    simulated: bool = False
    source: str = SOURCE
    gains: XcudaGains = field(default_factory=XcudaGains)  # xCUDA's PID gains, sent with every placement
    name_gpus: bool = False  # name the planned GPU in each share (SlurmCluster.name_gpus; docs/SLURM.md)
    plan_key: bytes | Callable[[], bytes] = b""  # signs the plans (executors.slurm.plan), or reads the key

    def _client(self):
        return self.client_factory()

    def cluster(self, store, round_id: int | None = None) -> SlurmCluster:
        return SlurmCluster(store, self._client(), Retry(self.retry_deadline_s), round_id=round_id,
                            partition=self.partition, gains=self.gains, name_gpus=self.name_gpus,
                            plan_key=self.plan_key)

    def sync_jobs(self, store, now: dt.datetime):
        """Job states follow Slurm: started, finished, requeued, evicted jobs held and queued (executors.scheduler.slurm.sync)."""
        return sync_jobs(self.cluster(store), now)

    def ensure_history(self, store, window_start: dt.datetime) -> int:
        """Online load history comes from the node agents' minute rows: nothing to record here."""
        return 0

    def dispatch(self, store, round_id: int, result: RoundResult, now: dt.datetime) -> tuple[int, int]:
        cluster = self.cluster(store, round_id)
        try:
            return round_runner.dispatch_round(store, cluster, round_id, result, now)
        except SlurmUnavailable as exc:
            mark_pending(store, round_id, f"pending: {exc}")
            raise

    def observe(self, store, window_start: dt.datetime, minutes: int, round_id: int | None) -> IntervalReport | None:
        """What Slurm did since the dispatch: the job-state sync (the node agents book metrics, evictions
        and health themselves). Returns None: nothing is booked from here but the sync's transitions."""
        self.sync_jobs(store, dt.datetime.now(dt.UTC))
        return None


def mark_pending(store, round_id: int, error: str) -> None:
    """Actions not done stay ``intent``/``sent``, with why they are pending."""
    with store.session() as s:
        dispatch_log.note_unfinished(s, round_id, error)


def dispatch_status(store, round_id: int) -> dict[str, int]:
    """The round's dispatch log by status (intent, sent, done, failed)."""
    with store.session() as s:
        return rounds_db.dispatch_counts(s, round_id)


def register_slurm_nodes(store, client) -> int:
    """Make the store's nodes and GPUs those of Slurm; return GPUs added.

    A node's GPUs come from its GRES, detected per node (:attr:`executors.slurm.models.Node.gpus`):
    ``gpu:<model>:<n>``, or one Type per GPU (``gpu:t4g0:1,…``). The store's GPU type is the model
    (``t4``) and a GPU's index is Slurm's (from its per-GPU Type where there is one).
    """
    added = 0
    nodes = client.list_nodes()
    with store.session() as s:
        for n in nodes:
            gpus = n.gpus
            if not gpus:
                continue
            repo.upsert_gpu_type(s, get_spec(n.gpu_type))
            row = inventory.node_named(s, n.name)
            if row is None:
                row = m.Node(name=n.name, simulated=False)
                s.add(row)
                s.flush()
            have = {g.gpu_index for g in row.gpus}
            for g in gpus:
                if g.index not in have:
                    s.add(m.Gpu(node_id=row.id, gpu_index=g.index, gpu_type=g.model,
                                uuid=f"slurm-{n.name}-gpu{g.index}"))
                    added += 1
    return added


def requeue_second_wait_s(j: Job, now: float, margin_s: float = REQUEUE_MARGIN_S) -> float:
    """Seconds to wait before releasing ``j`` so that Slurm starts it in a wall-clock second after its last
    requeue's (:meth:`SlurmCluster._past_requeue_second` says why); 0 for a job never requeued, or when the clocks
    disagree by more than that second (``now``: the wall clock, in seconds since the epoch)."""
    if j.submit_time_utc is None or not j.restart_count:
        return 0.0
    wait = math.floor(j.submit_time_utc.timestamp()) + 1 + margin_s - now
    return wait if 0 < wait <= 1 + margin_s else 0.0
