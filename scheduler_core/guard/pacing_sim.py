"""A closed-loop model of xCUDA's compute pacing: the controller against a job that launches kernels.

It runs the pacer of :mod:`scheduler_core.guard.xcuda_control` (the same maths as the C
library) at its control period against a model of one offline process and the GPU:

* the process repeats a training step: for each kernel, some host time, then a launch that
  takes a ticket from the token bucket (and waits while the bucket is empty: the pacing);
  at the end of the step it synchronises (waits for the GPU to drain), then spends the
  step's host gap (data loading, logging); a launch also blocks while ``max_queue`` kernels
  are pending on the GPU, as CUDA's launch queue does;
* the GPU runs the launched kernels in order; while a kernel runs, the SMs are busy at the
  kernel's occupancy, so SM activity over a window is the occupancy-weighted busy time;
* the node agent samples SM activity every ``sample_s`` (the mean over the last sample
  window, as NVML's GPM metrics give it) and publishes it, with its running integral, in
  the GPU record, which the controller reads once per control period (the mean since its
  last read: :class:`~scheduler_core.guard.xcuda_control.Meter`);
* the controller, each period, measures the launches asked for (tickets taken), steps
  the pacer and grants tokens at the new rate (banking at most two periods' worth).

What it answers: where the loop settles (the steady-state mean of the measured U_GPU
against the target) for a given job shape, and how fast. It is a model, not a GPU: the
tests hold the controller to it, and a real GPU's series (``make gpu-check``) says how
close the model is.
"""

from __future__ import annotations

import math
import random as _random
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler_core.guard.xcuda_control import Meter, Pacer, PacerMode, PacerParams, Pid


@dataclass(frozen=True)
class Kernel:
    host_s: float       # CPU time before the launch
    gpu_s: float        # time on the GPU
    occupancy: float    # share of the SMs busy while it runs, in (0, 1]


@dataclass(frozen=True)
class JobShape:
    """One training step: its kernels, then a synchronisation and ``gap_s`` of host time."""

    kernels: tuple[Kernel, ...]
    gap_s: float = 0.0
    sync: bool = True

    @classmethod
    def random(cls, seed: int, n: int = 200, host_s: tuple[float, float] = (5e-6, 30e-6),
               gpu_s: tuple[float, float] = (5e-6, 400e-6), occupancy: tuple[float, float] = (0.1, 1.0),
               gap_s: float = 1e-3, sync: bool = True) -> JobShape:
        """A step of ``n`` kernels with host times, GPU times (log-uniform) and occupancies drawn from ``seed``."""
        rng = _random.Random(seed)

        def log_uniform(lo: float, hi: float) -> float:
            return math.exp(rng.uniform(math.log(lo), math.log(hi)))

        return cls(tuple(Kernel(rng.uniform(*host_s), log_uniform(*gpu_s), rng.uniform(*occupancy))
                         for _ in range(n)), gap_s, sync)

    @classmethod
    def uniform(cls, n: int, host_s: float, gpu_s: float, occupancy: float, gap_s: float = 0.0,
                sync: bool = True) -> JobShape:
        return cls(tuple(Kernel(host_s, gpu_s, occupancy) for _ in range(n)), gap_s, sync)


@dataclass(frozen=True)
class LoopConfig:
    """The controller's settings (xCUDA's defaults) and the agent's sampling period."""

    kp: float = 1.0
    ki: float = 20.0
    kd: float = 0.0
    period_s: float = 0.02
    sample_s: float = 0.01
    sample_phase_s: float = 0.0    # when the agent's samples fall within the controller's periods
    min_rate: float = 10.0
    initial_rate: float = 2000.0
    integral: bool = True          # the record publishes U_SM's integral (else the controller sees the latest sample)
    params: PacerParams | None = None

    def pacer_params(self) -> PacerParams:
        return self.params or PacerParams(min_rate=self.min_rate)


@dataclass
class Tracking:
    target: float
    u_mean: float                 # steady-state mean of the measured U_GPU
    u_unpaced: float              # the same job's mean without pacing
    speed: float                  # steps/s paced ÷ unpaced
    settle_s: float               # the time discarded before the steady state
    series: list[tuple[float, float, float]] = field(default_factory=list)  # (t, U sample, rate or 0 = open)

    @property
    def error(self) -> float:
        """Steady-state error, U_GPU − target (only meaningful when the target binds: u_unpaced > target)."""
        return self.u_mean - self.target


