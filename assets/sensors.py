"""The deployment's automation: sensors that start rounds, profiling, requeues and fills.

  ``round_sensor``           the round of each window of the round period (15 minutes by default), as it starts:
                             adds the window's partition and requests its round_job run (never two at once)
  ``new_submission_sensor``  new SUBMITTED jobs → profile_job (on Slurm: after importing new sbatch jobs)
  ``eviction_sensor``        new evictions → requeue_job
  ``job_state_sensor``       (Slurm) job states follow Slurm between rounds: started, finished, requeued
  ``fill_sensor``            (Slurm) a GPU freed or a job arrived while jobs wait → ``fill_job``: the waiting jobs
                             start on the free GPUs now, not at the next round (never beside a round run)

Each is defined here at Dagster's defaults (a tick every 30 seconds, stopped until an operator starts it);
:func:`with_cadence` gives a deployment its own tick interval and start state (``pipelines.settings``). The round
sensor reads the time from the ``now`` resource: the wall clock, or the main job's simulated time.
"""

import warnings
from collections.abc import Callable

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.jobs import ROUND_TAGS, fill_job, profile_job, requeue_job, round_job, utcnow
from assets.resources import ClusterResource, FeatureStoreResource, SchedulingResource
from assets.rounds import round_partitions
from executors.scheduler.slurm.pickup import import_submissions
from executors.slurm.errors import SlurmError
from executors.store import inventory
from executors.store import rounds as rounds_db
from scheduler_core.domain import JobState

# Dagster's own @sensor passes its beta `owners` parameter internally and warns about it.
warnings.filterwarnings("ignore", message="Parameter `owners`", module="dagster")

NOW = "now"  # the resource key of the round sensor's clock: a callable returning an aware UTC datetime
_IN_PROGRESS = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
                DagsterRunStatus.STARTED]
_TICKS: dict[str, tuple[Callable, dict]] = {}  # sensor name → its evaluation function and decorator arguments


def _defined(**kwargs) -> Callable[[Callable], SensorDefinition]:
    """``@sensor`` at the defaults, remembering the function so :func:`with_cadence` can re-time it."""
    def wrap(fn: Callable) -> SensorDefinition:
        _TICKS[fn.__name__] = (fn, kwargs)
        return sensor(default_status=DefaultSensorStatus.STOPPED, **kwargs)(fn)  # Dagster's interval (30 s)
    return wrap


def with_cadence(definition: SensorDefinition, interval_s: int, running: bool) -> SensorDefinition:
    """The sensor ticking every ``interval_s`` seconds, running from the start when ``running`` (else stopped
    until an operator turns it on: the UI, ``dagster sensor start``)."""
    fn, kwargs = _TICKS[definition.name]
    status = DefaultSensorStatus.RUNNING if running else DefaultSensorStatus.STOPPED
    return sensor(minimum_interval_seconds=max(1, interval_s), default_status=status, **kwargs)(fn)


def pick_up_slurm_submissions(context: SensorEvaluationContext, store, cluster: ClusterResource) -> str:
    """Import new held ``sbatch -p offline`` jobs (docs/DESIGN.md §3 step 1) so the sensor's profiling run follows.

    Returns a note for the skip message. Slurm not answering does not fail the tick:
    jobs already in the store still get their profiling run, and the note says why
    nothing was imported (the next tick tries again; the pick-up is idempotent).
    """
    client = cluster.backend().client_factory()
    try:
        rep = import_submissions(store, client)  # a job type is a free label on Slurm (docs/SLURM.md)
    except SlurmError as exc:
        context.log.warning(f"Slurm pick-up failed, retried next tick: {exc}")
        return f" (Slurm pick-up failed: {exc})"
    finally:
        getattr(client, "close", lambda: None)()
    for sid, reason in rep.rejected:
        context.log.warning(f"Slurm job {sid} {reason}")
    if rep.imported or rep.rejected:
        context.log.info(f"picked up {len(rep.imported)} Slurm submission(s) (store jobs {rep.imported}), "
                         f"rejected {len(rep.rejected)}")
    return f" (Slurm pick-up: {len(rep.imported)} imported, {len(rep.rejected)} rejected)"


@_defined(job=round_job, required_resource_keys={"scheduling", NOW},
          description="A scheduling round at the start of every window of the round period.")
