"""The co-location harness's measurement logic and the gpu-check calibration part, on the CPU.

Pure parts are fed known values: repetitions and their spread, baselines before and after a point and the
unstable flag, the QPS calibration against a fake service, the host's CPU load, the pause/resume protocol of
the workload processes (on a fake clock), the plan that sizes windows to a deadline. The part itself runs
twice as a subprocess with tiny workloads and simulated metrics: once to the end (with the imports a GPU
machine lacks made to fail), once stopped by SIGTERM after its first point.
"""

from __future__ import annotations

import io
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from executors.node.profiling import calibration_sweep as cs
from executors.node.profiling.colocate import (
    Harness,
    HostLoad,
    auto_qps,
    build_report,
    cpu_busy_fraction,
    plan_rounds,
    read_cpu_times,
    spread_stats,
)
from executors.node.profiling.hosts import Control, job_loop, read_json_file, serve_loop, write_json

REPO = Path(__file__).resolve().parents[4]


# -- repetitions, baselines, stability --------------------------------------------------------------------

def test_spread_stats_known_values() -> None:
    st = spread_stats([1.0, 2.0, None, 4.0])
    assert st["n"] == 3 and st["mean"] == pytest.approx(7 / 3) and st["min"] == 1.0 and st["max"] == 4.0
    assert st["std"] == pytest.approx(statistics.stdev([1.0, 2.0, 4.0]))  # sample std (n - 1)
    assert st["values"] == [1.0, 2.0, None, 4.0]
    one = spread_stats([0.5])
    assert one["mean"] == 0.5 and one["std"] is None and one["min"] == one["max"] == 0.5
    assert spread_stats([None])["mean"] is None


def _svc(i: int, t: float, avg: float, p99: float, util: float = 0.5) -> dict:
    return {"index": i, "kind": "service_solo", "start_unix": t, "end_unix": t + 1,
            "latency": {"avg_ms": avg, "p99_ms": p99, "requests": 100, "achieved_qps": 100.0}, "utilization": util,
            "metrics": {"source": "measured", "gpu_util_pct": 100 * util, "sm_clock_mhz": 1900.0, "samples": 20},
            "host": {"cpu_busy_frac": 0.2}, "sm_clock_mhz": 1900.0}


def _job(i: int, t: float, mean_s: float) -> dict:
    return {"index": i, "kind": "job_solo", "start_unix": t, "end_unix": t + 1,
            "iterations": {"mean_s": mean_s, "iterations": 10, "min_s": mean_s, "max_s": mean_s}}


def _colo(i: int, t: float, sm: int, rep: int, mean_s: float, avg: float, p99: float) -> dict:
    return {"index": i, "kind": "colocated", "start_unix": t, "end_unix": t + 1, "sm_pct": sm, "rep": rep,
            "iterations": {"mean_s": mean_s, "iterations": 8}, "latency": {"avg_ms": avg, "p99_ms": p99,
                                                                           "requests": 90}}


WINDOWS = [
    _job(0, 0, 0.10), _svc(1, 1, 2.0, 4.0),
    _colo(2, 2, 20, 0, 0.25, 3.0, 8.0), _svc(3, 3, 2.2, 4.4),      # service 2.0 → 2.2: 9.5 %, stable
    _colo(4, 4, 80, 0, 0.125, 2.31, 5.25), _svc(5, 5, 3.0, 6.0),   # 2.2 → 3.0: 30.8 %, unstable
    _job(6, 6, 0.11),                                              # job 0.10 → 0.11: 9.5 %
    _colo(7, 7, 80, 1, 0.14, 3.0, 6.0), _svc(8, 8, 2.0, 4.0),      # 3.0 → 2.0: 40 %, unstable
    _colo(9, 9, 20, 1, 0.21, 2.2, 4.2), _svc(10, 10, 2.0, 4.0),    # 2.0 → 2.0, but no job baseline after
]


