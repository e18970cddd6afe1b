"""The simulator's cluster executor: a fleet of simulated GPUs, advanced one minute at a time, vectorized.

Every GPU hosts one online service replica whose request rate follows its
daily cycle with AR(1) noise and bursts (:mod:`scheduler_core.online.load`);
offline jobs placed by a policy share it under one of four sharing
mechanisms:

- ``mps``: space-sharing under an MPS share (MuxFlow and its ablations): the
  calibrated interference model :func:`scheduler_core.interference.pairs.colocate`.
- ``time``: GPU-driver time slices (Time-sharing, as in Gandiva).
- ``priority``: priority time slices (PB-time-sharing, as in AntMan/PAI).
- ``salus``: iteration-level switching between several resident jobs, shortest
  remaining time first (Salus).
- ``none``: no offline work (Online-only).

Under ``mps`` the GPU is :mod:`scheduler_core.interference.gpu_model` (the one simulated GPU
of the pipeline's cluster and the node agent too); the other mechanisms are
modelled here; protected policies run one
:class:`scheduler_core.guard.sysmonitor.SysMonitor` per GPU — the production state
machine, stepped only where a sample could change its state.

Actions are those of a production plan (:class:`scheduler_core.domain.PlanAction`);
a migration checkpoints (nothing lost) and pays ``restart_s``, an eviction by
SysMonitor loses the work since the last periodic checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scheduler_core.domain import Action, GpuHealth, PlanAction
from scheduler_core.prediction.features import RECENT_ONLINE_KEYS
from scheduler_core.interference.gpu_model import OnlineModel, clock_frac, online_alone, with_offline_jobs
from scheduler_core.gpu_specs import get_spec
from scheduler_core.interference.pairs import WorkloadTraits
from scheduler_core.online.load import diurnal_qps
from scheduler_core.rng import rng_stream
from scheduler_core.simulator.config import SimConfig
from scheduler_core.simulator.users import assign_users
from scheduler_core.simulator.workload import JobTable
from scheduler_core.guard.burst import BURST_TARGET_UTIL, BurstGuard, modelled_over_limit
from scheduler_core.guard.sysmonitor import GpuSample, SysMonitor, Thresholds
from scheduler_core.workloads import ONLINE_FAMILIES, WorkloadCatalog

SHARING_MODES = ("none", "mps", "time", "priority", "salus")

# Job states.
FUTURE, QUEUED, RUNNING, DONE = 0, 1, 2, 3

_HEALTH = list(GpuHealth)
_HEALTH_CODE = {h: i for i, h in enumerate(_HEALTH)}
HEALTHY = _HEALTH_CODE[GpuHealth.HEALTHY]


def _reached(th: Thresholds, util, sm, clock, mem_frac) -> np.ndarray:
    return (util >= th.gpu_util_pct) | (sm >= th.sm_activity_pct) | (clock <= th.sm_clock_frac) | (
        mem_frac >= th.mem_used_frac)


@dataclass
class Minute:
    """What one simulated minute produced, per GPU (arrays of length n) and in sum."""

    qps: np.ndarray
    latency_ms: np.ndarray
    solo_latency_ms: np.ndarray
    util_pct: np.ndarray
    sm_pct: np.ndarray
    mem_frac: np.ndarray
    solo_util_pct: np.ndarray
    solo_sm_pct: np.ndarray
    solo_mem_frac: np.ndarray
    offline_gpu_equiv: float  # Σ normalized throughput of the offline jobs that ran
    running: int
    active_per_gpu_max: int  # most offline jobs that progressed on one GPU in this minute
    evicted: int
    finished: int  # offline jobs that finished in this minute
    burst_paced: int = 0  # GPUs whose offline work the burst guard paced to xCUDA's floor in this minute


class Fleet:
    def __init__(self, cfg: SimConfig, catalog: WorkloadCatalog, jobs: JobTable, sharing: str, protection: bool):
        if sharing not in SHARING_MODES:
            raise ValueError(f"sharing must be one of {SHARING_MODES}, got {sharing!r}")
        self.cfg, self.catalog, self.jobs, self.sharing, self.protection = cfg, catalog, jobs, sharing, protection
        n = cfg.gpus
        self.n = n
        names: list[str] = []
        for name, count in cfg.types():
            names.extend([name] * count)
        self.type_names = sorted({t for t, _ in cfg.types()})
        self.gpu_type_name = names
        self.gpu_type = np.array([self.type_names.index(t) for t in names], dtype=np.int64)
        specs = [get_spec(t) for t in names]
        self.mem_total = np.array([s.memory_bytes for s in specs], dtype=float)
        self.rel_speed = np.array([s.relative_speed for s in specs])
        self.clock_drop = np.array([s.clock_drop_frac for s in specs])
        self.max_clock = np.array([s.max_sm_clock_mhz for s in specs], dtype=float)
        # Services round-robin over the GPUs.
        svc = [cfg.services[i % len(cfg.services)] for i in range(n)]
        self.service_index = np.arange(n) % len(cfg.services)
        fam = [ONLINE_FAMILIES[s.family] for s in svc]
        self.qps_min = np.array([s.qps_min for s in svc])
        self.qps_max = np.array([s.qps_max for s in svc])
        self.peak_hour = np.array([s.peak_hour_utc for s in svc])
        self.allowance = np.array([s.slowdown_allowance for s in svc])
        # One online model per (family, GPU type), stacked over the GPUs.
        per_kind = {(f.name, t): OnlineModel.of(f, catalog.online[f.name], sp)
                    for f, t, sp in zip(fam, names, specs)}
        self.online = OnlineModel.stack([per_kind[(f.name, t)] for f, t in zip(fam, names)])
        self.svc_mem = self.online.mem_bytes
        # Who the replicas and the jobs run as (−1: not declared; scheduler_core.simulator.users).
        self.gpu_user, self.job_user = assign_users(cfg.seed, cfg.users, cfg.users_zipf_s, n, jobs.size)
        # Offline job-type traits, by the job table's type index.
        wl = [catalog.offline[t] for t in jobs.types]
        self.off_sens = np.array([w.traits.sensitivity for w in wl])
        self.off_pres = np.array([w.traits.pressure for w in wl])
        self.off_sm_need = np.array([w.traits.sm_need for w in wl])
        self.off_mem_bw = np.array([w.traits.mem_bw for w in wl])
        self.sps_ref = np.array([w.solo_steps_per_s_p100 for w in wl])
        # Online load state and its streams (independent of the policy: every
        # policy sees the same online load).
        self.noise = np.zeros(n)
        self.burst_left = np.zeros(n, dtype=np.int64)
        self._noise_rng = rng_stream(cfg.seed, "sim-online-load")
        self._burst_rng = rng_stream(cfg.seed, "sim-bursts")
        # SysMonitor per GPU (protected policies only); health codes mirror their states.
        self.monitors = [SysMonitor(cfg.sysmonitor) for _ in range(n)] if protection else None
        self.health = np.full(n, _HEALTH_CODE[GpuHealth.INIT] if protection else HEALTHY, dtype=np.int64)
        self._first_step = True
        # Jobs.
        m = jobs.size
        self.state = np.zeros(m, dtype=np.int8)
        self.gpu = np.full(m, -1, dtype=np.int64)
        self.sm_pct = np.zeros(m, dtype=np.int64)
        self.steps_done = np.zeros(m)
        self.ckpt_step = np.zeros(m)
        self.warmup_s = np.zeros(m)
        self.since_ckpt_s = np.zeros(m)
        self.finish_s = np.full(m, np.nan)
        self.first_start_s = np.full(m, np.nan)
        self.real_s = np.zeros(m)  # wall time placed on a GPU
        self.sep_s = np.zeros(m)  # the same work's time on a dedicated GPU
        self.executions = np.zeros(m, dtype=np.int64)
        self.evictions = np.zeros(m, dtype=np.int64)
        self.migrations = np.zeros(m, dtype=np.int64)
        self.lost_steps = np.zeros(m)
        self._next_arrival = 0
        # Recent online-only metrics for the rounds' candidates (ring of the last 15 minutes)
        # and the SM-activity history the forecaster reads.
        self.recent_n = 15
        self._recent = np.full((7, self.recent_n, n), np.nan)
        self.history_minutes = 25 * 60
        self._hist = np.full((self.history_minutes, n), np.nan)
        self._hist_len = 0
        self._hist_pos = 0
        # Each minute's measured online slowdown, requests and latency alone per GPU (NaN slowdown: no offline job),
        # the last ``shared_n`` minutes: what MuxFlow's allowance correction reads between two of its calls
        # (scheduler_core.online.correction); ``minutes_stepped`` counts the minutes written.
        self.shared_n = max(self.recent_n, cfg.round_minutes)
        self._shared = np.full((3, self.shared_n, n), np.nan)
        self.minutes_stepped = 0
        # The node agent's burst guard (MPS sharing under xCUDA): a replica in a burst paces its GPU's offline work.
        self.burst = (BurstGuard(n, cfg.burst_guard) if sharing == "mps" and cfg.burst_guard is not None
                      and cfg.xcuda_target_util is not None else None)
        slos = np.array([np.nan if x is None else x for x in cfg.service_slos_ms()], dtype=float)
        self._slo_of_gpu = slos[self.service_index]
        self._allowance_of_gpu = np.array([sv.slowdown_allowance for sv in cfg.services])[self.service_index]

    # -- per-job helpers ----------------------------------------------------------
    def solo_sps(self, jobs: np.ndarray, gpus: np.ndarray) -> np.ndarray:
        return self.sps_ref[self.jobs.job_type[jobs]] * self.rel_speed[gpus]

    def admit(self, now_s: float) -> int:
        """Jobs that have arrived by ``now_s`` join the queue."""
        arr = self.jobs.arrival_s
        end = int(np.searchsorted(arr, now_s, side="right"))
        new = end - self._next_arrival
        if new > 0:
            self.state[self._next_arrival:end] = QUEUED
            self._next_arrival = end
        return max(0, new)

    def queued(self) -> np.ndarray:
        return np.flatnonzero(self.state == QUEUED)

    def running(self) -> np.ndarray:
        return np.flatnonzero(self.state == RUNNING)

    # -- rounds: observations and plans ----------------------------------------------
    def recent_online(self) -> dict[str, np.ndarray]:
        """Per GPU, the mean of its online service's metrics over the last 15 minutes (what the monitor reports)."""
        with np.errstate(invalid="ignore"):
            mean = np.nanmean(self._recent, axis=1)
        return {k: mean[i] for i, k in enumerate(RECENT_ONLINE_KEYS)}

    def sm_history(self) -> np.ndarray:
        """(GPUs × minutes) online SM activity, oldest first, up to 25 hours."""
        if self._hist_len < self.history_minutes:
            return self._hist[: self._hist_len].T
        return np.vstack([self._hist[self._hist_pos:], self._hist[: self._hist_pos]]).T

    def shared_minutes(self, since: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(minutes × GPUs) measured online slowdown (NaN where no offline job was placed), requests and mean
        latency alone (ms) of the minutes stepped since the count ``since`` (a former ``minutes_stepped``), oldest
        first; at most the last ``shared_n`` of them."""
        k = min(self.minutes_stepped - since, self.shared_n)
        if k <= 0:
            return np.zeros((0, self.n)), np.zeros((0, self.n)), np.zeros((0, self.n))
        rows = np.arange(self.minutes_stepped - k, self.minutes_stepped) % self.shared_n
        return self._shared[0, rows], self._shared[1, rows], self._shared[2, rows]

    def apply(self, actions: list[PlanAction], now_s: float) -> dict[str, int]:
        """Carry out a plan: evictions and the checkpoint half of migrations first, then restarts and starts."""
        counts = {"start": 0, "keep": 0, "migrate": 0, "evict": 0, "refused": 0}
        # Offline jobs one GPU may hold: Salus keeps residents (its planner bounds them, the fleet does not); MPS
        # policies as many as their rounds plan (each at its own share); time sharing one.
        limit = {"salus": math.inf, "mps": self.cfg.max_jobs_per_gpu}.get(self.sharing, 1)
        # Phase 1: evictions and the checkpoint half of every migration free their GPUs.
        for act in actions:
            if act.action in (Action.EVICT, Action.MIGRATE) and self.state[act.job_id] == RUNNING:
                self._stop(act.job_id, checkpoint=True)
            if act.action == Action.EVICT:
                counts["evict"] += 1
            elif act.action == Action.KEEP:
                counts["keep"] += 1
        # Phase 2: restarts and starts claim them.
        occupied = np.bincount(self.gpu[self.running()], minlength=self.n)
        for act in actions:
            if act.action not in (Action.MIGRATE, Action.START):
                continue
            j, g = act.job_id, int(act.gpu_id)
            if occupied[g] >= limit:
                # Never more offline jobs on one GPU than the mechanism holds: refused, the job waits in the queue.
                counts["refused"] += 1
                continue
            if act.action == Action.MIGRATE:
                self.migrations[j] += 1
                warm = self.cfg.restart_s
                counts["migrate"] += 1
            else:
                if self.state[j] != QUEUED:
                    counts["refused"] += 1
                    continue
                warm = self.cfg.restart_s if self.executions[j] > 0 else self.cfg.startup_s
                counts["start"] += 1
            self.state[j] = RUNNING
            self.gpu[j] = g
            occupied[g] += 1
            self.sm_pct[j] = int(act.sm_pct) if act.sm_pct is not None else 100
            self.warmup_s[j] = warm
            self.since_ckpt_s[j] = 0.0
            self.executions[j] += 1
            if np.isnan(self.first_start_s[j]):
                self.first_start_s[j] = now_s
        return counts

    def _stop(self, j: int, checkpoint: bool) -> None:
        if checkpoint:
            self.ckpt_step[j] = self.steps_done[j]
        else:
            lost = self.steps_done[j] - self.ckpt_step[j]
            self.lost_steps[j] += lost
            self.sep_s[j] -= lost / float(self.solo_sps(np.array([j]), np.array([self.gpu[j]]))[0])
            self.steps_done[j] = self.ckpt_step[j]
        self.state[j] = QUEUED
        self.gpu[j] = -1

    # -- one minute ---------------------------------------------------------------------
    def _burst_update(self, qps: np.ndarray, lat_solo: np.ndarray, slowdown: np.ndarray) -> np.ndarray:
        """The burst guard's step: each replica over its limit as it is — its p99 over its SLO, or, for a service
        without one, its slowdown over its allowance."""
        return self.burst.update(qps, modelled_over_limit(lat_solo, slowdown, self._slo_of_gpu, self._allowance_of_gpu))

    def _online_qps(self, hour: float) -> np.ndarray:
        c = self.cfg
        self.noise = 0.8 * self.noise + self._noise_rng.normal(0.0, c.qps_noise_frac, self.n)
        bursting = self.burst_left > 0
        self.burst_left[bursting] -= 1
        start = (~bursting) & (self._burst_rng.random(self.n) < c.burst_prob_per_min)
        if start.any():
            self.burst_left[start] = self._burst_rng.integers(c.burst_minutes[0], c.burst_minutes[1] + 1,
                                                               int(start.sum()))
        qps = diurnal_qps(hour, self.qps_min, self.qps_max, self.peak_hour) * (1.0 + self.noise)
        qps = np.where(self.burst_left > 0, qps * c.burst_factor, qps)
        return np.maximum(0.0, qps)

    def _active(self, run: np.ndarray) -> np.ndarray:
        """Of the placed jobs ``run``, those that progress this minute."""
        if self.sharing != "salus" or run.size == 0:
            return run
        # Salus: the resident job with the shortest remaining time runs (SRTF), one per GPU.
        remaining = (self.jobs.total_steps[run] - self.steps_done[run]) / self.solo_sps(run, self.gpu[run])
        order = np.lexsort((run, remaining, self.gpu[run]))
        g_sorted = self.gpu[run][order]
        first = np.ones(order.size, dtype=bool)
        first[1:] = g_sorted[1:] != g_sorted[:-1]
        return run[order[first]]

    def step(self, minute: int, hour: float, now_s: float) -> Minute:
        c, sh = self.cfg, self.cfg.sharing
        qps = self._online_qps(hour)
        bursting = None
        on = online_alone(self.online, qps)
        on_util, on_sm, on_bw, on_mem, lat_solo = on.util_pct, on.sm_pct, on.bw_pct, on.mem_bytes, on.latency_ms
        solo_clock = clock_frac(on_sm, self.clock_drop)
        util, sm, bw = on_util.copy(), on_sm.copy(), on_bw.copy()
        mem = on_mem.copy()
        slow = np.ones(self.n)
        run = self.running()
        placed = np.zeros(self.n, dtype=bool)  # GPUs with an offline job this minute (before any finishes)
        placed[self.gpu[run]] = True
        if run.size:
            np.add.at(mem, self.gpu[run], self.jobs.mem_bytes[run].astype(float))
            self.real_s[run] += 60.0
        act = self._active(run) if self.sharing != "none" else np.zeros(0, dtype=np.int64)
        gpu_equiv, per_gpu_max, finished = 0.0, 0, 0
        if act.size:
            g = self.gpu[act]
            per_gpu_max = int(np.bincount(g).max())
            t = self.jobs.job_type[act]
            active_s = np.maximum(0.0, 60.0 - self.warmup_s[act])
            duty = active_s / 60.0
            u = on_util[g] / 100.0
            if self.sharing == "mps":
                off_tr = WorkloadTraits(self.off_sens[t], self.off_pres[t], self.off_sm_need[t], self.off_mem_bw[t])
                # memory is added above for every placed job (Salus keeps several resident)
                shared = with_offline_jobs(on, self.online, g, off_tr, self.sm_pct[act], duty, 0.0,
                                           c.interference, c.xcuda_target_util)
                if self.burst is not None:
                    # The node agent sees the replica's rate and its p99 as it is (shared), then acts.
                    bursting = self._burst_update(qps, lat_solo, shared.slowdown)
                    if bursting[g].any():
                        shared = with_offline_jobs(on, self.online, g, off_tr, self.sm_pct[act], duty, 0.0,
                                                   c.interference,
                                                   np.where(bursting, BURST_TARGET_UTIL, c.xcuda_target_util))
                # Per GPU with jobs (several jobs on one GPU write the same totals).
                u_g, sm_g, bw_g = shared.util_pct[g], shared.sm_pct[g], shared.bw_pct[g]
                tput = shared.norm_tput
                slow[g] = shared.slowdown[g]
            else:
                if self.sharing == "time":
                    busy_on = np.minimum(0.95, u * (1.0 + sh.ts_online_wait))
                    tput = (1.0 - busy_on) * (1.0 - sh.ts_switch_overhead)
                    s = np.full(act.size, 1.0 + sh.ts_online_wait)
                elif self.sharing == "priority":
                    tput = (1.0 - np.minimum(0.95, u)) * sh.pb_offline_efficiency
                    s = np.full(act.size, 1.0 + sh.pb_online_wait)
                else:  # salus
                    tput = (1.0 - np.minimum(0.95, u)) * sh.salus_offline_efficiency
                    iter_ms = 1000.0 / self.solo_sps(act, g)
                    s = 1.0 + (tput / sh.salus_offline_efficiency) * 0.5 * iter_ms / lat_solo[g]
                u_g = 100.0 * np.minimum(1.0, u + duty * tput)
                sm_g = np.minimum(100.0, on_sm[g] + 100.0 * self.off_sm_need[t] * duty * tput)
                bw_g = np.minimum(100.0, on_bw[g] + 100.0 * self.off_mem_bw[t] * duty * tput)
                slow[g] = 1.0 + (s - 1.0) * duty
            util[g], sm[g], bw[g] = u_g, sm_g, bw_g
            # Progress, with completions inside the minute.
            sps = self.solo_sps(act, g)
            rate = tput * sps
            remaining = self.jobs.total_steps[act] - self.steps_done[act]
            inc = rate * active_s
            done = inc >= remaining - 1e-9
            steps = np.where(done, remaining, inc)
            self.steps_done[act] += steps
            self.sep_s[act] += steps / sps
            gpu_equiv = float(np.sum(tput * duty))
            self.since_ckpt_s[act] += 60.0
            ck = self.since_ckpt_s[act] >= c.checkpoint_interval_s
            if ck.any():
                self.ckpt_step[act[ck]] = self.steps_done[act[ck]]
                self.since_ckpt_s[act[ck]] = 0.0
            if done.any():
                fin = act[done]
                with np.errstate(divide="ignore", invalid="ignore"):
                    used = (60.0 - active_s[done]) + np.where(rate[done] > 0, remaining[done] / rate[done], 0.0)
                used = np.clip(used, 0.0, 60.0)
                self.finish_s[fin] = now_s + used
                self.real_s[fin] -= 60.0 - used
                self.state[fin] = DONE
                finished = int(fin.size)
                self.gpu[fin] = -1
        if run.size:  # start-up and restarts proceed on every placed job (Salus residents too)
            self.warmup_s[run] = np.maximum(0.0, self.warmup_s[run] - 60.0)
        clock = clock_frac(sm, self.clock_drop)
        mem_frac = mem / self.mem_total
        evicted = self._monitor(now_s + 60.0, util, sm, clock, mem_frac) if self.protection else 0
        # Observations for the next round: the online service's own metrics, in RECENT_ONLINE_KEYS order.
        self._recent[:, minute % self.recent_n, :] = (on_util, on_sm, on_mem, on_bw, lat_solo, qps,
                                                      solo_clock * self.max_clock)
        self._hist[self._hist_pos] = on_sm
        self._hist_pos = (self._hist_pos + 1) % self.history_minutes
        self._hist_len = min(self._hist_len + 1, self.history_minutes)
        pos = self.minutes_stepped % self.shared_n
        self._shared[0, pos] = np.where(placed, slow, np.nan)
        self._shared[1, pos] = qps
        self._shared[2, pos] = lat_solo
        self.minutes_stepped += 1
        if self.burst is not None:
            if bursting is None:  # no offline work anywhere this minute: the replicas as they are
                bursting = self._burst_update(qps, lat_solo, np.ones(self.n))
            self.burst.record_minute(qps)
        return Minute(
            qps=qps, latency_ms=lat_solo * slow, solo_latency_ms=lat_solo, util_pct=util, sm_pct=sm,
            mem_frac=mem_frac, solo_util_pct=on_util, solo_sm_pct=on_sm, solo_mem_frac=on_mem / self.mem_total,
            offline_gpu_equiv=gpu_equiv, running=int(run.size), active_per_gpu_max=per_gpu_max, evicted=evicted,
            finished=finished, burst_paced=int((bursting & placed).sum()) if bursting is not None else 0,
        )

    def _monitor(self, now_s: float, util, sm, clock, mem_frac) -> int:
        cfg = self.cfg.sysmonitor
        if self._first_step:
            idx = np.arange(self.n)
            self._first_step = False
        else:
            idx = np.flatnonzero((self.health != HEALTHY) | _reached(cfg.unhealthy, util, sm, clock, mem_frac)
                                 | _reached(cfg.overlimit, util, sm, clock, mem_frac))
        if idx.size == 0:
            return 0
        evict_gpus = []
        for i in idx:
            mon = self.monitors[i]
            if mon.step(now_s, GpuSample(float(util[i]), float(sm[i]), float(clock[i]), float(mem_frac[i]))):
                evict_gpus.append(i)
            self.health[i] = _HEALTH_CODE[mon.state]
        evicted = 0
        if evict_gpus:
            run = self.running()
            hit = run[np.isin(self.gpu[run], evict_gpus)]
            for j in hit:
                self._stop(int(j), checkpoint=False)
                self.evictions[j] += 1
                evicted += 1
        return evicted

    def health_of(self, i: int) -> GpuHealth:
        return _HEALTH[int(self.health[i])]


def hour_of_day(now_s: float, start_hour_utc: float = 0.0) -> float:
    return math.fmod(start_hour_utc + now_s / 3600.0, 24.0) % 24.0
