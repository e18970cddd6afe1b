"""Builds a node agent for one node of the feature store (simulated or NVML).

From the store: the node's GPUs and types, the online replica on each GPU (service, model
family, memory, daily cycle, metrics endpoint). Around them: a scraper per registered
endpoint, the placement source (Slurm or the store's latest round), the sampler (NVML with
per-process accounting, or the simulated GPU following those placements and scraped
rates), the evictor and the store writer.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from executors.data.calibration import default_catalog
from executors.node.agent import AgentConfig, EvictionEvent, GpuBinding, NodeAgent
from executors.node.attribution import default_task_prolog
from executors.node.detector import (
    DEFAULT_PIPE_ROOT,
    ErrorDetector,
    FakeMpsControl,
    MpsControl,
    SubprocessMpsControl,
    check_pipe_root,
)
from executors.node.evictor import CallbackEvictor, Evictor, SlurmEvictor, store_jobs_on_gpu
from executors.node.job_dir_cap import JobDirCap, JobDirCapThread, OverCap
from executors.node.metrics import GpuMeta, JobMeta, NodeAgentCollector, ServiceMeta
from executors.node.online import OnlineAccounting
from executors.node.placements import (
    JobInfoLoader,
    Placements,
    PolledPlacements,
    StaticPlacements,
    slurm_reader,
    store_reader,
)
from executors.node.profile_windows import ProfileWindows, ProfileWindowsThread, slurm_windows
from executors.node.prolog_watch import PrologWatch, PrologWatchThread, slurm_job_facts
from executors.node.sampler import GpuSampler, NvmlSampler, SimulatedSampler
from executors.node.scrape import ReplicaScraper, Scrapers
from executors.node.simgpu import Replica, SimulatedGpu
from executors.node.store_sink import StoreSink
from executors.node.xcuda.stats import StatsRefused, job_stats
from executors.node.xcuda_check import (
    Notices,
    Violation,
    XcudaCheck,
    XcudaWatch,
    pw_uid,
    read_procs,
    user_pids_of_jobs,
)
from executors.store import inventory
from executors.store import models as m
from scheduler_core.domain import GpuHealth, GpuTypeSpec
from scheduler_core.gpu_specs import get_spec
from scheduler_core.guard.sysmonitor import SysMonitor
from scheduler_core.interference.gpu_model import XCUDA_TARGET_UTIL, OnlineModel
from scheduler_core.workloads import ONLINE_FAMILIES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceConfig:
    """Where the agent learns what runs and how loaded the replicas are."""

    placements: str = "store"          # 'slurm' | 'store' | 'none'
    slurm_client: Callable[[], object] | None = None   # a SlurmRestClient factory, for 'slurm'
    plan_key: bytes = b""              # verifies the plans in Slurm jobs' comments, for 'slurm' (executors.slurm.plan)
    poll_s: float = 5.0                # placement poll period (s)
    scrape_s: float = 5.0              # endpoint scrape period (s)
    scrape_timeout_s: float = 2.0
    solo_window_s: float = 3600.0
    noise_pct: float = 1.0             # simulated GPUs' measurement noise
    warmup_s: float = 0.0              # simulated GPUs: seconds a started job runs no kernels
    sim_xcuda_target_util: float | None = XCUDA_TARGET_UTIL  # simulated GPUs: the load xCUDA paces jobs to (None: off)
    sim_mps_split_gaps: bool = False   # simulated GPUs: no online split while a job shares the GPU, as under MPS
    partition: str | None = None       # only Slurm jobs of this partition are offline work (None: any)
    xcuda_check_s: float = 0.0         # period of the check for offline processes without xCUDA (0: off; CLI: 5 s)
    xcuda_grace_s: float = 5.0         # a process younger than this is not judged yet (TaskProlog, Epilog)
    xcuda_lib: str | None = None       # the installed libxcuda.so (the TaskProlog's @XCUDA_LIB@; None: this tree's)
    notice_dir: str | None = None      # where the xCUDA check leaves a user's notices (<dir>/<uid>; None: log only)
    proc_root: str = "/proc"
    # Run this Prolog for a TaskProlog that waits for its missing plan file in plan_dir (both set: on;
    # executors.node.prolog_watch): slurmd skips the Prolog of a requeued job restarted on its node.
    prolog: str | None = None
    plan_dir: str | None = None
    # The TaskProlog script Slurm runs (slurm.conf's TaskProlog=): only a process running it under the job's
    # slurmstepd is the job's TaskProlog, for the Prolog watch and the xCUDA check (None: slurm.conf's, else
    # task_prolog.sh beside the Prolog; executors.node.attribution.task_prolog_of).
    task_prolog: str | None = None
    # Measure the node's profiling windows (jobs profiled in their own Slurm jobs) into their runs' rows, reading
    # each job's iteration report under this directory (the node scripts' @JOB_DIR@; executors.node.profile_windows).
    job_dir: str | None = None
    window_report_s: float = 1.0


def _task_prolog(src: SourceConfig) -> str | None:
    return src.task_prolog or default_task_prolog(src.prolog)


def node_gpus(store, node: str) -> list[tuple[m.Gpu, m.GpuType]]:
    with store.session() as s:
        node_row = inventory.node_named(s, node)
        if node_row is None:
            known = ", ".join(inventory.node_names(s)) or "none"
            raise ValueError(f"node {node!r} is not in the store (nodes: {known})")
        return inventory.node_gpus(s, node_row.id)


def node_replicas(store, gpu_ids: list[int]) -> dict[int, Replica]:
    """The online replica on each of these GPUs (by GPU id), as registered (with the user it runs as)."""
    with store.session() as s:
        users = inventory.replica_users(s, gpu_ids)
        return {gid: Replica(svc.name, svc.model_family, float(svc.mem_bytes), svc.qps_min, svc.qps_max,
                             svc.peak_hour_utc, url, float(svc.latency_slo_ms), users.get(gid))
                for gid, url, svc in inventory.replicas_on(s, gpu_ids)}


def type_spec(t: m.GpuType) -> GpuTypeSpec:
    """The GPU type's public spec; a type the spec table lacks keeps the store's figures (P100 speed, mild clock sag)."""
    try:
        return get_spec(t.name)
    except KeyError:
        log.warning("GPU type %r has no spec: simulated with relative speed 1.0 and clock drop 0.1", t.name)
        return GpuTypeSpec(t.name, t.sm_count, t.memory_bytes, t.max_sm_clock_mhz, 1.0, 0.1)


def restored_monitor(gpu: m.Gpu, cfg: AgentConfig) -> SysMonitor:
    """A SysMonitor carrying the GPU's stored Overlimit entries (the 2-hour back-off survives restarts).

    A GPU stored as Disabled stays Disabled; anything else starts in Init."""
    entries = []
    for t in gpu.overlimit_entries or []:
        try:
            d = dt.datetime.fromisoformat(t)
            entries.append((d if d.tzinfo else d.replace(tzinfo=dt.timezone.utc)).timestamp())
        except (TypeError, ValueError):
            log.warning("GPU %d: ignoring bad overlimit entry %r", gpu.id, t)
    mon = SysMonitor(cfg.sysmonitor, overlimit_entries_s=sorted(entries))
    if gpu.health == GpuHealth.DISABLED.value:
        mon.disable()
    return mon


def _placements(store, node: str, pairs, src: SourceConfig, catalog) -> Placements:
    gpu_types = {t.name for _, t in pairs}
    if src.placements == "none":
        return StaticPlacements()
    # one GPU type per node (the usual case); a mixed node looks profiles up for its first type
    jobs = JobInfoLoader(store, sorted(gpu_types)[0], catalog)
    if src.placements == "slurm":
        if src.slurm_client is None:
            raise ValueError("placements from Slurm need a Slurm REST client (MUXFLOW_SLURM_URL)")
        if not src.plan_key:
            raise ValueError("placements from Slurm need the plan key (slurm_plan_key_file, "
                             "MUXFLOW_SLURM_PLAN_KEY_FILE): plans in jobs' comments are signed with it")
        return PolledPlacements(slurm_reader(src.slurm_client, node, jobs, src.plan_key, src.partition), src.poll_s,
                                "Slurm").start()
    if src.placements == "store":
        index_of = {g.id: g.gpu_index for g, _ in pairs}
        return PolledPlacements(store_reader(store, index_of, jobs), src.poll_s, "the store").start()
    raise ValueError(f"placements: expected slurm, store or none, got {src.placements!r}")


def build_agent(
    store, node: str, *, simulated: bool, cfg: AgentConfig, shm_dir: Path | None,
    requeue: Callable[[int], object] | None = None, evict_callback: Callable[[int, str], list[int] | None] | None = None,
    mps_pipe_root: str = DEFAULT_PIPE_ROOT, sampler: GpuSampler | None = None, seed: int = 0, clock=None,
    sources: SourceConfig | None = None, placements: Placements | None = None,
) -> NodeAgent:
    src = sources or SourceConfig(placements="slurm" if requeue is not None else "store")
    pairs = node_gpus(store, node)
    if not pairs:
        raise ValueError(f"node {node!r} has no GPUs in the store")
    catalog = default_catalog()
    by_id = node_replicas(store, [g.id for g, _ in pairs])
    replicas = {g.gpu_index: by_id[g.id] for g, _ in pairs if g.id in by_id}
    closers: list[Callable[[], None]] = []
    if placements is None:
        placements = _placements(store, node, pairs, src, catalog)
        closers.append(placements.close)
    try:
        agent = _assemble(store, node, pairs, replicas, placements, closers, catalog, src, simulated=simulated, cfg=cfg,
                          shm_dir=shm_dir, requeue=requeue, evict_callback=evict_callback, mps_pipe_root=mps_pipe_root,
                          sampler=sampler, seed=seed, clock=clock)
        if src.prolog and src.plan_dir:
            watch = PrologWatch(src.prolog, src.plan_dir, node, proc_root=src.proc_root,
                                offline_partition=src.partition or "offline", task_prolog=_task_prolog(src),
                                slurm_job=None if src.slurm_client is None else slurm_job_facts(src.slurm_client))
            agent.stoppers.append(PrologWatchThread(watch).start().close)
        if src.job_dir and src.placements == "slurm":
            windows = ProfileWindows(store, node, slurm_windows(src.slurm_client, node, src.plan_key),
                                     Path(src.job_dir), {g.gpu_index: t.name for g, t in pairs}, simulated,
                                     report_s=src.window_report_s, seed=seed)
            agent.stoppers.append(ProfileWindowsThread(windows, src.window_report_s).start().close)
        return agent
    except BaseException:
        for close in closers:
            close()
        raise


def _assemble(store, node: str, pairs, replicas: dict[int, Replica], placements: Placements, closers: list, catalog,
              src: SourceConfig, *, simulated: bool, cfg: AgentConfig, shm_dir: Path | None, requeue, evict_callback,
              mps_pipe_root: str, sampler: GpuSampler | None, seed: int, clock) -> NodeAgent:
    agent_clock = clock
    if agent_clock is None:
        from executors.node.agent import RealClock, ScaledClock

        agent_clock = ScaledClock(cfg.time_scale) if cfg.time_scale != 1.0 else RealClock()
    scrapers = Scrapers({
        idx: ReplicaScraper(r.metrics_url, interval_s=src.scrape_s, timeout_s=src.scrape_timeout_s,
                            keep_s=src.solo_window_s + 300.0, clock=agent_clock.epoch,
                            solo=lambda i=idx: not placements.on_gpu(i))
        for idx, r in replicas.items() if r.metrics_url
    })
    sim_gpus: dict[int, SimulatedGpu] = {}
    if sampler is None:
        if simulated:
            models = sim_gpus
            for g, t in pairs:
                spec, rep = type_spec(t), replicas.get(g.gpu_index)
                online = None
                if rep is not None and rep.family in ONLINE_FAMILIES:
                    fam = ONLINE_FAMILIES[rep.family]
                    online = OnlineModel.of(fam, catalog.online[fam.name], spec, rep.mem_bytes)
                elif rep is not None:
                    log.warning("GPU %d: service %s has family %r, which the simulated GPU does not model",
                                g.gpu_index, rep.service, rep.family)
                sc = scrapers.get(g.gpu_index)
                models[g.gpu_index] = SimulatedGpu(
                    g.gpu_index, spec, online, rep, placements, None if sc is None else sc.current_qps,
                    noise_pct=src.noise_pct, warmup_s=src.warmup_s, seed=seed,
                    xcuda_target_util=src.sim_xcuda_target_util, mps_split_gaps=src.sim_mps_split_gaps)
            sampler = SimulatedSampler(models=models)
        else:
            from executors.node.attribution import ProcessAttribution

            def offline_slurm_jobs(gpu_index: int) -> set[int]:
                return {o.slurm_job_id for o in placements.on_gpu(gpu_index) if o.slurm_job_id is not None}

            import pynvml

            sampler = NvmlSampler([g.gpu_index for g, _ in pairs],
                                  attribution=ProcessAttribution(pynvml, offline_slurm_jobs))
    evictor: Evictor
    index_of = {g.id: g.gpu_index for g, _ in pairs}
    if requeue is not None:
        if src.placements != "store":  # Slurm's (or a given) view of what runs, not the store's last round
            def jobs_on_gpu(gpu_id: int) -> list[tuple[int | None, int]]:
                placements.refresh()  # evicting: Slurm's view of now, not the last poll's
                return [(o.job_id, o.slurm_job_id) for o in placements.on_gpu(index_of[gpu_id])
                        if o.slurm_job_id is not None]
            evictor = SlurmEvictor(jobs_on_gpu, requeue)
        else:
            evictor = SlurmEvictor(store_jobs_on_gpu(store), requeue)
    else:
        lookup = store_jobs_on_gpu(store, with_slurm_id=False)
        evictor = CallbackEvictor(evict_callback or (lambda gpu_id, reason: [j for j, _ in lookup(gpu_id) if j is not None]))
    bindings, detectors, monitors = [], {}, {}
    if not simulated:
        check_pipe_root(mps_pipe_root)  # never under /tmp: root resets MPS there
    for g, t in pairs:
        path = None if shm_dir is None else Path(shm_dir) / f"muxflow-gpu-{g.gpu_index}"
        bindings.append(GpuBinding(g.id, g.gpu_index, path, clock_threshold_mhz=0.85 * t.max_sm_clock_mhz))
        # the GPU's own control daemon, where the Prolog starts it (prolog.sh: @MPS_PIPE_ROOT@/gpu<i>)
        pipe = f"{mps_pipe_root}/gpu{g.gpu_index}"
        mps: MpsControl = FakeMpsControl(alive=None) if simulated else SubprocessMpsControl(pipe, f"{pipe}.log")
        detectors[g.gpu_index] = ErrorDetector(mps)
        monitors[g.gpu_index] = restored_monitor(g, cfg)
    sink = StoreSink(store, sampler.source)
    accounting = OnlineAccounting(replicas, scrapers, src.solo_window_s)
    scrapers.start()
    closers.insert(0, scrapers.close)
    rates = {g.gpu_index: sc.current for g, _ in pairs if (sc := scrapers.get(g.gpu_index)) is not None}
    slos = {idx: r.latency_slo_ms for idx, r in replicas.items()}
    agent = NodeAgent(sampler, bindings, evictor, sink, cfg, clock=agent_clock, detectors=detectors,
                      monitors=monitors, placements=placements, accounting=accounting, closers=closers, rates=rates,
                      slos=slos)
    for idx, model in sim_gpus.items():  # the simulated jobs' xCUDA paces to the target the GPU's loop publishes
        if idx in agent.loops:
            agent.loops[idx].burst_listeners.append(model.set_burst)
    if isinstance(evictor, SlurmEvictor) and src.xcuda_check_s > 0:
        agent.stoppers.append(_xcuda_watch(agent, node, evictor, sink, placements, pairs, src, replicas).close)
    if isinstance(evictor, SlurmEvictor) and src.job_dir:
        agent.stoppers.append(_job_dir_cap(agent, evictor, sink, placements, pairs, src.job_dir).close)
    return agent


def _xcuda_watch(agent: NodeAgent, node: str, evictor: SlurmEvictor, sink, placements: Placements, pairs,
                 src: SourceConfig, replicas: dict[int, Replica]) -> XcudaWatch:
    """The xCUDA check of the node's GPUs (executors.node.xcuda_check), evicting through the agent's evictor and
    recording in its sink: real GPUs judge the processes NVML lists on each GPU, simulated ones the simulated
    GPUs' (executors.node.simgpu.simulated_compute_pids)."""
    gpu_id_of = {g.gpu_index: g.id for g, _ in pairs}
    gpu_pids = getattr(agent.sampler, "compute_pids", None)
    check = XcudaCheck(placements, list(gpu_id_of), gpu_pids, src.proc_root, src.xcuda_grace_s, src.xcuda_lib,
                       task_prolog=_task_prolog(src), replicas={i: r.run_as_user for i, r in replicas.items()},
                       node=node)

    def evict(v: Violation) -> None:
        loop = agent.loops[v.gpu_index]
        done = evictor.evict_job(v.job_id, v.slurm_job_id)
        reason = v.reason if done.ok else f"{v.reason} (failed: {done.detail})"
        if v.job_id is None:  # a Slurm job MuxFlow did not place: no row of the store's (its user has the notice)
            log.warning("GPU %d: Slurm job %s requeue-held: %s", v.gpu_index, v.slurm_job_id, reason)
        sink.eviction(EvictionEvent(gpu_id_of[v.gpu_index], v.job_id, dt.datetime.fromtimestamp(agent.clock.epoch(), tz=dt.UTC), reason,
                                    loop.monitor.state.value, done.ok, done.slurm_job_id))

    return XcudaWatch(check, evict, src.xcuda_check_s, notices=Notices(src.notice_dir)).start()


