"""The measured co-location sample format: reading, validation, conversion, installation."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from executors.data.measurements import (
    DEFAULT_STRESSOR,
    ENV_VAR,
    FORMAT,
    GAVEL_FILE,
    MeasurementError,
    installed,
    load_file,
    parse_document,
    to_document,
)


def _gavel_pairs(raw: dict, gtype: str) -> int:
    """Pairs of single-GPU jobs with a measurement, counted straight from Gavel's layout."""
    n = 0
    for key, entry in raw[gtype].items():
        if not key.endswith(", 1)") or not entry.get("null"):
            continue
        n += sum(1 for pk, v in entry.items()
                 if pk != "null" and pk.endswith(", 1)") and v != [0.0, 0.0] and v[0] > 0)
    return n


def test_the_bundled_gavel_data_reads_as_measurements() -> None:
    m = load_file(GAVEL_FILE)
    raw = json.loads(GAVEL_FILE.read_text())
    assert sorted(m.types) == ["k80", "p100"] and m.stressor == DEFAULT_STRESSOR
    for g, t in m.types.items():
        assert len(t.pairs) == _gavel_pairs(raw, g)
        assert all(0.0 < p.norm_tput <= 1.5 for p in t.pairs)
        assert t.meta.method == "unknown" and t.meta.source == str(GAVEL_FILE)
        assert DEFAULT_STRESSOR in t.solo_steps_per_s


def test_the_bundled_data_is_the_published_data() -> None:
    """The bundled files are Gavel's, byte for byte: their checksums are recorded beside them."""
    sums = (GAVEL_FILE.parent / "SHA256SUMS").read_text().split("\n")
    recorded = dict(reversed(line.split()) for line in sums if line.strip())
    assert set(recorded) == {GAVEL_FILE.name, "philly_vc_0e4a51.sample.trace"}
    for name, digest in recorded.items():
        assert hashlib.sha256((GAVEL_FILE.parent / name).read_bytes()).hexdigest() == digest, name


def test_conversion_round_trips() -> None:
    m = load_file(GAVEL_FILE)
    doc = json.loads(json.dumps(to_document(m)))
    assert doc["format"] == FORMAT
    back = parse_document(doc, "converted")
    for g, t in m.types.items():
        assert back.types[g].solo_steps_per_s == t.solo_steps_per_s
        assert sorted(back.types[g].pairs, key=repr) == sorted(t.pairs, key=repr)
        assert back.types[g].meta.gpu_model == t.meta.gpu_model
    # Each unordered pair is one row carrying both sides.
    assert len(doc["pairs"]) < sum(len(t.pairs) for t in m.types.values())


def small_doc() -> dict:
    return {
        "format": FORMAT,
        "gpus": {"v100": {"gpu_model": "Tesla V100-SXM2-16GB", "driver": "535.104.05", "method": "mps",
                          "date": "2025-03-14"}},
        "solo": [{"gpu_type": "v100", "job_type": "A", "steps_per_s": 10.0, "sm_activity_pct": 80},
                 {"gpu_type": "v100", "job_type": "B", "steps_per_s": 4.0}],
        "pairs": [{"gpu_type": "v100", "job_type": "A", "partner": "B", "norm_tput": 0.6, "partner_norm_tput": 0.7}],
    }


def test_a_valid_document() -> None:
    m = parse_document(small_doc(), "site.json")
    t = m.types["v100"]
    assert {(p.workload, p.partner): p.norm_tput for p in t.pairs} == {("A", "B"): 0.6, ("B", "A"): 0.7}
    assert t.counters == {"A": {"sm_activity_pct": 80.0}}
    assert t.meta.driver == "535.104.05" and t.meta.date == "2025-03-14"


def _set(path: str, value):
    def mutate(doc: dict) -> None:
        *head, last = path.split("/")
        node = doc
        for k in head:
            node = node[int(k)] if k.isdigit() else node[k]
        if value is KeyError:
            del node[last]
        else:
            node[int(last) if last.isdigit() else last] = value
    return mutate


