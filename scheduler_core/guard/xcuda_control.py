"""xCUDA's compute-pacing maths (paper §4.1, Eq. 1-2 and PID), mirrored from C.

The same functions as ``executors/node/xcuda/src/control.c``, step for step, so the
simulator and the node agent can predict what every offline process's xCUDA
will do with a GPU record; both are checked against
``executors/node/xcuda/tests/control_vectors.csv``. Change one, change the other.

Control variable: the GPU load ``U_GPU = U_SM * a_C`` (Eq. 1) with the clock
factor ``a_C`` of Eq. 2, U_SM the mean over the control period (:class:`Meter`).
Actuator: the offline process's kernel-launch rate. The
PID acts on ``ln(rate)`` in velocity form: gains do not depend on how many
kernels a job launches; the clamped rate and the demand's decaying peak are its only state (no wind-up).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

import numpy as np


def clock_factor(c_sm: float, t_sm: float, c_h: float, a_l: float, a_h: float) -> float:
    """Eq. 2: ``a_C`` from the SM clock ``c_sm``, threshold ``t_sm`` and highest clock ``c_h`` (MHz).

    Below the threshold the load counts ``1 + a_L (T - C)/T`` times (a sagging clock
    means the online service is hurt); above it ``1 - a_H (C - T)/(C_H - T)`` (room
    to spare). 1 when there is no clock information; never negative.
    """
    if not (t_sm > 0.0) or not math.isfinite(t_sm) or not math.isfinite(c_sm):
        return 1.0
    if c_sm < t_sm:
        c = c_sm if c_sm > 0.0 else 0.0
        a = 1.0 + a_l * (t_sm - c) / t_sm
    else:
        if not (c_h > t_sm) or not math.isfinite(c_h):
            return 1.0
        c = c_sm if c_sm < c_h else c_h
        a = 1.0 - a_h * (c - t_sm) / (c_h - t_sm)
    return a if a > 0.0 else 0.0


def gpu_load(u_sm: float, a_c: float) -> float:
    """Eq. 1: ``U_GPU = U_SM * a_C`` with ``U_SM`` clamped to [0, 1]; NaN stays NaN."""
    if math.isnan(u_sm) or math.isnan(a_c):
        return math.nan
    return min(max(u_sm, 0.0), 1.0) * a_c


def clock_factor_array(c_sm: np.ndarray, t_sm: np.ndarray | float, c_h: np.ndarray | float,
                       a_l: float, a_h: float) -> np.ndarray:
    """:func:`clock_factor` over arrays (for the simulator); same edge cases."""
    c_sm, t_sm, c_h = np.broadcast_arrays(np.asarray(c_sm, float), np.asarray(t_sm, float), np.asarray(c_h, float))
    out = np.ones(c_sm.shape)
    valid = (t_sm > 0) & np.isfinite(t_sm) & np.isfinite(c_sm)
    low = valid & (c_sm < t_sm)
    safe_t = np.where(t_sm > 0, t_sm, 1.0)
    out[low] = 1.0 + a_l * (t_sm[low] - np.maximum(c_sm[low], 0.0)) / safe_t[low]
    high = valid & ~low & (c_h > t_sm) & np.isfinite(c_h)
    span = np.where(high, c_h - t_sm, 1.0)
    out[high] = 1.0 - a_h * (np.minimum(c_sm[high], c_h[high]) - t_sm[high]) / span[high]
    return np.maximum(out, 0.0)


@dataclass
class Pid:
    """Velocity-form PID on ``ln(rate)``: gains ``kp`` (1), ``ki`` (1/s), ``kd`` (s)."""

    kp: float
    ki: float
    kd: float
    e1: float = 0.0
    e2: float = 0.0
    primed: bool = False

    def delta(self, error: float, dt_s: float) -> float:
        """Change of ln(rate) for ``error = target - U_GPU`` over ``dt_s`` seconds."""
        if not self.primed:
            # No history yet: no proportional or derivative kick.
            self.e1 = error
            self.e2 = error
            self.primed = True
        d = self.kp * (error - self.e1)
        if dt_s > 0.0 and math.isfinite(dt_s):
            d += self.ki * error * dt_s
            d += self.kd * (error - 2.0 * self.e1 + self.e2) / dt_s
        self.e2 = self.e1
        self.e1 = error
        return d


METER_MAX_GAP_NS = 5_000_000_000  # a longer silence of the record is a gap: start again from its sample


@dataclass
class Meter:
    """The U_SM a control period acts on (``struct xc_meter``): the mean since the previous read.

    The node agent publishes, beside its latest sample, the running integral of U_SM over
    time; its increase over the record's time since the last period is what the GPU did in
    the period. The latest sample alone covers only the agent's own sampling window, and a
    controller reading one sample per period aliases with the job's launch bursts (it
    settles where the samples it happens to see average to the target). Without the
    integral, after a gap, or when the record goes back in time, the latest sample is used.
    """

    primed: bool = False
    integral_s: float = 0.0
    ts_ns: int = 0
    last: float = math.nan

    def update(self, u_sm: float, has_integral: bool, integral_s: float, ts_ns: int) -> float:
        if not has_integral or not math.isfinite(integral_s):
            self.primed, self.last = False, u_sm
            return u_sm
        u = u_sm
        if self.primed and ts_ns == self.ts_ns and integral_s == self.integral_s:
            u = self.last   # no new sample since the last period: the same mean
        elif (self.primed and self.ts_ns < ts_ns <= self.ts_ns + METER_MAX_GAP_NS
              and integral_s >= self.integral_s):
            u = (integral_s - self.integral_s) / ((ts_ns - self.ts_ns) / 1e9)
        self.primed, self.integral_s, self.ts_ns, self.last = True, integral_s, ts_ns, u
        return u


class PacerMode(IntEnum):
    FRESH = 0   # no sample yet
    CLOSED = 1  # launches paced at `rate`
    OPEN = 2    # the limit does not bind: launches go through unpaced


@dataclass(frozen=True)
class PacerParams:
    min_rate: float                       # launches/s floor
    headroom: float = 2.0                 # the limit never exceeds headroom x demand
    max_step_up: float = math.log(2.0)    # per period, on ln(rate): give the online service time
    max_step_down: float = math.log(10.0)  # cut fast to protect it
    demand_hold_s: float = 1.0            # the cap follows the demand's recent peak, decaying over this time


@dataclass
class Pacer:
    """The pacing state of one offline process (``struct xc_pacer``)."""

    mode: PacerMode
    rate: float
    demand_hold: float = 0.0   # the demand's recent peak (a job that stops launching for a while keeps its cap)

    @classmethod
    def fresh(cls, initial_rate: float) -> Pacer:
        return cls(PacerMode.FRESH, initial_rate)

    def step(self, params: PacerParams, pid: Pid, u_gpu: float, target: float, demand_rate: float,
             dt_s: float) -> None:
        """One control period: measured U_GPU, its target, launches/s asked for, period length."""
        e = target - u_gpu
        d = min(max(pid.delta(e, dt_s), -params.max_step_down), params.max_step_up)
        demand = demand_rate if demand_rate > params.min_rate else params.min_rate
        hold = demand
        if params.demand_hold_s > 0.0:
            decay = math.exp(-dt_s / params.demand_hold_s) if dt_s > 0.0 and math.isfinite(dt_s) else 1.0
            hold = max(hold, self.demand_hold * decay)
        self.demand_hold = hold
        cap = params.headroom * hold

        def clamp(x: float) -> float:
            return min(max(x, params.min_rate), cap)

        if self.mode == PacerMode.FRESH:
            if e >= 0.0:
                self.mode, self.rate = PacerMode.OPEN, cap
            else:
                self.mode = PacerMode.CLOSED
                self.rate = clamp(min(self.rate, cap) * math.exp(d))
        elif self.mode == PacerMode.OPEN:
            if e >= 0.0:
                self.rate = cap
            else:
                # Close from what the job was actually doing (bumpless).
                self.mode = PacerMode.CLOSED
                self.rate = clamp(demand * math.exp(d))
        else:
            self.rate = clamp(min(self.rate, cap) * math.exp(d))
            if e >= 0.0 and self.rate >= cap:
                self.mode = PacerMode.OPEN
