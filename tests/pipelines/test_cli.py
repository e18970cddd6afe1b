"""The ``muxflow`` command line on SQLite and PostgreSQL: happy paths, one-line errors that
leave the store untouched, help on every command, and a short scheduling flow."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import create_engine, func, select

from executors.store import models as m
from pipelines.cli import main

RESNET = "ResNet-50 (batch size 64)"
CLUSTER = ["cluster", "init", "--simulated", "--gpus", "16", "--types", "t4:8,a10:8", "--services", "3"]
JOB = ["submit", "--name", "j1", "--command", "python train.py", "--job-type", RESNET, "--mem", "2GiB",
       "--gpu-types", "t4,a10", "--checkpoint-dir", "/ckpt/j1", "--steps", "1000"]


def run(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--db", url, *args], catch_exceptions=False)


def ok(url: str, *args: str) -> Result:
    result = run(url, *args)
    assert result.exit_code == 0, result.output
    return result


def row_counts(url: str) -> dict[str, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {t.name: conn.scalar(select(func.count()).select_from(t)) for t in m.Base.metadata.sorted_tables}
    finally:
        engine.dispose()


def with_job(args: list[str], option: str, value: str | None) -> list[str]:
    """JOB with ``option`` replaced by ``value`` (or dropped when None)."""
    out, i = [], 0
    while i < len(args):
        if args[i] == option:
            if value is not None:
                out += [option, value]
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def assert_usage_error(url: str, args: list[str], field: str) -> Result:
    """Exit 2, exactly one line on stderr ``error: <field>...``, and not a row changed anywhere."""
    before = row_counts(url)
    result = run(url, *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert re.search(field, lines[0]), lines[0]
    assert row_counts(url) == before
    return result


@pytest.fixture
def cluster_url(store_url: str) -> str:
    ok(store_url, *CLUSTER)
    return store_url


# -- schema and cluster -------------------------------------------------------------


def test_db_upgrade_is_idempotent(store_url: str) -> None:
    first = ok(store_url, "db", "upgrade")
    before = row_counts(store_url)
    second = ok(store_url, "db", "upgrade")
    assert first.output == second.output
    assert "schema at revision" in second.output
    assert row_counts(store_url) == before


def test_db_upgrade_on_empty_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh' / 'store.db'}"
    ok(url, "db", "upgrade")
    ok(url, "db", "upgrade")
    assert set(row_counts(url)) == {t.name for t in m.Base.metadata.sorted_tables}


def test_command_on_unmigrated_store_says_upgrade(tmp_path: Path) -> None:
    result = run(f"sqlite:///{tmp_path / 'empty.db'}", "cluster", "show")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: database:") and "db upgrade" in result.stderr


def test_cluster_init_and_show(cluster_url: str) -> None:
    counts = row_counts(cluster_url)
    assert counts["gpus"] == 16 and counts["online_services"] == 3 and counts["service_instances"] == 16
    out = ok(cluster_url, "cluster", "show").output
    assert "16 GPUs (SIMULATED)" in out
    body = [ln for ln in out.splitlines() if ln.strip().startswith("sim-")]
    assert len(body) == 16
    assert sum(" t4 " in ln for ln in body) == 8 and sum(" a10 " in ln for ln in body) == 8


def test_cluster_show_without_cluster(store_url: str) -> None:
    assert "no cluster yet" in ok(store_url, "cluster", "show").output


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--gpus", "16", "--types", "t4:8,x99:8"], r"^error: types: .*x99"),
        (["--gpus", "10", "--types", "t4:8,a10:8"], r"^error: types: .*16.*10"),
        (["--gpus", "16", "--types", "t4"], r"^error: types:"),
        (["--gpus", "16", "--types", "t4:0,a10:16"], r"^error: types:"),
        (["--gpus", "0", "--types", ""], r"^error: types:"),
    ],
)
def test_cluster_init_bad_inputs(store_url: str, args: list[str], field: str) -> None:
    assert_usage_error(store_url, ["cluster", "init", "--simulated", *args], field)


# -- online services ------------------------------------------------------------------


def rows(url: str, stmt) -> list:
    """The rows ``stmt`` reads from the store at ``url`` (its own short-lived engine)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(stmt).all())
    finally:
        engine.dispose()


