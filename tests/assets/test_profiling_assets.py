"""The profiling assets with a cluster resource that measures (real processes on this machine in place of
the profile partition): runs, reasons and methods in the metadata; the simulated resource is tested in
tests/assets."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from dagster import materialize

from assets.resources import ClusterResource
from executors.scheduler.profiling.backend import profile_with, sample_with
from executors.scheduler.profiling.local import LocalProfileExecutor
from executors.scheduler.profiling.settings import ProfilingSettings, SamplingSettings
from executors.simulated.backend import SimulatedBackend
from executors.store import models as m
from executors.store import repo
from tests.assets.test_assets import meta, settings_for
from tests.executors.scheduler.profiling.helpers import add_job

REPO = Path(__file__).resolve().parents[2]
RUN_DIR: list[str] = []


class MeasuringBackend(SimulatedBackend):
    """The simulated cluster for everything but profiling and sampling, which really run (here, on CPU)."""

    def profile_new_jobs(self, store, seed):
        ex = LocalProfileExecutor()
        try:
            st = ProfilingSettings(bound_s=20, profile_seconds=5, iterations=4, poll_s=0.2, profile_dir=RUN_DIR[0])
            return len(profile_with(ex, store, seed, st).profiled)
        finally:
            ex.close()

    def collect_samples(self, store, per_type, seed):
        ex = LocalProfileExecutor()
        try:
            st = SamplingSettings(budget_gpu_s=20, window_s=2, setup_s=2, sm_pcts=(50,), size="tiny", poll_s=0.2,
                                  profile_dir=RUN_DIR[0])
            return sample_with(ex, ["t4"], store, per_type, seed, st)[0]
        finally:
            ex.close()


class MeasuringClusterResource(ClusterResource):
    def backend(self):
        return MeasuringBackend(simulated=False, source="measured")

    def profiler(self):
        return self.backend()


def test_profiling_assets_with_a_measuring_cluster(tmp_path, dagster_instance) -> None:
    # real processes are under test here: SQLite only (the simulated resource runs on both in tests/assets)
    from executors.simulated.setup import init_simulated_cluster
    from executors.store.db import Store
    from executors.store.migrate import upgrade

    RUN_DIR[:] = [str(tmp_path / "runs")]
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    cluster_store = Store(url)
    with cluster_store.session() as s:
        init_simulated_cluster(s, {"a10": 2, "t4": 2}, 2, seed=0)
    py = shlex.quote(sys.executable)
    good = add_job(cluster_store, "good", f"cd {REPO} && exec {py} -m executors.job.workloads.train --family "
                                          f"transformer --size tiny --ckpt {tmp_path}/ck --steps 100000")
    add_job(cluster_store, "bad", "exit 9")
    from pipelines.definitions import build_definitions, scheduling_resource

    settings = settings_for(url, tmp_path, samples_per_type=30)
    defs = build_definitions(settings)
    a = {x.key.to_user_string(): x for x in defs.assets}
    from assets.resources import FeatureStoreResource

    res = materialize([a["offline_job_profiles"], a["colocation_samples"]],
                      resources={"feature_store": FeatureStoreResource(db_url=url),
                                 "cluster": MeasuringClusterResource(),
                                 "scheduling": scheduling_resource(settings)},
                      instance=dagster_instance, selection=[a["offline_job_profiles"], a["colocation_samples"]])
    assert res.success
    prof = meta(res, "offline_job_profiles")
    assert prof["profiled_now"] == 1 and prof["profiler"] == "profile partition"
    assert prof["profiling_runs_ended_now"] == 2 and prof["profiling_runs_failed_now"] == 1
    assert prof["profiles_by_method"] == {"simulated-metrics/simulated": 1}
    assert "crashed (exit code 9)" in prof["profiling_runs"]
    smp = meta(res, "colocation_samples")
    assert smp["sampling_runs_ended_now"] == 1 and smp["sampling_gpu_minutes_now"] > 0
    assert smp["samples_by_type_and_method"]["t4/cpu (CPU: not training data)"] == 1
    # the bootstrap tops every type up with SIMULATED samples, labelled so
    assert smp["samples_by_type_and_method"]["t4/simulated (SIMULATED)"] == 30 and smp["samples_t4"] == 30
    with cluster_store.session() as s:
        assert repo.job_counts_by_state(s).get("PENDING") == 1
        assert s.get(m.OfflineJob, good).state == "PENDING"
