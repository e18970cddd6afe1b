"""Nodes Slurm says are not usable (DOWN, DRAIN, NOT_RESPONDING …): their GPUs leave the rounds, their jobs are
handed back to the queue (docs/SLURM.md "Node faults").

Run by the job-state sync (:func:`executors.scheduler.slurm.sync.sync_jobs`) with one node listing per call:

- each GPU of an unusable node is marked ``Unhealthy`` in the store (source ``slurm``), so the next round plans
  nothing there (the round plans on Healthy GPUs only); when Slurm says the node is usable again, the GPUs it
  marked — and only those: never an Unhealthy that a node agent's SysMonitor set — go back to ``Healthy``. A
  node agent's own later state wins (it writes its state when it starts, and at every change); every write
  here is a compare-and-set against what was read, so an agent's write in between is never overwritten;
- a MuxFlow job released onto such a node that has not started (slurmd died between the placement and the
  start: Slurm would start it there once the node returns) is held again, so the sync moves it to PENDING;
- a job still running on a draining node is checkpointed and requeued held (Slurm lets it run to its end,
  MuxFlow's job may run for days), so the sync moves it to PENDING. On a DOWN node Slurm requeues it itself
  (NODE_FAIL with ``JobRequeue=1``), which the sync already follows.
"""

from __future__ import annotations

import datetime as dt
import logging

from executors.slurm.models import PENDING, RUNNING, Job, Node
from executors.store import inventory, repo
from executors.store.models import HEALTH_BY_AGENT, HEALTH_BY_SLURM
from scheduler_core.domain import GpuHealth

log = logging.getLogger(__name__)

_DRAIN = frozenset({"DRAIN", "DRAINING", "DRAINED"})


def _draining(node: Node) -> bool:
    return node.state == "DRAINING" or bool(set(node.state_flags) & _DRAIN)


def mark_gpus(store, nodes: list[Node], now: dt.datetime) -> dict[int, str]:
    """Store health of the GPUs of Slurm's nodes: Unhealthy on an unusable node; Healthy again once it is usable
    (the GPUs this marked only). The changes made, by GPU id."""
    state = {n.name: n for n in nodes}
    unhealthy = GpuHealth.UNHEALTHY.value
    changes: dict[int, str] = {}
    with store.session() as s:
        for gpu_id, node, health, source in inventory.gpu_health_by_node(s):
            n = state.get(node)
            if n is None:
                continue
            if not n.usable and health != unhealthy:
                new = (unhealthy, HEALTH_BY_SLURM)
            elif n.usable and (health, source) == (unhealthy, HEALTH_BY_SLURM):
                new = (GpuHealth.HEALTHY.value, HEALTH_BY_AGENT)
            else:
                continue
            if repo.swap_gpu_health(s, gpu_id, (health, source), new, now):
                changes[gpu_id] = new[0]
    if changes:
        log.info("Slurm node states: GPU health %s", changes)
    return changes


def hand_back(cluster, jobs: list[Job], nodes: list[Node], managed: set[int]) -> list[int]:
    """Hold the MuxFlow jobs (Slurm ids ``managed``) stranded on unusable nodes; the Slurm ids acted on."""
    bad = {n.name: n for n in nodes if not n.usable}
    acted = []
    for j in jobs:
        if j.job_id not in managed or j.finished:
            continue
        if j.state == PENDING and not j.held and j.required_nodes and all(n in bad for n in j.required_nodes):
            cluster.retry.call(f"hold Slurm job {j.job_id}", lambda sid=j.job_id: cluster.client.hold(sid))
            acted.append(j.job_id)
        elif j.state == RUNNING and j.nodes and any(_draining(bad[n]) for n in j.nodes if n in bad):
            cluster._checkpoint_and_requeue(j.job_id)
            acted.append(j.job_id)
    if acted:
        log.info("Slurm node faults: held/requeued %s", acted)
    return acted
