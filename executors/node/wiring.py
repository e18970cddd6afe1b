"""Builds a node agent for one node of the feature store (simulated or NVML)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select

from executors.node.agent import AgentConfig, GpuBinding, NodeAgent, StoreSink
from executors.node.detector import ErrorDetector, FakeMpsControl, MpsControl, SubprocessMpsControl
from executors.node.evictor import CallbackEvictor, Evictor, SlurmEvictor, store_jobs_on_gpu
from executors.node.sampler import GpuSampler, NvmlSampler, SimulatedSampler, model_for_gpu_type
from executors.store import models as m
from scheduler_core.domain import GpuHealth
from scheduler_core.sysmonitor import SysMonitor

log = logging.getLogger(__name__)


def node_gpus(store, node: str) -> list[tuple[m.Gpu, m.GpuType]]:
    with store.session() as s:
        node_row = s.scalars(select(m.Node).where(m.Node.name == node)).first()
        if node_row is None:
            known = ", ".join(s.scalars(select(m.Node.name).order_by(m.Node.name))) or "none"
            raise ValueError(f"node {node!r} is not in the store (nodes: {known})")
        rows = s.execute(
            select(m.Gpu, m.GpuType).join(m.GpuType, m.GpuType.name == m.Gpu.gpu_type)
            .where(m.Gpu.node_id == node_row.id).order_by(m.Gpu.gpu_index)
        ).all()
        return [(g, t) for g, t in rows]


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


def build_agent(
    store, node: str, *, simulated: bool, cfg: AgentConfig, shm_dir: Path | None,
    requeue: Callable[[int], object] | None = None, evict_callback: Callable[[int, str], list[int] | None] | None = None,
    mps_pipe_dir: str | None = None, sampler: GpuSampler | None = None, seed: int = 0, clock=None,
) -> NodeAgent:
    pairs = node_gpus(store, node)
    if not pairs:
        raise ValueError(f"node {node!r} has no GPUs in the store")
    if sampler is None:
        if simulated:
            sampler = SimulatedSampler(models={
                g.gpu_index: model_for_gpu_type(t.max_sm_clock_mhz, t.memory_bytes, seed, g.gpu_index) for g, t in pairs
            }, seed=seed)
        else:
            sampler = NvmlSampler([g.gpu_index for g, _ in pairs])
    evictor: Evictor
    if requeue is not None:
        evictor = SlurmEvictor(store_jobs_on_gpu(store), requeue)
    else:
        lookup = store_jobs_on_gpu(store, with_slurm_id=False)
        evictor = CallbackEvictor(evict_callback or (lambda gpu_id, reason: [j for j, _ in lookup(gpu_id) if j is not None]))
    bindings, detectors, monitors = [], {}, {}
    for g, t in pairs:
        path = None if shm_dir is None else Path(shm_dir) / f"muxflow-gpu-{g.gpu_index}"
        bindings.append(GpuBinding(g.id, g.gpu_index, path, clock_threshold_mhz=0.85 * t.max_sm_clock_mhz))
        mps: MpsControl = FakeMpsControl(alive=None) if simulated else SubprocessMpsControl(mps_pipe_dir)
        detectors[g.gpu_index] = ErrorDetector(mps)
        monitors[g.gpu_index] = restored_monitor(g, cfg)
    sink = StoreSink(store, sampler.source)
    return NodeAgent(sampler, bindings, evictor, sink, cfg, clock=clock, detectors=detectors, monitors=monitors)