def test_report_divides_by_the_baselines_before_and_after_and_flags_unstable_points() -> None:
    rep = build_report({"qps": 100.0, "qps_selection": {"mode": "fixed"}}, WINDOWS, sm_pcts=[20, 80], repeat=2,
                       tolerance=0.10)
    assert rep["format"] == "muxflow-colocation-report/2" and [p["sm_pct"] for p in rep["points"]] == [20, 80]
    p20, p80 = (p["repetitions"] for p in rep["points"])
    a, b = p20
    # repetition 1 at 20 %: the service alone just before (2.0) and just after (2.2), the job around its round
    assert a["baseline"]["service_before"]["avg_ms"] == 2.0 and a["baseline"]["service_after"]["avg_ms"] == 2.2
    assert a["slowdown_avg"] == pytest.approx(3.0 / 2.1) and a["slowdown_p99"] == pytest.approx(8.0 / 4.2)
    assert a["norm_tput"] == pytest.approx(0.105 / 0.25)
    assert a["baseline"]["spread"]["service_avg"] == pytest.approx(0.2 / 2.1)
    assert a["baseline"]["spread"]["job_iter"] == pytest.approx(0.01 / 0.105)
    assert a["unstable"] is False and "unstable_reasons" not in a
    # 2.2 → 3.0 before and after: unstable, and said why
    c = p80[0]
    assert c["unstable"] is True and c["slowdown_avg"] == pytest.approx(2.31 / 2.6)
    assert "differs by 30.8 % (> 10 %)" in c["unstable_reasons"][0]
    # the last round has no job baseline after it: the one before is used, stability unknown
    assert b["baseline"]["job_after"] is None and b["baseline_missing"] == ["job after"]
    assert b["norm_tput"] == pytest.approx(0.11 / 0.21) and b["unstable"] is None
    assert b["slowdown_avg"] == pytest.approx(1.1) and b["slowdown_p99"] == pytest.approx(1.05)
    assert p80[1]["unstable"] is True and p80[1]["slowdown_avg"] == pytest.approx(3.0 / 2.5)
    assert "2 of 4 co-located windows" in rep["caveats"][-1]


def test_report_points_carry_the_spread_of_their_repetitions() -> None:
    rep = build_report({"qps": 100.0}, WINDOWS, sm_pcts=[20, 80], repeat=2)
    p20 = rep["points"][0]
    vals = [0.105 / 0.25, 0.11 / 0.21]
    st = p20["stats"]["norm_tput"]
    assert st["values"] == pytest.approx(vals) and st["n"] == 2
    assert st["mean"] == pytest.approx(sum(vals) / 2) == p20["norm_tput"]
    assert st["std"] == pytest.approx(abs(vals[0] - vals[1]) / math.sqrt(2))
    assert (st["min"], st["max"]) == pytest.approx((min(vals), max(vals)))
    assert p20["stats"]["slowdown_avg"]["values"] == pytest.approx([3.0 / 2.1, 1.1])
    assert p20["slowdown_p99"] == pytest.approx((8.0 / 4.2 + 1.05) / 2)
    assert p20["repetitions_measured"] == 2 and p20["unstable_repetitions"] == 0
    assert rep["points"][1]["unstable_repetitions"] == 2
    # the pooled solo runs the sample features come from
    solo = rep["solo_service"]
    assert solo["latency"]["avg_ms"] == pytest.approx((2.0 + 2.2 + 3.0 + 2.0 + 2.0) / 5)
    assert solo["latency"]["requests"] == 500 and solo["metrics"]["samples"] == 100
    assert rep["solo_job"]["iterations"]["mean_s"] == pytest.approx(0.105) and len(rep["job_baselines"]) == 2
    assert len(rep["baselines"]) == 5 and rep["timeline"][2][1:4] == ["colocated", 20, 0]
    # each point names the service's solo windows around its repetitions, shaped as solo_service
    assert [b["index"] for b in p20["baselines"]] == [1, 3, 8, 10]
    assert p20["baselines"][0]["latency"]["avg_ms"] == 2.0 and p20["baselines"][0]["metrics"]["gpu_util_pct"] == 50


def test_a_service_not_gpu_bound_at_a_given_qps_is_reported() -> None:
    low = [dict(w, utilization=0.15) if w["kind"] == "service_solo" else w for w in WINDOWS]
    rep = build_report({"qps": 100.0, "qps_selection": {"mode": "fixed"}, "utilization_source": "GPU utilization"},
                       low, sm_pcts=[20, 80], repeat=2)
    assert rep["gpu_bound"] is False
    assert any(c.startswith("not GPU-bound: slowdowns measure the host, not interference") and "0.15" in c
               for c in rep["caveats"])
    auto = build_report({"qps": 100.0, "qps_selection": {"mode": "auto"}}, WINDOWS, sm_pcts=[20, 80], repeat=2)
    assert auto["gpu_bound"] is True and not any("GPU-bound" in c for c in auto["caveats"])


