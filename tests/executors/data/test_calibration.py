"""Calibrations of the simulated GPU on the measured Gavel pairs, and a site's measurements joining them."""

from __future__ import annotations

import math

import pytest

from executors.data import calibration as cal
from executors.data.measurements import ENV_VAR, load_file

from .test_measurements import site_file


def test_the_model_transfers_between_the_measured_types() -> None:
    """Leave one GPU type out on real measurements: well below the per-job fit and the constant, and its
    80 % interval, built from the other type's held-out residuals, covers 75-85 % of the pairs."""
    reports = {r.test: r for r in cal.installed_calibrator().transfer_reports()}
    assert set(reports) == {"k80", "p100"}
    for r in reports.values():
        assert r.after.n > 500
        assert r.after.mape <= 0.10, r.as_dict()
        assert r.after.mape < 0.6 * r.before.mape and r.after.mape < 0.6 * r.constant.mape, r.as_dict()
        assert r.zero_shot.mape < r.before.mape, r.as_dict()
        assert 0.75 <= r.after_coverage <= 0.85, r.as_dict()


def test_within_type_error_stays_at_the_per_job_fits_level() -> None:
    for r in cal.installed_calibrator().within_type_reports():
        assert r.refined.n == r.before.n > 50
        assert r.refined.mape <= r.before.mape * 1.05, r.as_dict()


def test_calibrations_and_their_catalogs() -> None:
    assert cal.calibrations() == ["k80", "p100", "optimistic", "transfer", "pessimistic"]
    known = r"\(known: k80, p100, optimistic, transfer, pessimistic\)"
    with pytest.raises(ValueError, match=r"unknown calibration 'v100' " + known):
        cal.catalog_for("v100")
    job = "ResNet-50 (batch size 64)"
    # A per-job fit is the same on every GPU type; the transferable model is not.
    assert cal.catalog_for("p100", "t4").offline[job].traits == cal.catalog_for("p100", "h100").offline[job].traits
    t = {g: cal.catalog_for("transfer", g).offline[job].traits for g in ("k80", "p100", "t4")}
    assert t["k80"] != t["p100"] and t["t4"] != t["p100"]
    # Every job of the reference catalog exists under every calibration (K80 never paired some of them).
    ref = set(cal.default_catalog().offline)
    for name in cal.calibrations():
        assert set(cal.catalog_for(name, "t4").offline) == ref
    # The default is the transferable model, with every type's own catalog one call away.
    d = cal.default_catalog()
    assert d.calibration == "transfer" and d.gpu_type == "p100"
    assert d.for_gpu("T4") == cal.catalog_for("transfer", "t4") and d.for_gpu("no-such-gpu") is d


@pytest.mark.parametrize("gpu_type", ["a100", "p100"])
def test_the_interval_ends_scale_every_trait_by_one_factor(gpu_type: str) -> None:
    """optimistic / pessimistic = transfer with σ and π at the low / high end of the type's 80 % interval:
    the zero-shot interval on a type nobody measured, the measured one, scaled by its probes, on P100."""
    c = cal.installed_calibrator()
    iv, scale = c.interval_for(gpu_type)
    assert (scale is None) == (gpu_type == "a100")
    assert iv is c.intervals()["zero_shot" if gpu_type == "a100" else "after"]
    base = cal.catalog_for("transfer", gpu_type)
    for side in ("optimistic", "pessimistic"):
        f = iv.factor(side, scale)
        assert (f < 1.0) if side == "optimistic" else (f > 1.0)
        moved = cal.catalog_for(side, gpu_type)
        for job, w in base.offline.items():
            assert moved.offline[job].traits.sensitivity == pytest.approx(w.traits.sensitivity * f)
            assert moved.offline[job].traits.pressure == pytest.approx(w.traits.pressure * f)
        for fam, w in base.online.items():
            assert moved.online[fam].sensitivity == pytest.approx(w.sensitivity * f)


def test_synthesized_types_follow_the_nearest_measured_type() -> None:
    """T4 and H100 were never measured: profiles come from the P100 (nearest in speed) by the roofline."""
    c = cal.installed_calibrator()
    t4, p100 = c.type_profiles("t4"), c.type_profiles("p100")
    assert all(p.synthesized for p in t4.jobs.values())
    assert set(t4.jobs) == set(p100.jobs)
    # The T4 is slower than the P100: no job is less GPU-bound there, so no probe shows less contention.
    for job, p in t4.jobs.items():
        if p100.jobs[job].probe_tput is not None and not p100.jobs[job].synthesized:
            assert p.probe_tput <= p100.jobs[job].probe_tput + 1e-12


@pytest.fixture()
def site_measurements(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(site_file(tmp_path)))
    cal.reset()
    yield tmp_path / "v100.json"
    monkeypatch.delenv(ENV_VAR)
    cal.reset()


def test_a_site_file_recalibrates_the_chain_without_code_changes(site_measurements) -> None:
    before_print = cal.Calibrator(load_file(cal.COLOCATION_FILE)).fingerprint()
    c = cal.installed_calibrator()
    assert c.fingerprint() != before_print
    assert cal.calibrations() == ["k80", "p100", "v100", "optimistic", "transfer", "pessimistic"]
    assert cal.default_catalog().for_gpu("v100").calibration == "transfer"
    assert {r.test for r in c.transfer_reports()} == {"k80", "p100", "v100"}
    # Its pairs now shape the v100 traits through per-job residuals.
    assert c.type_offsets("v100") and not c.type_offsets("t4")
    assert math.isfinite(cal.catalog_for("v100", "t4").offline["A3C"].traits.sensitivity)
