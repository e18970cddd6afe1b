"""Solo profiling in place: a user's own Slurm job runs its profiling window on the profile partition.

MuxFlow never runs a user's code itself, nor a copy of it under its own identity: Slurm runs the job, as its
owner, with the owner's environment, groups and files. To profile a new offline job (paper §6), MuxFlow opens a
*profiling window*: it moves the held job to the profile partition, pins it to a node with a free GPU of the type
to profile, asks for the whole GPU (``mps:100``: no other MPS job shares it), writes the signed window plan into
its comment (:mod:`executors.slurm.plan`, kind ``profile``) and releases it. On the node:

- the Prolog verifies the plan, makes the job's own directory, and gives the GPU whole to it through its MPS
  control daemon;
- the TaskProlog exports the GPU and ``MUXFLOW_ITERATION_REPORT`` (a job using :class:`executors.job.runtime.Runtime`
  times its iterations there, and otherwise trains as always, checkpoints included);
- the node agent (:mod:`executors.node.profile_windows`) samples the GPU, reads that report and writes both into
  the profiling run's row.

The profiler (:class:`WindowProfiler`) closes the window once the row holds enough iterations, or after the
window's seconds: a requeue-hold (Slurm's SIGTERM: the job checkpoints and keeps its progress), then the job goes
back to the offline partition, held, its comment cleared. A job that ends inside its window ended: DONE or FAILED
as Slurm says. One window per job at a time, one per GPU type it may run on.

What MuxFlow needs of Slurm for this is what it needs to place jobs: Slurm's Operator level (update, release and
requeue other users' jobs). Everything here is idempotent: each call reads the job first and does only what is
missing, so a profiler that restarts carries on.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from executors.scheduler.profiling.outcome import ProfileOutcome, classify_window
from executors.scheduler.profiling.runs import (
    PHASE_FINISHED,
    PHASE_PENDING,
    PHASE_RUNNING,
    ExecStatus,
    ExecutorError,
    ExecutorUnavailable,
)
from executors.scheduler.profiling.settings import ProfilingSettings, deadline_s
from executors.scheduler.profiling.slurm_exec import call_slurm
from executors.scheduler.profiling.solo import ProfilingSummary, SoloProfiler
from executors.scheduler.slurm.sync import view_of
from executors.slurm import plan as plans
from executors.slurm.client import SlurmNotFound
from executors.slurm.hostlist import split_per_gpu_type
from executors.slurm.models import PENDING, Job, Node
from executors.slurm.retry import Retry
from executors.slurm.spec import JobUpdate
from executors.store import models as m
from executors.store import profiling as profstore
from executors.store import repo
from executors.store.db import Store
from executors.store.jobs import IllegalTransition, transition
from scheduler_core.domain import JobState
from scheduler_core.jobs.sync import ClusterView, Seen, decide

log = logging.getLogger(__name__)
_RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED"})
WHOLE_GPU = "mps:100"  # with Count=100 per GPU: all of one GPU's MPS, so no other MPS job shares it


@dataclass(frozen=True)
class WindowPlace:
    node: str
    gpu_index: int


def free_gpus(nodes: list[Node], partition: str, gpu_type: str, busy: set[tuple[str, int]]) -> list[WindowPlace]:
    """GPUs of ``gpu_type`` in ``partition`` on usable nodes with no MPS share in use on them (Slurm's typed
    accounting where the node has one gres Type per GPU; a node with untyped GPUs counts its shares in use, the
    lowest indices first) and not ``busy`` (windows open already); the node with the most free GPUs first."""
    out: list[tuple[int, str, int]] = []
    for n in nodes:
        if partition not in n.partitions or not n.usable or n.gpu_type != gpu_type:
            continue
        gpus = [g.index for g in n.gpus]
        used_by_type: dict[int, int] = {}
        untyped = 0
        for g in n.gres_used:
            if g.name != "mps" or not g.count:
                continue
            split = split_per_gpu_type(g.type) if g.type else None
            if split is not None:
                used_by_type[split[1]] = used_by_type.get(split[1], 0) + g.count
            else:
                untyped += g.count
        whole = math.ceil(untyped / 100) if untyped else 0  # untyped shares: at least this many GPUs in use
        free = [i for i in gpus if not used_by_type.get(i) and (n.name, i) not in busy][whole:]
        out += [(-len(free), n.name, i) for i in free]
    return [WindowPlace(name, i) for _, name, i in sorted(out)]


class SlurmProfileWindows:
    """Opens, follows and closes the profiling windows of users' own Slurm jobs, through slurmrestd."""

    kind = "slurm-window"
    persistent = True  # a window's handle is the job's own Slurm id

    def __init__(self, client, plan_key: bytes, partition: str = "profile", offline_partition: str = "offline",
                 retry_deadline_s: float = 30.0):
        if not plan_key:
            raise ValueError("profiling windows need the plan key (slurm_plan_key_file)")
        self.client = client
        self.key = plan_key
        self.partition = partition
        self.offline_partition = offline_partition
        self.retry = Retry(retry_deadline_s)

    def _call(self, what: str, fn):
        return call_slurm(self.retry, what, fn)

    def _job(self, sid: int) -> Job | None:
        try:
            return self._call(f"read Slurm job {sid}", lambda: self.client.get_job(sid))
        except SlurmNotFound:
            return None

    def _window_plan(self, j: Job, run_id: int | None) -> plans.Plan | None:
        """The job's verified window plan for ``run_id`` (None: for any run)."""
        p = plans.try_decode(j.comment, self.key, j.job_id)
        return p if p is not None and p.kind == "profile" and run_id in (None, p.run_id) else None

    def open(self, *, run_id: int, job_id: int, slurm_job_id: int, gpu_type: str,
             busy: set[tuple[str, int]]) -> WindowPlace | None:
        """Open run ``run_id``'s window for the held job; where it is, or None while no GPU of the type is free."""
        j = self._job(slurm_job_id)
        if j is None or j.finished:
            raise ExecutorError(f"Slurm job {slurm_job_id} is {'gone' if j is None else j.state}: nothing to profile")
        plan = self._window_plan(j, run_id)
        if plan is not None and not j.held:  # opened by an earlier call (a restart after sending)
            where = j.nodes or j.required_nodes
            return WindowPlace(where[0], plan.gpu_index) if where else None
        if j.state != PENDING:
            raise ExecutorError(f"Slurm job {slurm_job_id} is {j.state}, not waiting for MuxFlow: it cannot be "
                                "profiled in place")
        nodes = self._call(f"list the {self.partition} partition's nodes", self.client.list_nodes)
        places = free_gpus(nodes, self.partition, gpu_type, busy)
        if not places:
            return None
        place = places[0]
        window = plans.Plan(slurm_job_id=slurm_job_id, job_id=job_id, kind="profile", gpu_index=place.gpu_index,
                            run_id=run_id)
        update = JobUpdate(partition=self.partition, nodelist=place.node, gres_per_node=WHOLE_GPU,
                           comment=plans.encode(window, self.key), eligible_now=True, hold=False)
        self._call(f"open the profiling window of Slurm job {slurm_job_id}",
                   lambda: self.client.update_job(slurm_job_id, update))
        log.info("Slurm job %s: profiling window (run %s) on %s GPU %s", slurm_job_id, run_id, place.node,
                 place.gpu_index)
        return place

    def status(self, slurm_job_id: int, run_id: int) -> ExecStatus:
        """Run ``run_id``'s window: pending (released, not started), running, or finished (the job is held again,
        or ended, or gone)."""
        j = self._job(slurm_job_id)
        if j is None:
            return ExecStatus(PHASE_FINISHED, state="UNKNOWN (purged)")
        in_window = self._window_plan(j, run_id) is not None
        node = j.nodes[0] if j.nodes else None
        if j.state == PENDING and in_window and not j.held:
            return ExecStatus(PHASE_PENDING, None, None, j.state)
        if j.state in _RUNNING_STATES and in_window:
            return ExecStatus(PHASE_RUNNING, j.start_time_utc, node, j.state)
        if j.finished:
            return ExecStatus(PHASE_FINISHED, j.start_time_utc, node, j.state, j.exit_code)
        return ExecStatus(PHASE_FINISHED, j.start_time_utc, node, "HELD" if j.held else j.state)

    def close(self, slurm_job_id: int, run_id: int | None) -> bool:
        """End run ``run_id``'s window (None: whichever window the job is in): requeue-hold the job if it runs in it
        (Slurm's SIGTERM: a job that checkpoints does), then, once it waits held, back to the offline partition with
        its comment cleared. True when the job is back (or
        ended): call again until then."""
        j = self._job(slurm_job_id)
        if j is None or j.finished:
            return True
        in_window = self._window_plan(j, run_id) is not None
        if j.state != PENDING:
            if not in_window:
                return True  # running on a placement: not this window's to close
            self._call(f"requeue Slurm job {slurm_job_id} held", lambda: self.client.requeue(slurm_job_id, True))
            return False
        if not j.held:
            self._call(f"hold Slurm job {slurm_job_id}", lambda: self.client.hold(slurm_job_id))
        if in_window or self.partition in j.partition.split(","):
            self._call(f"return Slurm job {slurm_job_id} to the {self.offline_partition} partition",
                       lambda: self.client.update_job(slurm_job_id, JobUpdate(partition=self.offline_partition,
                                                                              comment="")))
        return True

    def cluster_views(self, slurm_job_ids: list[int]) -> dict[int, ClusterView]:
        by_id = {j.job_id: j for j in self._call("list Slurm jobs", self.client.list_jobs)}
        return {sid: view_of(by_id.get(sid)) for sid in slurm_job_ids}


