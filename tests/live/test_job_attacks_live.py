"""What a job can do against its own limits and its neighbours on a real Slurm cluster (docs/SECURITY.md, "Tested
attacks"): the attacks are tried by the real non-root users ``mxuser1`` and ``mxuser2`` with plain ``sbatch``, on
Slurm 22.05 in ``make test`` and 24.11 in ``make test-slurm-compat``.

- a memory need of one byte (``mem=1``), which would have made the Prolog's MPS limit ``0M`` (no limit), is
  refused at pick-up with one line;
- placed jobs whose scripts leave the job's process tree (``setsid -f env -u SLURM_JOB_ID -u LD_PRELOAD``),
  preload their own file named ``libxcuda.so`` or fill their own directory on the node, and a process of another
  user carrying a placed job's ``SLURM_JOB_ID``: the node agent stops the escaped process (its owner finds why in
  their notice file), evicts the jobs that dodged xCUDA or filled the directory, and leaves the job whose id was
  borrowed running;
- meanwhile an attacker holds a thousand idle connections to the agent's metrics endpoint: the agent still
  answers a scrape and still checks and evicts.

Each attempt and its outcome go to ``test-artifacts/job_attacks_<release>.json``.
"""

from __future__ import annotations

import os
import pwd
import socket
import sys
import urllib.request
from pathlib import Path

from sqlalchemy import select

from executors.scheduler.slurm.pickup import import_submissions
from executors.store import models as m
from tests.live.conftest import cancel_quietly
from tests.live.muxflow_helpers import GOOD_COMMENT, REPO, make_store, node_agent_env, place_running, register, sbatch
from tests.live.site_helpers import release_of, site_cluster, write_artifact  # noqa: F401  (the fixture)
from tests.live.test_profiling_live import user_script
from tests.processes import processes

USER, OTHER = "mxuser1", "mxuser2"
NODE = "mx-t4-1"
IDLE_SOCKETS = 1000


def test_a_memory_need_of_one_byte_is_refused_at_pick_up(site_cluster, private_tmp) -> None:
    live = site_cluster
    store, _url = make_store(private_tmp)
    register(store, live)
    d = live.user_dir("tiny-mem", USER)
    sids: list[int] = []
    table: list[dict] = []
    try:
        for mem in ("1", "0", "63MiB"):
            sids.append(sbatch(live, user_script(d, f"tiny{len(sids)}.sh", "sleep 60\n"), "-p", "offline",
                               "--gres=mps:10", f"--output={d}/%j.out",
                               f"--comment=muxflow: mem={mem} gpu-types=t4 ckpt={d}/ckpt", user=USER))
        with live.client() as c:
            rep = import_submissions(store, c, None, only=sids)
        assert rep.imported == [] and {sid for sid, _ in rep.rejected} == set(sids), rep
        for (sid, reason), mem in zip(sorted(rep.rejected), ("1", "0", "63MiB"), strict=True):
            # one line, naming the hint (and, for a need that is merely too small, the floor)
            assert "\n" not in reason and reason.startswith("rejected: mem: "), (sid, reason)
            assert mem == "0" or "below 64 MiB" in reason, (sid, reason)
            table.append({"attempt": f"sbatch --comment='muxflow: mem={mem}'", "as": USER, "outcome": reason})
        with store.session() as s:
            jobs = s.scalars(select(m.OfflineJob).where(m.OfflineJob.slurm_job_id.in_(sids))).all()
        assert {(j.state, j.job_type) for j in jobs} == {("FAILED", "(rejected)")}, [(j.state, j.job_type) for j in jobs]
        with live.client() as c:
            states = {sid: c.get_job(sid).state for sid in sids}
        assert set(states.values()) == {"CANCELLED"}, states
    finally:
        cancel_quietly(live, sids)
        write_artifact(f"job_attacks_mem_{release_of(live)}.json", table)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        assert r.status == 200
        return r.read().decode()


