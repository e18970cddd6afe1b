"""Malformed XCUDA_* values never crash the host process: a clear message on
stderr naming the variable, and the safe default."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

VARIABLES = ["XCUDA_MEM_QUOTA_BYTES", "XCUDA_GPU_INDEX", "XCUDA_SHM_PATH", "XCUDA_TARGET_UTIL", "XCUDA_KP",
             "XCUDA_KI", "XCUDA_KD", "XCUDA_A_L", "XCUDA_A_H", "XCUDA_FALLBACK_LAUNCH_RATE",
             "XCUDA_MIN_LAUNCH_RATE", "XCUDA_CONTROL_PERIOD_MS", "XCUDA_SHM_STALE_MS", "XCUDA_EXIT_TIMEOUT_MS",
             "XCUDA_LOG_LEVEL"]
WORKLOAD = ("init", "alloc", "v2", "4096", "meminfo", "free", "0", "launch", "50")


def test_malformed_values_are_survived_with_messages_and_defaults(harness) -> None:
    bad = {"XCUDA_MEM_QUOTA_BYTES": "lots", "XCUDA_GPU_INDEX": "-1", "XCUDA_SHM_PATH": "relative",
           "XCUDA_TARGET_UTIL": "high", "XCUDA_KP": "nan", "XCUDA_KI": "-3", "XCUDA_KD": "",
           "XCUDA_A_L": "1e400", "XCUDA_A_H": "2", "XCUDA_FALLBACK_LAUNCH_RATE": "0",
           "XCUDA_MIN_LAUNCH_RATE": "fast", "XCUDA_CONTROL_PERIOD_MS": "0", "XCUDA_SHM_STALE_MS": "1.5",
           "XCUDA_EXIT_TIMEOUT_MS": "99999999999999999999", "XCUDA_LOG_LEVEL": "loud",
           "XCUDA_MEM_QUOTA": "4G"}
    run = harness(*WORKLOAD, XCUDA_FAKE_TOTAL_MEM="1000000000", **bad)
    assert run.returncode == 0, run.stderr
    for name in VARIABLES:
        assert f"invalid configuration: {name}=" in run.stderr, name
    assert "XCUDA_MEM_QUOTA: unknown variable" in run.stderr
    # Defaults in force: 40 % of device memory, the default fallback rate (2000/s).
    assert run.fields("meminfo")["total"] == "400000000"
    assert run.fields("launched")["errors"] == "0"
    assert "fixed safe rate of 2000/s" in run.stderr


def test_valid_values_are_quiet(harness) -> None:
    run = harness(*WORKLOAD, XCUDA_MEM_QUOTA_BYTES="512MiB", XCUDA_TARGET_UTIL="85%", XCUDA_KP="0.5",
                  XCUDA_LOG_LEVEL="error")
    assert run.returncode == 0
    assert run.stderr == ""
    assert run.fields("meminfo")["total"] == str(512 << 20)


printable = st.text(st.characters(min_codepoint=1, max_codepoint=0x10FFFF, exclude_categories=("Cs",)), max_size=60)


@given(values=st.dictionaries(st.sampled_from(VARIABLES), printable, min_size=1, max_size=6))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_value_is_survived(harness, values) -> None:
    run = harness(*WORKLOAD, timeout=60, **values)
    assert run.returncode == 0, (values, run.stderr)
    assert run.fields("alloc")["rc"] in ("0", "2")  # a quota that parsed may be tiny
