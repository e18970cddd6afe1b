"""The simulated GPU against measured service points: model numbers from the simulator, measured ones from the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from executors.data.calibration import catalog_for
from executors.data.measurements import load_file, parse_document
from executors.data.service_model import compare, markdown
from scheduler_core.gpu_specs import get_spec
from scheduler_core.interference.gpu_model import OnlineModel, online_alone, traits_from_profile, with_offline
from scheduler_core.workloads import ONLINE_FAMILIES

H200_DIR = Path(__file__).resolve().parents[3] / "docs" / "evaluation" / "gpu" / "2026-11-27-h200"
TABLE_START, TABLE_END = "<!-- service-model table:", "<!-- end of service-model table -->"


def simulated(service: str, qps: float, job_traits, sm_pct: float, gpu_type: str, load: float | None = None):
    """What the simulated GPU (the per-GPU model behind the simulator and the simulated cluster) gives for a
    replica at ``qps`` (or at ``load``) and one job at ``sm_pct``: unpaced, running the whole time."""
    cat = catalog_for("transfer", gpu_type)
    model = OnlineModel.of(ONLINE_FAMILIES[service], cat.online[service], get_spec(gpu_type))
    alone = online_alone(model, qps if load is None else load * model.capacity_qps)
    shared = with_offline(alone, model, job_traits, sm_pct, 1.0, 1e9)
    return float(shared.norm_tput), float(shared.slowdown)


def test_the_comparison_gives_the_simulated_gpus_numbers_and_the_files_measured_values() -> None:
    raw = json.loads((H200_DIR / "colocation.json").read_text())["service_points"]
    rows = compare(load_file(H200_DIR / "colocation.json").service_points)
    assert len(rows) == len(raw) == 11
    for r, p in zip(rows, raw):
        assert r["measured"] == {k: p.get(k) for k in ("norm_tput", "slowdown_avg", "slowdown_p99")}
        assert (r["source"], r["service"], r["qps"], r["job_type"], r["sm_pct"], r["usable"]) == (
            p["source"], p["service"], p["qps"], p["job_type"], p["sm_pct"], p["usable"])
        cat = catalog_for("transfer", "h200")
        tput, slow = simulated(p["service"], p["qps"], cat.offline_workload(p["job_type"]).traits, p["sm_pct"], "h200")
        assert r["model"] == {"norm_tput": pytest.approx(tput, abs=5e-5), "slowdown": pytest.approx(slow, abs=5e-5)}
        # Measured inputs: the job's traits from its solo profile, the service at its measured busy fraction.
        traits = traits_from_profile(p["job_solo"]["sm_activity_pct"], p["job_solo"]["mem_bw_util_pct"], cat)
        tput, slow = simulated(p["service"], p["qps"], traits, p["sm_pct"], "h200", load=p["service_busy_frac"])
        assert r["model_measured_inputs"] == {"norm_tput": pytest.approx(tput, abs=5e-5),
                                              "slowdown": pytest.approx(slow, abs=5e-5)}
        assert r["measured_inputs"] == ["job profile", "service busy fraction"]
    # The cnn service with the cnn job at 20 % of the SMs: the model is optimistic on both sides.
    cnn = [r for r in rows if r["usable"]]
    assert [r["sm_pct"] for r in cnn] == [20.0, 80.0]
    for r in cnn:
        assert r["model"]["norm_tput"] > r["measured"]["norm_tput"]
        assert r["model"]["slowdown"] < r["measured"]["slowdown_avg"] < r["measured"]["slowdown_p99"]


def test_the_readme_table_is_the_commands_output() -> None:
    readme = (H200_DIR / "README.md").read_text()
    table = readme.split(TABLE_START, 1)[1].split("-->", 1)[1].split(TABLE_END, 1)[0].strip()
    assert table == markdown(compare(load_file(H200_DIR / "colocation.json").service_points)), (
        "regenerate the table: muxflow calibrate service-model docs/evaluation/gpu/2026-11-27-h200/colocation.json")


def test_a_point_the_model_cannot_describe_is_one_line() -> None:
    doc = {"format": "muxflow.colocation/1",
           "gpus": {"v100": {"gpu_model": "V100", "driver": "1", "method": "mps", "date": "2025"},
                    "h200": {"gpu_model": "H200", "driver": "1", "method": "mps", "date": "2026"}},
           "service_points": [{"gpu_type": "v100", "service": "cnn", "qps": 10, "job_type": "A3C", "sm_pct": 50,
                               "norm_tput": 0.5, "slowdown_avg": 1.1},
                              {"gpu_type": "h200", "service": "speech", "qps": 10, "job_type": "A3C", "sm_pct": 50,
                               "norm_tput": 0.5, "slowdown_avg": 1.1}]}
    first, second = parse_document(doc, "x").service_points
    with pytest.raises(ValueError, match="^v100: no GPU spec to model it with"):
        compare([first])
    with pytest.raises(ValueError, match="^speech: not an online family of the model"):
        compare([second])
    # Without measured inputs the second model column is empty, and the table says so.
    ok = parse_document({**doc, "service_points": [{**doc["service_points"][1], "service": "cnn"}]}, "x")
    rows = compare(ok.service_points)
    assert rows[0]["model_measured_inputs"] is None and rows[0]["measured_inputs"] == []
    assert markdown(rows).splitlines()[-1].endswith(f"x{rows[0]['model']['slowdown']:.2f} / x— |")