def test_a_failed_repetition_keeps_its_error_and_leaves_the_others() -> None:
    failed = {"index": 11, "kind": "colocated", "sm_pct": 20, "rep": 2, "start_unix": None, "end_unix": None,
              "error": "job-sm20: no iteration within 11 s"}
    rep = build_report({}, [*WINDOWS, failed], sm_pcts=[20, 80], repeat=3)
    p20 = rep["points"][0]
    assert p20["repetitions_measured"] == 2 and p20["stats"]["norm_tput"]["values"][2] is None
    assert p20["repetitions"][2]["error"].startswith("job-sm20") and "error" not in p20


# -- the order of the windows and the deadline ------------------------------------------------------------

def test_rounds_interleave_the_sm_shares() -> None:
    assert plan_rounds([20, 50, 80], 3, "interleaved") == [[20, 50, 80], [50, 80, 20], [80, 20, 50]]
    assert plan_rounds([20, 80], 3, "interleaved") == [[20, 80], [80, 20], [20, 80]]
    assert plan_rounds([20, 80], 2, "sm-major") == [[20, 20], [80, 80]]


def test_sweep_stops_starting_points_at_the_deadline_and_still_closes_the_round(tmp_path) -> None:
    h = Harness(tmp_path, gpu_type="t4", service_family="cnn", qps=100.0, job_family="cnn", size="tiny",
                window_s=1.0, repeat=3, device="cpu", metrics="simulated", mps="off", deadline_s=22.0)
    h.sm_pcts, h.order_used, h.order = [20, 50, 80], "interleaved", plan_rounds([20, 50, 80], 3, "interleaved")
    clock, done = {"t": 0.0}, []

    def step(name: str, kind: str):
        def run(*args):
            done.append(name + "".join(str(a) for a in args[:1] if name == "C"))
            clock["t"] += h.cost(kind)  # each step takes what the plan expects
        return run

    h.job_solo, h.service_solo, h.colocated = step("J", "job_solo"), step("S", "service_solo"), step("C", "colocated")
    h._progress = lambda: None
    h.left_s = lambda: 22.0 - clock["t"]
    h._sweep()
    # round 1 whole; round 2 ([50, 80, 20]) while a point, its baseline after and the job's closing one fit
    assert done == ["J", "S", "C20", "S", "C50", "S", "C80", "S", "J", "C50", "S", "C80", "S", "J"]
    assert h.incomplete.startswith("deadline: stopped before SM 20 % repetition 2")
    assert clock["t"] + h.reserve_s() <= 22.0


def test_sm_major_order_with_one_job_process_per_share(tmp_path) -> None:
    h = Harness(tmp_path, gpu_type="t4", service_family="cnn", qps=200.0, job_family="cnn", size="tiny",
                window_s=0.3, repeat=2, device="cpu", metrics="simulated", mps="off", max_batch=4,
                order="sm-major", per_sm_processes=True)
    rep = h.run([20, 80])
    assert rep["complete"], rep.get("error") or rep.get("why_incomplete")
    assert rep["order"] == "sm-major" and rep["rounds"] == [[20, 20], [80, 80]]
    assert set(rep["job_processes"]) == {"job-solo", "job-sm20", "job-sm80"}
    assert [w["round"] for w in rep["job_baselines"]] == ["before", "after SM 20 %", "after SM 80 %"]
    j = {w["round"]: w["index"] for w in rep["job_baselines"]}
    for p in rep["points"]:
        for r in p["repetitions"]:
            assert r["iterations"]["process"] == f"job-sm{p['sm_pct']}"
            after = j[f"after SM {p['sm_pct']} %"]
            assert r["baseline"]["job_after"]["index"] == after and r["baseline"]["job_before"]["index"] < r["index"]
    assert json.loads((tmp_path / "colocation.json").read_text())["complete"] is True
    assert not [p for p in (tmp_path / ".colocate-work").glob("*.log") if "Traceback" in p.read_text()]


# -- the QPS calibration ----------------------------------------------------------------------------------

def _fake_service(capacity: float, util_at_capacity: float = 0.8, util_cap: float = 1.0):
    """An M/D/1-like service: utilization grows with the load (up to a cap: a host-bound service), p99 explodes
    at capacity, where it stops keeping up."""
    def step(q: float) -> dict:
        rho = q / capacity
        p99 = 2.0 / (1.0 - rho) if rho < 1 else 1e4
        return {"qps": q, "utilization": min(util_cap, util_at_capacity * min(rho, 1.0)),
                "latency": {"p99_ms": p99, "achieved_qps": q, "served_qps": min(q, capacity)}}
    return step


