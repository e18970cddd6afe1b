"""xCUDA's controller trace: what the pacing thread saw and decided each period, replayed through the mirror.

With ``XCUDA_LOG_LEVEL=debug`` the library writes one line per control period to stderr::

    xcuda[PID]: debug: pace ts=… flags=1 u_sm=… integral=… c_sm=… t_sm=… c_h=… target=… demand=… dt=… u=… u_gpu=…
        mode=1 rate=…

(the record as read, the launches asked for and the period's length; the U_SM it acted on, U_GPU, the pacer's
mode and rate), every number at full precision. :func:`replay` runs the same inputs through
:mod:`scheduler_core.guard.xcuda_control` and returns what the mirror decides, so a trace taken on a real GPU
(``make gpu-check`` keeps one) or under the fake driver checks that the library in a live process does what the
maths say; :func:`steady_state` gives the loop's tracking from a trace.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from scheduler_core.guard.xcuda_control import Meter, Pacer, PacerMode, PacerParams, Pid, clock_factor, gpu_load

START_MARKER = "closed-loop pacing of kernel launches"   # the library's line when control (re)starts
_PACE = re.compile(r"debug: pace (.*)$")
_FIELD = re.compile(r"(\w+)=(\S+)")
_INTS = {"ts", "flags", "mode"}


@dataclass(frozen=True)
class Period:
    ts: int             # the record's timestamp (CLOCK_MONOTONIC ns)
    flags: int
    u_sm: float         # the record's latest sample
    integral: float
    c_sm: float
    t_sm: float
    c_h: float
    target: float
    demand: float       # launches/s asked for in the period
    dt: float           # the period's length (s)
    u: float            # what the library acted on (the mean since its last read)
    u_gpu: float
    mode: int
    rate: float


@dataclass(frozen=True)
class Gains:
    """The library's settings a replay needs (its defaults; XCUDA_* variables change them)."""

    fallback_rate: float = 2000.0
    min_rate: float = 10.0
    kp: float = 1.0
    ki: float = 20.0
    kd: float = 0.0
    a_l: float = 5.0
    a_h: float = 0.5


def parse(text: str) -> list[list[Period]]:
    """The trace's periods, one list per stretch of closed-loop control (a new one each time control restarts)."""
    runs: list[list[Period]] = []
    current: list[Period] | None = None
    for line in text.splitlines():
        if START_MARKER in line:
            current = []
            runs.append(current)
            continue
        m = _PACE.search(line)
        if m is None:
            continue
        f = dict(_FIELD.findall(m.group(1)))
        try:
            p = Period(**{k: (int(f[k]) if k in _INTS else float(f[k])) for k in Period.__dataclass_fields__})
        except (KeyError, ValueError):
            continue   # a line cut short (the process was killed mid-write)
        if current is None:
            current = []
            runs.append(current)
        current.append(p)
    return [r for r in runs if r]


def replay(periods: list[Period], gains: Gains = Gains()) -> list[tuple[float, float, int, float]]:
    """The mirror's (u, u_gpu, mode, rate) for each period of one stretch of control, from the logged inputs."""
    params = PacerParams(min_rate=gains.min_rate)
    pacer, pid, meter = Pacer.fresh(gains.fallback_rate), Pid(gains.kp, gains.ki, gains.kd), Meter()
    out = []
    for p in periods:
        u = meter.update(p.u_sm, bool(p.flags & 1), p.integral, p.ts)
        u_gpu = gpu_load(u, clock_factor(p.c_sm, p.t_sm, p.c_h, gains.a_l, gains.a_h))
        pacer.step(params, pid, u_gpu, p.target, p.demand, p.dt)
        out.append((u, u_gpu, int(pacer.mode), pacer.rate))
    return out


def mismatches(periods: list[Period], gains: Gains = Gains(), rel: float = 1e-9) -> list[str]:
    """Where the library and the mirror disagree (empty: they agree on every period)."""
    bad = []
    for i, (p, (u, u_gpu, mode, rate)) in enumerate(zip(periods, replay(periods, gains))):
        if mode != p.mode or not all(_close(a, b, rel) for a, b in ((u, p.u), (u_gpu, p.u_gpu), (rate, p.rate))):
            bad.append(f"period {i}: library u={p.u!r} u_gpu={p.u_gpu!r} mode={p.mode} rate={p.rate!r}; "
                       f"mirror u={u!r} u_gpu={u_gpu!r} mode={mode} rate={rate!r}")
    return bad


def _close(a: float, b: float, rel: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= rel * (1.0 + abs(b))


def steady_state(periods: list[Period], settle_s: float = 3.0) -> dict[str, float | int | None]:
    """The loop's tracking from a trace: the time-weighted mean of U_GPU it acted on after ``settle_s`` of control,
    its error against the (last) target, the share of periods paced (not open) and the mean paced rate."""
    t = 0.0
    kept = [(p, p.dt) for p in periods if (t := t + p.dt) > settle_s and p.dt > 0 and not math.isnan(p.u_gpu)]
    if not kept:
        return {"periods": 0, "u_gpu_mean": None, "target": None, "error": None, "paced_share": None,
                "rate_mean": None}
    span = sum(w for _, w in kept)
    mean = sum(p.u_gpu * w for p, w in kept) / span
    paced = [p for p, _ in kept if p.mode == PacerMode.CLOSED]
    target = kept[-1][0].target
    return {"periods": len(kept), "u_gpu_mean": mean, "target": target, "error": mean - target,
            "paced_share": len(paced) / len(kept),
            "rate_mean": sum(p.rate for p in paced) / len(paced) if paced else None}
