"""Co-location sample collection on a GPU-time budget (paper §6: ~2,000 measured samples per GPU type).

1. **Plan** (:func:`scheduler_core.prediction.sampling_plan.plan_sampling`): the store's online
   services (each at its mean QPS × ``qps_scale``) × the offline reference
   workloads (one job type per family at the configured size) × the SM sweep, on
   each GPU type the profile partition has, given the samples already measured.
2. **Run**: one ``sampling_runs`` row per planned (GPU type, service, job) run,
   written before the harness job (:mod:`executors.node.profiling.colocate`) is
   submitted, followed until it ends (or its time limit), like solo profiling.
3. **Store**: each measured point becomes a ``colocation_samples`` row tagged with
   the GPU type, the method (``mps`` / ``no-mps`` / ``cpu``), the device and the
   date. Features are the solo ones the predictor sees (docs/DESIGN.md §5): measured with
   NVML on a GPU; on a node without a GPU the simulated model's (the labels, and
   the run's measured values in its report, are what the CPU measured).

Services of a family without a reference workload (``lm``) are left out, and said so.
"""

from __future__ import annotations

import datetime as dt
import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from executors.job.workloads.models import FAMILIES, workload_size
from executors.node.profiling.colocate import REPORT_FILE
from executors.node.profiling.probe import read_json
from executors.scheduler.profiling.runs import (
    PHASE_FINISHED,
    ExecutorError,
    ExecutorUnavailable,
    ProfileExecutor,
    RunHandles,
    RunSpec,
    prepare_run_dir,
    run_log_tail,
)
from executors.scheduler.profiling.settings import SamplingSettings
from executors.store import inventory
from executors.store import models as m
from executors.store import profiling as profstore
from executors.store.db import Store
from scheduler_core.domain import OfflineFeatures, OnlineFeatures
from scheduler_core.prediction.sampling_plan import PairCandidate, SamplingCost, SamplingPlan, plan_sampling

log = logging.getLogger(__name__)


@dataclass
class SamplingSummary:
    plan: SamplingPlan | None = None
    skipped_services: list[str] = field(default_factory=list)
    submitted: int = 0
    done: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    samples: dict[str, int] = field(default_factory=dict)   # method → samples written now
    in_progress: list[int] = field(default_factory=list)
    gpu_s_used: float = 0.0


def _features(metrics: dict, fields: tuple[str, ...]) -> dict[str, float]:
    return {k: float(metrics[k]) for k in fields}


_GPU_FIELDS = ("gpu_util_pct", "sm_activity_pct", "sm_occupancy_pct", "mem_used_bytes", "mem_bw_util_pct",
               "sm_clock_mhz")