def _spare_gpu(url: str) -> int:
    """A GPU without an online service (cluster init gives every GPU one)."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            node_id = conn.execute(m.Node.__table__.insert().values(name="spare", simulated=True)).inserted_primary_key[0]
            return conn.execute(m.Gpu.__table__.insert().values(
                node_id=node_id, gpu_index=0, gpu_type="t4", uuid="GPU-spare-0", health="Init",
                overlimit_entries=[])).inserted_primary_key[0]
    finally:
        engine.dispose()


REGISTER = ["online", "register", "--name", "search", "--family", "transformer", "--qps-min", "10",
            "--qps-max", "200", "--mem", "3GiB"]


def test_online_register_happy_path(cluster_url: str) -> None:
    gpu_id = _spare_gpu(cluster_url)
    before = row_counts(cluster_url)
    out = ok(cluster_url, *REGISTER, "--gpu-ids", str(gpu_id)).output
    assert "registered online service search on 1 GPU(s)" in out
    after = row_counts(cluster_url)
    assert after["online_services"] == before["online_services"] + 1
    assert after["service_instances"] == before["service_instances"] + 1
    show = ok(cluster_url, "cluster", "show").output
    assert any("spare" in ln and "search" in ln for ln in show.splitlines())
    # The same name again is refused.
    assert_usage_error(cluster_url, [*REGISTER, "--gpu-ids", str(gpu_id)], r"^error: name: ")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"--qps-min": "300"}, r"^error: qps: "),
        ({"--qps-min": "-1"}, r"^error: qps: "),
        ({"--mem": "lots"}, r"^error: mem: "),
        ({"--mem": "0GiB"}, r"^error: mem: "),
        ({"--name": "  "}, r"^error: name: "),
        ({"--gpu-ids": "1,x"}, r"^error: gpu-ids: "),
        ({"--gpu-ids": "9999"}, r"^error: gpu-ids: .*9999"),
        ({"--gpu-ids": "1"}, r"^error: gpu-ids: .*already"),  # hosts a service since cluster init
        ({"--gpu-ids": ","}, r"^error: gpu-ids: "),
        ({"--peak-hour": "24"}, r"^error: peak-hour: "),
        ({"--slo-ms": "0"}, r"^error: slo-ms: "),
        ({"--allowance": "-0.1"}, r"^error: allowance: "),
    ],
)
def test_online_register_bad_inputs(cluster_url: str, change: dict[str, str], field: str) -> None:
    gpu_id = _spare_gpu(cluster_url)
    args = {"--gpu-ids": str(gpu_id)}
    args.update(change)
    flat = list(REGISTER)
    for opt, val in args.items():
        if opt in flat:
            flat[flat.index(opt) + 1] = val
        else:
            flat += [opt, val]
    assert_usage_error(cluster_url, flat, field)


def test_online_register_unknown_family_is_usage_error(cluster_url: str) -> None:
    before = row_counts(cluster_url)
    bad = list(REGISTER)
    bad[bad.index("--family") + 1] = "quantum"
    result = run(cluster_url, *bad, "--gpu-ids", "1")
    assert result.exit_code == 2 and "--family" in result.output
    assert row_counts(cluster_url) == before


# -- offline job submission ----------------------------------------------------------------


def test_submit_and_list(cluster_url: str) -> None:
    out = ok(cluster_url, *JOB).output
    assert re.search(r"submitted job \d+ \(j1\)", out)
    listing = ok(cluster_url, "jobs", "list").output
    (line,) = [ln for ln in listing.splitlines() if " j1 " in ln]
    assert "SUBMITTED" in line and RESNET in line and "0.0%" in line
    assert " j1 " in ok(cluster_url, "jobs", "list", "--state", "submitted").output
    assert ok(cluster_url, "jobs", "list", "--state", "RUNNING").output.strip() == "no jobs"
    assert_usage_error(cluster_url, ["jobs", "list", "--state", "SLEEPING"], r"^error: state: ")


def test_jobs_list_empty(cluster_url: str) -> None:
    assert ok(cluster_url, "jobs", "list").output.strip() == "no jobs"


@pytest.mark.parametrize(
    ("option", "value", "field"),
    [
        ("--name", None, r"^error: name: "),
        ("--command", None, r"^error: command: "),
        ("--steps", None, r"^error: steps: "),
        ("--mem", "-1GiB", r"^error: mem: "),
        ("--mem", "0", r"^error: mem: "),
        ("--gpu-types", "t4,x99", r"^error: gpu[-_]types: .*x99"),
        ("--gpu-types", "a100", r"^error: gpu[-_]types: .*a100"),  # a known model, but not in this cluster
        ("--job-type", "Quantum (batch size 1)", r"^error: job[-_]type: "),
        ("--checkpoint-dir", "ckpt/j1", r"^error: checkpoint[-_]dir: "),
        ("--steps", "0", r"^error: steps: "),
        ("--name", "", r"^error: name: "),
        ("--name", "n" * 129, r"^error: name: "),
    ],
)
def test_submit_bad_inputs(cluster_url: str, option: str, value: str | None, field: str) -> None:
    assert_usage_error(cluster_url, with_job(JOB, option, value), field)


def test_submit_priority_out_of_range(cluster_url: str) -> None:
    assert_usage_error(cluster_url, [*JOB, "--priority", "5000"], r"^error: priority: ")


def _trace_line(job_type: str = RESNET, steps: str = "500", arrival: str = "0", scale: str = "1") -> str:
    return "\t".join([job_type, "cd %s/x && python3 main.py", "--num_steps", "1", steps, arrival, scale]) + "\n"


def test_submit_trace(cluster_url: str, tmp_path: Path) -> None:
    trace = tmp_path / "good.trace"
    trace.write_text(_trace_line() + _trace_line(steps="900", arrival="30") + _trace_line(scale="4"))
    out = ok(cluster_url, "submit", "--trace", str(trace)).output
    assert "submitted 2 jobs" in out and "1 multi-GPU lines skipped" in out
    assert row_counts(cluster_url)["offline_jobs"] == 2
    listing = ok(cluster_url, "jobs", "list").output
    assert "philly-l1-resnet-50" in listing and "philly-l2-resnet-50" in listing


def test_submit_trace_with_malformed_line_stores_nothing(cluster_url: str, tmp_path: Path) -> None:
    trace = tmp_path / "bad.trace"
    five_cols = "\t".join([RESNET, "cmd", "--num_steps", "1", "500"]) + "\n"
    trace.write_text(_trace_line() + _trace_line() + five_cols + _trace_line())
    result = assert_usage_error(cluster_url, ["submit", "--trace", str(trace)], r"^error: .*bad.trace: trace line 3: ")
    assert result.stderr.strip() == f"error: {trace}: trace line 3: expected 7 tab-separated columns, found 5"
    assert row_counts(cluster_url)["offline_jobs"] == 0


def test_submit_trace_rejected_job_rolls_back_earlier_lines(cluster_url: str, tmp_path: Path) -> None:
    # Lines 1–2 are fine and would be inserted first; line 3 names an unknown job type: all or nothing.
    trace = tmp_path / "unknown.trace"
    trace.write_text(_trace_line() + _trace_line() + _trace_line(job_type="Quantum (batch size 1)"))
    assert_usage_error(cluster_url, ["submit", "--trace", str(trace)], r"^error: .*unknown.trace: trace line 3: ")
    assert row_counts(cluster_url)["offline_jobs"] == 0


def test_submit_missing_trace_file(cluster_url: str, tmp_path: Path) -> None:
    assert_usage_error(cluster_url, ["submit", "--trace", str(tmp_path / "nope.trace")], r"^error: trace: no such")


@pytest.mark.parametrize("extra", [["--name", "mine"], ["--steps", "10"], ["--job-type", RESNET],
                                   ["--priority", "3"]])
def test_submit_trace_refuses_the_options_of_one_job(cluster_url: str, tmp_path: Path, extra: list[str]) -> None:
    trace = tmp_path / "good.trace"
    trace.write_text(_trace_line())
    assert_usage_error(cluster_url, ["submit", "--trace", str(trace), *extra],
                       rf"^error: {extra[0][2:]}: not with --trace \(each trace line is one job")


def test_submit_limit_without_a_trace_is_refused(cluster_url: str) -> None:
    assert_usage_error(cluster_url, [*JOB, "--limit", "3"], r"^error: limit: only with --trace$")


# -- help everywhere ------------------------------------------------------------------------


def _command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            paths += _command_paths(cmd, (*prefix, name))
        else:
            paths.append((*prefix, name))
    return paths


HELP_PATHS = _command_paths(main)


def test_help_paths_cover_all_commands() -> None:
    flat = {" ".join(p) for p in HELP_PATHS}
    assert {"db upgrade", "cluster init", "cluster show", "online register", "submit", "jobs list",
            "profile", "sample", "train", "round", "report", "run"} <= flat


@pytest.mark.parametrize("path", HELP_PATHS, ids=lambda p: " ".join(p) or "main")
def test_help_works(path: tuple[str, ...], tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'help.db'}"
    for flag in ("--help", "-h"):
        result = CliRunner().invoke(main, ["--db", url, *path, flag], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert result.output.startswith("Usage:")
    assert not (tmp_path / "help.db").exists()  # help writes nothing


# -- the scheduling flow --------------------------------------------------------------------


def test_sample_train_round_report_flow(cluster_url: str, tmp_path: Path) -> None:
    long_job = with_job(JOB, "--steps", "5000000")  # runs through both rounds
    ok(cluster_url, *long_job)
    ok(cluster_url, *with_job(long_job, "--name", "j2"))
    sampled = ok(cluster_url, "sample", "--per-type", "200").output
    assert "'t4': 200" in sampled and "'a10': 200" in sampled
    trained = ok(cluster_url, "train", "--epochs", "20", "--hidden", "64").output  # the paper's width
    assert re.search(r"^t4 v1 \(mlp 4 x 64, 20 epochs\): .*promoted", trained, re.M)
    assert re.search(r"^a10 v1 \(mlp 4 x 64, 20 epochs\): .*promoted", trained, re.M)
    assert row_counts(cluster_url)["predictor_models"] == 2

    for k in (1, 2):
        out = ok(cluster_url, "round", "--once").output
        assert "SIMULATED" in out
        assert re.search(rf"^round {k} window .* 16 GPUs, 2 jobs", out, re.M), out
    counts = row_counts(cluster_url)
    assert counts["scheduling_rounds"] == 2
    assert counts["gpu_metrics_minute"] == 16 * (60 + 2 * 15)  # an hour of warm-up, then two rounds
    assert counts["job_profiles"] > 0

    report = ok(cluster_url, "report", "placements_per_round").output
    rows = [ln for ln in report.splitlines()[1:] if ln.strip()]
    assert len(rows) == 2
    assert [int(r.split()[0]) for r in rows] == [1, 2]

    csv_path = tmp_path / "out" / "oversold.csv"
    out = ok(cluster_url, "report", "oversold_per_round", "--csv", str(csv_path)).output
    assert f"wrote {csv_path}" in out
    with open(csv_path, newline="") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 2 and "oversold_gpu" in table[0] and table[0]["source"] == "simulated"

    listed = ok(cluster_url, "report", "--list").output
    assert "placements_per_round" in listed and "oversold_per_round" in listed
    assert_usage_error(cluster_url, ["report", "nosuch"], r"^error: report: .*nosuch")


def test_round_with_several_jobs_per_gpu_puts_jobs_together_within_the_gpu(cluster_url: str) -> None:
    # 24 jobs that need few SMs (35 %) on 16 GPUs: with two slots per GPU the round places more than 16, two on
    # some GPUs, each in its own slot, their shares within the GPU; the simulated cluster runs them together.
    small = with_job(with_job(JOB, "--job-type", "Recommendation (batch size 512)"), "--steps", "5000000")
    for i in range(24):
        ok(cluster_url, *with_job(small, "--name", f"s{i}"))
    ok(cluster_url, "sample", "--per-type", "600")
    ok(cluster_url, "train", "--epochs", "60")
    before = row_counts(cluster_url)
    refused = run(cluster_url, "round", "--once", "--max-jobs-per-gpu", "0")
    assert refused.exit_code == 2 and "--max-jobs-per-gpu" in refused.stderr and row_counts(cluster_url) == before
    out = ok(cluster_url, "round", "--once", "--max-jobs-per-gpu", "2").output
    placed = int(re.search(r"^placements (\d+)", out, re.M).group(1))
    assert 16 < placed <= 24, out
    engine = create_engine(cluster_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(m.Placement.gpu_id, m.Placement.slot, m.Placement.sm_pct)).all()
            running = conn.scalar(select(func.count()).select_from(m.OfflineJob).where(m.OfflineJob.state == "RUNNING"))
    finally:
        engine.dispose()
    per_gpu: dict[int, list[tuple[int, int]]] = {}
    for gpu_id, slot, pct in rows:
        per_gpu.setdefault(gpu_id, []).append((slot, pct))
    shared = {g: ps for g, ps in per_gpu.items() if len(ps) > 1}
    assert shared and all(sorted(s for s, _ in ps) == [0, 1] and sum(p for _, p in ps) <= 100
                          for ps in shared.values()), per_gpu
    assert running == placed  # every placement was dispatched and runs, two to a GPU where the plan said so


def _job_rows(url: str) -> dict[int, tuple[str, str | None]]:
    return {j.id: (j.state, j.state_reason) for j in rows(url, select(m.OfflineJob))}


def test_jobs_cancel_all_or_none_and_a_slurm_job_is_scancelled(cluster_url: str) -> None:
    for name in ("a", "b", "c"):
        ok(cluster_url, *with_job(JOB, "--name", name))
    assert_usage_error(cluster_url, ["jobs", "cancel", "1", "9"], r"^error: no offline job 9$")
    out = ok(cluster_url, "jobs", "cancel", "1", "2", "--reason", "wrong data").output
    assert out.splitlines() == ["cancelled job 1 (SUBMITTED -> FAILED)", "cancelled job 2 (SUBMITTED -> FAILED)"]
    jobs = _job_rows(cluster_url)
    assert jobs[1] == jobs[2] == ("FAILED", "cancelled by the user (muxflow jobs cancel): wrong data")
    assert jobs[3][0] == "SUBMITTED"
    assert_usage_error(cluster_url, ["jobs", "cancel", "3", "1"], r"^error: job 1 has already ended \(FAILED\)$")
    assert _job_rows(cluster_url)[3][0] == "SUBMITTED"  # all or none
    engine = create_engine(cluster_url)
    with engine.begin() as conn:
        conn.execute(m.OfflineJob.__table__.update().where(m.OfflineJob.id == 3).values(slurm_job_id=4242))
    engine.dispose()
    assert_usage_error(cluster_url, ["jobs", "cancel", "3"], r"^error: job 3 is Slurm job 4242: cancel it with "
                                                             r"`scancel 4242`")


def test_a_running_job_cancelled_stops_and_the_next_round_goes_on_without_it(cluster_url: str) -> None:
    long_job = with_job(JOB, "--steps", "5000000")
    ok(cluster_url, *long_job)
    ok(cluster_url, *with_job(long_job, "--name", "j2"))
    ok(cluster_url, "sample", "--per-type", "200")
    ok(cluster_url, "train", "--epochs", "20")
    ok(cluster_url, "round", "--once")
    running = [j for j, (state, _) in _job_rows(cluster_url).items() if state == "RUNNING"]
    assert running, _job_rows(cluster_url)
    gone = running[0]
    ran_before = len(rows(cluster_url, select(m.JobExecution).where(m.JobExecution.job_id == gone)))
    assert ok(cluster_url, "jobs", "cancel", str(gone)).output.strip() == f"cancelled job {gone} (RUNNING -> FAILED)"
    out = ok(cluster_url, "round", "--once").output
    assert re.search(r"^round 2 window .* 16 GPUs, 1 jobs", out, re.M), out
    assert _job_rows(cluster_url)[gone][0] == "FAILED"
    # It ran until the cancel, at the simulated cluster's time (the end of the booked window), and no more.
    assert ran_before >= 1
    assert len(rows(cluster_url, select(m.JobExecution).where(m.JobExecution.job_id == gone))) == ran_before
    assert not rows(cluster_url, select(m.Placement).where(m.Placement.job_id == gone, m.Placement.round_id == 2))


def test_round_is_once_or_fill_and_a_fill_needs_a_real_cluster(cluster_url: str) -> None:
    assert_usage_error(cluster_url, ["round"], r"^error: round: give --once \(a round\) or --fill")
    assert_usage_error(cluster_url, ["round", "--once", "--fill"], r"^error: round: give --once")
    ok(cluster_url, *JOB)
    ok(cluster_url, "sample", "--per-type", "200")
    ok(cluster_url, "train", "--epochs", "3")
    assert_usage_error(cluster_url, ["round", "--fill"], r"^error: round: fills run on a real cluster: the "
                                                          r"simulated cluster books whole round windows")


def test_round_without_predictor_or_cluster(store_url: str) -> None:
    assert_usage_error(store_url, ["round", "--once"], r"^error: cluster: ")
    ok(store_url, *CLUSTER)
    assert_usage_error(store_url, ["train", "--epochs", "1"], r"^error: samples: ")
    ok(store_url, *JOB)
    # No predictor: refused before the simulated cluster profiles the job or records its online warm-up hour.
    assert_usage_error(store_url, ["round", "--once"], r"^error: round: no promoted speed predictor")


@pytest.mark.parametrize("command", [["slurm", "pickup"], ["slurm", "register-nodes"]])
def test_slurm_commands_use_the_groups_db_and_say_in_one_line_that_slurm_does_not_answer(
        store_url: str, tmp_path: Path, monkeypatch, command: list[str]) -> None:
    monkeypatch.chdir(tmp_path)  # no default store here: only `muxflow --db` names one
    monkeypatch.delenv("MUXFLOW_DATABASE_URL", raising=False)
    monkeypatch.setenv("MUXFLOW_SLURM_URL", f"unix:{tmp_path}/no-slurmrestd.sock")
    before = row_counts(store_url)
    result = run(store_url, *command)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: slurm: "), result.stderr
    assert "no-slurmrestd.sock" in lines[0]
    assert row_counts(store_url) == before


@pytest.mark.parametrize("args", [
    ["round", "--once", "--migration-penalty", "nan"],
    ["round", "--once", "--seed", "-1"],
    ["submit", "--trace", "x.trace", "--limit", "-3"],
    ["simulate", "--hours", "inf"],
    ["simulate", "--jobs", str(10**9)],
])
def test_values_no_run_could_use_are_refused_before_anything_runs(store_url: str, args: list[str]) -> None:
    before = row_counts(store_url)
    result = run(store_url, *args)
    assert result.exit_code == 2 and "Invalid value" in result.output, result.output
    assert row_counts(store_url) == before


def test_submit_refuses_steps_the_store_could_not_hold(cluster_url: str) -> None:
    assert_usage_error(cluster_url, with_job(JOB, "--steps", str(10**23)), "steps")


def test_main_job_checks_its_trace_and_report_dir_before_it_writes_anything(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'run.db'}"
    trace = tmp_path / "t.trace"
    trace.write_text("ResNet-50 (batch size 64)\tpython t.py\t--steps\t0\t100\t0\t1\n"
                     "No Such Model (batch size 1)\tpython t.py\t--steps\t0\t100\t5\t1\n")
    common = ["run", "--gpus", "t4:2", "--services", "1", "--hours", "0.25", "--dagster-home", str(tmp_path / "dh")]
    result = run(url, *common, "--trace", str(trace), "--report-dir", str(tmp_path / "rep"))
    assert result.exit_code == 2 and "trace line 2: unknown job type 'No Such Model" in result.stderr, result.output
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    result = run(url, *common, "--report-dir", str(not_a_dir / "sub"))
    assert result.exit_code == 2 and result.stderr.startswith("error: report-dir: cannot write"), result.output
    assert not (tmp_path / "run.db").exists()  # nothing was set up


def test_simulate_compare_checks_its_out_dir_before_simulating(tmp_path: Path) -> None:
    from executors.data.calibration import SAMPLE_TRACE

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    result = CliRunner().invoke(main, ["simulate", "compare", "--trace", str(SAMPLE_TRACE), "--gpus", "4",
                                       "--hours", "0.25", "--quiet", "--out", str(not_a_dir / "sub")])
    assert result.exit_code == 2 and "out: cannot write to" in result.stderr, result.output
    assert "round" not in result.stderr  # no policy ran


def test_a_bad_measurement_file_is_one_line_and_the_round_writes_nothing(store_url: str, tmp_path: Path,
                                                                         monkeypatch) -> None:
    from executors.data import calibration

    ok(store_url, *CLUSTER)
    bad = tmp_path / "lab.json"
    bad.write_text('{"format": "muxflow.colocation/1", "gpus": {"v100": {"gpu_model": "Tesla V100", "driver": "535", '
                   '"method": "mps", "date": "2025-03-14"}}, "solo": [{"gpu_type": "v100", "job_type": "ResNet-50 '
                   '(batch size 16)", "steps_per_s": NaN}], "pairs": []}')
    before = row_counts(store_url)
    monkeypatch.setenv("MUXFLOW_MEASUREMENTS", str(bad))
    calibration.reset()
    try:
        result = CliRunner().invoke(main, ["--db", store_url, "round", "--once"])
    finally:
        monkeypatch.delenv("MUXFLOW_MEASUREMENTS")
        calibration.reset()
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert f"measurements (MUXFLOW_MEASUREMENTS): {bad}: solo[0].steps_per_s: expected a number, got nan" \
        in result.output
    assert row_counts(store_url) == before


def test_simulate_says_whether_the_burst_guard_ran_and_what_it_paced() -> None:
    """The same hours with the guard and without, every replica over its SLO (scale 0.5): the config says which ran;
    with it the bursts on shared GPUs are paced, without it nothing is."""
    import json

    from executors.data.calibration import SAMPLE_TRACE

    got = {}
    for flag in ("--burst-guard", "--no-burst-guard"):
        result = CliRunner().invoke(main, ["simulate", "--trace", str(SAMPLE_TRACE), "--gpus", "16", "--hours", "3",
                                           "--jobs", "40", "--slo-scale", "0.5", "--quiet", "--json", flag])
        assert result.exit_code == 0, result.output
        got[flag] = json.loads(result.stdout)
    assert got["--burst-guard"]["config"]["burst_guard"] is True
    assert got["--no-burst-guard"]["config"]["burst_guard"] is False
    assert got["--no-burst-guard"]["offline"]["burst_paced_gpu_minutes"] == 0
    assert got["--burst-guard"]["offline"]["burst_paced_gpu_minutes"] > 0
