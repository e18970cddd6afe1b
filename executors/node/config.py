"""SysMonitor thresholds from a configuration file (TOML or JSON).

```toml
base_hold_s = 60        # Overlimit → Unhealthy hold for the first entry in two hours
window_s = 7200         # the back-off window
idle_util_pct = 5       # node agent: below this utilization a low clock is idling

[healthy]               # all below → Unhealthy goes back to Healthy
gpu_util_pct = 99
sm_activity_pct = 85
sm_clock_frac = 0.80    # current / max SM clock; lower is worse
mem_used_frac = 0.85
[unhealthy]             # any reached → Healthy goes to Unhealthy
...
[overlimit]             # any reached → Overlimit, evict
...
```

Missing keys keep ``SysMonitorConfig``'s defaults. The levels must be ordered
(healthy ≤ unhealthy ≤ overlimit; for the clock, ≥), or there would be no hysteresis.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, fields, replace
from pathlib import Path

from scheduler_core.guard.sysmonitor import SysMonitorConfig, Thresholds

LEVELS = ("healthy", "unhealthy", "overlimit")
METRICS = tuple(f.name for f in fields(Thresholds))


class ConfigError(ValueError):
    pass


def parse_sysmonitor_config(raw: dict, base: SysMonitorConfig | None = None) -> tuple[SysMonitorConfig, float]:
    """(config, idle_util_pct) from a parsed mapping; ConfigError names what is wrong."""
    cfg = base or SysMonitorConfig()
    known = set(LEVELS) | {"base_hold_s", "window_s", "idle_util_pct"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"unknown SysMonitor setting(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    levels = {}
    for level in LEVELS:
        section = raw.get(level, {})
        if not isinstance(section, dict):
            raise ConfigError(f"[{level}] must be a table of {', '.join(METRICS)}")
        bad = sorted(set(section) - set(METRICS))
        if bad:
            raise ConfigError(f"[{level}]: unknown metric(s) {', '.join(bad)} (known: {', '.join(METRICS)})")
        values = asdict(getattr(cfg, level))
        for k, v in section.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise ConfigError(f"[{level}] {k} must be a number, got {v!r}")
            values[k] = float(v)
        levels[level] = Thresholds(**values)
    h, u, o = (levels[lv] for lv in LEVELS)
    for k in METRICS:
        a, b, c = getattr(h, k), getattr(u, k), getattr(o, k)
        ordered = (a >= b >= c) if k == "sm_clock_frac" else (a <= b <= c)
        if not ordered:
            rel = ">=" if k == "sm_clock_frac" else "<="
            raise ConfigError(f"{k}: healthy {a:g} {rel} unhealthy {b:g} {rel} overlimit {c:g} does not hold")
    scal = {}
    for k in ("base_hold_s", "window_s", "idle_util_pct"):
        if k in raw:
            v = raw[k]
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"{k} must be a number >= 0, got {v!r}")
            scal[k] = float(v)
    idle = scal.pop("idle_util_pct", 5.0)
    return replace(cfg, healthy=h, unhealthy=u, overlimit=o, **scal), idle


def load_sysmonitor_config(path: str | Path) -> tuple[SysMonitorConfig, float]:
    p = Path(path)
    text = p.read_text()
    try:
        raw = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{p}: {exc}") from exc
    try:
        return parse_sysmonitor_config(raw)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from exc
