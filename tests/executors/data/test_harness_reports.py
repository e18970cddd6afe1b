"""Co-location harness reports as muxflow.colocation/1 service points: values, caveats, verdicts."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from executors.data.harness_reports import convert, load_report, report_from_suite_output, to_colocation
from executors.data.measurements import MeasurementError, load_file, parse_document

H200_FILE = Path(__file__).resolve().parents[3] / "docs" / "evaluation" / "gpu" / "2026-11-27-h200" / "colocation.json"
START = 1795808331.9  # 2026-11-27, UTC


def point(sm: int, tput: float, avg: float, p99: float, **extra) -> dict:
    return {"sm_pct": sm, "iterations": {"mean_s": 0.1 / tput, "iterations": 50}, "norm_tput": tput,
            "slowdown_avg": avg, "slowdown_p99": p99,
            "latency": {"avg_ms": 4.0 * avg, "p99_ms": 8.0 * p99, "requests": 800}, **extra}


def report(points: list[dict], *, util: float | None = 45.0, service: str = "cnn", qps: float = 200.0,
           **extra) -> dict:
    metrics = None if util is None else {"gpu_util_pct": util, "source": "measured"}
    return {
        "format": "muxflow-colocation-report/1", "method": "mps", "method_note": "private MPS control daemon",
        "gpu_type": "h100", "service_family": service, "qps": qps, "job_family": "transformer",
        "job_type": "Transformer (batch size 32)", "size": "gpu", "window_s": 8.0,
        "sm_pcts": [p["sm_pct"] for p in points], "started_unix": START,
        "device": "NVIDIA H200 (driver 580.159.04)",
        "solo_service": {"latency": {"avg_ms": 4.0, "p99_ms": 8.0, "busy_frac": 0.5,
                                     "job_type": "ResNet-18 (batch size 64)"}, "metrics": metrics},
        "solo_job": {"iterations": {"mean_s": 0.1},
                     "metrics": {"sm_activity_pct": 80.0, "mem_bw_util_pct": 40.0, "gpu_util_pct": 97.0,
                                 "source": "measured"}},
        "points": points, **extra}


def by_sm(doc: dict) -> dict[float, dict]:
    return {p["sm_pct"]: p for p in doc["service_points"]}


def test_a_report_1_becomes_service_points_with_their_caveats_and_verdicts() -> None:
    rep = report([point(20, 0.25, 1.3, 2.0), point(50, 0.55, 0.8, 0.95),
                  {"sm_pct": 80, "error": "job at 80%: exit code 1"}])
    doc = convert([("runs/colocation.json", rep)], gpu_type="h200")
    assert doc["gpus"] == {"h200": {"gpu_model": "NVIDIA H200", "driver": "580.159.04", "method": "mps",
                                    "date": "2026-11-27", "notes": doc["gpus"]["h200"]["notes"]}}
    assert doc["caveats"] == ["the harness labelled these runs 'h100'; they ran on NVIDIA H200 (h200)"]
    pts = by_sm(doc)
    ok = pts[20]
    assert ok["usable"] is True and "reasons" not in ok
    assert (ok["norm_tput"], ok["slowdown_avg"], ok["slowdown_p99"]) == (0.25, 1.3, 2.0)
    assert (ok["gpu_type"], ok["service"], ok["qps"], ok["job_type"]) == ("h200", "cnn", 200.0,
                                                                            "Transformer (batch size 32)")
    assert (ok["window_s"], ok["repetitions"], ok["baseline"]) == (8.0, 1, "one solo run of each, before the points")
    assert (ok["noise"], ok["noise_from"], ok["source"]) == (0.1, "assumed", "colocation.json")
    assert ok["service_solo_gpu_util_pct"] == 45.0 and ok["service_busy_frac"] == 0.5
    assert ok["job_solo"] == {"gpu_util_pct": 97.0, "sm_activity_pct": 80.0, "mem_bw_util_pct": 40.0}
    assert ok["iter_time_s"] == 0.4 and ok["latency_avg_ms"] == 5.2
    assert "noise not measured (a single repetition and a single solo baseline): assumed 10 %" in ok["notes"]
    # Below 1 by more than the noise on the average; within it on the p99.
    assert pts[50]["usable"] is False and len(pts[50]["reasons"]) == 1
    assert pts[50]["reasons"][0].startswith("online slowdown x0.80 (average) is below 1 by more than the noise (10 %)")
    assert pts[80]["usable"] is False and pts[80]["reasons"] == ["the run failed: job at 80%: exit code 1"]
    assert "norm_tput" not in pts[80] and "slowdown_avg" not in pts[80]  # nothing measured, nothing written
    # What it writes is what it validates.
    m = parse_document(doc, "converted")
    assert [(p.sm_pct, p.usable) for p in m.service_points] == [(20.0, True), (50.0, False), (80.0, False)]


def test_a_service_that_is_not_gpu_bound_keeps_its_points_out_and_its_utilization_is_quoted_elsewhere() -> None:
    busy = report([point(20, 0.25, 1.3, 2.0)], util=12.0)
    unknown = report([point(20, 0.26, 1.2, 1.9)], util=None)
    other = report([point(20, 0.26, 1.2, 1.9)], util=None, service="recommender")
    doc = convert([("a.json", busy), ("b.json", unknown), ("c.json", other)], gpu_type="h200")
    a, b, c = doc["service_points"]
    assert a["usable"] is False and a["reasons"][0].startswith(
        "the service was not GPU-bound: 12.0 % GPU utilization alone (< 30 %)")
    # Utilization unknown: usable, with what another run of the same service at the same QPS recorded.
    assert b["usable"] is True and "service_solo_gpu_util_pct" not in b
    assert ("the service's solo GPU utilization was not recorded in this run (the same service at the same QPS "
            "on this GPU: 12.0 % in a.json)") in b["notes"]
    assert c["usable"] is True and not any("same service" in n for n in c["notes"])
    relaxed = convert([("a.json", busy)], gpu_type="h200", min_service_util_pct=10.0)
    assert relaxed["service_points"][0]["usable"] is True


def test_faster_than_alone_beyond_the_noise_is_kept_out_and_the_noise_can_be_given() -> None:
    rep = report([point(50, 1.2, 1.0, 1.0), point(80, 1.05, 0.85, 1.0)])
    strict = by_sm(convert([("a.json", rep)], gpu_type="h200"))
    assert strict[50]["reasons"] == ["the job ran x1.20 faster beside the service than alone, more than the "
                                     "noise (10 %)"]
    assert strict[80]["usable"] is False
    loose = by_sm(convert([("a.json", rep)], gpu_type="h200", noise=0.25))
    assert loose[80]["usable"] is True and loose[80]["noise"] == 0.25 and loose[50]["usable"] is True


def test_a_value_no_gpu_produces_is_kept_out_for_the_record_however_noisy_the_run() -> None:
    """A loaded machine's run: repetitions so far apart that the measured noise covers x1.52 — the point is still
    kept out (beyond what sharing can give), its numbers stay, and the document validates."""
    reps = [point(20, 2.8, 10.7, 12.0), point(20, 0.25, 1.2, 1.5)]
    rep = report([{"sm_pct": 20, "repetitions": reps}], format="muxflow-colocation-report/2")
    doc = convert([("r2.json", rep)], gpu_type="h200")
    p = doc["service_points"][0]
    assert p["noise"] > 0.52 and p["norm_tput"] == 1.525
    assert p["usable"] is False and p["reasons"] == [
        "the job ran x1.52 faster beside the service than alone, beyond what sharing can give (x1.5): a broken "
        f"measurement, whatever the noise ({100 * p['noise']:.0f} %)"]
    kept = parse_document(doc, "converted").service_points[0]
    assert (kept.usable, kept.norm_tput) == (False, 1.525)
    # A usable point is still held to the bound: a file that calls the same numbers usable is refused.
    doc["service_points"][0].update(usable=True)
    del doc["service_points"][0]["reasons"]
    with pytest.raises(MeasurementError, match=r"service_points\[0\]\.norm_tput: 1.525 is outside \(0.0, 1.5\]"):
        parse_document(doc, "edited")


def test_a_report_2_uses_the_repetitions_means_and_measures_its_noise() -> None:
    reps = [point(20, 0.24, 1.2, 1.8), point(20, 0.26, 1.4, 2.2), {"sm_pct": 20, "error": "timed out"}]
    rep = report([{"sm_pct": 20, "repetitions": reps, "clocks": {"sm_mhz": 1980}}],
                 format="muxflow-colocation-report/2", cpu_load={"mean": 0.4}, future_field=[1, 2])
    rep["solo_service_after"] = {"latency": {"avg_ms": 4.4, "p99_ms": 8.0, "busy_frac": 0.5},
                                 "metrics": {"gpu_util_pct": 55.0, "source": "measured"}}
    p = convert([("r2.json", rep)], gpu_type="h200")["service_points"][0]
    assert (p["norm_tput"], p["slowdown_avg"], p["slowdown_p99"]) == (0.25, 1.3, 2.0)
    assert p["repetitions"] == 2 and p["spread"] == {"norm_tput": [0.24, 0.26], "slowdown_avg": [1.2, 1.4],
                                                     "slowdown_p99": [1.8, 2.2]}
    assert p["baseline"] == "2 solo runs of the service (before and after the points)"
    assert p["solo_latency_avg_ms"] == 4.2 and p["service_solo_gpu_util_pct"] == 50.0
    # Noise: the larger of the repetitions' relative spread (p99: 0.283 / 2.0) and the baselines' drift (0.4 / 4.2).
    assert p["noise_from"] == "baselines and repetitions" and p["noise"] == pytest.approx(0.1414, abs=1e-4)
    assert p["usable"] is True and not any("noise not measured" in n for n in p.get("notes", []))
    failed = report([{"sm_pct": 20, "repetitions": [{"sm_pct": 20, "error": "timed out"}]}],
                    format="muxflow-colocation-report/2")
    assert convert([("r2.json", failed)], gpu_type="h200")["service_points"][0]["reasons"] == [
        "the run failed: every repetition failed (timed out)"]


def test_a_points_own_baselines_before_and_after_it_replace_the_reports() -> None:
    rep = report([point(20, 0.25, 1.3, 2.0), point(80, 0.8, 1.4, 1.5)], format="muxflow-colocation-report/2")
    rep["points"][0]["baselines"] = {
        "before": {"latency": {"avg_ms": 3.0, "p99_ms": 6.0}, "metrics": {"gpu_util_pct": 40.0}},
        "after": {"latency": {"avg_ms": 3.6, "p99_ms": 7.0}, "metrics": {"gpu_util_pct": 20.0}}}
    first, second = convert([("r2.json", rep)], gpu_type="h200")["service_points"]
    assert first["baseline"] == "2 solo runs of the service (before and after this point)"
    assert (first["solo_latency_avg_ms"], first["service_solo_gpu_util_pct"]) == (3.3, 30.0)
    assert first["noise_from"] == "baselines" and first["noise"] == pytest.approx(0.6 / 3.3, abs=1e-4)
    assert second["baseline"] == "one solo run of each, before the points" and second["noise_from"] == "assumed"


def test_make_gpu_checks_simulated_sweep_converts_only_as_simulated() -> None:
    cpu = report([point(20, 0.25, 1.3, 2.0)], method="cpu", device="cpu", gpu_type="t4")
    with pytest.raises(MeasurementError, match="^report 1: method 'cpu': a CPU run tests the harness"):
        to_colocation([cpu], gpu_model="none (simulated)", driver="none", date="2026-11-29")
    doc = to_colocation([cpu, cpu], gpu_model="none (simulated)", driver="none", date="2026-11-29",
                        method="simulated")
    assert doc["gpus"] == {"t4": {"gpu_model": "none (simulated)", "driver": "none", "method": "simulated",
                                  "date": "2026-11-29", "notes": doc["gpus"]["t4"]["notes"]}}
    assert [p["source"] for p in doc["service_points"]] == ["report 1", "report 2"]


def test_workload_notes_reach_every_point_whose_job_or_service_stands_for_the_workload() -> None:
    doc = convert([("a.json", report([point(20, 0.25, 1.3, 2.0)]))], gpu_type="h200",
                  workload_notes={"ResNet-18 (batch size 64)": "a heavier model", "LM (batch size 5)": "unused"},
                  caveats=["one repetition"])
    notes = doc["service_points"][0]["notes"]
    assert "service 'ResNet-18 (batch size 64)': a heavier model" in notes and not any("unused" in n for n in notes)
    assert doc["caveats"][0] == "one repetition"


@pytest.mark.parametrize("mutate,kwargs,message", [
    (lambda r: r.update(method="cpu"), {}, "a.json: method 'cpu': a CPU run tests the harness, it measures no GPU "
     "(convert it only as method 'simulated')"),
    (lambda r: r.update(format="muxflow-colocation-report/9"), {},
     "a.json: format: expected one of muxflow-colocation-report/1, muxflow-colocation-report/2, got "
     "'muxflow-colocation-report/9'"),
    (lambda r: r.pop("device"), {"gpu_type": "h200"}, "gpu model: not in the reports; give it"),
    (lambda r: (r.pop("gpu_type"), r.pop("device")), {}, "gpu type: the reports say nothing; give it"),
    (lambda r: None, {"method": "time-slicing"}, "method: 'time-slicing' is not one of mps, no-mps, simulated, "
                                                 "unknown"),
    (lambda r: None, {"noise": 1.5}, "noise: 1.5 is outside [0, 1]"),
])
def test_what_cannot_be_converted_is_one_line(mutate, kwargs, message) -> None:
    rep = report([point(20, 0.25, 1.3, 2.0)])
    mutate(rep)
    with pytest.raises(MeasurementError) as err:
        convert([("a.json", rep)], **kwargs)
    assert str(err.value) == message


def test_the_identity_can_be_given_and_reports_must_agree_on_the_rest() -> None:
    rep = report([point(20, 0.25, 1.3, 2.0)])
    # Not given: the GPU type of the device the harness ran on, over the label it was given.
    found = convert([("a.json", rep)])
    assert list(found["gpus"]) == ["h200"] and found["service_points"][0]["gpu_type"] == "h200"
    assert found["caveats"] == ["the harness labelled these runs 'h100'; they ran on NVIDIA H200 (h200)"]
    assert list(convert([("a.json", {**rep, "device": "NVIDIA Z9 (driver 1)"})])["gpus"]) == ["h100"]
    rep.pop("device")
    doc = convert([("a.json", rep)], gpu_type="h200", gpu_model="NVIDIA H200", driver="580.1", date="2026-11-28")
    assert doc["gpus"]["h200"]["driver"] == "580.1" and doc["gpus"]["h200"]["date"] == "2026-11-28"
    other = copy.deepcopy(rep)
    other["method"] = "no-mps"
    with pytest.raises(MeasurementError, match="^method: the reports say mps, no-mps; give it$"):
        convert([("a.json", rep), ("b.json", other)], gpu_type="h200", gpu_model="x", driver="y")


SUITE = """\
.........INFO __main__: cnn/gpu on NVIDIA H200 (CUDA 13.0, torch 2.11.0+cu130) from step 0 (profiling)
MUXFLOW-ITERATION-REPORT {"stopped_by": "iterations", "mean_s": 0.129, "iterations": 20}
solo profile on the GPU: {"features": {"gpu_util_pct": 99.0, "sm_activity_pct": 82.0, "mem_bw_util_pct": 52.0, \
"iter_time_s": 0.129}, "iterations": 20, "device": "NVIDIA H200 (driver 580.159.04)"}
.MUXFLOW-LATENCY-REPORT {"family": "cnn", "size": "gpu", "job_type": "ResNet-18 (batch size 64)", "qps_target": 200.0, \
"avg_ms": 3.0, "p99_ms": 9.0, "busy_frac": 0.4, "stopped_early": false, "window_start_unix": 1795808233.8}
INFO __main__: cnn/gpu on NVIDIA H200 (CUDA 13.0, torch 2.11.0+cu130) from step 0 (profiling)
MUXFLOW-ITERATION-REPORT {"stopped_by": "seconds", "max_seconds": 10.0, "mean_s": 0.12, "iterations": 70}
INFO __main__: cnn/gpu on NVIDIA H200 (CUDA 13.0, torch 2.11.0+cu130) from step 0 (profiling)
MUXFLOW-ITERATION-REPORT {"stopped_by": "seconds", "max_seconds": 10.0, "mean_s": 0.48, "iterations": 18}
MUXFLOW-LATENCY-REPORT {"family": "cnn", "avg_ms": 4.2, "p99_ms": 19.0, "stopped_early": true}
INFO __main__: cnn/gpu on NVIDIA H200 (CUDA 13.0, torch 2.11.0+cu130) from step 0 (profiling)
MUXFLOW-ITERATION-REPORT {"stopped_by": "seconds", "max_seconds": 10.0, "mean_s": 0.15, "iterations": 58}
MUXFLOW-LATENCY-REPORT {"family": "cnn", "avg_ms": 3.9, "p99_ms": 12.0, "stopped_early": true}
co-location on the GPU: {"20": {"norm_tput": 0.25, "slowdown_avg": 1.3, "slowdown_p99": 2.5}, \
"80": {"norm_tput": 0.8, "slowdown_avg": 1.5, "slowdown_p99": 1.6}}
.
11 passed in 118.26s
"""


def test_the_gpu_suites_printed_output_is_recovered_as_a_report(tmp_path) -> None:
    rep = report_from_suite_output(SUITE, "suite.txt")
    assert rep["method"] == "mps" and "0.25 at 20 %, 0.80 at 80 %" in rep["method_note"]
    assert (rep["service_family"], rep["qps"], rep["job_type"], rep["window_s"]) == (
        "cnn", 200.0, "ResNet-18 (batch size 64)", 10.0)
    assert rep["solo_job"]["iterations"]["mean_s"] == 0.12 and rep["solo_service"]["latency"]["avg_ms"] == 3.0
    assert rep["solo_job"]["metrics"] == {"gpu_util_pct": 99.0, "sm_activity_pct": 82.0, "mem_bw_util_pct": 52.0}
    assert [(p["sm_pct"], p["iterations"]["mean_s"]) for p in rep["points"]] == [(20, 0.48), (80, 0.15)]
    assert rep["points"][0]["latency"] == {"avg_ms": pytest.approx(3.9), "p99_ms": pytest.approx(22.5)}
    path = tmp_path / "suite.txt"
    path.write_text(SUITE)
    doc = convert([(str(path), load_report(path))], gpu_type="h200")
    p = doc["service_points"][0]
    assert doc["gpus"]["h200"]["driver"] == "580.159.04" and doc["gpus"]["h200"]["date"] == "2026-11-27"
    assert p["usable"] is True and p["service_busy_frac"] == 0.4 and "service_solo_gpu_util_pct" not in p
    assert any(n.startswith("recovered from the GPU suite's printed output") for n in p["notes"])
    # An iteration report that does not give the summarised norm_tput is refused, not guessed around.
    with pytest.raises(MeasurementError, match="the 20 % point's iteration report does not give its norm_tput"):
        report_from_suite_output(SUITE.replace('"mean_s": 0.48', '"mean_s": 0.5'), "suite.txt")


def test_a_file_that_is_neither_is_one_line(tmp_path) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("11 passed\n")
    with pytest.raises(MeasurementError, match=r"notes.txt: neither a harness report \(JSON\) nor the GPU suite"):
        load_report(bad)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"format": "muxflow.colocation/1"}))
    with pytest.raises(MeasurementError, match="wrong.json: format: expected one of muxflow-colocation-report/1"):
        load_report(wrong)


def test_the_committed_h200_measurements_validate() -> None:
    m = load_file(H200_FILE)
    assert m.types == {}  # service points only: not a type of the interference model
    meta = m.service_points[0].meta
    assert (meta.gpu_model, meta.driver, meta.method, meta.date) == ("NVIDIA H200", "580.159.04", "mps", "2026-11-27")
    assert len(m.service_points) == 11 and all(p.gpu_type == "h200" for p in m.service_points)
    usable = [p for p in m.service_points if p.usable]
    assert [(p.service, p.job_type, p.sm_pct) for p in usable] == [
        ("cnn", "ResNet-18 (batch size 64)", 20.0), ("cnn", "ResNet-18 (batch size 64)", 80.0)]
    assert all(p.reasons for p in m.service_points if not p.usable)
    assert {(p.row["window_s"], p.row["repetitions"]) for p in m.service_points} == {(8.0, 1), (10.0, 1)}
    assert all(any("heavier" in n for n in p.row["notes"]) for p in m.service_points
               if "ResNet-18 (batch size 64)" in (p.job_type, p.row.get("service_job_type")))


def test_the_converter_needs_no_store_dagster_or_torch(tmp_path) -> None:
    """`make gpu-check` converts on a GPU machine without SQLAlchemy, Alembic, Dagster or OR-Tools."""
    import subprocess
    import sys

    path = tmp_path / "r.json"
    path.write_text(json.dumps(report([point(20, 0.25, 1.3, 2.0)])))
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('sqlalchemy', 'alembic', 'dagster', 'ortools', 'torch'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from executors.data.harness_reports import convert, load_report\n"
        "from executors.data.service_model import compare\n"
        f"doc = convert([('r.json', load_report({str(path)!r}))])\n"
        "print(len(doc['service_points']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[3], timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"