def test_auto_qps_raises_the_load_into_the_target() -> None:
    choice = auto_qps(_fake_service(1000.0), t1=0.002, t_max=0.01, max_batch=32, target=(0.3, 0.6))
    assert choice["in_target"] and 0.3 <= choice["utilization"] <= 0.6 and 375 <= choice["qps"] <= 750
    assert [s["qps"] for s in choice["steps"]][0] == pytest.approx(150.0)  # 30 % busy at batches of 1
    assert choice["steps"][-1]["bounded"] and "within 0.3..0.6" in choice["why"]
    assert choice["p99_bound_ms"] == pytest.approx(max(5 * 2.0 / 0.85, 40.0))


def test_auto_qps_says_when_the_target_cannot_be_reached() -> None:
    # a host-bound service: 0.2 of the GPU at most, then it saturates
    choice = auto_qps(_fake_service(1000.0, util_cap=0.2), t1=0.002, t_max=0.01, max_batch=32, target=(0.3, 0.6))
    assert not choice["in_target"] and "not reached" in choice["why"]
    assert choice["utilization"] == pytest.approx(0.2) and choice["qps"] < 1000
    assert any(not s["bounded"] for s in choice["steps"])  # it went past the saturation and came back
    none = auto_qps(_fake_service(1000.0), t1=0.002, t_max=0.01, max_batch=32, can_step=lambda: False)
    assert none["steps"] == [] and not none["in_target"] and none["qps"] == pytest.approx(150.0)


# -- host CPU load ----------------------------------------------------------------------------------------