@pytest.mark.parametrize("mutate,message", [
    (_set("format", "gavel"), "site.json: format: expected 'muxflow.colocation/1', got 'gavel'"),
    (_set("gpus/v100/driver", KeyError), "site.json: gpus.v100.driver: required, a non-empty string"),
    (_set("gpus/v100/method", "cuda"), "site.json: gpus.v100.method: 'cuda' is not one of mps, no-mps, simulated, "
                                       "unknown"),
    (_set("gpus/v100/date", "March 2025"), "site.json: gpus.v100.date: 'March 2025' is not YYYY, YYYY-MM or "
                                           "YYYY-MM-DD"),
    (_set("solo/1/steps_per_s", 0), "site.json: solo[1].steps_per_s: 0 is outside (0.0, 1000000000.0]"),
    (_set("solo/0/sm_activity_pct", 180), "site.json: solo[0].sm_activity_pct: 180 is outside [0.0, 100.0]"),
    (_set("pairs/0/gpu_type", "a100"), "site.json: pairs[0].gpu_type: 'a100' is not described under gpus"),
    (_set("pairs/0/partner", "C"), "site.json: pairs[0].partner: no solo run of 'C' on v100 to normalize by"),
    (_set("pairs/0/norm_tput", "0.6"), "site.json: pairs[0].norm_tput: expected a number, got '0.6'"),
    (_set("pairs/0/partner_norm_tput", 3.0), "site.json: pairs[0].partner_norm_tput: 3.0 is outside (0.0, 1.5]"),
])
def test_a_bad_field_is_one_line_naming_it(mutate, message) -> None:
    doc = copy.deepcopy(small_doc())
    mutate(doc)
    with pytest.raises(MeasurementError) as err:
        parse_document(doc, "site.json")
    assert str(err.value) == message


def test_a_repeated_pair_is_refused() -> None:
    doc = small_doc()
    doc["pairs"].append(dict(doc["pairs"][0]))
    with pytest.raises(MeasurementError, match=r"pairs\[1\]: a second measurement of \('A', 'B'\) on v100"):
        parse_document(doc, "site.json")


