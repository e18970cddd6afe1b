"""The one owner of offline-job state on Slurm: what Slurm did to a job becomes the store's state.

Slurm starts a placed job (PLACED → RUNNING, at Slurm's start time), finishes it
(→ DONE, or FAILED with Slurm's state, reason and exit code), requeues it after a
node failure (→ PENDING, and it is held so that only a round places it again), and
finishes the requeue-hold of an eviction (EVICTED → PENDING). A placed job that Slurm delayed after its release
(a requeue that finished later pushes its begin time ahead) is made eligible again. A job Slurm no longer
knows is FAILED with that reason. Nodes Slurm says are unusable take their GPUs out of the rounds
and hand their jobs back (:mod:`executors.scheduler.slurm.node_faults`). The decisions are
:func:`scheduler_core.jobs.sync.decide`;
this module reads Slurm once per call (one job listing), applies them with
compare-and-set transitions (audited in ``job_transitions``) and books each stretch
of running that ended as a ``job_executions`` row (steps from the job's checkpoints
when the scheduler host can read its checkpoint directory).

Idempotent and crash-safe: every call starts from what Slurm and the store say now;
a change already made is not made again, and a hold is sent before the store moves,
so a crash between the two is finished by the next call. Jobs with dispatch actions
in flight (the latest round, still being dispatched) are left to the dispatcher, and
jobs whose store state moved while Slurm was asked (a dispatch booked, a job picked
up) to the next call: a listing older than the state says nothing about it.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import pwd
import stat

from executors.cluster import ExecutionRecord, JobSyncReport
from executors.job.runtime.checkpoint import NAME as CHECKPOINT_NAME
from executors.scheduler.slurm import node_faults
from executors.slurm.models import FINISHED_STATES, PENDING, Job
from executors.slurm.spec import JobUpdate
from executors.store import jobs as jobstore
from executors.store import models as m
from executors.store import profiling as profstore
from executors.store import repo
from executors.store import rounds as rounds_db
from scheduler_core.domain import JobState
from scheduler_core.jobs.sync import ClusterView, Decision, Seen, decide

log = logging.getLogger(__name__)

SOURCE = "measured"
# States a store job can be in while Slurm holds its fate.
WATCHED = (JobState.SUBMITTED, JobState.PROFILING, JobState.PENDING, JobState.PLACED, JobState.RUNNING,
           JobState.EVICTED)
_RUNNING_LIKE = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STAGE_OUT", "SIGNALING",
                           "RESIZING", "STOPPED"})


def view_of(job: Job | None) -> ClusterView:
    """What Slurm's record of a job means for the store."""
    if job is None:
        return ClusterView(Seen.ABSENT)
    reason = job.state if not job.state_reason or job.state_reason == "None" else f"{job.state}: {job.state_reason}"
    if job.state in _RUNNING_LIKE:
        seen = Seen.RUNNING
    elif job.state == PENDING:
        seen = Seen.HELD if job.held else Seen.WAITING
    elif job.state == "COMPLETED":
        seen = Seen.COMPLETED if not job.exit_code else Seen.FAILED
    elif job.state == "CANCELLED":
        seen = Seen.CANCELLED
    elif job.state in FINISHED_STATES:
        seen = Seen.FAILED
    else:  # REQUEUED, REQUEUE_HOLD, REQUEUE_FED, SPECIAL_EXIT, … or a state newer than this code: not an end
        seen = Seen.CHANGING
    # Released but not to start before its begin time: Slurm's reason for a job it delays (BeginTime)
    delayed = seen == Seen.WAITING and job.state_reason == "BeginTime"
    return ClusterView(seen, reason, job.exit_code, job.start_time_utc, job.end_time_utc, delayed=delayed)