def simulate(shape: JobShape, target: float | Callable[[float], float] | None, duration_s: float, *,
             cfg: LoopConfig = LoopConfig(),
             dt_s: float = 2e-4, settle_s: float = 3.0, keep_series: bool = False,
             max_queue: int = 1024) -> tuple[float, float, list]:
    """Run the job for ``duration_s`` (``target`` None: unpaced). Returns (mean U after ``settle_s``, steps/s after
    ``settle_s``, series of (t, U sample, granted rate; 0 while the gate is open)). ``target`` may change over time
    (a function of the time in seconds), as the node agent's record may change it."""
    target_at = target if callable(target) else (lambda _t: target)
    params = cfg.pacer_params()
    pacer = Pacer.fresh(cfg.initial_rate)
    pid = Pid(cfg.kp, cfg.ki, cfg.kd)
    kernels = shape.kernels
    # CPU side of the job
    k = 0                      # next kernel of the step
    host_left = kernels[0].host_s
    phase = "host"             # host | launch | sync | gap
    # GPU side: queue of (remaining gpu_s, occupancy)
    queue: list[list[float]] = []
    # token bucket
    taken = 0                  # tickets taken (a waiting launch holds one)
    granted = math.inf if target is None else 0.0
    waiting = False
    last_taken = 0
    open_gate = target is None
    record: float | None = None  # the GPU record's U (None: no record yet)
    busy_acc = 0.0             # occupancy-weighted busy time in the current sample window
    integral = 0.0             # the record's running integral of U over time (what the agent publishes)
    record_t = 0.0             # the record's timestamp
    meter = Meter()
    steps = 0
    t = 0.0
    next_sample = cfg.sample_s + cfg.sample_phase_s
    next_period = cfg.period_s
    u_sum = u_n = 0.0
    steps_at_settle = None
    series: list[tuple[float, float, float]] = []
    n = int(round(duration_s / dt_s))
    for _ in range(n):
        # CPU
        budget = dt_s
        while budget > 0.0:
            if phase == "host":
                use = min(budget, host_left)
                host_left -= use
                budget -= use
                if host_left <= 1e-12:
                    phase = "launch"
                    waiting = False
            elif phase == "launch":
                if not waiting:
                    taken += 1
                    waiting = True
                if len(queue) >= max_queue:
                    break          # CUDA's launch queue is full: the launch blocks until the GPU takes one
                if open_gate or taken <= granted:
                    kn = kernels[k]
                    queue.append([kn.gpu_s, kn.occupancy])
                    waiting = False
                    k += 1
                    if k == len(kernels):
                        k = 0
                        phase = "sync" if shape.sync else "gap"
                        host_left = shape.gap_s
                    else:
                        phase = "host"
                        host_left = kernels[k].host_s
                else:
                    break          # paced: waits for tokens
            elif phase == "sync":
                if queue:
                    break
                phase = "gap"
            else:  # gap
                use = min(budget, host_left)
                host_left -= use
                budget -= use
                if host_left <= 1e-12:
                    steps += 1
                    phase = "host"
                    host_left = kernels[0].host_s
        # GPU
        g = dt_s
        while g > 0.0 and queue:
            head = queue[0]
            use = min(g, head[0])
            head[0] -= use
            busy_acc += use * head[1]
            g -= use
            if head[0] <= 1e-12:
                queue.pop(0)
        t += dt_s
        if t + 1e-12 >= next_sample:
            u = busy_acc / cfg.sample_s
            busy_acc = 0.0
            next_sample += cfg.sample_s
            record = u
            integral += u * cfg.sample_s
            record_t = t
            if t >= settle_s:
                u_sum += u
                u_n += 1
                if steps_at_settle is None:
                    steps_at_settle = steps
            if keep_series:
                series.append((round(t, 6), u, 0.0 if open_gate else pacer.rate))
        if target is not None and t + 1e-12 >= next_period:
            next_period += cfg.period_s
            demand = (taken - last_taken) / cfg.period_s
            last_taken = taken
            if record is None:
                rate, is_open = cfg.initial_rate, False   # the fallback rate until the agent writes
            else:
                u_seen = meter.update(record, cfg.integral, integral, int(round(record_t * 1e9)))
                pacer.step(params, pid, u_seen, target_at(t), demand, cfg.period_s)
                rate, is_open = pacer.rate, pacer.mode == PacerMode.OPEN
            if is_open:
                open_gate = True
            else:
                if open_gate:
                    granted = float(taken)       # closing: forget the open gate's slack
                open_gate = False
                nxt = granted + rate * cfg.period_s
                bank = taken + max(1.0, math.ceil(2 * rate * cfg.period_s))   # an idle job banks two periods
                granted = nxt if nxt <= bank else max(granted, bank)
    if steps_at_settle is None:
        return math.nan, math.nan, series
    return u_sum / max(u_n, 1), (steps - steps_at_settle) / max(duration_s - settle_s, 1e-9), series


def tracking(shape: JobShape, target: float, duration_s: float = 20.0, *, cfg: LoopConfig = LoopConfig(),
             settle_s: float = 3.0, keep_series: bool = False) -> Tracking:
    """The loop's steady state at ``target`` for ``shape``, against the same job unpaced."""
    u0, s0, _ = simulate(shape, None, duration_s, cfg=cfg, settle_s=settle_s)
    u, s, series = simulate(shape, target, duration_s, cfg=cfg, settle_s=settle_s, keep_series=keep_series)
    return Tracking(target, u, u0, s / s0 if s0 else math.nan, settle_s, series)
