"""The round's rule for several jobs per GPU against the simulated GPU running them together."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from executors.data.calibration import default_catalog
from pipelines.cli import main
from scheduler_core.interference.composition import composition_errors

CATALOG = default_catalog()


def test_the_rule_is_conservative_on_the_catalog() -> None:
    two, three = composition_errors(CATALOG)
    for e in (two, three):
        assert e.cases > 0
        # Its slowdown bound (each job's pair slowdown at the whole share, added up) is almost never below the
        # truth, and then by little: several jobs together can oversubscribe the SMs where none alone does.
        assert e.slowdown_under_frac < 0.01 and e.slowdown_worst_excess < 0.05
        # Co-runners cost throughput (efficiency < 1), less than the round's constant assumes.
        assert 0.75 < e.implied_efficiency < 1.0 and e.tput_bias < 0.0
        assert e.tput_mae == pytest.approx(-e.tput_bias, rel=0.01)  # under almost everywhere
    assert three.tput_mae > two.tput_mae  # the constant's error compounds per co-runner


def test_ignoring_co_runners_promises_more_than_the_jobs_get() -> None:
    (two,) = composition_errors(CATALOG, slots=(2,), corunner_efficiency=1.0)
    assert two.tput_bias > 0.0


def test_cli_prints_the_errors_labelled_simulated() -> None:
    out = CliRunner().invoke(main, ["simulate", "composition", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["simulated"] is True and [e["slots"] for e in doc["errors"]] == [2, 3]
    text = CliRunner().invoke(main, ["simulate", "composition"])
    assert text.exit_code == 0 and text.output.startswith("SIMULATED")
    bad = CliRunner().invoke(main, ["simulate", "composition", "--gpu-type", "v100x"])
    assert bad.exit_code != 0 and "unknown GPU type" in bad.output
