"""What a job can do against its own limits and its neighbours on a real Slurm cluster (docs/SECURITY.md, "Tested
attacks"): the attacks are tried by the real non-root users ``mxuser1`` and ``mxuser2`` with plain ``sbatch``, on
Slurm 22.05 in ``make test`` and 24.11 in ``make test-slurm-compat``.

- a memory need of one byte (``mem=1``), which would have made the Prolog's MPS limit ``0M`` (no limit), is
  refused at pick-up with one line;
- placed jobs whose scripts leave the job's process tree (``setsid -f env -u SLURM_JOB_ID -u LD_PRELOAD``) or
  preload their own file named ``libxcuda.so``, and a process of another user carrying a placed job's
  ``SLURM_JOB_ID``: the node agent stops the escaped process and evicts the jobs that dodged xCUDA, and leaves
  the job whose id was borrowed running;
- meanwhile an attacker holds a thousand idle connections to the agent's metrics endpoint: the agent still
  answers a scrape and still checks and evicts.

Each attempt and its outcome go to ``test-artifacts/job_attacks_<release>.json``.
"""

from __future__ import annotations

from sqlalchemy import select

from executors.scheduler.slurm.pickup import import_submissions
from executors.store import models as m
from tests.live.conftest import cancel_quietly
from tests.live.muxflow_helpers import make_store, register, sbatch
from tests.live.site_helpers import release_of, site_cluster, write_artifact  # noqa: F401  (the fixture)
from tests.live.test_profiling_live import user_script

USER = "mxuser1"


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