def _job_dir_cap(agent: NodeAgent, evictor: SlurmEvictor, sink, placements: Placements, pairs,
                 job_dir: str) -> JobDirCapThread:
    """The bound on each placed job's own directory (executors.node.job_dir_cap): a job over it is evicted."""
    gpu_id_of = {g.gpu_index: g.id for g, _ in pairs}

    def jobs() -> list[tuple[int, int | None, int]]:
        return [(i, o.job_id, o.slurm_job_id) for i in gpu_id_of for o in placements.on_gpu(i)
                if o.slurm_job_id is not None]

    def evict(over: OverCap) -> None:
        done = evictor.evict_job(over.job_id, over.slurm_job_id)
        reason = over.reason if done.ok else f"{over.reason} (failed: {done.detail})"
        sink.eviction(EvictionEvent(gpu_id_of[over.gpu_index], over.job_id,
                                    dt.datetime.fromtimestamp(agent.clock.epoch(), tz=dt.UTC), reason,
                                    agent.loops[over.gpu_index].monitor.state.value, done.ok, done.slurm_job_id))

    return JobDirCapThread(JobDirCap(job_dir, jobs), evict).start()


def node_metrics(store, node: str, agent: NodeAgent, job_dir: str | None = None, proc_root: str = "/proc"):
    """The Prometheus collector of this node's agent (executors.node.metrics): labels from the store (GPU UUIDs and
    types, each replica's service, SLO and allowance; each placed job's owner and type, read once per job); with
    ``job_dir`` (the node scripts' @JOB_DIR@), each placed Slurm job's xCUDA counters, read as its user's input."""
    pairs = node_gpus(store, node)
    gpus = [GpuMeta(g.gpu_index, g.id, g.uuid, t.name) for g, t in pairs]
    index_of = {g.id: g.gpu_index for g, _ in pairs}
    with store.session() as s:
        services = {index_of[gid]: ServiceMeta(svc.name, float(svc.latency_slo_ms), float(svc.slowdown_allowance))
                    for gid, _, svc in inventory.replicas_on(s, list(index_of))}
    cache: dict[int, JobMeta | None] = {}

    def job(job_id: int) -> JobMeta | None:
        if job_id not in cache:
            try:
                with store.session() as s:
                    row = s.get(m.OfflineJob, job_id)
                    cache[job_id] = None if row is None else JobMeta(row.run_as_user or "", row.job_type or "")
            except Exception as exc:  # the store briefly away: unlabelled now, looked up again next scrape
                log.warning("metrics: cannot read offline job %d: %s", job_id, exc)
                return None
        return cache[job_id]

    return NodeAgentCollector(agent, node, gpus, services, job,
                              _xcuda_counters(Path(job_dir), Path(proc_root)) if job_dir else lambda _jobs: {})


def _xcuda_counters(job_dir: Path, proc_root: Path):
    """[(Slurm job id, user)] → the xCUDA counters of each job's live processes that run as its user (one read of
    ``proc_root`` per call); a job whose directory is refused is logged once and left out."""
    import pwd


    refused: set[tuple[int, str]] = set()

    def read(jobs: list[tuple[int, str]]) -> dict[int, list]:
        if not jobs:
            return {}
        uids = {sid: uid for sid, user in jobs if user and (uid := pw_uid(user)) is not None}
        pids = user_pids_of_jobs(read_procs(proc_root), {sid for sid, _ in jobs}, proc_root, uids)  # one walk
        out: dict[int, list] = {}
        for sid, user in jobs:
            try:
                uid = pwd.getpwnam(user).pw_uid if user else None
                out[sid] = list(job_stats(job_dir, sid, uid, pids.get(sid, set())).values())
            except (KeyError, StatsRefused) as exc:
                if (sid, str(exc)) not in refused:
                    refused.add((sid, str(exc)))
                    log.warning("metrics: xCUDA counters of Slurm job %d not read: %s", sid, exc)
        return out

    return read