def sync_jobs(cluster, now: dt.datetime | None = None) -> JobSyncReport:
    """Bring the store's offline jobs in line with Slurm (``cluster``: a :class:`SlurmCluster`)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    store = cluster.store
    def read_store():
        with store.session() as s:
            return ([(j.id, int(j.slurm_job_id), JobState(j.state), j.checkpoint_dir)
                     for j in jobstore.live_cluster_jobs(s, WATCHED)], jobstore.in_flight_job_ids(s))

    watched, busy_before = read_store()
    report = JobSyncReport()
    if not watched:
        return report
    state_before = {job_id: state for job_id, _, state, _ in watched}
    jobs = cluster.retry.call("list Slurm jobs", cluster.client.list_jobs)
    # Node faults first: jobs stranded on unusable nodes are held (read again), their GPUs leave the rounds.
    nodes = cluster.retry.call("list Slurm nodes", cluster.client.list_nodes)
    node_faults.mark_gpus(store, nodes, now)
    if node_faults.hand_back(cluster, jobs, nodes, {sid for _, sid, _, _ in watched}):
        jobs = cluster.retry.call("list Slurm jobs", cluster.client.list_jobs)
    by_id = {j.job_id: j for j in jobs}
    # The store again, after Slurm's answer: a dispatcher logs its intent before it asks Slurm, so a job Slurm
    # shows released is booked (PLACED) or in flight (skipped) here — never adopted as if nobody had placed it.
    # Read before the listing, a release between the two reads looked like an administrator's.
    # Only jobs whose state is the same in both reads are decided: the listing is then no older than the state.
    # A job that moved between them (a dispatch booked after Slurm answered: PLACED while the listing still shows
    # it held), or that is new (picked up after the listing: absent from it), is the next call's.
    watched, busy = read_store()
    for job_id, sid, state, ckpt_dir in watched:
        if job_id in busy or job_id in busy_before:
            report.skipped_in_flight += 1
            continue
        if state_before.get(job_id) != state:
            report.moved_meanwhile += 1
            continue
        sjob = by_id.get(sid)
        decision = decide(state, view_of(sjob))
        if not decision.changes:
            continue
        if decision.hold:
            try:
                _hold(cluster, sjob)
                report.held.append(sid)
            except Exception as exc:  # the store stays as it is; the next call tries again
                report.errors.append(f"job {job_id} (Slurm {sid}): hold failed: {exc}")
                log.warning("sync: could not hold Slurm job %s: %s", sid, exc)
                continue
        if decision.make_eligible:
            try:
                cluster.retry.call(f"make Slurm job {sid} eligible now", lambda: cluster.client.update_job(
                    sid, JobUpdate(eligible_now=True)))
                report.made_eligible.append(sid)
                log.info("sync: Slurm delayed placed job %s (%s) after its release; made it eligible now", sid,
                         sjob.state_reason)
            except Exception as exc:  # the next call tries again
                report.errors.append(f"job {job_id} (Slurm {sid}): making it eligible failed: {exc}")
                log.warning("sync: could not make Slurm job %s eligible: %s", sid, exc)
        if not decision.steps and not decision.hold:
            continue
        try:
            with store.session() as s:
                _apply(s, job_id, state, decision, now, report)
                if decision.run_ended:
                    _book_run(s, job_id, sjob, ckpt_dir, decision, now, report)
        except jobstore.IllegalTransition as exc:  # moved by someone else meanwhile: next call re-reads
            report.errors.append(f"job {job_id}: {exc}")
            log.info("sync: job %s changed meanwhile: %s", job_id, exc)
    if report.changed:
        log.info("Slurm sync: %s, held %s, %d execution(s)", report.transitions, report.held, report.executions)
    return report


def _hold(cluster, sjob: Job | None) -> None:
    if sjob is None or sjob.finished:
        return
    if sjob.state == PENDING:
        if not sjob.held:
            cluster.retry.call(f"hold Slurm job {sjob.job_id}", lambda: cluster.client.hold(sjob.job_id))
        return
    cluster._checkpoint_and_requeue(sjob.job_id)


def _apply(s, job_id: int, state: JobState, decision: Decision, now: dt.datetime, report: JobSyncReport) -> None:
    current = state
    # Slurm's times have whole seconds: a job started within the second of its release would read as
    # started before it was placed. The audit trail stays in time order.
    floor = jobstore.entered_at(s, job_id, state)
    for step in decision.steps:
        at = step.at_utc or now
        at = max(at, floor) if floor is not None else at
        jobstore.transition(s, job_id, step.target, step.reason, expected=current, at_utc=at)
        floor = at
        report.count(step.target.value)
        current = step.target
    if decision.exit_code is not None:
        s.get(m.OfflineJob, job_id).exit_code = decision.exit_code


def _book_run(s, job_id: int, sjob: Job | None, ckpt_dir: str, decision: Decision, now: dt.datetime,
              report: JobSyncReport) -> None:
    """One ``job_executions`` row for the stretch of running that just ended (when it can be measured)."""
    job = s.get(m.OfflineJob, job_id)
    start = jobstore.entered_at(s, job_id, JobState.RUNNING)
    end = (sjob.end_time_utc if sjob is not None and sjob.end_time_utc else None) or now
    if start is None or end <= start or sjob is None:
        return
    placed = rounds_db.latest_placements(s, [job_id]).get(job_id)
    gpu_id = placed.gpu_id if placed is not None else None  # where MuxFlow placed it (its own record)
    before = job.checkpoint_step or 0.0
    total = float(job.total_steps) if job.total_steps is not None else float("inf")  # None: unknown
    if decision.steps and decision.steps[-1].target == JobState.DONE and job.total_steps is not None:
        reached: float | None = total
    else:
        newest = _newest_checkpoint(ckpt_dir, job.run_as_user)
        reached = None if newest is None else float(min(newest, total))
    if reached is not None:
        job.steps_done = max(job.steps_done or 0.0, reached)
        job.checkpoint_step = max(before, reached)
    if gpu_id is None or reached is None:
        log.info("sync: job %s ran %s–%s but %s; no execution booked", job_id, start, end,
                 "its GPU is unknown" if gpu_id is None else "its checkpoints are not readable here")
        return
    gtype = s.get(m.Gpu, gpu_id).gpu_type
    prof = profstore.profile_on(s, job_id, gtype)
    # The solo time of the steps, as measured where the profile ran (the device the job really used when
    # the profile was measured; the model's iteration time only when nothing was measured).
    iter_s = None if prof is None else (prof.measured_iter_time_s or prof.iter_time_s)
    if not iter_s:
        log.info("sync: job %s has no profile on %s; no execution booked", job_id, gtype)
        return
    steps = max(0.0, reached - before)
    repo.write_executions(s, [ExecutionRecord(job_id, gpu_id, start, end, int(sjob.mps_pct or 0), steps,
                                              (end - start).total_seconds(), steps * iter_s)],
                          rounds_db.round_at(s, start), SOURCE)
    report.executions += 1


MAX_CHECKPOINT_ENTRIES = 10_000  # a checkpoint directory is listed by name; a huge one is not a job's


def _newest_checkpoint(ckpt_dir: str, user: str | None) -> int | None:
    """The newest checkpoint step in the job's checkpoint directory (by file name; nothing is read), where this host
    can see it. The path is the user's (``ckpt=`` of the comment): only a directory of the job's user, not a link,
    counts, and only checkpoint files the user owns in it; a user cannot claim progress from another user's files,
    and MuxFlow follows no link a user sets."""
    if not ckpt_dir or not user:
        return None
    try:
        uid = pwd.getpwnam(user).pw_uid
        st = os.lstat(ckpt_dir)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            return None
        best = None
        with os.scandir(ckpt_dir) as entries:
            for i, e in enumerate(entries):
                if i >= MAX_CHECKPOINT_ENTRIES:
                    return None
                m_ = CHECKPOINT_NAME.match(e.name)
                if m_ and e.is_file(follow_symlinks=False) and e.stat(follow_symlinks=False).st_uid == uid:
                    best = max(best or 0, int(m_.group(1)))
        return best
    except (KeyError, OSError):
        return None
