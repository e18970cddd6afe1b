"""What a malicious user can do to MuxFlow on a real Slurm cluster: the attacks of docs/SECURITY.md, tried for real.

On a private dev cluster of each release under test (22.05 in ``make test``, 24.11 in ``make test-slurm-compat``),
the real non-root user ``mxuser1`` submits with plain ``sbatch`` an offline job whose script, once MuxFlow profiles
it, tries what a user who wants MuxFlow's or Slurm's privileges would: read the cluster's JWT signing key,
MuxFlow's tokens, plan keys, the accounting database's password and MuxFlow's settings; drain a node; mint tokens
for root or MuxFlow; release another user's job; write a plan for itself; plant plan files and job-state files;
raise its own admin level. MuxFlow profiles the job as it profiles every job: in the job's own Slurm job, which
Slurm runs as its owner. The test asserts that the window ran as ``mxuser1`` with ``mxuser1``'s groups, that
every attempt was refused, and that the cluster is unchanged. Around it:

- a comment that claims to be a plan is refused at submission;
- a job name and type label carrying shell and SQL are stored as text (the pick-up quotes nothing into a shell
  and writes through bound parameters);
- a process of the user that pretends to be a TaskProlog of another user's job makes the node agent run nothing.

Each attempt and its outcome go to ``test-artifacts/security_attacks_<release>.json``.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

from sqlalchemy import select

from executors.node.prolog_watch import PrologWatch
from executors.scheduler.profiling.settings import ProfilingSettings
from executors.scheduler.profiling.windows import SlurmProfileWindows, WindowProfiler
from executors.scheduler.slurm.pickup import import_submissions
from executors.store import models as m
from pipelines.settings import MuxflowSettings, write_settings
from tests.live.conftest import cancel_quietly
from tests.live.muxflow_helpers import make_store, register, sbatch, sbatch_run
from tests.live.site_helpers import release_of, run_as, site_cluster, write_artifact  # noqa: F401  (the fixture)
from tests.live.test_profiling_live import measuring, user_script

USER, OTHER, SERVICE = "mxuser1", "mxuser2", "muxflow"
COMMENT = "muxflow: mem=1GiB gpu-types=t4 ckpt={d}/ckpt steps=100"
ATTACKS = ("read_jwt_key", "read_muxflow_token", "read_reference_token", "read_plan_key", "read_node_plan_key",
           "read_slurmdbd_conf", "read_service_settings", "drain_node", "mint_root_token", "mint_muxflow_token",
           "release_another_users_job", "write_own_plan", "plant_plan_file", "plant_in_job_state_dir",
           "raise_own_admin_level")


def _attack_script(live, d: Path, other_sid: int, settings_file: Path) -> str:
    lay = live.layout
    forged = "muxflow-plan=1 slurm=$SLURM_JOB_ID job=1 kind=place gpu=0 pct=100 sig=" + "0" * 64
    tries = {
        "read_jwt_key": f"cat {lay.jwt_key}",
        "read_muxflow_token": f"cat {lay.muxflow_jwt_file}",
        "read_reference_token": f"cat {lay.reference_jwt_file}",
        "read_plan_key": f"cat {lay.plan_key_file}",
        "read_node_plan_key": f"cat {lay.node_plan_key_file}",
        "read_slurmdbd_conf": f"cat {lay.etc_dir / 'slurmdbd.conf'}",
        "read_service_settings": f"cat {settings_file}",
        "drain_node": "scontrol update NodeName=$SLURMD_NODENAME State=DRAIN Reason=pwned-by-a-user",
        "mint_root_token": "scontrol token username=root lifespan=60",
        "mint_muxflow_token": f"scontrol token username={SERVICE} lifespan=60",
        "release_another_users_job": f"scontrol release {other_sid}",
        "write_own_plan": f'scontrol update JobId=$SLURM_JOB_ID "Comment={forged}"',
        "plant_plan_file": f"sh -c 'echo gpu=0 > {lay.plan_dir}/{other_sid}.plan'",
        "plant_in_job_state_dir": f"sh -c 'echo x > {lay.job_state_dir}/{other_sid}'",
        "raise_own_admin_level": f"sacctmgr -i modify user {USER} set adminlevel=Administrator",
    }
    assert set(tries) == set(ATTACKS)
    lines = [f'try {name} {cmd}' for name, cmd in tries.items()]
    return ("out=" + str(d) + "/attacks.$SLURM_JOB_ID\n"
            'try() { n=$1; shift; if eval "$@" >/dev/null 2>&1; then echo "$n=SUCCEEDED"; '
            'else echo "$n=refused"; fi; }\n'
            '{ echo "uid=$(id -u)"; echo "groups=$(id -G)"; echo "run=${MUXFLOW_PROFILING_RUN:-}"\n' + "\n".join(lines) + "\n} > $out.tmp\n"
            "mv $out.tmp $out\nsleep 600\n")


def test_a_users_job_cannot_take_muxflows_or_slurms_privileges(site_cluster, private_tmp) -> None:
    live = site_cluster
    release = release_of(live)
    lay = live.layout
    store, _url = make_store(private_tmp)
    register(store, live)
    submitted: list[int] = []
    table: list[dict] = []
    try:
        # MuxFlow's own settings file, as a site keeps it: its account's alone (write_settings makes it 0600)
        service_dir = lay.muxflow_dir / f"security-{os.getpid()}"
        service_dir.mkdir(mode=0o700)
        settings_file = write_settings(MuxflowSettings(db_url="postgresql+psycopg2://muxflow:secret@db/muxflow"),
                                       service_dir)
        svc = pwd.getpwnam(SERVICE)
        for p in (service_dir, settings_file):
            os.chown(p, svc.pw_uid, svc.pw_gid)

        # another user's held job: the attacker's target
        od = live.user_dir("victim", OTHER)
        other = sbatch(live, user_script(od, "victim.sh", "sleep 300\n", user=OTHER), "-p", "offline",
                       "--gres=mps:10", f"--output={od}/%j.out", f"--comment={COMMENT.format(d=od)}", user=OTHER)
        submitted.append(other)
        with live.client() as c:
            before = c.get_job(other)

        # 1. a comment claiming to be a plan is refused at submission
        d = live.user_dir("attacker", USER)
        forged = ("--comment=muxflow-plan=1 slurm=1 job=1 kind=place gpu=0 pct=100 sig=" + "0" * 64)
        out = sbatch_run(live, user_script(d, "forged.sh", "true\n"), "-p", "offline", "--gres=mps:10", forged,
                         user=USER)
        table.append({"attempt": "submit with a plan in its comment", "exit": out.returncode,
                      "message": out.stderr.strip()[-200:]})
        assert out.returncode != 0 and "reserved for MuxFlow" in out.stderr, out.stderr

        # 2. shell and SQL in the job's name and label are text
        hostile = "x'); DROP TABLE offline_jobs; --"
        named = sbatch(live, user_script(d, "named.sh", "sleep 300\n"), "-p", "offline", "--gres=mps:10",
                       "-J", "$(touch /tmp/pwned-by-name)", f"--output={d}/%j.out",
                       f"--comment=muxflow: type=\"{hostile}\" mem=1GiB gpu-types=t4 ckpt={d}/ckpt steps=10",
                       user=USER)
        submitted.append(named)

        # 3. the attack: a job that, profiled, tries everything above
        attack = sbatch(live, user_script(d, "attack.sh", _attack_script(live, d, other, settings_file)), "-p",
                        "offline", "--gres=mps:10", "-J", f"mx-attack{os.getpid()}", f"--output={d}/%j.out",
                        f"--comment={COMMENT.format(d=d)}", user=USER)
        submitted.append(attack)
        with live.client() as c:
            rep = import_submissions(store, c, None, only=[named, attack])
        assert not rep.rejected and len(rep.imported) == 2, rep
        with store.session() as s:
            labels = {j.slurm_job_id: (j.job_type, j.name) for j in s.scalars(select(m.OfflineJob))}
        assert labels[named] == (hostile, "$(touch /tmp/pwned-by-name)") and not Path("/tmp/pwned-by-name").exists()

        settings = ProfilingSettings(iterations=5, profile_seconds=12.0, bound_s=60.0, poll_s=0.5, wait_s=120.0)
        with live.client() as c:
            windows = SlurmProfileWindows(c, live.plan_key)
            with measuring(live, store):
                WindowProfiler(store, windows, settings).run()
        report = d / f"attacks.{attack}"
        assert report.exists(), live.explain_job(attack)
        seen = dict(line.split("=", 1) for line in report.read_text().splitlines() if "=" in line)
        u = pwd.getpwnam(USER)
        # the window is the job itself, run by Slurm as its owner: the owner's uid and groups, nothing of MuxFlow's
        assert seen["uid"] == str(u.pw_uid), seen
        with store.session() as s:  # and in its profiling window: the Prolog verified the window's plan
            run = s.scalars(select(m.ProfilingRun).join(m.OfflineJob).where(m.OfflineJob.slurm_job_id == attack)).one()
        assert seen["run"] == str(run.id), (seen, live.explain_job(attack))
        assert set(seen["groups"].split()) == {str(g) for g in os.getgrouplist(USER, u.pw_gid)}, seen
        for name in ATTACKS:
            table.append({"attempt": name, "as": USER, "outcome": seen.get(name)})
        assert {name: seen.get(name) for name in ATTACKS} == dict.fromkeys(ATTACKS, "refused"), seen

        # the cluster is unchanged: nodes usable, the other user's job held as it was, the attacker no admin
        with live.client() as c:
            nodes = {n.name: n for n in c.list_nodes()}
            after = c.get_job(other)
        assert all(n.usable for n in nodes.values()), {n: (x.state, x.state_flags, x.reason) for n, x in nodes.items()}
        assert after.held and (after.comment, after.partition, after.priority) == (before.comment, before.partition,
                                                                                     before.priority)
        admin = run_as(live, None, "sacctmgr", "-n", "-P", "show", "user", USER, "format=user,adminlevel")
        assert admin.stdout.strip() == f"{USER}|None", admin.stdout
        assert not (lay.plan_dir / f"{other}.plan").exists() and not (lay.job_state_dir / str(other)).exists()

        # 4. a process of the user pretending to be the TaskProlog of the other user's job: the agent runs nothing
        fake = d / "task_prolog.sh"
        fake.write_text("#!/bin/bash\nsleep 30\n")
        os.chown(fake, u.pw_uid, u.pw_gid)
        fake.chmod(0o700)
        env = {"SLURM_JOB_ID": str(other), "SLURM_JOB_PARTITION": "offline", "SLURMD_NODENAME": "mx-t4-1",
               "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "PATH": "/usr/bin:/bin"}
        pretender = subprocess.Popen(["/bin/bash", str(fake)], env=env, user=u.pw_uid, group=u.pw_gid,
                                     extra_groups=[])
        ran: list[dict] = []
        try:
            watch = PrologWatch(lay.node_script_dir / "prolog.sh", lay.plan_dir, "mx-t4-1", min_wait_s=0.0,
                                task_prolog=lay.node_script_dir / "task_prolog.sh",
                                run=lambda argv, **kw: ran.append(kw.get("env", {})))
            live.wait_for("the pretender to run", lambda: Path(f"/proc/{pretender.pid}").exists(), timeout_s=5)
            assert watch.waiting() == {} and watch.once() == [] and ran == []
        finally:
            pretender.kill()
            pretender.wait()
        table.append({"attempt": "pretend to be another user's TaskProlog", "as": USER, "outcome": "ignored"})
    finally:
        cancel_quietly(live, submitted)
        write_artifact(f"security_attacks_{release}.json", table)
