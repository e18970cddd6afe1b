"""xCUDA's real-driver check (executors.node.xcuda.realcheck) without a GPU: its --simulate half end to end against
the fake driver, with the database libraries blocked; a deadline and a SIGTERM leave a valid partial part file; the
steady-state statistics and the series on constructed data."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from executors.node.xcuda.build import Artifacts
from executors.node.xcuda.realcheck_loop import (PERIOD_FIELDS, controller_trace, downsample, mirror_check, series,
                                                 steady_state)
from executors.node.xcuda.trace import Period, mismatches, replay

REPO = Path(__file__).resolve().parents[4]
BLOCKED = ("sqlalchemy", "dagster", "alembic", "ortools")
# Runs the part as `python -m executors.node.xcuda.realcheck` would, with the database libraries unimportable.
RUNNER = f"""
import runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError("blocked for the GPU check: " + name)
sys.meta_path.insert(0, Block())
sys.argv = ["realcheck", *sys.argv[1:]]
runpy.run_module("executors.node.xcuda.realcheck", run_name="__main__")
"""
CHECKS = {"fallback", "quota", "graphs", "exit", "overhead", "tracking"}
SERIES_COLUMNS = {"t_s", "u_sm", "u_sm_integral_s", "sm_clock_mhz", "target", "u_gpu", "gpu_util", "launches_per_s",
                  "paced_rate", "gate_open", "fallback", "wait_frac", "steps", "steps_per_s"}
CONTROLLER_COLUMNS = {"t_s", "run", *PERIOD_FIELDS}
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XCUDA_") and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = str(REPO)
    return env


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RUNNER, *args], cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUNNER, *args], cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=timeout, check=False)


def _valid_part(path: Path) -> dict:
    doc = json.loads(path.read_text())
    assert doc["format"] == "muxflow.gpu-check.part/1"
    assert doc["part"] == "xcuda"
    assert doc["method"] == "simulated"
    assert doc["gpu"] is None
    assert ISO.match(doc["started"]) and ISO.match(doc["ended"])
    assert isinstance(doc["complete"], bool) and isinstance(doc["errors"], list)
    assert (doc["why_incomplete"] is None) == doc["complete"]
    results = doc["results"]
    assert set(results) <= CHECKS | {"deadline_s", "elapsed_s", "config", "library"}
    for name in CHECKS & set(results):
        assert results[name]["status"] in {"passed", "failed", "error", "skipped", "needs_gpu", "stopped"}, name
        assert results[name]["method"] == "simulated"
    return doc


def _only_the_part_file(out: Path) -> None:
    assert sorted(p.name for p in out.iterdir()) == [".xcuda-work", "xcuda.json"]


def test_simulate_end_to_end_writes_a_valid_part_file_without_database_libraries(xcuda: Artifacts,
                                                                                 tmp_path: Path) -> None:
    help_run = _run("--help")
    assert help_run.returncode == 0 and "--simulate" in help_run.stdout, help_run.stderr
    out = tmp_path / "out"
    run = _run("--out", str(out), "--deadline", "90", "--simulate")
    assert run.returncode == 0, run.stderr[-3000:]
    _only_the_part_file(out)
    doc = _valid_part(out / "xcuda.json")
    assert doc["complete"] is True and doc["errors"] == [], doc["errors"]
    checks = doc["results"]
    assert CHECKS <= set(checks)
    assert checks["config"]["agent_interval_s"] == 0.01 and checks["library"]["error"] is None

    fb = checks["fallback"]
    assert fb["status"] == "passed" and fb["fallback_flag"] is True and fb["warned_once"] is True
    assert abs(fb["launches_per_s"] - 2000) <= 200

    quota = checks["quota"]
    assert quota["status"] == "passed"
    assert set(quota["allocators"]) == {"cuMemAlloc_v2", "cuMemCreate", "cuMemAllocAsync", "cuMemAllocFromPoolAsync"}
    for a in quota["allocators"].values():
        assert [s["ok"] for s in a["steps"]] == [True, False, True] and a["steps"][1]["oom"] is True
        assert a["reported_total_bytes"] == 2 * 2**30
    assert all(quota["hooked"].values())

    assert checks["graphs"]["status"] == "needs_gpu"

    ex = checks["exit"]
    assert ex["status"] == "passed", ex
    # The job's handler ran with its context kept and launched its clean-up; the loop without one died of the
    # signal after xCUDA released its context.
    handled, default = ex["handled"], ex["default_action"]
    assert handled["exit_status"] == 0 and handled["xcuda_kept"] and not handled["xcuda_released"]
    assert handled["after_signal"].startswith("after-signal launches=100 errors=0")
    assert default["exit_status"] == -signal.SIGTERM and default["xcuda_released"] and not default["xcuda_kept"]

    ov = checks["overhead"]
    assert ov["status"] == "passed" and ov["gate_open_frac"] >= 0.9
    assert ov["with_xcuda"]["preloaded"] is True and ov["without_xcuda"]["preloaded"] is False

    tr = checks["tracking"]
    assert set(tr["targets"]) == {"0.3", "0.5", "0.7"}
    for key, r in tr["targets"].items():
        target = float(key)
        s = r["series"]
        assert set(s) >= SERIES_COLUMNS
        n = len(s["t_s"])
        assert n > 100 and all(len(s[c]) == n for c in SERIES_COLUMNS)
        # The agent's loop wrote the record (with the integral), at the target asked for.
        assert all(v == target for v in s["target"])
        assert any(v is not None and v > 0 for v in s["u_sm_integral_s"])
        c = r["controller"]
        assert set(c) >= CONTROLLER_COLUMNS and len(c["t_s"]) > 50
        assert all(len(c[k]) == len(c["t_s"]) for k in CONTROLLER_COLUMNS)
        # The stored trace replays through the mirror as the library decided, period by period.
        periods = [Period(**{f: c[f][i] for f in PERIOD_FIELDS}) for i in range(len(c["t_s"]))]
        assert set(c["run"]) == {0} and mismatches(periods) == []
        assert r["controller_check"]["mirror_agrees"] is True
        assert r["controller_check"]["periods"] == len(periods)
        st = r["steady"]
        assert st["target"] == target and st["samples"] > 50
        # Paced through the fake driver onto the toy GPU (200 µs a launch): the launch rate follows the target.
        assert abs(st["mean_u_gpu"] - target) <= 0.1, st
        assert st["gate_open_frac"] == 0.0
        assert st["mean_launches_per_s"] == pytest.approx(target / 200e-6, rel=0.2)
        assert r["agent"]["ticks"] > 100 and r["agent"]["error"] is None


def test_a_deadline_cut_leaves_a_valid_partial_file(xcuda: Artifacts, tmp_path: Path) -> None:
    out = tmp_path / "out"
    t = time.monotonic()
    run = _run("--out", str(out), "--deadline", "4", "--simulate")
    elapsed = time.monotonic() - t
    assert run.returncode == 0, run.stderr[-3000:]
    _only_the_part_file(out)
    doc = _valid_part(out / "xcuda.json")
    assert doc["complete"] is False and doc["why_incomplete"].startswith("deadline")
    checks = doc["results"]
    assert checks["tracking"]["status"] == "skipped" and "tracking" in doc["why_incomplete"]
    assert checks["quota"]["status"] == "passed" and checks["fallback"]["status"] == "passed"
    assert set(checks) >= CHECKS
    assert checks["elapsed_s"] <= 4.0 and elapsed < 15


def test_sigterm_mid_run_keeps_what_was_measured(xcuda: Artifacts, tmp_path: Path) -> None:
    out = tmp_path / "out"
    part = out / "xcuda.json"
    proc = _start("--out", str(out), "--deadline", "90", "--simulate")
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:  # wait for tracking to start (the file is replaced atomically)
            if part.exists() and json.loads(part.read_text())["results"].get("tracking", {}).get("status") == "running":
                break
            time.sleep(0.05)
        else:
            pytest.fail("tracking did not start within 60 s")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    doc = _valid_part(part)
    assert doc["complete"] is False and doc["why_incomplete"].startswith("stopped by SIGTERM")
    results = doc["results"]
    assert results["fallback"]["status"] == "passed" and results["quota"]["status"] == "passed"
    # Stopped in tracking's first target: the overhead's two runs (before it) are kept, tracking says it stopped.
    assert results["overhead"]["without_xcuda"]["preloaded"] is False
    assert results["overhead"]["with_xcuda"]["preloaded"] is True
    assert results["overhead"]["status"] == "passed" and results["tracking"]["status"] == "stopped"
    assert results["exit"]["status"] == "passed"
    # The workloads it had started are gone (their counters name them).
    for stats in (out / ".xcuda-work").rglob("xcuda-*.stats"):
        pid = int(stats.stem.split("-")[1])
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        assert state in ("Z", "X"), f"workload {pid} still running"


@pytest.mark.parametrize("args", [("--out", "x", "--deadline", "0", "--simulate"), ("--deadline", "5"),
                                  ("--out", "x", "--deadline", "5", "--targets", "0.3,3")])
def test_bad_arguments_exit_2_with_one_line(args: tuple[str, ...], tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "executors.node.xcuda.realcheck", *args], cwd=tmp_path,
                         env=_env(), capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert not (tmp_path / "x").exists()


# -- the statistics and series on constructed data -----------------------------------------------

def _constructed(target: float = 0.5) -> tuple[list[float], list[float | None], list[int], list[float]]:
    """10 s at 10 ms: 3 s of start-up at 0.9 with the gate open, then target ± 0.02 (alternating) paced, a gap
    (None) at 5 s; 40 steps/s throughout."""
    t = [round(i * 0.01, 2) for i in range(1000)]
    u: list[float | None] = [0.9 if x < 3.0 else target + (0.02 if i % 2 else -0.02) for i, x in enumerate(t)]
    u[500] = None
    gate = [1 if x < 3.0 else 0 for x in t]
    launches = [3000.0 if x < 3.0 else 1000.0 for x in t]
    return t, u, gate, launches


def test_steady_state_discards_the_settling_time() -> None:
    t, u, gate, launches = _constructed()
    progress = [(i / 40.0, float(i)) for i in range(401)]
    st = steady_state(t, u, 0.5, 3.0, progress, 0.05, gate, launches)
    assert st["samples"] == 699  # 700 ticks from 3.0 s, one of them a gap
    assert st["mean_u_gpu"] == pytest.approx(0.5, abs=1e-3)
    assert st["std_u_gpu"] == pytest.approx(0.02, abs=1e-3)
    assert st["error"] == pytest.approx(0.0, abs=1e-3) and st["within_tolerance"] == 1.0
    assert st["p05_u_gpu"] == pytest.approx(0.48) and st["p95_u_gpu"] == pytest.approx(0.52)
    assert st["gate_open_frac"] == 0.0 and st["mean_launches_per_s"] == 1000.0
    assert st["steps_per_s"] == pytest.approx(40.0)
    assert st["window_s"] == pytest.approx(6.99)
    # Without the settling time the start-up's 0.9 pulls the mean up and the error shows it.
    early = steady_state(t, u, 0.5, 0.0, progress, 0.05, gate, launches)
    assert early["mean_u_gpu"] == pytest.approx((300 * 0.9 + 699 * 0.5) / 999, abs=1e-3)
    assert early["error"] > 0.1 and early["within_tolerance"] < 0.75 and early["gate_open_frac"] == pytest.approx(0.3)
    # A load that settles under its target: the error is negative and relative.
    low = steady_state(t, [None if v is None else v - 0.2 for v in u], 0.5, 3.0)
    assert low["error"] == pytest.approx(-0.2, abs=1e-3) and low["relative_error"] == pytest.approx(-0.4, abs=1e-3)
    assert low["within_tolerance"] == 0.0 and low["steps_per_s"] is None
    # Nothing after the settling time: no statistics, no crash.
    none = steady_state(t, u, 0.5, 20.0)
    assert none["samples"] == 0 and none["mean_u_gpu"] is None and none["error"] is None


def test_series_columns_from_agent_ticks_and_counters() -> None:
    """Rows as the Recorder keeps them; the job's counters update every other tick (20 ms period, 10 ms ticks)."""
    rows = []
    launches = waited = 0
    for i in range(200):
        mono_ns = 1_000_000_000 + i * 10_000_000
        stats = None
        if i >= 2:
            if i % 2 == 0:
                launches += 30                      # 30 launches per 20 ms: 1,500/s
                waited += 10_000_000                # waiting half the time
            ts = 1_000_000_000 + (i - i % 2) * 10_000_000
            stats = (ts, launches, launches // 2, waited, 1500.0, False, i < 50)
        rows.append((mono_ns, mono_ns, 0.4, 0.004 * i, 1980.0, 0.0, 1980.0, 0.5, 0.45, stats))
    steps = [1.0 + k * 0.05 for k in range(40)]     # 20 steps/s from t0 + 0
    cols = series(rows, 1.0, steps)
    assert set(cols) == SERIES_COLUMNS
    n = len(cols["t_s"])
    assert n == 200 and all(len(v) == n for v in cols.values())
    assert cols["t_s"][0] == 0.0 and cols["t_s"][-1] == pytest.approx(1.99)
    assert cols["u_gpu"][10] == 0.4  # no clock threshold in the record: a_C = 1
    assert cols["launches_per_s"][0] is None and cols["gate_open"][0] is None
    assert cols["launches_per_s"][100] == pytest.approx(1500.0)
    assert cols["wait_frac"][100] == pytest.approx(0.5)
    assert cols["gate_open"][10] == 1 and cols["paced_rate"][10] is None
    assert cols["gate_open"][100] == 0 and cols["paced_rate"][100] == 1500.0 and cols["fallback"][100] == 0
    assert cols["steps"][-1] == 40 and cols["steps_per_s"][60] == pytest.approx(20.0, rel=0.05)
    assert cols["u_sm_integral_s"][100] == pytest.approx(0.4)
    # Stored at most max_points rows: groups averaged, a group of nulls stays null.
    small, group = downsample(cols, 60)
    assert group == 4 and len(small["t_s"]) == 50
    assert small["launches_per_s"][0] is None and small["launches_per_s"][25] == pytest.approx(1500.0)
    assert small["t_s"][1] == pytest.approx((0.04 + 0.05 + 0.06 + 0.07) / 4)
    same, one = downsample(cols, 1000)
    assert one == 1 and same is cols


def _decided(inputs: list[dict]) -> list[Period]:
    """Periods with the inputs given and the outputs the mirror decides: what a correct library logs."""
    blank = [Period(**d, u=0.0, u_gpu=0.0, mode=0, rate=0.0) for d in inputs]
    return [replace(p, u=u, u_gpu=g, mode=m, rate=r) for p, (u, g, m, r) in zip(blank, replay(blank))]


def _line(p: Period) -> str:
    return "xcuda[7]: debug: pace " + " ".join(f"{f}={getattr(p, f)!r}" for f in PERIOD_FIELDS)


def test_controller_trace_splits_stretches_and_checks_the_mirror() -> None:
    """Pace lines as the library writes them: a restart of control begins a new stretch; a line cut short is left
    out; a period the mirror would have decided otherwise is counted."""
    start = "xcuda[7]: info: GPU record /x in use: closed-loop pacing of kernel launches"
    common = {"flags": 1, "c_sm": 1980.0, "t_sm": 0.0, "c_h": 1980.0, "target": 0.4, "demand": 1500.0, "dt": 0.02}
    first = _decided([{"ts": 10**9 + k * 20_000_000, "u_sm": 0.6, "integral": 0.012 * k, **common}
                      for k in range(3)])
    second = _decided([{"ts": 5 * 10**9, "u_sm": 0.2, "integral": 0.0, **common}])
    lines = [(10.0, start), *((10.02 * (k + 1), _line(p)) for k, p in enumerate(first)),
             (11.0, start), (11.02, _line(second[0])), (11.04, "xcuda[7]: debug: pace ts=9 flags=1 u_sm=0.5")]
    runs, cols = controller_trace(lines, 10.0)
    assert runs == [first, second]
    assert cols["run"] == [0, 0, 0, 1] and cols["t_s"][0] == pytest.approx(0.02)
    assert set(cols) == CONTROLLER_COLUMNS and all(len(v) == 4 for v in cols.values())
    assert cols["rate"][:3] == [p.rate for p in first] and first[-1].mode == 1  # over the target: paced
    check = mirror_check(runs, settle_s=0.0)
    assert check["mirror_agrees"] is True and (check["periods"], check["stretches"]) == (4, 2)
    assert check["steady"]["periods"] == 3 and check["steady"]["target"] == 0.4
    wrong = [(t, text.replace(f"rate={first[1].rate!r}", f"rate={first[1].rate * 1.01!r}")) for t, text in lines]
    check = mirror_check(controller_trace(wrong, 10.0)[0], settle_s=0.0)
    assert check["mirror_agrees"] is False and check["mirror_mismatches"] == 1
    assert check["first_mismatches"][0].startswith("period 1:")
