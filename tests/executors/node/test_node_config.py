"""SysMonitor thresholds from configuration files."""

from __future__ import annotations

import json

import pytest

from executors.node.config import ConfigError, load_sysmonitor_config, parse_sysmonitor_config
from scheduler_core.guard.sysmonitor import SysMonitorConfig


def test_defaults_and_overrides(tmp_path):
    cfg, idle = parse_sysmonitor_config({})
    assert cfg == SysMonitorConfig() and idle == 5.0
    p = tmp_path / "sm.toml"
    p.write_text("base_hold_s = 30\nidle_util_pct = 2\n[overlimit]\nsm_activity_pct = 95\n[unhealthy]\nsm_clock_frac = 0.75\n")
    cfg, idle = load_sysmonitor_config(p)
    assert cfg.base_hold_s == 30.0 and idle == 2.0 and cfg.window_s == 7200.0
    assert cfg.overlimit.sm_activity_pct == 95.0 and cfg.overlimit.mem_used_frac == SysMonitorConfig().overlimit.mem_used_frac
    assert cfg.unhealthy.sm_clock_frac == 0.75
    j = tmp_path / "sm.json"
    j.write_text(json.dumps({"healthy": {"mem_used_frac": 0.8}}))
    assert load_sysmonitor_config(j)[0].healthy.mem_used_frac == 0.8


@pytest.mark.parametrize("raw, msg", [
    ({"overlimt": {}}, "unknown SysMonitor setting(s): overlimt"),
    ({"healthy": {"sm": 1}}, "[healthy]: unknown metric(s) sm"),
    ({"healthy": {"sm_activity_pct": "high"}}, "must be a number"),
    ({"healthy": {"sm_activity_pct": 95}}, "sm_activity_pct: healthy 95 <= unhealthy 90"),
    ({"overlimit": {"sm_clock_frac": 0.9}}, "sm_clock_frac: healthy 0.8 >= unhealthy 0.76 >= overlimit 0.9"),
    ({"base_hold_s": -1}, "base_hold_s must be a number >= 0"),
    ({"healthy": 3}, "[healthy] must be a table"),
])
def test_bad_configs_say_what_is_wrong(raw, msg):
    with pytest.raises(ConfigError, match=None) as ei:
        parse_sysmonitor_config(raw)
    assert msg in str(ei.value)


def test_cli_rejects_a_bad_config(tmp_path):
    from click.testing import CliRunner

    from pipelines.cli import main

    p = tmp_path / "sm.toml"
    p.write_text("[overlimit]\nsm_activity_pct = 50\n")
    r = CliRunner().invoke(main, ["--db", f"sqlite:///{tmp_path / 'x.db'}", "node-agent", "--node", "n", "--simulated",
                                  "--sysmonitor-config", str(p)])
    assert r.exit_code == 1 and "sm_activity_pct: healthy 85 <= unhealthy 90 <= overlimit 50 does not hold" in r.output