def samples_from_report(rep: dict[str, Any], run_id: int, service_name: str, job_type: str,
                        service_mem_bytes: float) -> tuple[list[m.ColocationSample], str | None]:
    """The run's samples (rows not yet added to a session), and why there are none when there are none."""
    if rep.get("error") and not rep.get("points"):
        return [], rep["error"]
    solo_s, solo_j = rep.get("solo_service") or {}, rep.get("solo_job") or {}
    ms, mj = solo_s.get("metrics") or {}, solo_j.get("metrics") or {}
    if "error" in ms or "error" in mj or not ms or not mj:
        return [], f"no GPU metrics for the solo runs: {ms.get('error') or mj.get('error') or 'none taken'}"
    gpu_type, method = rep["gpu_type"], rep["method"]
    lat, it = solo_s.get("latency") or {}, solo_j.get("iterations") or {}
    if ms.get("source") == "measured":
        online = OnlineFeatures(**_features(ms, _GPU_FIELDS), latency_ms=float(lat["avg_ms"]),
                                qps=float(lat["achieved_qps"]))
        offline = OfflineFeatures(**_features(mj, _GPU_FIELDS), iter_time_s=float(it["mean_s"]))
    else:  # simulated metrics: the model's features throughout (outcome.py explains why)
        from executors.data.calibration import default_catalog
        from executors.simulated.profiling import online_features
        from scheduler_core.gpu_specs import get_spec
        from scheduler_core.online.load import capacity_qps
        from scheduler_core.workloads import ONLINE_FAMILIES

        cap = capacity_qps(ONLINE_FAMILIES[rep["service_family"]], get_spec(gpu_type))
        model = online_features(default_catalog(), rep["service_family"], gpu_type,
                                min(1.0, max(0.05, rep["qps"] / cap)), service_mem_bytes, None)
        online = OnlineFeatures(**_features(ms, _GPU_FIELDS), latency_ms=model.latency_ms, qps=model.qps)
        offline = OfflineFeatures(**_features(mj, _GPU_FIELDS), iter_time_s=float(solo_j["model_iter_time_s"]))
    out, errors = [], []
    for p in rep.get("points") or []:
        if p.get("error") or not p.get("norm_tput") or not p.get("slowdown_avg"):
            errors.append(f"{p.get('sm_pct')}%: {p.get('error') or 'no measurement'}")
            continue
        out.append(m.ColocationSample(
            gpu_type=gpu_type, service_name=service_name, job_type=job_type, online_features=asdict(online),
            offline_features=asdict(offline), sm_pct=float(p["sm_pct"]), offline_norm_tput=float(p["norm_tput"]),
            online_slowdown=float(p["slowdown_avg"]), method=method, online_slowdown_p99=p.get("slowdown_p99"),
            device=(rep.get("device") or "")[:128] or None, qps=float(rep["qps"]), sampling_run_id=run_id))
    return out, (None if out else "; ".join(errors) or "the run measured no point")


