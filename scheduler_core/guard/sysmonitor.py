"""SysMonitor: the per-GPU health state machine (paper §4.1, Fig. 6b; docs/DESIGN.md §8).

Each state has thresholds on GPU utilization, SM activity, SM clock and memory.
Healthy → Unhealthy when any metric reaches its Unhealthy threshold; any live
state → Overlimit when any metric exceeds the Overlimit threshold (offline work
is evicted); Unhealthy → Healthy when all metrics are below the Healthy
thresholds; Overlimit → Unhealthy once all metrics have stayed below Overlimit
for a hold period of ``base_hold_s · 2^(k−1)``, k = Overlimit entries in the
last two hours.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler_core.domain import GpuHealth


@dataclass(frozen=True)
class GpuSample:
    gpu_util_pct: float
    sm_activity_pct: float
    sm_clock_frac: float  # current SM clock / max SM clock (low = throttled)
    mem_used_frac: float


@dataclass(frozen=True)
class Thresholds:
    """Higher-is-worse for utilization, SM activity and memory; lower-is-worse for clock."""

    gpu_util_pct: float
    sm_activity_pct: float
    sm_clock_frac: float
    mem_used_frac: float

    def reached_by(self, s: GpuSample) -> bool:
        return (
            s.gpu_util_pct >= self.gpu_util_pct
            or s.sm_activity_pct >= self.sm_activity_pct
            or s.sm_clock_frac <= self.sm_clock_frac
            or s.mem_used_frac >= self.mem_used_frac
        )

    def all_below(self, s: GpuSample) -> bool:
        return not self.reached_by(s)

    def reasons(self, s: GpuSample) -> list[str]:
        """Each metric of ``s`` that reaches its threshold, as one readable line (for eviction records)."""
        out = []
        if s.gpu_util_pct >= self.gpu_util_pct:
            out.append(f"gpu_util {s.gpu_util_pct:.1f}% >= {self.gpu_util_pct:g}%")
        if s.sm_activity_pct >= self.sm_activity_pct:
            out.append(f"sm_activity {s.sm_activity_pct:.1f}% >= {self.sm_activity_pct:g}%")
        if s.sm_clock_frac <= self.sm_clock_frac:
            out.append(f"sm_clock {s.sm_clock_frac:.2f} of max <= {self.sm_clock_frac:g}")
        if s.mem_used_frac >= self.mem_used_frac:
            out.append(f"memory {s.mem_used_frac:.2f} >= {self.mem_used_frac:g}")
        return out


@dataclass(frozen=True)
class SysMonitorConfig:
    # GPU utilization saturates near 100 % whenever a training job co-runs, so
    # by itself it only gates new placements; SM activity, clock and memory
    # are what signal that the online service is at risk.
    healthy: Thresholds = Thresholds(99.0, 85.0, 0.80, 0.85)
    unhealthy: Thresholds = Thresholds(99.5, 90.0, 0.76, 0.90)
    overlimit: Thresholds = Thresholds(100.5, 97.0, 0.70, 0.96)
    base_hold_s: float = 60.0
    window_s: float = 2 * 3600.0


@dataclass
class SysMonitor:
    """State of one GPU. ``step`` returns True when offline work must be evicted now."""

    config: SysMonitorConfig = field(default_factory=SysMonitorConfig)
    state: GpuHealth = GpuHealth.INIT
    overlimit_entries_s: list[float] = field(default_factory=list)
    calm_since_s: float | None = None

    def hold_period_s(self, now_s: float) -> float:
        recent = [t for t in self.overlimit_entries_s if now_s - t <= self.config.window_s]
        return self.config.base_hold_s * 2 ** max(0, len(recent) - 1)

    def step(self, now_s: float, sample: GpuSample) -> bool:
        cfg = self.config
        self.overlimit_entries_s = [t for t in self.overlimit_entries_s if now_s - t <= cfg.window_s]
        if self.state == GpuHealth.DISABLED:
            return False
        if self.state == GpuHealth.INIT:
            self.state = GpuHealth.HEALTHY
        if cfg.overlimit.reached_by(sample):
            evict = self.state != GpuHealth.OVERLIMIT
            if evict:
                self.overlimit_entries_s.append(now_s)
            self.state = GpuHealth.OVERLIMIT
            self.calm_since_s = None
            return evict
        if self.state == GpuHealth.OVERLIMIT:
            if self.calm_since_s is None:
                self.calm_since_s = now_s
            if now_s - self.calm_since_s >= self.hold_period_s(now_s):
                self.state = GpuHealth.UNHEALTHY
                self.calm_since_s = None
            return False
        if self.state == GpuHealth.HEALTHY and cfg.unhealthy.reached_by(sample):
            self.state = GpuHealth.UNHEALTHY
        elif self.state == GpuHealth.UNHEALTHY and cfg.healthy.all_below(sample):
            self.state = GpuHealth.HEALTHY
        return False

    def disable(self) -> None:
        self.state = GpuHealth.DISABLED