def test_host_cpu_load_from_proc_stat(tmp_path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n")
    assert read_cpu_times(str(stat)) == (150, 1000)
    stat.write_text("intr 1 2 3\n")
    assert read_cpu_times(str(stat)) is None and read_cpu_times(str(tmp_path / "none")) is None
    assert cpu_busy_fraction((150, 1000), (350, 1400)) == pytest.approx(0.5)
    assert cpu_busy_fraction((150, 1000), (150, 1000)) is None

    readings = iter([(0.0, (0, 100)), (1.0, (30, 200)), (2.0, (90, 300)), (3.0, (95, 400))])
    now = {"t": 0.0}

    def reader():
        t, r = next(readings)
        now["t"] = t
        return r

    hl = HostLoad(reader=reader, loadavg=lambda: (1.5, 1.0, 0.5), wall=lambda: now["t"])
    for _ in range(3):
        hl._read()
    w = hl.window(0.5, 1.5)  # from the reading before it (t=0) to the one after it (t=2)
    assert w["cpu_busy_frac"] == pytest.approx(90 / 200) and w["loadavg_1m"] == 1.5 and w["span_s"] == 2.0
    real = HostLoad(interval_s=0.02).start()
    time.sleep(0.05)  # a reading before the window
    t0 = time.time()
    while time.time() < t0 + 0.15:  # this process busy: more than one clock tick of CPU time
        sum(i * i for i in range(10_000))
    got = real.window(t0, time.time())
    real.stop()
    assert got["source"] == "/proc/stat" and 0.0 <= got["cpu_busy_frac"] <= 1.0 and len(got["loadavg"]) == 3


# -- the workload processes' protocol, on a fake clock --------------------------------------------------

class _Clock:
    def __init__(self, events: dict[float, dict], control: Path, state: Path, seen: dict):
        self.t, self.events, self.control, self.state, self.seen = 0.0, dict(events), control, state, seen

    def advance(self, dt: float) -> None:
        self.t += dt
        for at in sorted(self.events):
            if self.t >= at:
                self.seen[at] = read_json_file(self.state)  # what the process had acknowledged by then
                write_json(self.control, self.events.pop(at))


def _control(tmp_path: Path, first: dict, events: dict[float, dict], **kw) -> tuple[Control, _Clock]:
    control, state = tmp_path / "control", tmp_path / "state"
    write_json(control, first)
    clock = _Clock(events, control, state, {})
    return Control(control, state, lambda: clock.t, **kw), clock


def test_service_pauses_after_serving_what_arrived_and_restarts_its_arrivals(tmp_path) -> None:
    ctl, clock = _control(tmp_path, {"seq": 1, "qps": 400.0, "paused": False}, {
        1.0: {"seq": 2, "qps": 400.0, "paused": True},
        2.0: {"seq": 3, "qps": 100.0, "paused": False},
        3.0: {"seq": 4, "qps": 100.0, "paused": False, "stop": True}}, qps=400.0, paused=True)
    sizes: list[int] = []

    def handle(n: int) -> None:
        sizes.append(n)
        clock.advance(0.008 + 0.001 * n)  # 333 requests/s in batches of 4: at 400 QPS requests queue

    out = io.StringIO()
    served = serve_loop(handle, ctl, out, max_batch=4, arrivals="uniform", clock=lambda: clock.t,
                        sleep=clock.advance, wall_offset=0.0)
    batches = [json.loads(x) for x in out.getvalue().splitlines()]
    arrivals = [a for _s, _f, arr in batches for a in arr]
    assert served == len(arrivals) == sum(sizes) and max(sizes) == 4  # dynamic batching, up to max_batch
    assert all(f >= s >= max(arr) for s, f, arr in batches)           # served after arriving
    assert not [a for a in arrivals if 1.012 < a < 2.0]                # nothing arrives while paused
    assert 395 <= len([a for a in arrivals if a <= 1.012]) <= 406      # and what had arrived was all served,
    assert max(f for s, f, _a in batches if s < 2.0) > 1.1             # the queue after the pause included
    # by the resume the pause was acknowledged, and the service idle
    assert clock.seen[2.0]["seq"] == 2 and clock.seen[2.0]["idle"] is True
    assert 97 <= len([a for a in arrivals if 2.0 <= a < 3.0]) <= 101   # 100 QPS from the resume on, no burst
    assert not [n for n, (s, _f, _a) in zip(sizes, batches) if s > 2.0 and n > 1]  # no queue at 100 QPS


def test_job_pauses_after_its_iteration_and_streams_each_one(tmp_path) -> None:
    ctl, clock = _control(tmp_path, {"seq": 1, "paused": False}, {
        1.0: {"seq": 2, "paused": True}, 2.0: {"seq": 3, "paused": False},
        2.5: {"seq": 4, "paused": False, "stop": True}})
    out = io.StringIO()
    n = job_loop(lambda: clock.advance(0.05), ctl, out, clock=lambda: clock.t, sleep=clock.advance, wall_offset=0.0)
    its = [tuple(float(x) for x in line.split()) for line in out.getvalue().splitlines()]
    assert n == len(its) and all(e - s == pytest.approx(0.05) for s, e in its)
    assert not [s for s, _e in its if 1.06 < s < 2.0]
    assert clock.seen[2.0]["idle"] is True and 18 <= len([1 for s, _ in its if s < 1.06]) <= 22


# -- the part ---------------------------------------------------------------------------------------------

def test_plan_sizes_windows_to_the_deadline() -> None:
    pairs, sms = [("cnn", "cnn")], [20, 50, 80]
    p100 = cs.plan(100, pairs=pairs, sm_pcts=sms, repeat=3, costs=cs.GPU_COSTS)
    p150 = cs.plan(150, pairs=pairs, sm_pcts=sms, repeat=3, costs=cs.GPU_COSTS)
    for p, deadline in ((p100, 100), (p150, 150)):
        assert p.fits and p.repeat == 3 and p.estimate_s <= deadline
        assert cs.GPU_COSTS.window_min_s <= p.window_s <= cs.GPU_COSTS.window_max_s
        assert p.baseline_window_s == pytest.approx(cs.BASELINE_SHARE * p.window_s, abs=0.01)
    assert p150.window_s > p100.window_s
    short = cs.plan(60, pairs=pairs, sm_pcts=sms, repeat=3, costs=cs.GPU_COSTS)
    assert short.fits and short.repeat < 3 and "do not fit" in short.note and short.estimate_s <= 60
    assert not cs.plan(20, pairs=pairs, sm_pcts=sms, repeat=3, costs=cs.GPU_COSTS).fits
    two = cs.plan(150, pairs=[("cnn", "cnn"), ("transformer", "recommender")], sm_pcts=sms, repeat=3,
                  costs=cs.GPU_COSTS)
    assert two.per_pair_s == 75 and two.estimate_s <= 75
    given = cs.plan(100, pairs=pairs, sm_pcts=sms, repeat=3, costs=cs.GPU_COSTS, window_s=5.0)
    assert given.window_s == 5.0 and not given.fits and given.note == "window given"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


# A GPU machine has no SQLAlchemy, Alembic, Dagster or OR-Tools: the part must not import them.
BLOCKED_RUN = """
import importlib.abc, runpy, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("sqlalchemy", "dagster", "alembic", "ortools"):
            raise ImportError("not on a GPU machine: " + name)
sys.meta_path.insert(0, Block())
sys.argv = ["calibration_sweep", *sys.argv[1:]]
runpy.run_module("executors.node.profiling.calibration_sweep", run_name="__main__", alter_sys=True)
"""


def test_simulated_part_writes_its_file_with_repetitions_baselines_and_window_readings(tmp_path) -> None:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", BLOCKED_RUN, "--out", str(tmp_path), "--deadline", "40",
                          "--simulate"], env=_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".calibration-work", "calibration.json"]
    doc = json.loads((tmp_path / "calibration.json").read_text())
    assert (doc["format"], doc["part"], doc["method"], doc["gpu"]) == ("muxflow.gpu-check.part/1", "calibration",
                                                                        "simulated", None)
    assert doc["complete"] is True and doc["why_incomplete"] is None and doc["errors"] == [] and doc["ended"]
    res = doc["results"]
    assert res["plan"]["repeat"] == 2 and res["plan"]["sm_pcts"] == [20, 80] and res["plan"]["fits"]
    (rep,) = res["reports"]
    assert rep["format"] == "muxflow-colocation-report/2" and rep["method"] == "cpu" and rep["complete"]
    assert rep["order"] == "interleaved" and rep["rounds"] == [[20, 80], [80, 20]]
    sel = rep["qps_selection"]
    assert sel["mode"] == "auto" and sel["steps"] and sel["why"] and rep["qps"] == sel["qps"]
    assert sel["utilization_source"].startswith("busy fraction")
    windows = rep["baselines"] + rep["job_baselines"] + [r for p in rep["points"] for r in p["repetitions"]]
    assert len(rep["baselines"]) == 5 and len(rep["job_baselines"]) == 3 and len(windows) == 12
    for w in windows:
        assert 0.0 <= w["host"]["cpu_busy_frac"] <= 1.0 and w["host"]["loadavg_1m"] is not None
        assert w["sm_clock_mhz"] > 0 and w["metrics"]["source"] == "simulated"
    for p in rep["points"]:
        assert p["repetitions_measured"] == 2 and p["stats"]["slowdown_p99"]["n"] == 2
        for r in p["repetitions"]:
            b = r["baseline"]
            assert b["service_before"]["index"] < r["index"] < b["service_after"]["index"]
            assert b["job_before"]["index"] < r["index"] < b["job_after"]["index"]
            assert r["slowdown_avg"] == pytest.approx(r["latency"]["avg_ms"] / b["service_avg_ms"])
            assert isinstance(r["unstable"], bool)
    summary = {(row["pair"], row["sm_pct"]) for row in res["points_summary"]}
    assert summary == {("cnn+cnn", 20), ("cnn+cnn", 80)} and res["qps"]["cnn+cnn"]["mode"] == "auto"
    assert elapsed < 40


