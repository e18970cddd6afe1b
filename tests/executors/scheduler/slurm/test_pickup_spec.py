"""The sbatch → JobSpec contract of the offline pick-up (no Slurm needed)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from executors.scheduler.slurm.pickup import is_candidate, spec_from_job
from executors.scheduler.submission import SubmissionError
from executors.slurm.errors import SlurmTransportError
from executors.slurm.models import Job
from executors.slurm.retry import Retry, SlurmUnavailable

GOOD = "muxflow: type='ResNet-50 (batch size 64)' mem=4GiB gpu-types=t4,A10 ckpt=/ckpt/a steps=100 priority=5"


def job(comment: str = GOOD, gres: str = "gres:mps:30", priority: int = 0, partition: str = "offline") -> Job:
    return Job(job_id=42, name="train", state="PENDING", state_reason="JobHeldUser", partition=partition,
               user_name="u", nodes=(), required_nodes=(), gres_per_node=gres, priority=priority, requeue=True,
               restart_count=0, exit_code=None, comment=comment, working_dir="/home/u", submit_time_utc=None,
               start_time_utc=None, end_time_utc=None)


def test_good_comment_gives_the_spec() -> None:
    s = spec_from_job(job())
    assert (s.name, s.job_type, s.mem_bytes, s.allowed_gpu_types, s.checkpoint_dir, s.total_steps, s.priority) == (
        "train", "ResNet-50 (batch size 64)", 4 * 1024**3, ("t4", "a10"), "/ckpt/a", 100, 5)


@pytest.mark.parametrize("comment", ["", "my own notes", "muxflow:", "muxflow: type=x"])
def test_every_comment_field_is_optional(comment) -> None:
    """``sbatch -p offline --gres=mps:30 train.sbatch`` alone is a job: memory from its profile, any GPU type of the
    cluster, unknown steps, no checkpoint directory, checkpointing detected when it is profiled."""
    s = spec_from_job(job(comment), ("t4", "a10"))
    assert (s.mem_bytes, s.allowed_gpu_types, s.checkpoint_dir, s.total_steps, s.checkpointing) == (
        None, ("a10", "t4"), "", None, None)
    assert s.name == "train" and s.job_type == ("x" if "type=x" in comment else "")


@pytest.mark.parametrize(("comment", "checkpointing"), [
    ("muxflow: ckpt=/c", "declared"), ("muxflow: checkpoint=signal", "declared"),
    ("muxflow: checkpoint=none ckpt=/c", "none"), ("muxflow: steps=10", None)])
def test_a_job_says_whether_it_checkpoints_on_the_signals(comment, checkpointing) -> None:
    assert spec_from_job(job(comment), ("t4",)).checkpointing == checkpointing


@pytest.mark.parametrize(("comment", "gres", "field"), [
    ("muxflow: checkpoint=maybe", "gres:mps:30", "checkpoint"),
    ("muxflow: steps=many", "gres:mps:30", "steps"),
    ("muxflow: mem=", "gres:mps:30", "mem"),
    (GOOD, "", "gres"),
    (GOOD, "gres:mps:101", "gres"),
    (GOOD, "gres:gpu:1", "gres"),
    (GOOD + " steps=7", "gres:mps:30", "steps"),
    ("muxflow: type=x bogus=1", "gres:mps:30", "comment"),
    ("muxflow: type='unterminated", "gres:mps:30", "comment"),
    (GOOD.replace("mem=4GiB", "mem=lots"), "gres:mps:30", "mem"),
])
def test_missing_or_contradictory_options_are_rejected(comment, gres, field) -> None:
    with pytest.raises(SubmissionError) as exc:
        spec_from_job(job(comment, gres))
    assert exc.value.field == field


def test_only_held_offline_jobs_are_candidates() -> None:
    assert is_candidate(job())
    assert not is_candidate(job(priority=100))
    assert not is_candidate(job(partition="online"))


def test_retry_backs_off_then_gives_up_with_slurm_unavailable() -> None:
    waits: list[float] = []
    r = Retry(deadline_s=1.0, first_wait_s=0.1, max_wait_s=0.4, sleep=waits.append)

    def down():
        raise SlurmTransportError("connection refused")

    with pytest.raises(SlurmUnavailable):
        r.call("x", down)
    assert waits[:3] == [0.1, 0.2, 0.4] and all(w <= 0.4 for w in waits)


def test_scontrol_failures_while_slurmctld_is_down_are_retried() -> None:
    from executors.slurm.scontrol import ScontrolError

    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ScontrolError("scontrol requeuehold 5: Unable to contact slurm controller (connect failure)")
        return "ok"

    assert Retry(deadline_s=30, first_wait_s=0.01, sleep=lambda _s: None).call("x", flaky) == "ok"
    with pytest.raises(ScontrolError):
        Retry(deadline_s=30, sleep=lambda _s: None).call("x", lambda: (_ for _ in ()).throw(
            ScontrolError("scontrol requeuehold 5: Invalid job id specified")))


@pytest.mark.parametrize(("shape", "field", "words"), [
    (dict(array_job_id=42, array_tasks="0-2"), "array", "tasks 0-2"),
    (dict(array_job_id=40, array_tasks="2"), "array", "array 40"),
    (dict(het_job_id=42), "hetjob", "het job 42"),
    (dict(node_count=2), "nodes", "2 nodes"),
    (dict(requeue=False), "requeue", "--no-requeue"),
])
def test_arrays_heterogeneous_multi_node_and_unrequeueable_jobs_are_refused(shape, field, words) -> None:
    """Each would run several processes on one planned GPU share (or on nodes the plan never saw), or could
    not be evicted or migrated (Slurm refuses to requeue it)."""
    with pytest.raises(SubmissionError) as exc:
        spec_from_job(replace(job(), **shape))
    assert exc.value.field == field and words in str(exc.value)
    assert spec_from_job(replace(job(), node_count=1)).total_steps == 100  # one node is what MuxFlow places
