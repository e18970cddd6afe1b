"""MuxFlow's Prometheus alert rules (deploy/prometheus/muxflow-rules.yml): valid for Prometheus, and each alert
fires when, and only when, its unit tests (muxflow-rules.test.yml: series in, alerts out) say."""

from __future__ import annotations

from tests.prometheus_helpers import RULES, promtool


def test_the_rules_are_valid() -> None:
    out = promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 14 rules found" in out.stdout


def test_the_alerts_fire_as_their_unit_tests_say() -> None:
    out = promtool("test", "rules", "muxflow-rules.test.yml", cwd=RULES.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_a_rule_that_disagrees_with_its_test_fails(tmp_path) -> None:
    """The unit tests can fail: the Overlimit alert made to wait 5 minutes misses its expected firing."""
    (tmp_path / "muxflow-rules.yml").write_text(RULES.read_text().replace(
        '        expr: muxflow_gpu_health{state="Overlimit"} == 1\n',
        '        expr: muxflow_gpu_health{state="Overlimit"} == 1\n        for: 5m\n'))
    (tmp_path / "muxflow-rules.test.yml").write_text((RULES.parent / "muxflow-rules.test.yml").read_text())
    out = promtool("test", "rules", "muxflow-rules.test.yml", cwd=tmp_path)
    assert out.returncode != 0 and "MuxflowGpuOverlimit" in out.stdout + out.stderr
