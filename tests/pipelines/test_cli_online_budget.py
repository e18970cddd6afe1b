"""``muxflow online register --slowdown-budget``: stored with the service (0.1 unless told), 'none' for the flat
rule, refused when not a number > 0."""

from __future__ import annotations

from sqlalchemy import select

from executors.store import models as m
from tests.pipelines.test_cli import REGISTER, _spare_gpu, assert_usage_error, cluster_url, ok, rows  # noqa: F401


def _budgets(url: str) -> dict[str, tuple[float, float | None]]:
    return {n: (a, b) for n, a, b in rows(url, select(m.OnlineService.name, m.OnlineService.slowdown_allowance,
                                                       m.OnlineService.slowdown_budget))}


def test_the_budget_is_stored_beside_the_allowance_it_is_capped_by(cluster_url: str) -> None:  # noqa: F811
    gpu = _spare_gpu(cluster_url)
    out = ok(cluster_url, *REGISTER, "--gpu-ids", str(gpu), "--allowance", "0.3", "--slowdown-budget", "0.1").output
    assert "slowdown budget 0.1 (each minute within 0.3)" in out
    assert _budgets(cluster_url)["search"] == (0.3, 0.1)


def test_by_default_a_service_has_a_budget_of_a_tenth_under_an_allowance_of_a_quarter(cluster_url: str) -> None:  # noqa: F811
    out = ok(cluster_url, *REGISTER, "--gpu-ids", str(_spare_gpu(cluster_url))).output
    assert "slowdown budget 0.1 (each minute within 0.25)" in out
    assert _budgets(cluster_url)["search"] == (0.25, 0.1)


def test_with_no_budget_the_flat_allowance_is_kept(cluster_url: str) -> None:  # noqa: F811
    out = ok(cluster_url, *REGISTER, "--gpu-ids", str(_spare_gpu(cluster_url)), "--slowdown-budget", "none").output
    assert "slowdown budget" not in out
    assert _budgets(cluster_url)["search"] == (0.25, None)


def test_a_budget_that_is_not_a_number_over_0_is_refused_and_nothing_is_written(cluster_url: str) -> None:  # noqa: F811
    gpu = _spare_gpu(cluster_url)
    for bad in ("-0.1", "0", "nan", "inf", "lots"):
        assert_usage_error(cluster_url, [*REGISTER, "--gpu-ids", str(gpu), "--slowdown-budget", bad],
                           r"^error: slowdown-budget: .* is not a number > 0 or 'none'")
    assert "search" not in _budgets(cluster_url)


def test_a_budget_not_below_the_allowance_is_kept_with_a_note(cluster_url: str) -> None:  # noqa: F811
    res = ok(cluster_url, *REGISTER, "--gpu-ids", str(_spare_gpu(cluster_url)), "--allowance", "0.2",
             "--slowdown-budget", "0.2")
    assert "every minute gets the allowance" in res.stderr
    assert _budgets(cluster_url)["search"] == (0.2, 0.2)
