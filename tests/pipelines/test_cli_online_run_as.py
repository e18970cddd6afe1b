"""``muxflow online register --run-as``: the user each replica runs as, refused when it cannot be a user name."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from executors.store import models as m
from tests.pipelines.test_cli import REGISTER, _spare_gpu, assert_usage_error, cluster_url, ok, rows  # noqa: F401


def _users(url: str) -> dict[int, str | None]:
    return dict(rows(url, select(m.ServiceInstance.gpu_id, m.ServiceInstance.run_as_user)))


def _services(url: str) -> int:
    [(n,)] = rows(url, select(func.count()).select_from(m.OnlineService))
    return n


def test_the_replicas_user_is_stored(cluster_url: str) -> None:  # noqa: F811
    gpu = _spare_gpu(cluster_url)
    out = ok(cluster_url, *REGISTER, "--gpu-ids", str(gpu), "--run-as", "svc-search").output
    assert "registered online service search on 1 GPU(s), running as svc-search" in out
    assert _users(cluster_url)[gpu] == "svc-search"


def test_without_run_as_no_user_is_declared(cluster_url: str) -> None:  # noqa: F811
    gpu = _spare_gpu(cluster_url)
    ok(cluster_url, *REGISTER, "--gpu-ids", str(gpu))
    assert _users(cluster_url)[gpu] is None


@pytest.mark.parametrize("user", ["", "two words", "1234", "-x", "a:b", "x" * 65])
def test_a_name_that_cannot_be_a_user_is_refused_and_nothing_is_written(cluster_url: str, user: str) -> None:  # noqa: F811
    gpu = _spare_gpu(cluster_url)
    before = _services(cluster_url)
    assert_usage_error(cluster_url, [*REGISTER, "--gpu-ids", str(gpu), "--run-as", user], r"^error: run-as: ")
    assert _services(cluster_url) == before
