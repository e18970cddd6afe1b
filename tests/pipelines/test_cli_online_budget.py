"""``muxflow online register --slowdown-budget``: stored with the service, refused when negative."""

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


def test_without_a_budget_the_flat_allowance_is_kept(cluster_url: str) -> None:  # noqa: F811
    ok(cluster_url, *REGISTER, "--gpu-ids", str(_spare_gpu(cluster_url)))
    assert _budgets(cluster_url)["search"][1] is None


def test_a_negative_budget_is_refused_and_nothing_is_written(cluster_url: str) -> None:  # noqa: F811
    gpu = _spare_gpu(cluster_url)
    assert_usage_error(cluster_url, [*REGISTER, "--gpu-ids", str(gpu), "--slowdown-budget", "-0.1"],
                       r"^error: slowdown-budget: ")
    assert "search" not in _budgets(cluster_url)


def test_a_budget_not_below_the_allowance_is_kept_with_a_note(cluster_url: str) -> None:  # noqa: F811
    res = ok(cluster_url, *REGISTER, "--gpu-ids", str(_spare_gpu(cluster_url)), "--allowance", "0.2",
             "--slowdown-budget", "0.2")
    assert "every minute gets the allowance" in res.stderr
    assert _budgets(cluster_url)["search"] == (0.2, 0.2)