def test_part_stopped_after_its_first_point_leaves_a_valid_partial_file(tmp_path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "executors.node.profiling.calibration_sweep", "--out",
                             str(tmp_path), "--deadline", "60", "--simulate", "--window", "0.5"], env=_env(), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    path = tmp_path / "calibration.json"
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and proc.poll() is None:
            doc = read_json_file(path) or {}
            reps = (doc.get("results") or {}).get("reports") or []
            if reps and reps[0].get("points"):
                break
            time.sleep(0.05)  # polling the part's file for its first point
        assert proc.poll() is None, "the part ended before a point was seen"
        partial = json.loads(path.read_text())  # as rewritten after the first point, while running
        assert partial["complete"] is False and partial["ended"] is None
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    doc = json.loads(path.read_text())
    assert doc["complete"] is False and "stopped by a signal" in doc["why_incomplete"] and doc["ended"]
    (rep,) = doc["results"]["reports"]
    assert rep["complete"] is False and rep["points"] and rep["repetitions_measured"] < 4
    assert all(not p.get("error") for p in rep["points"])


def test_part_bad_arguments_are_one_line_and_status_2(tmp_path, capsys) -> None:
    for args, words in [
        (["--gpu-type", "h900"], ["unknown GPU type 'h900'"]),
        (["--pairs", "cnn"], ["pairs: SERVICE+JOB"]),
        (["--deadline", "-5"], ["deadline"]),
        (["--sm", "0"], ["sm: percentages within 1..100"]),
        (["--pairs", "lm+cnn"], ["'lm'"]),
        (["--window", "-1"], ["window"]),
    ]:
        argv = ["--out", str(tmp_path), "--deadline", "30", "--simulate", *args]
        assert cs.main(argv) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and all(w in err[0] for w in words), err
    assert not (tmp_path / "calibration.json").exists()
