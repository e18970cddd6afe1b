"""Any training script is a job on Slurm: the job type is a free, optional label; a job whose memory need
exceeds every allowed GPU type's is refused at submission and rejected (and cancelled) at pick-up."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from executors.scheduler.slurm.pickup import import_submissions, spec_from_job, submission_comment, submit_held
from executors.scheduler.submission import JobSpec, SubmissionError, format_bytes, gpu_type_memory, validate
from executors.store import models as m
from executors.store.db import Store
from scheduler_core.gpu_specs import get_spec
from tests.executors.scheduler.slurm.fake_slurm import FakeSlurm, make_job, store_with_fake_nodes

T4, A10 = get_spec("t4").memory_bytes, get_spec("a10").memory_bytes  # 15 and 24 GiB
CATALOG = {"ResNet-50 (batch size 64)"}


def _spec(**over) -> JobSpec:
    base = dict(name="j", command="train.sh", job_type="", mem_bytes=1024**3, allowed_gpu_types=("t4", "a10"),
                checkpoint_dir="/ckpt/j", total_steps=10)
    return JobSpec(**{**base, **over})


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    return store_with_fake_nodes(tmp_path)


def test_the_store_knows_each_gpu_types_memory(store: Store) -> None:
    with store.session() as s:
        assert gpu_type_memory(s) == {"t4": T4, "a10": A10}


@pytest.mark.parametrize("label", ["", "my llama fine-tune", "ResNet-50 (batch size 64)"])
def test_any_label_or_none_goes_where_no_catalog_is_given(label) -> None:
    validate(_spec(job_type=label), {"t4": T4, "a10": A10}, None)


def test_the_simulated_cluster_keeps_its_catalog_types() -> None:
    with pytest.raises(SubmissionError, match="unknown job type 'mine'") as exc:
        validate(_spec(job_type="mine"), {"t4": T4}, CATALOG)
    assert exc.value.field == "job_type"
    with pytest.raises(SubmissionError, match="at most 64") as exc:
        validate(_spec(job_type="x" * 65), {"t4": T4}, None)


def test_memory_above_every_allowed_gpu_type_is_refused_naming_them() -> None:
    gpus = {"t4": T4, "a10": A10}
    validate(_spec(mem_bytes=A10), gpus, None)  # fits the A10 exactly
    with pytest.raises(SubmissionError) as exc:
        validate(_spec(mem_bytes=A10 + 1), gpus, None)
    assert exc.value.field == "mem" and str(exc.value) == "mem: 24 GiB is more than any allowed GPU type has (a10 24 " \
        "GiB, t4 15 GiB)"
    # only the allowed types count: 16 GiB fits an A10, but the job allows only T4s
    with pytest.raises(SubmissionError, match=r"mem: 16 GiB is more than any allowed GPU type has \(t4 15 GiB\)"):
        validate(_spec(mem_bytes=16 * 1024**3, allowed_gpu_types=("t4",)), gpus, None)
    with pytest.raises(SubmissionError, match=r"^mem: 99,999 TiB is more"):
        validate(_spec(mem_bytes=99999 * 1024**4), gpus, None)


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (512, 2048, 1.5 * 1024**3, 16 * 1024**3, 3 * 1024**4, 99999 * 1024**4)] == [
        "512 B", "2 KiB", "1.5 GiB", "16 GiB", "3 TiB", "99,999 TiB"]


def test_a_comment_without_a_type_is_a_job_without_a_label() -> None:
    spec = spec_from_job(make_job(3, comment="muxflow: mem=2GiB gpu-types=t4 ckpt=/ckpt/x steps=5"))
    assert spec.job_type == "" and spec.mem_bytes == 2 * 1024**3
    # and the comment muxflow submit sends for it reads back the same
    assert spec_from_job(make_job(4, comment=submission_comment(spec))).job_type == ""
    assert "type=" not in submission_comment(spec)


def test_pickup_imports_free_labels_and_rejects_and_cancels_impossible_memory(store: Store) -> None:
    fake = FakeSlurm([
        make_job(21, comment="muxflow: mem=2GiB gpu-types=t4 ckpt=/ckpt/a steps=5"),
        make_job(22, comment="muxflow: type='my own model' mem=2GiB gpu-types=t4,a10 ckpt=/ckpt/b steps=5"),
        make_job(23, comment="muxflow: type=big mem=99999TiB gpu-types=t4,a10 ckpt=/ckpt/c steps=5"),
        make_job(24, comment="muxflow: mem=20GiB gpu-types=t4 ckpt=/ckpt/d steps=5"),
    ])
    rep = import_submissions(store, fake, only=[21, 22, 23, 24])
    assert len(rep.imported) == 2 and [sid for sid, _ in rep.rejected] == [23, 24]
    with store.session() as s:
        rows = {j.slurm_job_id: (j.job_type, j.state, j.state_reason) for j in s.scalars(select(m.OfflineJob))}
    assert rows[21][:2] == ("", "SUBMITTED") and rows[22][:2] == ("my own model", "SUBMITTED")
    assert rows[23][1] == "FAILED" and rows[23][2].startswith("rejected: mem: 99,999 TiB is more than any allowed")
    assert rows[24][2] == "rejected: mem: 20 GiB is more than any allowed GPU type has (t4 15 GiB)"
    for sid in (23, 24):  # cancelled in Slurm, the reason in its comment
        assert fake.jobs[sid].state == "CANCELLED" and fake.jobs[sid].comment.startswith("muxflow rejected: mem:")
    assert fake.jobs[21].state == fake.jobs[22].state == "PENDING"


def test_submit_held_refuses_impossible_memory_before_sending_anything(store: Store) -> None:
    fake = FakeSlurm()
    with pytest.raises(SubmissionError) as exc:
        submit_held(store, fake, _spec(mem_bytes=99999 * 1024**4), "#!/bin/sh\n", mps_pct=20, working_dir="/tmp",
                    environment={}, known_job_types=None)
    assert exc.value.field == "mem" and fake.calls == []
    sid, rep = submit_held(store, fake, _spec(), "#!/bin/sh\n", mps_pct=20, working_dir="/tmp", environment={},
                           known_job_types=None)
    assert len(rep.imported) == 1 and fake.jobs[sid].held


@pytest.mark.parametrize("on_slurm", [False, True])
def test_muxflow_submit_refuses_impossible_memory_in_one_line(tmp_path: Path, store: Store, on_slurm: bool) -> None:
    """On the simulated cluster and on Slurm (where nothing answers: the refusal comes before Slurm is asked)."""
    from pipelines.cli import main

    url = str(store.engine.url)
    env = {"MUXFLOW_SETTINGS": None, "DAGSTER_HOME": None, "MUXFLOW_DATABASE_URL": url,
           "MUXFLOW_CLUSTER": "slurm" if on_slurm else "simulated",
           "MUXFLOW_SLURM_URL": f"unix:{tmp_path / 'none.sock'}" if on_slurm else None}
    args = ["submit", "--name", "j", "--command", "python train.py", "--mem", "99999TiB", "--gpu-types", "t4,a10",
            "--checkpoint-dir", "/ckpt/j", "--steps", "10"]
    if not on_slurm:
        args += ["--job-type", "ResNet-50 (batch size 64)"]
    out = CliRunner().invoke(main, args, env=env, catch_exceptions=False)
    assert out.exit_code == 2, out.output
    assert out.stderr.strip() == ("error: mem: 99,999 TiB is more than any allowed GPU type has "
                                  "(a10 24 GiB, t4 15 GiB)")
    with store.session() as s:
        assert s.scalars(select(m.OfflineJob)).all() == []


def test_muxflow_slurm_submit_takes_no_job_type_and_refuses_impossible_memory(tmp_path: Path, store: Store) -> None:
    from pipelines.cli.slurm import slurm

    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    args = ["submit", "--db", str(store.engine.url), "--state-dir", str(tmp_path / "no-cluster"), "--script",
            str(script), "--name", "j", "--mem", "99999TiB", "--gpu-types", "t4", "--checkpoint-dir", "/ckpt/j",
            "--steps", "10"]
    out = CliRunner().invoke(slurm, args, env={"MUXFLOW_SLURM_URL": f"unix:{tmp_path / 'none.sock'}"},
                             catch_exceptions=False)
    assert out.exit_code == 2 and out.stderr.strip() == (
        "error: mem: 99,999 TiB is more than any allowed GPU type has (t4 15 GiB)"), out.output


@pytest.mark.parametrize("mem", ["1", "0.5", "1KiB", "63MiB"])
def test_a_memory_need_below_any_real_models_is_rejected_at_pickup_in_one_line(store: Store, mem: str) -> None:
    """mem=1 once passed: the planner took the job to fit anywhere and the Prolog's quota rounded to 0M (no limit)."""
    fake = FakeSlurm([make_job(31, comment=f"muxflow: mem={mem} gpu-types=t4 steps=5"),
                      make_job(32, comment="muxflow: mem=64MiB gpu-types=t4 steps=5")])
    rep = import_submissions(store, fake, only=[31, 32])
    assert len(rep.imported) == 1 and [sid for sid, _ in rep.rejected] == [31]
    reason = rep.rejected[0][1]
    assert reason.startswith("rejected: mem: ") and "below 64 MiB" in reason and "\n" not in reason, reason
    assert fake.jobs[31].state == "CANCELLED" and fake.jobs[32].state == "PENDING"


def test_a_checkpoint_path_is_bounded_and_one_line() -> None:
    gpus = {"t4": T4, "a10": A10}
    with pytest.raises(SubmissionError, match="checkpoint_dir: at most 1024"):
        validate(_spec(checkpoint_dir="/" + "c" * 2000), gpus, None)
    with pytest.raises(SubmissionError, match="checkpoint_dir: must not hold"):
        validate(_spec(checkpoint_dir="/ckpt/a\nb"), gpus, None)
    validate(_spec(checkpoint_dir="/" + "c" * 1000), gpus, None)