def round_sensor(context: SensorEvaluationContext):
    scheduling: SchedulingResource = context.resources.scheduling
    clock = scheduling.clock()
    window = clock.window_of(getattr(context.resources, NOW)())
    key = clock.key(window)
    start, end = scheduling.start(), scheduling.end()
    if window < start:
        return SkipReason(f"rounds start at {start.isoformat()}")
    if end is not None and window >= end:
        return SkipReason(f"rounds ended at {end.isoformat()}")
    if context.cursor == key:
        return SkipReason(f"the round of {key} is requested already")
    if context.instance.get_runs_count(RunsFilter(job_name="round_job", statuses=_IN_PROGRESS)):
        return SkipReason(f"the previous round is still running; {key} waits for it")
    return SensorResult(
        run_requests=[RunRequest(run_key=f"round-{key}", partition_key=key, tags=ROUND_TAGS)],
        dynamic_partitions_requests=[round_partitions.build_add_request([key])],
        cursor=key,
    )


@_defined(job=profile_job, description="Profiles offline jobs as soon as they are submitted; on Slurm it first picks "
                                       "up new `sbatch -p offline` submissions.")
def new_submission_sensor(context: SensorEvaluationContext, feature_store: FeatureStoreResource,
                          cluster: ClusterResource):
    note = pick_up_slurm_submissions(context, feature_store.store, cluster) if cluster.kind == "slurm" else ""
    with feature_store.store.session() as s:
        newest = inventory.newest_job_id(s, JobState.SUBMITTED)
    if newest is None:
        return SkipReason("no submitted job waits for profiling" + note)
    if context.cursor and int(context.cursor) >= newest:
        return SkipReason(f"job {newest} and earlier already have a profiling run" + note)
    context.update_cursor(str(newest))
    return RunRequest(run_key=f"profile-upto-{newest}")


@_defined(job=requeue_job, description="Returns evicted jobs to the queue after each eviction.")
def eviction_sensor(context: SensorEvaluationContext, feature_store: FeatureStoreResource):
    with feature_store.store.session() as s:
        newest = inventory.newest_eviction_id(s)
        waiting = inventory.jobs_in_state(s, JobState.EVICTED)
    if newest is None or (context.cursor and int(context.cursor) >= newest):
        # (On Slurm an eviction whose requeue-hold was still under way is finished by job_state_sensor.)
        return SkipReason("no new eviction")
    context.update_cursor(str(newest))
    if not waiting:
        return SkipReason(f"evictions up to {newest} already requeued")
    return RunRequest(run_key=f"requeue-upto-{newest}")


@_defined(description="Between rounds, job states follow Slurm: placed jobs that started, jobs that finished or "
                      "failed, jobs Slurm requeued (held again for the next round).")
def job_state_sensor(context: SensorEvaluationContext, feature_store: FeatureStoreResource, cluster: ClusterResource):
    try:
        report = cluster.backend().sync_jobs(feature_store.store, utcnow())
    except SlurmError as exc:
        return SkipReason(f"Slurm did not answer; next tick tries again: {exc}")
    if not report.changed:
        return SkipReason("job states match Slurm")
    return SkipReason(f"job states now follow Slurm: {report.transitions}"
                      + (f", held {report.held}" if report.held else "")
                      + (f", {report.executions} execution(s) booked" if report.executions else ""))


@_defined(job=fill_job, description="Between rounds, a fill when a GPU frees up or a job starts waiting while jobs "
                                    "wait: they start now instead of at the next round.")
def fill_sensor(context: SensorEvaluationContext, feature_store: FeatureStoreResource):
    with feature_store.store.session() as s:
        rnd = rounds_db.latest_round(s)
        if rnd is None or rnd.status != "dispatched":
            return SkipReason("no dispatched round to follow yet")
        seen_round, _, seen_tid = (context.cursor or "").partition(":")
        after = int(seen_tid) if seen_round == str(rnd.id) and seen_tid else None
        event = inventory.newest_fill_event(s, after, rnd.finished_utc)
        newest = inventory.newest_transition_id(s)
        waiting = inventory.jobs_in_state(s, JobState.PENDING)
    if event is None:
        context.update_cursor(f"{rnd.id}:{newest}")
        return SkipReason(f"no GPU freed and no job arrived since round {rnd.id} or its last fill")
    # Rounds and fills carry the same tag (one at a time, dagster.yaml).
    if context.instance.get_runs_count(RunsFilter(tags=ROUND_TAGS, statuses=_IN_PROGRESS)):
        return SkipReason("a round or a fill is running; the fill waits for it")  # cursor kept: not lost
    context.update_cursor(f"{rnd.id}:{newest}")
    if not waiting:
        return SkipReason("GPUs freed, but no job waits")
    return RunRequest(run_key=f"fill-r{rnd.id}-t{newest}", tags=ROUND_TAGS)


SENSORS = [round_sensor, new_submission_sensor, eviction_sensor]
SLURM_SENSORS = [job_state_sensor, fill_sensor]
