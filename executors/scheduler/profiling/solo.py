"""Solo profiling of new offline jobs (paper §6, docs/DESIGN.md §3 step 2): a dry run on the profile partition.

For every SUBMITTED job and each GPU type it may run on, one *profiling run*: a
copy of the job's script (its Slurm batch script, or its command) runs under the
probe (:mod:`executors.node.profiling.probe`) on a dedicated GPU of that type, in the
runtime's profiling mode, and the probe's report becomes the job's profile on
that type (:mod:`executors.scheduler.profiling.outcome`). The job's type is only a label: on a node
without a GPU the metrics come from the simulated model of a catalog type, or of a generic
job for any other label (:func:`executors.node.profiling.metrics.simulated_job_model`), said in
the job's reason. The job goes SUBMITTED →
PROFILING → PENDING, or FAILED with the reason (``muxflow jobs list`` shows it)
when a run crashes, reports no iterations or exceeds the bound.

Every run is a ``profiling_runs`` row written *before* it is submitted, its
handle recorded as soon as the executor has it, and its end after. A profiler
that stops (a Dagster run that ends, a crash) leaves the jobs PROFILING and the
runs in the table; the next call picks them up (a run submitted but not yet
recorded is found again by its key), so nothing is submitted twice and nothing
is lost. With ``reuse_profiles`` a job type already profiled on a GPU type
takes that profile instead of a new run.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from executors.node.profiling.probe import PROBE_FILE, read_json
from executors.scheduler.profiling.outcome import classify
from executors.scheduler.profiling.runs import (
    PHASE_FINISHED,
    PHASE_PENDING,
    ExecutorError,
    ExecutorUnavailable,
    ProfileExecutor,
    RunHandles,
    RunSpec,
    prepare_run_dir,
    probe_script,
    run_log_tail,
    write_executable,
)
from executors.scheduler.profiling.settings import ProfilingSettings
from executors.store import models as m
from executors.store import profiling as profstore
from executors.store import repo
from executors.store.db import Store
from executors.store.jobs import ConcurrentTransition, IllegalTransition, entered_at, transition
from scheduler_core.domain import JobState, OfflineFeatures
from scheduler_core.jobs.sync import decide

log = logging.getLogger(__name__)


@dataclass
class ProfilingSummary:
    submitted: int = 0
    profiled: list[int] = field(default_factory=list)        # jobs now PENDING
    reused: list[int] = field(default_factory=list)          # of which all profiles were reused
    failed: dict[int, str] = field(default_factory=dict)     # job → reason
    in_progress: list[int] = field(default_factory=list)     # jobs still PROFILING when the call returned
    runs: list[dict] = field(default_factory=list)           # finished runs: job, gpu type, ok, reason, seconds


# A job is profiled while it is in these states; a job that left them has no use for its runs.
_PROFILED_STATES = frozenset({JobState.SUBMITTED.value, JobState.PROFILING.value})


class SoloProfiler:
    USER_JOB_CHECK_S = 10.0  # how often a poll asks the cluster whether the profiled jobs' own jobs still exist
    # Profiler runs may overlap (the submission sensor starts one per batch of new jobs). Work another profiler
    # may still be doing — a PROFILING job without its runs yet, a run's row before its sbatch came back — is
    # taken over only this long after it began (a profiler that stopped in between); until then a run of its
    # is only looked for (by its key), never sent again.
    TAKEOVER_GRACE_S = 120.0

    def __init__(self, store: Store, executor: ProfileExecutor, settings: ProfilingSettings = ProfilingSettings(),
                 seed: int = 0, now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
                 sleep: Callable[[float], None] = time.sleep, monotonic: Callable[[], float] = time.monotonic):
        self.store = store
        self.executor = executor
        self.settings = settings
        self.seed = seed
        self.now = now
        self.sleep = sleep
        self.monotonic = monotonic
        self.handles = RunHandles(executor)
        self._next_user_check = -math.inf
        self._own_runs: set[int] = set()  # runs this profiler created: sent again at once when Slurm was down

    # -- the whole step ---------------------------------------------------------------------------
    def run(self) -> ProfilingSummary:
        """Start runs for new jobs, then follow every open run until all ended or the wait is over."""
        summary = ProfilingSummary()
        self.start_new(summary)
        wait = self.settings.wait_s if self.settings.wait_s is not None else self.settings.bound_s + 60.0
        end = self.monotonic() + wait
        while self.poll_once(summary) and self.monotonic() < end:
            self.sleep(self.settings.poll_s)  # polling the runs' state with a deadline
        with self.store.session() as s:
            summary.in_progress = [j.id for j in repo.jobs_in_states(s, [JobState.PROFILING])]
        return summary

    # -- starting ---------------------------------------------------------------------------------
    def start_new(self, summary: ProfilingSummary) -> None:
        """Runs for SUBMITTED jobs, and for PROFILING jobs that lack one (a profiler stopped in between)."""
        with self.store.session() as s:
            jobs = [(j.id, j.state, j.job_type, list(j.allowed_gpu_types), j.slurm_job_id, j.command, j.mem_bytes)
                    for j in repo.jobs_in_states(s, [JobState.SUBMITTED, JobState.PROFILING])]
        ended = self._drop_ended([(job_id, state, slurm_id) for job_id, state, _, _, slurm_id, _, _ in jobs], summary)
        for job_id, state, job_type, gpu_types, slurm_id, command, mem_bytes in jobs:
            if job_id in ended:
                continue
            if state == JobState.PROFILING.value and not self._left_behind(job_id):
                continue  # another profiler may be starting its runs right now
            if state == JobState.SUBMITTED.value and not self._begin(job_id, f"solo profiling on the "
                                                                             f"{self.settings.partition} partition",
                                                                  gpu_types):
                continue
            todo = self._still_to_profile(job_id, job_type, gpu_types, summary)
            if not todo:
                continue
            try:
                script = self.executor.job_script(slurm_id, command)
            except ExecutorUnavailable as exc:
                log.warning("job %s: cannot read its script now (%s); it stays PROFILING", job_id, exc)
                continue
            except ExecutorError as exc:
                self._fail_job(job_id, f"profiling failed: {exc}", summary)
                continue
            for gtype in todo:
                self._submit(job_id, job_type, gtype, script.text, script.working_dir, summary, mem_bytes)

    def _begin(self, job_id: int, what: str, gpu_types: list[str]) -> bool:
        """SUBMITTED → PROFILING; False when the job-state sync ended it meanwhile (cancelled)."""
        with self.store.session() as s:
            try:
                transition(s, job_id, JobState.PROFILING, f"{what} ({', '.join(gpu_types)})",
                           expected=JobState.SUBMITTED)
            except IllegalTransition as exc:
                log.info("job %s: not profiled: %s", job_id, exc)
                return False
        return True

    def _still_to_profile(self, job_id: int, job_type: str, gpu_types: list[str],
                          summary: ProfilingSummary) -> list[str]:
        """The allowed GPU types with neither a profile, an open run nor (with reuse) a profile to take over; the job
        PENDING when none is left."""
        missing = self._missing(job_id, gpu_types)
        # an empty label says nothing about the job: no other job's profile stands for it
        reuse = self.settings.reuse_profiles and missing and job_type
        reused = self._reuse(job_id, job_type, missing) if reuse else set()
        todo = [g for g in missing if g not in reused]
        if not todo:
            self._finish_job(job_id, summary)
            if reused and job_id in summary.profiled:
                summary.reused.append(job_id)
        return todo

    def _left_behind(self, job_id: int) -> bool:
        """Whether a PROFILING job became so long enough ago that no live profiler is still starting its runs."""
        with self.store.session() as s:
            since = entered_at(s, job_id, JobState.PROFILING)
        return since is None or (self.now() - since).total_seconds() >= self.TAKEOVER_GRACE_S

    def _drop_ended(self, jobs: list[tuple[int, str, int | None]], summary: ProfilingSummary) -> set[int]:
        """Jobs (id, state, Slurm id) whose own Slurm job ended before they were placed (the user cancelled it,
        Slurm lost it): FAILED with the job-state sync's reason, their open runs cancelled; their ids."""
        ids = sorted({sid for _, _, sid in jobs if sid is not None})
        if not ids:
            return set()
        self._next_user_check = self.monotonic() + self.USER_JOB_CHECK_S
        try:
            views = self.executor.cluster_views(ids)
        except (ExecutorUnavailable, ExecutorError) as exc:  # the next call, or the job-state sync, sees it
            log.warning("cannot read the profiled jobs' own Slurm jobs now: %s", exc)
            return set()
        ended = set()
        for job_id, state, sid in jobs:
            view = views.get(sid) if sid is not None else None
            steps = decide(JobState(state), view).steps if view is not None else ()
            if steps and steps[-1].target == JobState.FAILED:
                self._fail_job(job_id, steps[-1].reason, summary, runs_reason=f"the job {steps[-1].reason}")
                ended.add(job_id)
        return ended

    def _missing(self, job_id: int, gpu_types: list[str]) -> list[str]:
        """Allowed GPU types with neither a profile nor an open run."""
        with self.store.session() as s:
            have = profstore.profiled_gpu_types(s, job_id) | profstore.profiling_gpu_types(s, job_id)
        return [g for g in gpu_types if g not in have]

    def _reuse(self, job_id: int, job_type: str, gpu_types: list[str]) -> set[str]:
        done = set()
        with self.store.session() as s:
            for gtype in gpu_types:
                src = profstore.reusable_profile(s, job_type, gtype, job_id)
                if src is None:
                    continue
                f = OfflineFeatures(**{k: getattr(src, k) for k in OfflineFeatures.__dataclass_fields__})
                repo.save_profile(s, job_id, gtype, f, src.source, "reused", reused_from_job_id=src.job_id,
                                  iterations=src.iterations, measured_iter_time_s=src.measured_iter_time_s,
                                  iter_time_p50_s=src.iter_time_p50_s, iter_time_p95_s=src.iter_time_p95_s,
                                  device=src.device)
                done.add(gtype)
                log.info("job %s reuses job %s's profile on %s (%s)", job_id, src.job_id, gtype, job_type)
        return done

    def _spec(self, run: m.ProfilingRun, job_type: str, script_text: str, working_dir: str | None,
              mem_bytes: int | None = None) -> RunSpec:
        st = self.settings
        run_dir = Path(run.run_dir)
        job_script = write_executable(run_dir / "job.sh", script_text)
        header = (f"MuxFlow solo profiling run {run.id}: job {run.job_id} ({job_type}) on {run.gpu_type}, "
                  f"a dry run bounded to {st.bound_s:.0f} s (docs/PROFILING.md)")
        text = probe_script(python=st.node_python, run_dir=run_dir, job_script=job_script, job_type=job_type,
                            gpu_type=run.gpu_type, metrics=st.metrics, iterations=st.iterations,
                            seconds=st.profile_seconds, warmup=st.warmup_iterations, deadline_s=st.deadline_s,
                            seed=self.seed * 1_000_003 + run.job_id, interval_ms=st.interval_ms,
                            working_dir=working_dir, header=header, mem_bytes=mem_bytes)
        return RunSpec(key=f"muxflow-profile-run={run_dir.name}", name=f"mxprof-j{run.job_id}-{run.gpu_type}",
                       gpu_type=run.gpu_type, run_dir=run_dir, script=text, time_limit_s=st.bound_s + 60.0)

    def _submit(self, job_id: int, job_type: str, gtype: str, script_text: str, working_dir: str | None,
                summary: ProfilingSummary, mem_bytes: int) -> None:
        with self.store.session() as s:
            run = m.ProfilingRun(job_id=job_id, gpu_type=gtype, state="submitted", run_dir="",
                                 bound_s=self.settings.bound_s, submitted_utc=self.now())
            s.add(run)
            s.flush()
            run.run_dir = str(prepare_run_dir(self.settings.profile_dir, f"solo-run{run.id}-job{job_id}-{gtype}",
                                              getattr(self.executor, "report_owner", None)))
            spec = self._spec(run, job_type, script_text, working_dir, mem_bytes)
            run_id = run.id
        self._own_runs.add(run_id)
        # the intent (the row) is committed before anything is sent
        self._send(run_id, spec, summary)

    def _send(self, run_id: int, spec: RunSpec, summary: ProfilingSummary, may_submit: bool = True) -> None:
        """Find the run's job by its key (a persistent executor) or submit it; ``may_submit`` False: find only."""
        try:
            handle = self.executor.find(spec) if self.executor.persistent else None
            if handle is None:
                if not may_submit:
                    return
                handle = self.executor.submit(spec)
                summary.submitted += 1
        except ExecutorUnavailable as exc:
            log.warning("profiling run %s: executor unavailable (%s); submitted on a later call", run_id, exc)
            return
        except ExecutorError as exc:
            self._end_run(run_id, False, f"could not submit the profiling job: {exc}", summary)
            return
        self.handles.record(self.store, m.ProfilingRun, run_id, handle)

    # -- following --------------------------------------------------------------------------------
    def poll_once(self, summary: ProfilingSummary) -> int:
        """Check every open run once; the number still open.

        Runs of a job that ended meanwhile (the job-state sync failed it, or its own Slurm job ended,
        checked every ``USER_JOB_CHECK_S``) are cancelled: nothing is profiled for a job nobody wants."""
        with self.store.session() as s:
            jobs = {j.id: (j.state, j.state_reason, j.slurm_job_id) for j in (
                s.get(m.OfflineJob, i) for i in sorted({r.job_id for r in profstore.open_profiling_runs(s)}))}
        gone = {j: reason for j, (state, reason, _) in jobs.items() if state not in _PROFILED_STATES}
        for job_id, reason in gone.items():
            self._fail_job(job_id, "", summary, runs_reason=f"the job ended before it was profiled: {reason}")
        if jobs and self.monotonic() >= self._next_user_check:
            self._drop_ended([(j, st, sid) for j, (st, _, sid) in jobs.items() if j not in gone], summary)
        with self.store.session() as s:
            runs = [(r.id, r.job_id, r.gpu_type, r.slurm_job_id, r.state, r.submitted_utc, r.started_utc,
                     r.bound_s, r.run_dir, r.node) for r in profstore.open_profiling_runs(s)]
        left = 0
        for run_id, job_id, gtype, sid, state, submitted, started, bound_s, run_dir, node in runs:
            handle = self.handles.lookup(run_id, sid)
            if handle is None:
                if self.handles.lost(node):
                    self._end_run(run_id, False, "the local profiling process was lost (the profiler restarted)",
                                  summary)
                    continue
                if not self._resubmit(run_id, summary):
                    left += 1
                continue
            try:
                st = self.executor.status(handle)
            except ExecutorUnavailable as exc:
                log.warning("profiling run %s: status unavailable: %s", run_id, exc)
                left += 1
                continue
            now = self.now()
            if st.phase == PHASE_FINISHED:
                probe = read_json(Path(run_dir) / PROBE_FILE, owner=getattr(self.executor, "report_owner", None))
                out = classify(probe, bound_s=bound_s, slurm_state=st.state, slurm_exit=st.exit_code,
                               log_tail="" if probe else run_log_tail(Path(run_dir)))
                self._record_finished(run_id, out, probe, st, summary)
                continue
            if st.phase == PHASE_PENDING:
                if (now - submitted).total_seconds() > self.settings.max_queue_s:
                    self._cancel(handle)
                    self._end_run(run_id, False, f"not started on the {self.settings.partition} partition within "
                                                 f"{self.settings.max_queue_s:.0f} s", summary)
                    continue
            else:
                started = started or st.started_utc or now
                if state != "running":
                    with self.store.session() as s:
                        run = s.get(m.ProfilingRun, run_id)
                        run.state, run.started_utc, run.node = "running", started, st.node or run.node
                # the probe stops the job at its deadline; this is the bound if the probe itself hangs
                if (now - started).total_seconds() > bound_s + 30.0:
                    self._cancel(handle)
                    self._end_run(run_id, False, f"exceeded the profiling bound of {bound_s:.0f} s (cancelled)",
                                  summary)
                    continue
            left += 1
        return left

    def _resubmit(self, run_id: int, summary: ProfilingSummary) -> bool:
        """A run whose submission did not get through (executor down): find it or send it again.

        Another profiler's run, younger than :attr:`TAKEOVER_GRACE_S`, may be in its sbatch right now: it
        is only looked for."""
        with self.store.session() as s:
            run = s.get(m.ProfilingRun, run_id)
            job = s.get(m.OfflineJob, run.job_id)
            job_type, slurm_id, command, mem_bytes = job.job_type, job.slurm_job_id, job.command, job.mem_bytes
            age_s = (self.now() - run.submitted_utc).total_seconds()
        may_submit = run_id in self._own_runs or age_s >= self.TAKEOVER_GRACE_S
        try:
            script = self.executor.job_script(slurm_id, command)
        except ExecutorUnavailable:
            return False
        except ExecutorError as exc:
            self._end_run(run_id, False, f"profiling failed: {exc}", summary)
            return True
        with self.store.session() as s:
            spec = self._spec(s.get(m.ProfilingRun, run_id), job_type, script.text, script.working_dir, mem_bytes)
        self._send(run_id, spec, summary, may_submit)
        return False

    def _cancel(self, handle: int) -> None:
        try:
            self.executor.cancel(handle)
        except (ExecutorUnavailable, ExecutorError) as exc:
            log.warning("cancel of profiling job %s failed: %s", handle, exc)

    def _record_finished(self, run_id: int, out, probe: dict | None, st, summary: ProfilingSummary) -> None:
        with self.store.session() as s:
            run = s.get(m.ProfilingRun, run_id)
            run.report = probe
            run.node = run.node if run.node and run.node != "local" else (st.node or run.node)
            run.started_utc = run.started_utc or st.started_utc
            if out.ok:
                repo.save_profile(s, run.job_id, run.gpu_type, out.features, out.source, out.method,
                                  slurm_job_id=run.slurm_job_id, **out.measured)
        self._end_run(run_id, out.ok, out.reason, summary,
                      seconds=float((probe or {}).get("elapsed_s") or 0.0))

    def _end_run(self, run_id: int, ok: bool, reason: str, summary: ProfilingSummary,
                 seconds: float = math.nan) -> None:
        with self.store.session() as s:
            run = s.get(m.ProfilingRun, run_id)
            run.state, run.reason, run.finished_utc = ("done" if ok else "failed"), reason[:4000], self.now()
            job_id, gtype = run.job_id, run.gpu_type
        summary.runs.append({"run": run_id, "job": job_id, "gpu_type": gtype, "ok": ok, "reason": reason,
                             "seconds": seconds})
        log.info("profiling run %s (job %s on %s): %s%s", run_id, job_id, gtype, "ok: " if ok else "FAILED: ", reason)
        if ok:
            self._finish_job(job_id, summary)
        else:
            self._fail_job(job_id, f"profiling failed on {gtype}: {reason}", summary)

    def _finish_job(self, job_id: int, summary: ProfilingSummary) -> None:
        """PENDING once every allowed GPU type has a profile and no run is open."""
        with self.store.session() as s:
            job = s.get(m.OfflineJob, job_id)
            if job.state != JobState.PROFILING.value:
                return
            have = profstore.profiled_gpu_types(s, job_id)
            if profstore.profiling_gpu_types(s, job_id) or not set(job.allowed_gpu_types) <= have:
                return
            generic = {r.report["metrics_model"] for r in profstore.done_profiling_runs(s, job_id)
                       if isinstance(r.report, dict) and r.report.get("metrics_generic")}
            note = f" (GPU metrics SIMULATED as {sorted(generic)[0]})" if generic else ""
            if job.mem_bytes is None:  # not declared: what it used, with room to grow
                job.mem_bytes = profstore.measured_mem_need(s, job_id)
                note += f"; GPU memory {job.mem_bytes / 2**30:.2f} GiB from its profile"
            try:
                transition(s, job_id, JobState.PENDING,
                           "profiled on " + ", ".join(sorted(job.allowed_gpu_types)) + note)
            except ConcurrentTransition as exc:  # the job-state sync ended it meanwhile (its owner cancelled it)
                log.info("job %s: profiled, but %s", job_id, exc)
                return
        summary.profiled.append(job_id)

    def _fail_job(self, job_id: int, reason: str, summary: ProfilingSummary,
                  runs_reason: str = "another profiling run failed") -> None:
        """The job FAILED with ``reason`` (unless it already left profiling), its open runs ended and cancelled."""
        with self.store.session() as s:
            runs = profstore.open_profiling_runs(s, [job_id])
            others = [(r.id, r.slurm_job_id) for r in runs]
            for run in runs:
                run.state, run.reason = "failed", f"cancelled: {runs_reason}"[:4000]
                run.finished_utc = self.now()
            job = s.get(m.OfflineJob, job_id)
            if job.state in _PROFILED_STATES:
                try:
                    transition(s, job_id, JobState.FAILED, reason[:2000], expected=JobState(job.state))
                    summary.failed[job_id] = reason
                except ConcurrentTransition as exc:  # the job-state sync ended it meanwhile; the runs still end
                    log.info("job %s: %s", job_id, exc)
        for rid, sid in others:
            handle = self.handles.lookup(rid, sid)
            if handle is not None:
                self._cancel(handle)