def test_unreadable_files_name_the_file(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(MeasurementError, match=f"^{bad}: not JSON"):
        load_file(bad)
    with pytest.raises(MeasurementError, match="cannot read"):
        load_file(tmp_path / "missing.json")


def site_file(tmp_path: Path, name: str = "v100", from_type: str = "p100", speedup: float = 2.0) -> Path:
    """Another GPU type's measurements: Gavel's ``from_type`` pairs on a GPU ``speedup`` times as fast."""
    doc = to_document(load_file(GAVEL_FILE))
    doc["gpus"] = {name: {**doc["gpus"][from_type], "gpu_model": f"test {name}", "date": "2025-01"}}
    doc["solo"] = [{**r, "gpu_type": name, "steps_per_s": r["steps_per_s"] * speedup}
                   for r in doc["solo"] if r["gpu_type"] == from_type]
    doc["pairs"] = [{**r, "gpu_type": name} for r in doc["pairs"] if r["gpu_type"] == from_type]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def test_site_files_join_the_installed_measurements(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(site_file(tmp_path)))
    m = installed()
    assert sorted(m.types) == ["k80", "p100", "v100"]
    assert m.types["v100"].meta.gpu_model == "test v100"
    data = m.type_data()
    # No spec and no relative_speed: the stressor's solo speed against the known types.
    assert data["v100"].speed == pytest.approx(2.0 * data["p100"].speed)
    # A later file's type replaces an earlier one.
    override = site_file(tmp_path, name="p100", from_type="k80", speedup=1.0)
    monkeypatch.setenv(ENV_VAR, f"{tmp_path / 'v100.json'}:{override}")
    m = installed()
    assert m.types["p100"].meta.gpu_model == "test p100"
    assert len(m.types["p100"].pairs) == len(load_file(GAVEL_FILE).types["k80"].pairs)


def with_points() -> dict:
    """The small document with an H200 described for its service points alone, and one point on the V100."""
    doc = small_doc()
    doc["gpus"]["h200"] = {"gpu_model": "NVIDIA H200", "driver": "580.159.04", "method": "mps", "date": "2026-11-27"}
    doc["service_points"] = [
        {"gpu_type": "h200", "service": "cnn", "qps": 200, "job_type": "ResNet-18 (batch size 64)", "sm_pct": 20,
         "norm_tput": 0.26, "slowdown_avg": 1.29, "slowdown_p99": 2.56, "window_s": 10, "repetitions": 1,
         "baseline": "one solo run of each, before the points", "noise": 0.1, "notes": ["one run"],
         "service_busy_frac": 0.43, "job_solo": {"sm_activity_pct": 82.7}, "a_later_field": {"x": 1}},
        {"gpu_type": "h200", "service": "cnn", "qps": 200, "job_type": "Recommendation (batch size 2048)",
         "sm_pct": 50, "norm_tput": 0.97, "slowdown_avg": 0.62, "usable": False,
         "reasons": ["the service was not GPU-bound"]},
        {"gpu_type": "h200", "service": "cnn", "qps": 200, "job_type": "A", "sm_pct": 80, "usable": False,
         "reasons": ["the run failed: exit code 1"]},
        {"gpu_type": "v100", "service": "transformer", "qps": 50, "job_type": "A", "sm_pct": 50, "norm_tput": 0.6,
         "slowdown_avg": 1.1},
    ]
    doc["caveats"] = ["one repetition per point"]
    return doc


def test_service_points_are_read_with_their_verdicts_and_stay_out_of_the_interference_model() -> None:
    m = parse_document(with_points(), "site.json")
    # The H200 has service points only: no type of the interference model; the V100 keeps its pairs.
    assert sorted(m.types) == ["v100"] and len(m.types["v100"].pairs) == 2
    first, kept_out, failed, v100 = m.service_points
    assert (first.gpu_type, first.service, first.qps, first.job_type, first.sm_pct) == (
        "h200", "cnn", 200.0, "ResNet-18 (batch size 64)", 20.0)
    assert (first.norm_tput, first.slowdown_avg, first.slowdown_p99, first.usable) == (0.26, 1.29, 2.56, True)
    assert first.meta.driver == "580.159.04" and first.row["a_later_field"] == {"x": 1}  # unknown fields are kept
    assert kept_out.usable is False and kept_out.reasons == ("the service was not GPU-bound",)
    assert failed.norm_tput is None and failed.slowdown_avg is None
    assert v100.usable and v100.slowdown_p99 is None and m.caveats == ("one repetition per point",)
    # Written back as read.
    back = parse_document(json.loads(json.dumps(to_document(m))), "again")
    unsourced = lambda ps: [replace(p, meta=replace(p.meta, source="")) for p in ps]  # noqa: E731
    assert unsourced(back.service_points) == unsourced(m.service_points) and back.caveats == m.caveats
    assert [p.row for p in back.service_points] == [p.row for p in m.service_points]
    assert back.types["v100"].pairs == m.types["v100"].pairs


@pytest.mark.parametrize("mutate,message", [
    (_set("service_points/0/usable", "yes"), "site.json: service_points[0].usable: expected true or false, got 'yes'"),
    (_set("service_points/1/reasons", KeyError), "site.json: service_points[1].reasons: required when usable is false "
                                                 "(why the point is kept out)"),
    (_set("service_points/1/reasons", ["ok", ""]), "site.json: service_points[1].reasons: expected a list of "
                                                   "non-empty strings"),
    (_set("service_points/0/norm_tput", KeyError), "site.json: service_points[0].norm_tput: required in a usable "
                                                   "point"),
    (_set("service_points/3/slowdown_avg", None), "site.json: service_points[3].slowdown_avg: required in a usable "
                                                  "point"),
    (_set("service_points/0/sm_pct", 0), "site.json: service_points[0].sm_pct: 0 is outside (0.0, 100.0]"),
    (_set("service_points/0/qps", -1), "site.json: service_points[0].qps: -1 is outside (0.0, 1000000000.0]"),
    (_set("service_points/0/gpu_type", "a100"), "site.json: service_points[0].gpu_type: 'a100' is not described "
                                                "under gpus"),
    (_set("service_points/0/service", ""), "site.json: service_points[0].service: required, a non-empty string"),
    (_set("service_points/0/repetitions", 0), "site.json: service_points[0].repetitions: expected a whole number "
                                              ">= 1, got 0"),
    (_set("service_points/0/service_busy_frac", 1.5), "site.json: service_points[0].service_busy_frac: 1.5 is "
                                                      "outside [0.0, 1.0]"),
    (_set("service_points/0/window_s", "8"), "site.json: service_points[0].window_s: expected a number, got '8'"),
    (_set("service_points/0/baseline", 3), "site.json: service_points[0].baseline: expected a non-empty string"),
    (_set("service_points/0/notes", "one run"), "site.json: service_points[0].notes: expected a list of non-empty "
                                                "strings"),
    (_set("service_points/0/norm_tput", 2.0), "site.json: service_points[0].norm_tput: 2.0 is outside (0.0, 1.5]"),
    (_set("caveats", "few"), "site.json: caveats: expected a list of non-empty strings"),
    (_set("service_points", {}), "site.json: service_points: expected a list"),
])
def test_a_bad_service_point_field_is_one_line_naming_it(mutate, message) -> None:
    doc = with_points()
    mutate(doc)
    with pytest.raises(MeasurementError) as err:
        parse_document(doc, "site.json")
    assert str(err.value) == message


def test_a_points_only_file_installed_changes_no_calibration(tmp_path, monkeypatch) -> None:
    from executors.data.calibration import Calibrator

    doc = with_points()
    doc["gpus"].pop("v100")
    doc["solo"], doc["pairs"] = [], []
    doc["service_points"] = [p for p in doc["service_points"] if p["gpu_type"] == "h200"]
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(doc))
    before = Calibrator(installed())
    monkeypatch.setenv(ENV_VAR, str(path))
    after = Calibrator(installed())
    assert len(after.mset.service_points) == 3 and not before.mset.service_points
    assert after.measured_types() == before.measured_types() == ["k80", "p100"]
    assert after.fingerprint() == before.fingerprint()
    # A later file's service points on a GPU type replace an earlier one's.
    again = after.mset.merged(parse_document({**doc, "service_points": doc["service_points"][:1]}, "later.json"))
    assert [p.job_type for p in again.service_points] == ["ResNet-18 (batch size 64)"]
