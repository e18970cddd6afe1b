"""xCUDA takes its limits from its Slurm job's root plan, live (executors/node/xcuda/README.md "Configuration",
docs/SECURITY.md "xCUDA's limits").

On a private dev cluster ``mxuser1`` submits an offline job with plain ``sbatch``; the dispatcher places it with
the 2 GiB quota its comment asks for, and the Prolog writes that quota into the job's root plan. After the
TaskProlog's exports the job's script exports what would lift its limits (no quota, launch rates of 1e9/s, a GPU
record of its own, another job's id in ``SLURM_JOB_ID``) and runs the xCUDA test harness against the fake driver
on a device of 64 GiB, under the installed library the TaskProlog preloads (the cluster's link to the tree's
``build/libxcuda.so``, beside the root ``xcuda.conf`` naming the cluster's plan directory). Its 3 GiB allocation
is refused: the plan's quota, not the environment's ``none`` nor the built-in 40 % of the device; xCUDA says it
used the plan of that very Slurm job and names each ignored variable.
"""

from __future__ import annotations

import datetime as dt
import re

from sqlalchemy import select

from executors.dev.slurm.cluster import XCUDA_LIB, xcuda_install_dir
from executors.node.xcuda.build import Artifacts, build
from executors.scheduler.slurm.pickup import import_submissions
from executors.store import models as m
from scheduler_core.domain import Action, PlanAction
from tests.live.conftest import cancel_quietly
from tests.live.muxflow_helpers import GOOD_COMMENT, backend, make_pending, make_store, register, sbatch, write_script

NODE = "mx-t4-1"
GIB = 1 << 30


def test_a_placed_jobs_environment_lifts_no_limit_of_its_plan(private_cluster, private_tmp) -> None:
    live = private_cluster
    xcuda: Artifacts = build()  # the harness and the fake driver; the tree is readable by every job user
    lib = xcuda_install_dir(live.layout) / "libxcuda.so"
    assert lib.is_symlink() and lib.resolve() == XCUDA_LIB.resolve()
    store, _url = make_store(private_tmp)
    gpus = register(store, live)
    d = live.job_dir("xcuda-limits")
    body = f"""job=$SLURM_JOB_ID
out={d}/result.$job
echo "preload=$LD_PRELOAD" >"$out"
export XCUDA_MEM_QUOTA_BYTES=none XCUDA_FALLBACK_LAUNCH_RATE=1e9 XCUDA_MIN_LAUNCH_RATE=1e9 \\
    XCUDA_SHM_PATH=${{HOME:-/tmp}}/my-idle-gpu SLURM_JOB_ID=$((job + 1)) XCUDA_LOG_LEVEL=info \\
    XCUDA_FAKE_TOTAL_MEM={64 * GIB} LD_LIBRARY_PATH={xcuda.fake_dir}
{xcuda.harness} init alloc v2 {3 * GIB} launch 5 >>"$out" 2>&1
echo "exit=$?" >>"$out"
mv "$out" "$out.done"
"""
    script = write_script(d, body, "limits.sh")
    sid = sbatch(live, script, "-p", "offline", "--gres=mps:20", "-J", "mx-xc-limits", f"--output={d}/%j.out",
                 f"--comment={GOOD_COMMENT.format(name='limits')}", user="mxuser1")
    try:
        with live.client() as c:
            import_submissions(store, c, None, only=[sid])
        with store.session() as s:
            job_id = s.scalars(select(m.OfflineJob.id).where(m.OfflineJob.slurm_job_id == sid)).one()
        make_pending(store, [job_id])
        action = PlanAction(Action.START, job_id, gpus[(NODE, 0)], None, 20)
        assert all(r.ok for r in backend(live).cluster(store).dispatch([action], dt.datetime.now(dt.UTC)))
        done = d / f"result.{sid}.done"
        live.wait_for("the job to run the harness", done.exists, 90)
        out = done.read_text()
    finally:
        cancel_quietly(live, [sid])

    plan = live.layout.plan_dir / f"{sid}.plan"
    assert f"preload={lib}\n" in out, out  # the TaskProlog's: the cluster's link, not the test library
    assert "exit=0" in out, out
    assert f"plan directory {live.layout.plan_dir}, from {lib}'s xcuda.conf" in out, out
    # That job's plan, not SLURM_JOB_ID's job's.
    assert re.search(rf"info: limits: plan {re.escape(str(plan))}$", out, flags=re.M), out
    alloc = dict(re.findall(r"(\w+)=(\S+)", next(line for line in out.splitlines() if line.startswith("alloc"))))
    assert alloc["rc"] == "2", out  # CUDA_ERROR_OUT_OF_MEMORY: the plan's 2 GiB, not none nor 40 % of 64 GiB
    assert f"memory quota {2 * GIB} bytes" in out, out
    for name in ("XCUDA_MEM_QUOTA_BYTES", "XCUDA_FALLBACK_LAUNCH_RATE", "XCUDA_MIN_LAUNCH_RATE", "XCUDA_SHM_PATH"):
        assert re.search(rf"{name}: .*may only make xCUDA stricter", out), (name, out)