class WindowProfiler(SoloProfiler):
    """Solo profiling of new jobs in their own profiling windows (:class:`SlurmProfileWindows`), one GPU type at a
    time: the run row is written before the window opens, its report is the node agent's, and the window closes
    when the report holds ``iterations`` measured iterations, after ``profile_seconds`` (a job still starting up that
    has announced its iterations: a margin before the bound), or at the bound."""

    def __init__(self, store: Store, windows: SlurmProfileWindows, settings: ProfilingSettings = ProfilingSettings(),
                 seed: int = 0, now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC), **kw):
        super().__init__(store, windows, settings, seed, now=now, **kw)
        self.windows = windows

    # -- starting ---------------------------------------------------------------------------------
    def start_new(self, summary: ProfilingSummary) -> None:
        with self.store.session() as s:
            jobs = [(j.id, j.state, j.job_type, list(j.allowed_gpu_types), j.slurm_job_id)
                    for j in _jobs(s, [JobState.SUBMITTED, JobState.PROFILING])]
            open_jobs = {r.job_id for r in profstore.open_profiling_runs(s)}
        ended = self._drop_ended([(job_id, state, sid) for job_id, state, _, _, sid in jobs], summary)
        for job_id, state, job_type, gpu_types, sid in jobs:
            if job_id in ended or job_id in open_jobs:
                continue
            if sid is None:
                self._fail_job(job_id, "profiling failed: the job has no Slurm job to profile in place", summary)
                continue
            if state == JobState.SUBMITTED.value and not self._begin(
                    job_id, f"profiling windows on the {self.settings.partition} partition", gpu_types):
                continue
            self._next_window(job_id, job_type, gpu_types, int(sid), summary)

    def _next_window(self, job_id: int, job_type: str, gpu_types: list[str], sid: int,
                     summary: ProfilingSummary) -> None:
        """The job's next window (the first GPU type without a profile), or PENDING when every type has one."""
        todo = self._still_to_profile(job_id, job_type, gpu_types, summary)
        if not todo:
            return
        with self.store.session() as s:
            run = m.ProfilingRun(job_id=job_id, gpu_type=todo[0], state="submitted", run_dir="", slurm_job_id=sid,
                                 bound_s=self.settings.bound_s, submitted_utc=self.now())
            s.add(run)
            s.flush()
            run_id = run.id
        self._open(run_id, summary)

    def _busy(self) -> set[tuple[str, int]]:
        with self.store.session() as s:
            return {(r.node, r.gpu_index) for r in profstore.open_profiling_runs(s)
                    if r.node is not None and r.gpu_index is not None}

    def _open(self, run_id: int, summary: ProfilingSummary) -> bool:
        """Open the run's window; False while no GPU is free (the run waits, up to ``max_queue_s``)."""
        with self.store.session() as s:
            run = s.get(m.ProfilingRun, run_id)
            job_id, gtype, sid = run.job_id, run.gpu_type, int(run.slurm_job_id)
        try:
            place = self.windows.open(run_id=run_id, job_id=job_id, slurm_job_id=sid, gpu_type=gtype, busy=self._busy())
        except ExecutorUnavailable as exc:
            log.warning("profiling run %s: Slurm unavailable (%s); the window opens on a later call", run_id, exc)
            return False
        except ExecutorError as exc:
            self._end_run(run_id, False, f"could not open the profiling window: {exc}", summary)
            return False
        if place is None:
            return False
        with self.store.session() as s:
            run = s.get(m.ProfilingRun, run_id)
            run.node, run.gpu_index, run.run_dir = place.node, place.gpu_index, f"slurm-window:{place.node}"
        summary.submitted += 1
        return True

    # -- following --------------------------------------------------------------------------------
    def poll_once(self, summary: ProfilingSummary) -> int:
        with self.store.session() as s:
            jobs = {j.id: (j.state, j.state_reason, j.slurm_job_id) for j in (
                s.get(m.OfflineJob, i) for i in sorted({r.job_id for r in profstore.open_profiling_runs(s)}))}
        gone = {j: reason for j, (state, reason, _) in jobs.items()
                if state not in (JobState.SUBMITTED.value, JobState.PROFILING.value)}
        for job_id, reason in gone.items():
            self._fail_job(job_id, "", summary, runs_reason=f"the job ended before it was profiled: {reason}")
        with self.store.session() as s:
            runs = [(r.id, r.job_id, r.slurm_job_id, r.state, r.submitted_utc, r.started_utc, r.bound_s,
                     r.gpu_index, r.report) for r in profstore.open_profiling_runs(s)]
        left = 0
        for run_id, job_id, sid, state, submitted, started, bound_s, gpu_index, report in runs:
            now = self.now()
            if gpu_index is None:  # not opened yet: no GPU was free
                if (now - submitted).total_seconds() > self.settings.max_queue_s:
                    self._end_run(run_id, False, f"no GPU of its type free on the {self.settings.partition} "
                                                 f"partition within {self.settings.max_queue_s:.0f} s", summary)
                    continue
                self._open(run_id, summary)
                left += 1
                continue
            try:
                st = self.windows.status(int(sid), run_id)
            except ExecutorUnavailable as exc:
                log.warning("profiling run %s: status unavailable: %s", run_id, exc)
                left += 1
                continue
            if st.phase == PHASE_FINISHED:
                try:
                    if not self.windows.close(int(sid), run_id):
                        left += 1
                        continue
                except ExecutorUnavailable:
                    left += 1
                    continue
                except ExecutorError as exc:
                    log.warning("profiling run %s: %s", run_id, exc)
                self._window_ended(run_id, job_id, st, summary)
                continue
            if st.phase == PHASE_PENDING:
                if (now - submitted).total_seconds() > self.settings.max_queue_s:
                    self._close_quietly(int(sid), run_id)
                    self._end_run(run_id, False, f"not started on the {self.settings.partition} partition within "
                                                 f"{self.settings.max_queue_s:.0f} s", summary)
                    continue
                left += 1
                continue
            started = started or st.started_utc or now
            if state != "running":
                with self.store.session() as s:
                    run = s.get(m.ProfilingRun, run_id)
                    run.state, run.started_utc, run.node = "running", started, st.node or run.node
            if self._window_done(report, (now - started).total_seconds(), bound_s):
                self._close_quietly(int(sid), run_id)
            left += 1
        return left

    def _window_done(self, report: dict | None, elapsed_s: float, bound_s: float) -> bool:
        """Enough measured iterations; else ``profile_seconds``, except for a job that has announced iterations
        (its iteration report, none counted yet: still starting up), which has until a margin before the bound."""
        it = (report or {}).get("iteration_report") or {}
        n = it.get("iterations") if isinstance(it.get("iterations"), int) else 0
        if (n >= self.settings.iterations and bool((report or {}).get("metrics"))) or elapsed_s >= bound_s:
            return True
        if elapsed_s < self.settings.profile_seconds:
            return False
        announced = isinstance(it, dict) and it.get("total_iterations") == 0 and it.get("final") is False
        return not announced or elapsed_s >= deadline_s(self.settings.profile_seconds, bound_s)

    def _close_quietly(self, sid: int, run_id: int | None) -> None:
        try:
            self.windows.close(sid, run_id)
        except (ExecutorUnavailable, ExecutorError) as exc:
            log.warning("closing the window of Slurm job %s: %s (tried again)", sid, exc)

    def _window_ended(self, run_id: int, job_id: int, st: ExecStatus, summary: ProfilingSummary) -> None:
        with self.store.session() as s:
            run = s.get(m.ProfilingRun, run_id)
            report, node, started = run.report, run.node, run.started_utc
            job = s.get(m.OfflineJob, job_id)
            job_type, gpu_types, sid = job.job_type, list(job.allowed_gpu_types), job.slurm_job_id
        out: ProfileOutcome = classify_window(report, slurm_state=st.state, exit_code=st.exit_code,
                                              node=node or st.node, started=started is not None or
                                              st.started_utc is not None)
        if st.state not in ("HELD", PENDING, None):
            # The job itself ended inside its window: its profile is kept if measured, and the job ends as Slurm says.
            with self.store.session() as s:
                run = s.get(m.ProfilingRun, run_id)
                run.report, run.node = report, run.node or st.node
                run.state, run.reason = ("done" if out.ok else "failed"), out.reason[:4000]
                run.finished_utc = self.now()
                if out.ok:
                    repo.save_profile(s, job_id, run.gpu_type, out.features, out.source, out.method,
                                      slurm_job_id=run.slurm_job_id, **out.measured)
                gtype = run.gpu_type
            summary.runs.append({"run": run_id, "job": job_id, "gpu_type": gtype, "ok": out.ok, "reason": out.reason,
                                 "seconds": float((report or {}).get("elapsed_s") or 0.0)})
            self._job_ended_in_window(job_id, st, out, summary)
            return
        if out.ok and report is not None:  # known before the job can be PENDING (placed by a round)
            seen = set(report.get("checkpoint_signals") or ()) if not report.get("shell_dies_first") else set()
            with self.store.session() as s:
                job = s.get(m.OfflineJob, job_id)
                job.checkpointing = checkpointing_after_window(job.checkpointing, seen)
        self._record_finished(run_id, out, report, st, summary)
        with self.store.session() as s:
            state = s.get(m.OfflineJob, job_id).state
        if out.ok and state == JobState.PROFILING.value and sid is not None:
            self._next_window(job_id, job_type, gpu_types, int(sid), summary)

    def _job_ended_in_window(self, job_id: int, st: ExecStatus, out: ProfileOutcome,
                             summary: ProfilingSummary) -> None:
        """The job itself ended inside its window: DONE (it ran to its end) or FAILED, as Slurm says."""
        view = view_of_status(st)
        with self.store.session() as s:
            job = s.get(m.OfflineJob, job_id)
            if job.state != JobState.PROFILING.value:
                return
            for step in decide(JobState.PROFILING, view).steps:
                try:
                    transition(s, job_id, step.target, step.reason, expected=JobState.PROFILING,
                               at_utc=step.at_utc)
                except IllegalTransition as exc:
                    log.info("job %s: %s", job_id, exc)
                    return
            final = s.get(m.OfflineJob, job_id).state
        if final == JobState.FAILED.value:
            summary.failed[job_id] = out.reason if not out.ok else "failed in its profiling window"

    def _cancel(self, handle: int) -> None:
        """A run of a job that failed or ended: its window closes (the job itself is never cancelled here)."""
        self._close_quietly(handle, None)


def checkpointing_after_window(before: str | None, caught: set[str]) -> str | None:
    """What a window tells of a job's checkpointing. The comment's word stands (``declared``, ``none``);
    otherwise a job seen catching SIGUSR1 or SIGTERM is ``detected`` (and stays so), one not seen is
    ``undetected`` until a later window sees it."""
    if before in ("declared", "none", "detected"):
        return before
    return "detected" if caught & {"SIGUSR1", "SIGTERM"} else "undetected"


def view_of_status(st: ExecStatus) -> ClusterView:
    """A finished window's status as the job-state sync reads a Slurm job."""
    if st.state == "COMPLETED" and not st.exit_code:
        seen = Seen.COMPLETED
    elif st.state == "CANCELLED":
        seen = Seen.CANCELLED
    elif st.state and st.state.startswith("UNKNOWN"):
        seen = Seen.ABSENT
    else:
        seen = Seen.FAILED
    return ClusterView(seen, st.state or "", st.exit_code, st.started_utc)


def _jobs(s, states):
    return repo.jobs_in_states(s, states)
