"""``muxflow jobs show``: one job's life as its owner wants to read it (on SQLite and on PostgreSQL)."""

from __future__ import annotations

import datetime as dt

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from executors.scheduler.slurm.backend import register_slurm_nodes
from executors.scheduler.submission import JobSpec, submit
from executors.store import models as m
from executors.store.db import Store
from executors.store.inventory import job_history
from executors.store.jobs import transition
from pipelines.cli import main
from pipelines.cli.jobs import placement_actions
from scheduler_core.domain import JobState
from tests.executors.scheduler.slurm.fake_slurm import FakeSlurm

GIB = 1024**3
T0 = dt.datetime(2026, 3, 1, 10, 0, tzinfo=dt.UTC)
ENV = {"MUXFLOW_SETTINGS": None, "DAGSTER_HOME": None, "MUXFLOW_CLUSTER": "simulated"}


@pytest.fixture()
def life(store: Store) -> dict:
    """A job started, kept, restarted at a new share on its GPU, moved, evicted and placed again; and another job's
    placements beside it (not its own)."""
    register_slurm_nodes(store, FakeSlurm())
    with store.session() as s:
        a, b = sorted(s.scalars(select(m.Gpu).where(m.Gpu.gpu_type == "t4")), key=lambda g: g.gpu_index)[:2]
        job = submit(s, JobSpec(name="bert", command="train.sh", job_type="BERT", mem_bytes=3 * GIB,
                                allowed_gpu_types=("t4",), checkpoint_dir="/ckpt", total_steps=1000), None)
        other = submit(s, JobSpec(name="other", command="x.sh", job_type="", mem_bytes=GIB,
                                  allowed_gpu_types=("t4",), checkpoint_dir="/c2", total_steps=10), None)
        job.slurm_job_id, job.run_as_user, job.checkpointing, job.steps_done = 4242, "alice", "detected", 250.0
        for st in (JobState.PROFILING, JobState.PENDING, JobState.PLACED, JobState.RUNNING):
            transition(s, job.id, st, f"to {st.value}")
        plan = [("start", a, 70), ("keep", a, 70), ("migrate", a, 50), ("migrate", b, 60), ("start", a, 40)]
        for k, (action, gpu, pct) in enumerate(plan):
            rnd = m.SchedulingRound(window_start_utc=T0 + dt.timedelta(minutes=15 * k))
            s.add(rnd)
            s.flush()
            s.add(m.Placement(round_id=rnd.id, job_id=job.id, gpu_id=gpu.id, sm_pct=pct, mem_quota_bytes=4 * GIB,
                              predicted_norm_tput=0.5 + k / 10, predicted_online_slowdown=1.1, action=action))
            s.add(m.Placement(round_id=rnd.id, job_id=other.id, gpu_id=b.id if gpu is a else a.id, sm_pct=30,
                              mem_quota_bytes=GIB, predicted_norm_tput=0.3, predicted_online_slowdown=1.05,
                              action="migrate" if k else "start"))
        s.add(m.Eviction(job_id=job.id, gpu_id=b.id, at_utc=T0 + dt.timedelta(minutes=50), health="Overlimit",
                         reason="Overlimit: sm_activity 99% >= 97%", source="node-agent"))
        for k in range(2):
            s.add(m.JobExecution(job_id=job.id, gpu_id=a.id, start_utc=T0 + dt.timedelta(minutes=15 * k),
                                 end_utc=T0 + dt.timedelta(minutes=15 * (k + 1)), sm_pct=70, steps=100.0,
                                 wall_s=900.0, solo_equiv_s=700.0, source="measured"))
        return {"job": job.id, "a": (a.node.name, a.gpu_index), "b": (b.node.name, b.gpu_index)}


def test_the_rounds_starts_moves_and_new_shares_are_told_apart(store: Store, life: dict) -> None:
    with store.session() as s:
        h = job_history(s, job_id=life["job"])
        acts = [(what, (node, index), pct) for what, _at, node, index, pct, _p in placement_actions(h)]
    a, b = life["a"], life["b"]
    # the keep is no action; a restart at 50 % on the same GPU is a new share; the start after the eviction a start
    assert acts == [("start", a, 70), ("resize", a, 50), ("move", b, 60), ("start", a, 40)]
    assert [t.to_state for t in h.transitions] == ["PROFILING", "PENDING", "PLACED", "RUNNING"]


