"""Offline pick-up on the live dev cluster: plain ``sbatch -p offline`` jobs are held by job_submit.lua,
imported once with their spec (or none: any script is a job), and bad submissions are rejected (cancelled, reason
shown by `jobs list`)."""

from __future__ import annotations

import subprocess
import sys

from sqlalchemy import select

from executors.scheduler.slurm.pickup import import_submissions
from executors.store import models as m
from tests.live.muxflow_helpers import GOOD_COMMENT, REPO, make_store, register, sbatch, sbatch_run, write_script


def test_sbatch_offline_is_held_imported_once_and_bad_ones_rejected(dev_cluster, private_tmp) -> None:
    store, url = make_store(private_tmp)
    register(store, dev_cluster)
    d = dev_cluster.job_dir("pickup")
    script = write_script(d, "sleep 1\n")
    out = f"--output={d}/%j.out"
    good = sbatch(dev_cluster, script, "-p", "offline", "--gres=mps:30", "-J", "mx-good", out,
                  f"--comment={GOOD_COMMENT.format(name='good')}")
    no_spec = sbatch(dev_cluster, script, "-p", "offline", "--gres=mps:30", "-J", "mx-nospec", out)
    too_big = sbatch(dev_cluster, script, "-p", "offline", "--gres=mps:150", "-J", "mx-toobig", out,
                     f"--comment={GOOD_COMMENT.format(name='big')}")
    bad_type = sbatch(dev_cluster, script, "-p", "offline", "--gres=mps:20", "-J", "mx-badtype", out,
                      "--comment=muxflow: type=A3C mem=1GiB gpu-types=v100 ckpt=/c steps=10")
    no_gres = sbatch(dev_cluster, script, "-p", "offline", "-J", "mx-nogres", out,
                     f"--comment={GOOD_COMMENT.format(name='nogres')}")
    twice = sbatch(dev_cluster, script, "-p", "offline", "--gres=mps:20", "-J", "mx-twice", out,
                   "--comment=muxflow: type=x steps=1 steps=2")
    online = sbatch(dev_cluster, script, "-p", "online", "-J", "mx-online", out)
    try:

        with dev_cluster.client() as c:
            # job_submit.lua: every offline job waits held; the online one is not held.
            for sid in (good, no_spec, too_big, bad_type, no_gres, twice):
                j = c.get_job(sid)
                assert j.held and j.state == "PENDING", (sid, j.state, j.state_reason)
            assert not c.get_job(online).held

            mine = {good, no_spec, too_big, bad_type, no_gres, twice}
            # as on any real cluster, a job type is a free label (None); these jobs only: other test runs may
            # share the cluster, their jobs are theirs
            rep = import_submissions(store, c, None, only=mine | {online})
            again = import_submissions(store, c, None, only=mine | {online})
            assert again.imported == [] and again.rejected == []

            with store.session() as s:
                rows = {j.slurm_job_id: j for j in s.scalars(select(m.OfflineJob).where(
                    m.OfflineJob.slurm_job_id.in_(mine)))}
                assert set(rows) == mine
                g = rows[good]
                assert (g.state, g.job_type, g.mem_bytes, sorted(g.allowed_gpu_types), g.checkpoint_dir,
                        g.total_steps) == ("SUBMITTED", "ResNet-50 (batch size 64)", 2 * 1024**3, ["a10", "t4"],
                                           "/ckpt/good", 1000)
                # any script is a job: no comment, everything left to profiling
                n = rows[no_spec]
                assert (n.state, n.job_type, n.mem_bytes, sorted(n.allowed_gpu_types), n.total_steps,
                        n.checkpointing, n.name) == ("SUBMITTED", "", None, ["a10", "t4"], None, None, "mx-nospec")
                reasons = {sid: rows[sid].state_reason for sid in mine - {good, no_spec}}
                assert all(rows[sid].state == "FAILED" for sid in reasons)
            assert "mps:150" in reasons[too_big]
            assert "v100" in reasons[bad_type] and "gres" in reasons[no_gres] and "twice" in reasons[twice]
            assert all(r.startswith("rejected: ") for r in reasons.values())
            assert {sid for sid, _ in rep.rejected} == mine - {good, no_spec} and len(rep.imported) == 2

            for sid in mine - {good, no_spec}:
                j = c.get_job(sid)
                assert j.state == "CANCELLED" and "rejected" in j.comment, (sid, j.state, j.comment)
            assert c.get_job(good).held and c.get_job(no_spec).held  # still waiting for their placement

    finally:
        with dev_cluster.client() as c:
            for sid in (good, no_spec, online):
                try:
                    c.cancel(sid)
                except Exception:
                    pass

    listed = subprocess.run([sys.executable, "-m", "pipelines.cli", "--db", url, "jobs", "list"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "rejected: gres" in listed.stdout and "FAILED" in listed.stdout and "mx-good" in listed.stdout


def test_arrays_multi_node_heterogeneous_and_unrequeueable_jobs_are_refused_at_sbatch(dev_cluster) -> None:
    """job_submit.lua refuses, with the reason, what MuxFlow cannot place on one GPU share or move by requeue;
    an offline job that does not say gets requeue on; the online partition is left alone."""
    from executors.dev.slurm.install import JOB_USERS

    d = dev_cluster.job_dir("pickup-shapes")
    script = write_script(d, "sleep 1\n")
    user = JOB_USERS[0]
    common = ("-p", "offline", "--gres=mps:20", "--output=/dev/null", f"--comment={GOOD_COMMENT.format(name='s')}")
    refused = {
        "array": (("--array=0-2",), "job arrays are not placed by MuxFlow"),
        "nodes": (("-N", "2"), "-N 2 asks for more"),
        "het": ((":", "-p", "offline", "--gres=mps:10"), "heterogeneous jobs are not placed by MuxFlow"),
        "no-requeue": (("--no-requeue",), "drop --no-requeue"),
    }
    with dev_cluster.client() as c:
        before = {j.job_id for j in c.list_jobs()}
        for what, (extra, words) in refused.items():
            out = sbatch_run(dev_cluster, script, *common, *extra, user=user)
            assert out.returncode != 0 and words in out.stderr, (what, out.returncode, out.stderr)
        good = sbatch(dev_cluster, script, *common, user=user)
        online = sbatch(dev_cluster, script, "-p", "online", "--no-requeue", "--output=/dev/null", user=user)
        try:
            assert {j.job_id for j in c.list_jobs()} - before == {good, online}  # nothing refused got in
            assert c.get_job(good).held and c.get_job(good).requeue
            assert not c.get_job(online).requeue
        finally:
            for sid in (good, online):
                try:
                    c.cancel(sid)
                except Exception:
                    pass


def test_a_user_cannot_release_a_held_offline_job_by_hand(dev_cluster) -> None:
    env = {**__import__("os").environ, **dev_cluster.cluster.slurm_env(dev_cluster.layout)}
    sub = subprocess.run(["runuser", "-u", "nobody", "--", "sbatch", "--parsable", "-p", "offline", "-o", "/dev/null",
                          "--wrap", "true"], env=env, capture_output=True, text=True, timeout=30, cwd="/tmp")
    assert sub.returncode == 0, sub.stderr
    sid = int(sub.stdout.strip())
    rel = subprocess.run(["runuser", "-u", "nobody", "--", "scontrol", "release", str(sid)], env=env,
                         capture_output=True, text=True, timeout=30, cwd="/tmp")
    assert rel.returncode != 0
    with dev_cluster.client() as c:
        assert c.get_job(sid).held
        c.cancel(sid)


def test_muxflow_slurm_submit_does_the_same_as_sbatch(dev_cluster, private_tmp) -> None:
    store, url = make_store(private_tmp)
    register(store, dev_cluster)
    d = dev_cluster.job_dir("cli-submit")
    script = write_script(d, "true\n")
    args = ["submit", "--db", url, "--script", str(script), "--name", "mx-cli", "--job-type", "A3C",
            "--mem", "1GiB", "--gpu-types", "t4", "--checkpoint-dir", "/ckpt/cli", "--steps", "10", "--mps", "25"]
    out = dev_cluster.cli(*args)
    assert out.returncode == 0, out.stderr
    with store.session() as s:
        job = s.scalars(select(m.OfflineJob).where(m.OfflineJob.name == "mx-cli")).one()
        sid = job.slurm_job_id
        assert (job.job_type, job.mem_bytes, job.allowed_gpu_types, job.total_steps) == ("A3C", 1024**3, ["t4"], 10)
    with dev_cluster.client() as c:
        j = c.get_job(sid)
        assert j.held and j.mps_pct == 25 and j.partition == "offline"
        c.cancel(sid)
    bad = dev_cluster.cli(*[a if a != "t4" else "v100" for a in args])
    assert bad.returncode == 2 and "gpu_types" in bad.stderr


def test_muxflow_submit_on_a_slurm_setup_goes_through_slurm(dev_cluster, private_tmp) -> None:
    """`muxflow submit` with settings naming a Slurm cluster: sbatch through slurmrestd, held, picked up."""
    import os

    from executors.scheduler.slurm.pickup import spec_from_job

    store, url = make_store(private_tmp)
    register(store, dev_cluster)
    d = dev_cluster.job_dir("top-submit")
    env = {k: v for k, v in os.environ.items() if k not in ("MUXFLOW_SETTINGS", "DAGSTER_HOME")}
    env.update(MUXFLOW_CLUSTER="slurm", MUXFLOW_SLURM_URL=f"unix:{dev_cluster.layout.rest_socket}",
               MUXFLOW_DATABASE_URL=url)
    name = f"mx-top{os.getpid()}"

    def submit(*args: str) -> subprocess.CompletedProcess[str]:
        base = ["--name", name, "--job-type", "A3C", "--mem", "1GiB", "--gpu-types", "a10",
                "--checkpoint-dir", "/ckpt/top", "--steps", "10"]
        return subprocess.run([sys.executable, "-m", "pipelines.cli", "submit", *base, *args], cwd=d, env=env,
                              capture_output=True, text=True, timeout=120)

    out = submit("--command", "echo trained > done.txt", "--mps", "15")
    assert out.returncode == 0, out.stderr
    with store.session() as s:
        job = s.scalars(select(m.OfflineJob).where(m.OfflineJob.name == name)).one()
        sid, job_id = job.slurm_job_id, job.id
        assert (job.state, job.job_type, job.mem_bytes, job.allowed_gpu_types) == ("SUBMITTED", "A3C", 1024**3,
                                                                                   ["a10"])
    assert f"submitted job {job_id} ({name}) as Slurm job {sid}" in out.stdout
    try:
        with dev_cluster.client() as c:
            j = c.get_job(sid)
            assert j.held and j.mps_pct == 15 and j.partition == "offline" and j.working_dir == str(d)
            spec = spec_from_job(j)
            assert (spec.name, spec.job_type, spec.mem_bytes, spec.checkpoint_dir) == (name, "A3C", 1024**3,
                                                                                         "/ckpt/top")
            # bad input (more cases in test_cli.py): one line naming the field, exit 2, nothing sent or stored
            bad = submit("--command", "x", "--gpu-types", "v100")
            assert bad.returncode == 2 and bad.stderr.startswith("error: gpu_types"), bad.stderr
            assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
            assert [j.job_id for j in c.list_jobs() if j.name == name] == [sid]  # others may submit meanwhile
        with store.session() as s:
            assert len(s.scalars(select(m.OfflineJob)).all()) == 1
    finally:
        with dev_cluster.client() as c:
            c.cancel(sid)


def test_dagster_submission_sensor_picks_up_sbatch_jobs_on_slurm(private_cluster, private_tmp) -> None:
    """The sensor as Dagster evaluates it, against a real slurmrestd (a private cluster: the sensor imports,
    and rejects, every held offline job it sees, so it must not see other test runs' jobs)."""
    import datetime as dt

    from dagster import DagsterInstance, build_sensor_context

    from pipelines.definitions import build_definitions
    from pipelines.settings import MuxflowSettings

    live = private_cluster
    store, url = make_store(private_tmp)
    register(store, live)
    d = live.job_dir("sensor")
    script = write_script(d, "sleep 1\n")
    good = sbatch(live, script, "-p", "offline", "--gres=mps:20", "-J", "mx-sensor", f"--output={d}/%j.out",
                  f"--comment={GOOD_COMMENT.format(name='sensor')}")
    bad = sbatch(live, script, "-p", "offline", "--gres=mps:150", "-J", "mx-sensor-bad", f"--output={d}/%j.out")
    defs = build_definitions(MuxflowSettings(db_url=url, cluster="slurm", slurm_url=f"unix:{live.layout.rest_socket}",
                                             rounds_start=dt.datetime(2026, 1, 5, tzinfo=dt.UTC),
                                             report_dir=str(private_tmp / "report")))
    sensor = defs.resolve_sensor_def("new_submission_sensor")
    with DagsterInstance.ephemeral() as inst:
        with build_sensor_context(instance=inst, resources=defs.resources, definitions=defs) as ctx:
            tick = sensor.evaluate_tick(ctx)
        with store.session() as s:
            rows = {j.slurm_job_id: j for j in s.scalars(select(m.OfflineJob))}
        assert set(rows) == {good, bad}
        assert rows[good].state == "SUBMITTED" and rows[bad].state == "FAILED"
        assert [r.run_key for r in tick.run_requests] == [f"profile-upto-{rows[good].id}"]
        assert sensor.job_name == "profile_job"
        with live.client() as c:
            assert c.get_job(good).held and c.get_job(bad).state == "CANCELLED"
        with build_sensor_context(instance=inst, cursor=tick.cursor, resources=defs.resources,
                                  definitions=defs) as ctx:
            again = sensor.evaluate_tick(ctx)
        assert not again.run_requests and "0 imported" in again.skip_message
