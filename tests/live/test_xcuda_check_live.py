"""A job that unsets LD_PRELOAD is seen and evicted by the node agent, live (docs/NODE_AGENT.md "xCUDA check").

On a private dev cluster: two offline jobs of ``mxuser1``, submitted with plain ``sbatch`` and placed by the
dispatcher on two GPUs of ``mx-t4-1``; one script runs ``unset LD_PRELOAD`` before its work. The TaskProlog
preloads xCUDA into both; ``muxflow node-agent --simulated --evict scontrol`` finds the process without
``libxcuda.so`` in its memory maps and evicts that job alone: requeued held in Slurm, an ``evictions`` row with
the reason, EVICTED in the store. The well-behaved job, checked in the same pass, keeps running.
"""

from __future__ import annotations

import sys

from sqlalchemy import select

from executors.store import models as m
from tests.live.conftest import cancel_quietly
from tests.live.muxflow_helpers import (
    GOOD_COMMENT,
    REPO,
    make_store,
    node_agent_env,
    place_running,
    register,
    sbatch,
    write_script,
)
from tests.processes import processes

NODE = "mx-t4-1"


def test_a_job_that_unsets_ld_preload_is_evicted_and_its_neighbour_is_not(private_cluster, private_tmp) -> None:
    live = private_cluster
    store, url = make_store(private_tmp)
    gpus = register(store, live)
    d = live.job_dir("xcuda-check")
    scripts = {"rogue": write_script(d, "unset LD_PRELOAD\nsleep 600\n", "rogue.sh"),
               "good": write_script(d, "sleep 600\n", "good.sh")}
    sids = {k: sbatch(live, p, "-p", "offline", "--gres=mps:20", "-J", f"mx-xc-{k}", f"--output={d}/%j.out",
                      f"--comment={GOOD_COMMENT.format(name=k)}", user="mxuser1") for k, p in scripts.items()}
    try:
        ids = place_running(live, store, sids, {"rogue": 0, "good": 1}, NODE)
        env = node_agent_env(live, private_tmp)
        with processes(private_tmp) as procs:
            agent = procs.start("agent", [sys.executable, "-m", "pipelines.cli", "--db", url, "node-agent", "--node",
                                          NODE, "--simulated", "--evict", "scontrol", "--no-shm", "--interval-ms",
                                          "100", "--placement-poll", "1", "--xcuda-check", "1"], env=env, cwd=REPO)

            def evicted():
                assert agent.alive(), agent.log_tail()
                with store.session() as s:
                    return s.scalars(select(m.Eviction)).all()

            evs = live.wait_for("the agent to evict the job without xCUDA", evicted, 90)
            assert len(evs) == 1, [(e.job_id, e.gpu_id, e.reason) for e in evs]
            ev = evs[0]
            with live.client() as c:
                held = live.wait_job(c, sids["rogue"], lambda j: j.held, "the rogue job requeued held", 60)
                good = c.get_job(sids["good"])
            assert held.state == "PENDING"
            assert good.state == "RUNNING" and not good.held
            with store.session() as s:
                rogue, kept = s.get(m.OfflineJob, ids["rogue"]), s.get(m.OfflineJob, ids["good"])
                assert (ev.job_id, ev.gpu_id, ev.source) == (ids["rogue"], gpus[(NODE, 0)], "simulated")
                assert ev.reason.startswith("xCUDA not loaded: process ") and f"of Slurm job {sids['rogue']} " in ev.reason
                assert "(sleep)" in ev.reason  # the script's child, started after the unset
                assert rogue.state == "EVICTED" and rogue.state_reason.startswith("node agent: xCUDA not loaded")
                # Checked in the same pass as the rogue one (its processes are as old), and kept.
                assert kept.state == "RUNNING"
                assert s.scalars(select(m.Eviction).where(m.Eviction.job_id == ids["good"])).all() == []
            assert not procs.dead(), procs.dead()
    finally:
        cancel_quietly(live, sids.values())
