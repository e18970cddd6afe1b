"""The measured co-location sample format: reading, validation, conversion, installation."""

from __future__ import annotations

import copy
import hashlib
import json
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