def test_jobs_show_by_id_and_by_slurm_job(store: Store, life: dict) -> None:
    url = str(store.engine.url)
    out = CliRunner().invoke(main, ["--db", url, "jobs", "show", str(life["job"])], env=ENV, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    text = out.stdout
    assert text.splitlines()[0] == f"job {life['job']} 'bert' (type BERT, user alice, Slurm job 4242)"
    assert "  progress     25.0% of 1,000 steps" in text
    assert "  checkpoints  on signal (detected)" in text
    assert ("  by rounds    started 2x, moved 1x to another GPU, restarted 1x at a new share on its GPU, kept 1x; "
            "evicted 1x") in text
    assert "  on GPUs      2 execution(s), 0.50 h, 200 steps" in text
    rows = [ln.split() for ln in text.split("placements (")[1].split("\n\n")[0].splitlines()[3:]]
    assert [(r[2], r[3]) for r in rows] == [("start", life["a"][0]), ("resize", life["a"][0]),
                                            ("move", life["b"][0]), ("start", life["a"][0])]
    assert [r[8] for r in rows] == ["70", "50", "60", "40"]   # the share, after "<node> GPU <i> (id <n>)"
    assert "Overlimit: sm_activity 99% >= 97%" in text.split("evictions (")[1]
    assert "PLACED -> RUNNING" in text.split("state changes:")[1]
    by_slurm = CliRunner().invoke(main, ["--db", url, "jobs", "show", "--slurm", "4242"], env=ENV)
    assert by_slurm.exit_code == 0 and by_slurm.stdout == text


@pytest.mark.parametrize("args, said", [(["77"], "no job 77"), (["--slurm", "77"], "no Slurm job 77"),
                                        (["0"], "0 is not in the range"), (["x"], "'x' is not a valid integer")])
def test_an_unknown_or_bad_job_is_one_line_and_exit_2(store: Store, life: dict, args: list, said: str) -> None:
    out = CliRunner().invoke(main, ["--db", str(store.engine.url), "jobs", "show", *args], env=ENV)
    assert out.exit_code == 2 and said in out.stderr and not out.stdout, out.output


def test_what_users_wrote_reaches_the_operators_terminal_escaped(store: Store) -> None:
    """A Slurm user names their job and their program writes the error a reason quotes: escape sequences (retitle,
    rewrite the screen), a newline forging a line of the table, a bidirectional override reordering what is shown
    all print escaped, in ``jobs list`` and in ``jobs show``."""
    register_slurm_nodes(store, FakeSlurm())
    name = "evil\x1b]0;owned\x07\x1b[2J\n99  root-job  RUNNING"
    with store.session() as s:
        job = submit(s, JobSpec(name=name, command="x.sh", job_type="t\x1b[31m", mem_bytes=GIB,
                                allowed_gpu_types=("t4",), checkpoint_dir="/c", total_steps=10), None)
        transition(s, job.id, JobState.PROFILING, "profiling")
        transition(s, job.id, JobState.FAILED, "crashed: RuntimeError: \u202egnp.exe\r\x1b[1Aall good")
        job_id = job.id
    url = str(store.engine.url)
    for args in (["jobs", "list"], ["jobs", "show", str(job_id)]):
        out = CliRunner().invoke(main, ["--db", url, *args], env=ENV, catch_exceptions=False)
        assert out.exit_code == 0, out.output
        text = out.stdout
        assert not [c for c in text if not c.isprintable() and c != "\n"], repr(text)
        assert "evil\\x1b]0;owned\\x07\\x1b[2J\\n99  root-job  RUNNING" in text
        assert "\\u202egnp.exe\\r\\x1b[1Aall good" in text
        assert not any(line.startswith("99") for line in text.splitlines())  # no forged line


@pytest.mark.parametrize("text, shown", [
    ("resnet-50 (batch 64) ünïcode 日本", "resnet-50 (batch 64) ünïcode 日本"),   # printable text is kept as it is
    ("a\x1b]0;t\x07b", "a\\x1b]0;t\\x07b"), ("x\ny\r\tz\x7f", "x\\ny\\r\\tz\\x7f"), ("\u202eexe.txt", "\\u202eexe.txt"),
    ("\x9b31m", "\\x9b31m"),   # a C1 control (the 8-bit CSI)
])
def test_printable_escapes_control_characters_only(text: str, shown: str) -> None:
    from executors.text import printable

    assert printable(text) == shown