def test_processes_that_dodge_xcuda_are_stopped_and_a_borrowed_job_id_evicts_no_one(site_cluster, private_tmp):
    live = site_cluster
    release = release_of(live)
    store, url = make_store(private_tmp)
    register(store, live)
    d = live.user_dir("dodge", USER)
    u1, u2 = pwd.getpwnam(USER), pwd.getpwnam(OTHER)
    bodies = {
        # leaves the job's tree and its environment: a process of no job, next to placed work
        "escaper": f"setsid -f env -u SLURM_JOB_ID -u LD_PRELOAD sh -c 'echo $$ > {d}/escaped.pid; exec sleep 600'\n"
                   "sleep 600\n",
        # its own copy of the library: a file named libxcuda.so that is not the installed one
        "impostor": f'cp "$LD_PRELOAD" {d}/libxcuda.so && LD_PRELOAD={d}/libxcuda.so exec sleep 600\n',
        "good": "sleep 600\n",
        # fills its own directory on the node (the job-state tmpfs, shared by every job there)
        "filler": 'head -c 9437184 /dev/zero > "$XCUDA_STATS_DIR/fill" && sleep 600\n',
    }
    sids = {k: sbatch(live, user_script(d, f"{k}.sh", body), "-p", "offline", "--gres=mps:20", "-J", f"mx-dodge-{k}",
                      f"--output={d}/%j.out", f"--comment={GOOD_COMMENT.format(name=k)}", user=USER)
            for k, body in bodies.items()}
    gpu_of = {"escaper": 0, "impostor": 1, "good": 2, "filler": 3}
    notices = private_tmp / "notices"
    table: list[dict] = []
    idle: list[socket.socket] = []
    try:
        ids = place_running(live, store, sids, gpu_of, NODE)
        live.wait_for("the escaped process to write its pid", lambda: (d / "escaped.pid").exists(), 30)
        escaped = int((d / "escaped.pid").read_text())

        env = node_agent_env(live, private_tmp)
        port = _free_port()
        with processes(private_tmp) as procs:
            # another user's process that claims the good job (its id, its GPU, its node) from outside its tree
            borrower = procs.start("borrower", ["sleep", "600"], user=OTHER, env={
                "PATH": "/usr/bin:/bin", "SLURM_JOB_ID": str(sids["good"]), "SLURMD_NODENAME": NODE,
                "CUDA_VISIBLE_DEVICES": str(gpu_of["good"])})
            agent = procs.start("agent", [sys.executable, "-m", "pipelines.cli", "--db", url, "node-agent", "--node",
                                          NODE, "--simulated", "--evict", "scontrol", "--no-shm", "--interval-ms",
                                          "100", "--placement-poll", "1", "--xcuda-check", "1", "--notice-dir",
                                          str(notices), "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
                                          "--job-dir", str(live.layout.job_state_dir)],
                                env=env, cwd=REPO)
            def serving() -> bool:
                assert agent.alive(), agent.log_tail()
                try:
                    return bool(_scrape(port))
                except OSError:  # not listening yet
                    return False

            live.wait_for("the agent's metrics endpoint", serving, 60, explain=agent.log_tail)
            fds_before = len(os.listdir(f"/proc/{agent.popen.pid}/fd"))
            # an attacker on the network holds a thousand idle connections to the root agent's endpoint, from
            # before the check has anything to find until after it acted
            for _ in range(IDLE_SOCKETS):
                sock = socket.socket()
                sock.setblocking(False)
                sock.connect_ex(("127.0.0.1", port))
                idle.append(sock)

            def evicted():
                assert agent.alive(), agent.log_tail()
                with store.session() as s:
                    return s.scalars(select(m.Eviction)).all()

            live.wait_for("the agent to evict the job with its own libxcuda.so and the one filling its directory",
                          lambda: len(evicted()) >= 2, 90, explain=agent.log_tail)
            live.wait_for("the escaped process and the borrower to be stopped",
                          lambda: not Path(f"/proc/{escaped}").exists() and borrower.popen.poll() is not None, 60,
                          explain=agent.log_tail)
            assert borrower.popen.returncode == -9, borrower.popen.returncode
            assert agent.alive(), agent.log_tail()
            # the connections cost the agent a bounded number of descriptors (its cap, 64), and once the held ones
            # reach their deadline a scrape is answered again, the thousand still open
            fds = len(os.listdir(f"/proc/{agent.popen.pid}/fd"))
            assert fds <= fds_before + 64 + 8, (fds_before, fds)
            live.wait_for("a scrape answered beside the idle connections", serving, 60, explain=agent.log_tail)
            table.append({"attempt": f"{IDLE_SOCKETS} idle connections to the agent's /metrics", "as": "network",
                          "outcome": f"agent descriptors {fds_before} -> {fds}; checks and evictions went on; "
                                     "scraped again"})
            with live.client() as c:
                for k in ("impostor", "filler"):
                    held = live.wait_job(c, sids[k], lambda j: j.held, f"the {k} job requeued held", 60)
                    assert held.state == "PENDING", (k, held.state)
                states = {k: c.get_job(sid) for k, sid in sids.items() if k not in ("impostor", "filler")}
            # the job the escaped process left and the job whose id was borrowed run on
            assert all(j.state == "RUNNING" and not j.held for j in states.values()), \
                {k: (j.state, j.held) for k, j in states.items()}
            with store.session() as s:
                reasons = {e.job_id: e.reason for e in s.scalars(select(m.Eviction))}
            assert set(reasons) == {ids["impostor"], ids["filler"]}, reasons
            assert "not the installed library" in reasons[ids["impostor"]], reasons
            assert "job directory" in reasons[ids["filler"]] and "9.0 MiB" in reasons[ids["filler"]], reasons
            told = {u.pw_name: (notices / str(u.pw_uid)).read_text() for u in (u1, u2)}
            assert str(escaped) in told[USER], told
            assert str(borrower.popen.pid) in told[OTHER], told
            assert all((notices / str(u.pw_uid)).stat().st_uid == u.pw_uid for u in (u1, u2))
            table += [{"attempt": "setsid -f env -u SLURM_JOB_ID -u LD_PRELOAD (a placed job's child)", "as": USER,
                       "outcome": "killed, owner told; the job it left runs on"},
                      {"attempt": "preload a copy of libxcuda.so", "as": USER, "outcome": reasons[ids["impostor"]]},
                      {"attempt": "write 9 MiB into its own directory on the node", "as": USER,
                       "outcome": reasons[ids["filler"]]},
                      {"attempt": f"a process claiming {USER}'s placed job by SLURM_JOB_ID", "as": OTHER,
                       "outcome": "killed, owner told; the claimed job runs on"}]
            assert not procs.dead() or procs.dead() == [p for p in procs.dead() if p.startswith("borrower")], \
                procs.dead()
    finally:
        for sock in idle:
            sock.close()
        cancel_quietly(live, sids.values())
        write_artifact(f"job_attacks_{release}.json", table)