class ColocationSampler:
    def __init__(self, store: Store, executor: ProfileExecutor, settings: SamplingSettings = SamplingSettings(),
                 seed: int = 0, now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
                 sleep: Callable[[float], None] = time.sleep, monotonic: Callable[[], float] = time.monotonic):
        self.store, self.executor, self.settings, self.seed = store, executor, settings, seed
        self.now, self.sleep, self.monotonic = now, sleep, monotonic
        self.handles = RunHandles(executor)
        self.family_of_job_type = {workload_size(f, settings.size).job_type: f for f in FAMILIES}

    @property
    def cost(self) -> SamplingCost:
        return SamplingCost(self.settings.window_s, self.settings.setup_s)

    # -- planning ---------------------------------------------------------------------------------
    def services(self) -> tuple[list[tuple[str, str, float, float]], list[str]]:
        """(name, family, qps, mem_bytes) of the services a reference workload can stand in for; skipped names."""
        ok, skipped = [], []
        with self.store.session() as s:
            for v in inventory.online_services(s):
                if v.model_family not in FAMILIES:
                    skipped.append(f"{v.name} ({v.model_family})")
                    continue
                qps = self.settings.qps_scale * (v.qps_min + v.qps_max) / 2.0
                if qps > 0:
                    ok.append((v.name, v.model_family, qps, float(v.mem_bytes)))
                else:
                    skipped.append(f"{v.name} (no load)")
        return ok, skipped

    def measured(self, gpu_types: list[str]) -> dict[tuple[str, str, str], dict[int, int]]:
        with self.store.session() as s:
            return profstore.measured_sample_counts(s, gpu_types)

    def plan(self, gpu_types: list[str], budget_s: float | None = None) -> tuple[SamplingPlan, list[str]]:
        services, skipped = self.services()
        cands = [PairCandidate(g, name, job_type, qps) for g in sorted(gpu_types) for name, _f, qps, _m in services
                 for job_type in sorted(self.family_of_job_type)]
        budget = self.settings.budget_gpu_s if budget_s is None else budget_s
        return plan_sampling(cands, self.measured(gpu_types), budget, self.cost, self.settings.sm_pcts), skipped

    # -- running ----------------------------------------------------------------------------------
    def run(self, gpu_types: list[str], budget_s: float | None = None) -> SamplingSummary:
        summary = SamplingSummary()
        plan, summary.skipped_services = self.plan(gpu_types, budget_s)
        summary.plan = plan
        services = {name: (fam, mem) for name, fam, _q, mem in self.services()[0]}
        for r in plan.runs:
            self._submit(r, services[r.service], summary)
        limit = max([self._time_limit_s(len(r.sm_pcts), r.cost_s) for r in plan.runs] or [0.0])
        wait = self.settings.wait_s if self.settings.wait_s is not None else limit + 60.0
        end = self.monotonic() + wait
        while self.poll_once(summary) and self.monotonic() < end:
            self.sleep(self.settings.poll_s)  # polling the runs' state with a deadline
        with self.store.session() as s:
            summary.in_progress = [r.id for r in profstore.open_sampling_runs(s)]
        return summary

    def _time_limit_s(self, points: int, cost_s: float) -> float:
        # every phase may spend a few minutes starting (CUDA, MPS) beyond what the budget counts
        return cost_s + 120.0 * (2 + points) + 120.0

    def _script(self, run: m.SamplingRun, mem_bytes: float) -> str:
        st, q = self.settings, shlex.quote
        args = [q(st.node_python), "-m", "executors.node.profiling.colocate", "--run-dir", q(run.run_dir),
                "--gpu-type", q(run.gpu_type), "--service", run.service_family, "--qps", repr(run.qps),
                "--job", run.job_family, "--size", st.size, "--sm", ",".join(str(p) for p in run.sm_pcts),
                "--window", repr(st.window_s), "--metrics", st.metrics, "--mps", st.mps,
                # One repetition per point, as SamplingCost plans the GPU time (each still between baselines taken
                # before and after it); repeated sweeps with their spread are make gpu-check's calibration part.
                "--repeat", "1",
                "--seed", str(self.seed * 1_000_003 + run.id), "--service-mem", repr(mem_bytes)]
        return (f"#!/bin/sh\n# MuxFlow co-location sampling run {run.id}: {run.service_name} ({run.service_family}) "
                f"at {run.qps:g} QPS with {run.job_type} on {run.gpu_type} (docs/PROFILING.md)\n"
                f"cd {q(run.run_dir)} || exit 1\nexec " + " ".join(args) + "\n")

    def _spec(self, run: m.SamplingRun, mem_bytes: float) -> RunSpec:
        return RunSpec(key=f"muxflow-sampling-run={Path(run.run_dir).name}",
                       name=f"mxsample-{run.id}-{run.gpu_type}", gpu_type=run.gpu_type, run_dir=Path(run.run_dir),
                       script=self._script(run, mem_bytes), time_limit_s=self._time_limit_s(len(run.sm_pcts), run.planned_gpu_s))

    def _submit(self, planned, service: tuple[str, float], summary: SamplingSummary) -> None:
        family, mem = service
        with self.store.session() as s:
            run = m.SamplingRun(gpu_type=planned.gpu_type, service_name=planned.service, service_family=family,
                                job_type=planned.job_type, job_family=self.family_of_job_type[planned.job_type],
                                qps=planned.qps, sm_pcts=list(planned.sm_pcts), planned_gpu_s=planned.cost_s,
                                state="submitted", run_dir="", samples=0, submitted_utc=self.now(),
                                report={"service_mem_bytes": mem})
            s.add(run)
            s.flush()
            run.run_dir = str(prepare_run_dir(self.settings.profile_dir, f"sampling-run{run.id}-{planned.gpu_type}",
                                              getattr(self.executor, "report_owner", None)))
            spec = self._spec(run, mem)
            run_id = run.id
        try:
            handle = self.executor.submit(spec)
            summary.submitted += 1
        except ExecutorUnavailable as exc:
            self._end(run_id, False, f"not submitted: {exc}", summary)
            return
        except ExecutorError as exc:
            self._end(run_id, False, f"could not submit the sampling job: {exc}", summary)
            return
        self.handles.record(self.store, m.SamplingRun, run_id, handle)

    def poll_once(self, summary: SamplingSummary) -> int:
        with self.store.session() as s:
            runs = [(r.id, r.slurm_job_id, r.state, r.submitted_utc, r.started_utc, r.planned_gpu_s,
                     len(r.sm_pcts), r.node) for r in profstore.open_sampling_runs(s)]
        left = 0
        for run_id, sid, state, submitted, started, planned_s, points, node in runs:
            handle = self.handles.lookup(run_id, sid)
            if handle is None:
                if self.handles.lost(node) or self.executor.persistent:
                    self._end(run_id, False, "the sampling job was lost (the sampler restarted)", summary)
                else:
                    left += 1  # another process's run: not ours to judge
                continue
            try:
                st = self.executor.status(handle)
            except ExecutorUnavailable as exc:
                log.warning("sampling run %s: status unavailable: %s", run_id, exc)
                left += 1
                continue
            if st.phase == PHASE_FINISHED:
                self._finished(run_id, st, summary)
                continue
            now = self.now()
            if st.started_utc is not None and state != "running":
                with self.store.session() as s:
                    run = s.get(m.SamplingRun, run_id)
                    run.state, run.started_utc, run.node = "running", st.started_utc, st.node or run.node
            since = st.started_utc or started or submitted
            if (now - since).total_seconds() > self._time_limit_s(points, planned_s) + 60.0:
                try:
                    self.executor.cancel(handle)
                except (ExecutorUnavailable, ExecutorError) as exc:
                    log.warning("cancel of sampling run %s failed: %s", run_id, exc)
                self._end(run_id, False, "exceeded its time limit (cancelled)", summary)
                continue
            left += 1
        return left

    def _finished(self, run_id: int, st, summary: SamplingSummary) -> None:
        with self.store.session() as s:
            run = s.get(m.SamplingRun, run_id)
            rep = read_json(Path(run.run_dir) / REPORT_FILE, owner=getattr(self.executor, "report_owner", None))
            mem = float((run.report or {}).get("service_mem_bytes") or 0.0)
            if rep is None:
                tail = run_log_tail(Path(run.run_dir))
                ok, reason, samples = False, f"the sampling job ended {st.state} without a report" + (
                    f": {tail}" if tail else ""), []
            else:
                samples, why = samples_from_report(rep, run_id, run.service_name, run.job_type, mem)
                ok, reason = bool(samples), why or f"{len(samples)} sample(s), method {rep.get('method')}"
                run.method = rep.get("method")
                run.used_gpu_s = float(rep.get("elapsed_s") or 0.0)
                run.report = {**rep, "service_mem_bytes": mem}
                s.add_all(samples)
                run.samples = len(samples)
            run.node = st.node or run.node
            run.started_utc = run.started_utc or st.started_utc
            used = run.used_gpu_s or 0.0
            method = run.method
        summary.gpu_s_used += used
        if samples:
            summary.samples[method] = summary.samples.get(method, 0) + len(samples)
        self._end(run_id, ok, reason, summary)

    def _end(self, run_id: int, ok: bool, reason: str, summary: SamplingSummary) -> None:
        with self.store.session() as s:
            run = s.get(m.SamplingRun, run_id)
            run.state, run.reason, run.finished_utc = ("done" if ok else "failed"), reason[:4000], self.now()
        if ok:
            summary.done.append(run_id)
        else:
            summary.failed[run_id] = reason
        log.info("sampling run %s: %s%s", run_id, "" if ok else "FAILED: ", reason)


def plan_table(plan: SamplingPlan) -> list[dict[str, Any]]:
    return [{"gpu_type": r.gpu_type, "service": r.service, "job_type": r.job_type, "qps": round(r.qps, 2),
             "sm_pcts": ",".join(str(p) for p in r.sm_pcts), "gpu_min": round(r.cost_s / 60.0, 2),
             "new_job_type": r.opens_job_type} for r in plan.runs]

