"""xCUDA controller maths (paper §4.1, Eq. 1-2, PID): the Python mirror against the
vectors the C implementation is tested with, hand-computed values and properties."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.guard.xcuda_control import (
    Pacer,
    PacerMode,
    PacerParams,
    Pid,
    clock_factor,
    clock_factor_array,
    gpu_load,
)

VECTORS = Path(__file__).resolve().parents[3] / "executors" / "node" / "xcuda" / "tests" / "control_vectors.csv"


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= 1e-9 * (1.0 + abs(b))


def _rows() -> list[dict[str, str]]:
    with VECTORS.open(newline="") as f:
        return list(csv.DictReader(f))


def test_vectors_file_is_there_and_substantial() -> None:
    rows = _rows()
    assert len(rows) > 500
    assert {r["kind"] for r in rows} == {"clock", "pacer"}
    modes = {int(r["mode"]) for r in rows if r["kind"] == "pacer"}
    assert modes == {PacerMode.CLOSED, PacerMode.OPEN}


def test_clock_and_load_match_the_c_vectors() -> None:
    for r in _rows():
        f = {k: float(v) for k, v in r.items() if k != "kind"}
        a_c = clock_factor(f["c_sm"], f["t_sm"], f["c_h"], f["a_l"], f["a_h"])
        assert _close(a_c, f["a_c"]), r
        assert _close(gpu_load(f["u_sm"], a_c), f["u_gpu"]), r


def test_pacer_sequences_match_the_c_vectors() -> None:
    pacer: Pacer | None = None
    params = pid = None
    case = None
    steps = 0
    for r in _rows():
        if r["kind"] != "pacer":
            continue
        f = {k: float(v) for k, v in r.items() if k != "kind"}
        if r["case"] != case:
            case = r["case"]
            params = PacerParams(min_rate=f["min_rate"])
            pid = Pid(f["kp"], f["ki"], f["kd"])
            pacer = Pacer.fresh(f["init_rate"])
        u = gpu_load(f["u_sm"], clock_factor(f["c_sm"], f["t_sm"], f["c_h"], f["a_l"], f["a_h"]))
        pacer.step(params, pid, u, f["target"], f["demand"], f["dt"])
        assert int(pacer.mode) == int(f["mode"]), (case, r["step"])
        assert _close(pacer.rate, f["rate"]), (case, r["step"], pacer.rate, f["rate"])
        steps += 1
    assert steps > 400


def test_clock_factor_by_hand() -> None:
    assert clock_factor(900, 1000, 1500, 5.0, 0.5) == pytest.approx(1.5)
    assert clock_factor(1000, 1000, 1500, 5.0, 0.5) == 1.0
    assert clock_factor(1250, 1000, 1500, 5.0, 0.5) == pytest.approx(0.75)
    assert clock_factor(1800, 1000, 1500, 5.0, 0.5) == pytest.approx(0.5)
    assert clock_factor(900, 0, 1500, 5.0, 0.5) == 1.0
    assert clock_factor(math.nan, 1000, 1500, 5.0, 0.5) == 1.0
    assert gpu_load(0.6, 1.5) == pytest.approx(0.9)
    assert gpu_load(1.4, 1.0) == 1.0


def test_pid_by_hand() -> None:
    pid = Pid(2.0, 10.0, 0.1)
    assert pid.delta(0.2, 0.02) == pytest.approx(10.0 * 0.2 * 0.02)
    expect = 2.0 * (-0.1 - 0.2) + 10.0 * -0.1 * 0.02 + 0.1 * (-0.1 - 0.4 + 0.2) / 0.02
    assert pid.delta(-0.1, 0.02) == pytest.approx(expect)


def test_overload_drives_the_rate_to_the_floor_and_room_opens_the_gate() -> None:
    params = PacerParams(min_rate=10.0)
    pacer, pid = Pacer.fresh(2000.0), Pid(1.0, 20.0, 0.0)
    for _ in range(300):
        pacer.step(params, pid, 1.3, 0.9, max(pacer.rate, 10.0), 0.02)
    assert pacer.mode == PacerMode.CLOSED and pacer.rate == 10.0
    for _ in range(300):
        pacer.step(params, pid, 0.2, 0.9, 5000.0, 0.02)
    assert pacer.mode == PacerMode.OPEN


clocks = st.floats(min_value=0, max_value=3000, allow_nan=False)


@given(c1=clocks, c2=clocks, t=st.floats(min_value=100, max_value=2000), span=st.floats(min_value=1, max_value=1000),
       a_l=st.floats(min_value=0, max_value=50), a_h=st.floats(min_value=0, max_value=1))
def test_clock_factor_never_increases_with_the_clock(c1, c2, t, span, a_l, a_h) -> None:
    lo, hi = sorted((c1, c2))
    assert clock_factor(lo, t, t + span, a_l, a_h) >= clock_factor(hi, t, t + span, a_l, a_h) - 1e-12
    assert clock_factor(t, t, t + span, a_l, a_h) == 1.0  # continuous at the threshold
    assert 0.0 <= clock_factor(hi, t, t + span, a_l, a_h) <= 1.0 + a_l + 1e-12  # (T − 0)/T · a_L may round up


@given(st.lists(st.tuples(st.floats(min_value=0, max_value=2), st.floats(min_value=0, max_value=1e6),
                          st.floats(min_value=0, max_value=0.2)), min_size=1, max_size=60))
@settings(max_examples=200)
def test_paced_rate_stays_within_floor_and_headroom(steps) -> None:
    params = PacerParams(min_rate=10.0)
    pacer, pid = Pacer.fresh(2000.0), Pid(1.0, 20.0, 0.05)
    for u, demand, dt in steps:
        before = pacer.rate if pacer.mode == PacerMode.CLOSED else None
        pacer.step(params, pid, u, 0.9, demand, dt)
        assert pacer.demand_hold >= max(demand, params.min_rate)
        assert params.min_rate <= pacer.rate <= params.headroom * pacer.demand_hold * (1 + 1e-12)
        if before is not None and pacer.mode == PacerMode.CLOSED:
            assert pacer.rate <= 2.0 * before * (1 + 1e-12)  # never more than doubles in a period


def test_array_form_agrees_with_the_scalar_one() -> None:
    rng = np.random.default_rng(0)
    c = rng.uniform(-100, 2000, 500)
    t = rng.choice([0.0, 1000.0, 1290.0], 500)
    h = rng.choice([900.0, 1290.0, 1590.0], 500)
    got = clock_factor_array(c, t, h, 5.0, 0.5)
    want = [clock_factor(ci, ti, hi, 5.0, 0.5) for ci, ti, hi in zip(c, t, h)]
    assert np.allclose(got, want, rtol=1e-12, atol=0)
