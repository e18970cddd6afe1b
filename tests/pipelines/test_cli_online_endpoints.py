"""``muxflow online register --endpoint``: each replica's metrics endpoint, checked before anything is written."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, select

from executors.store import models as m
from tests.pipelines.test_cli import REGISTER, _spare_gpu, assert_usage_error, cluster_url, ok, rows  # noqa: F401


def _urls(url: str) -> dict[int, str | None]:
    return dict(rows(url, select(m.ServiceInstance.gpu_id, m.ServiceInstance.metrics_url)))


def test_endpoints_are_stored_per_replica(cluster_url: str) -> None:  # noqa: F811
    a = _spare_gpu(cluster_url)
    out = ok(cluster_url, *REGISTER, "--gpu-ids", str(a), "--endpoint", "http://10.0.0.7:9100").output
    assert "registered online service search on 1 GPU(s), 1 with a metrics endpoint" in out
    assert _urls(cluster_url)[a] == "http://10.0.0.7:9100/metrics"


def test_several_replicas_name_their_gpu(cluster_url: str) -> None:  # noqa: F811
    engine = create_engine(cluster_url)
    with engine.begin() as conn:  # two more GPUs on the spare node
        node = conn.execute(m.Node.__table__.insert().values(name="spare2", simulated=True)).inserted_primary_key[0]
        ids = [conn.execute(m.Gpu.__table__.insert().values(node_id=node, gpu_index=i, gpu_type="t4",
                                                          uuid=f"GPU-spare2-{i}", health="Init",
                                                          overlimit_entries=[])).inserted_primary_key[0]
               for i in range(2)]
    engine.dispose()
    ok(cluster_url, *REGISTER, "--gpu-ids", f"{ids[0]},{ids[1]}", "--endpoint", f"{ids[1]}=http://n:9101/metrics")
    urls = _urls(cluster_url)
    assert urls[ids[0]] is None and urls[ids[1]] == "http://n:9101/metrics"


@pytest.mark.parametrize("endpoint", ["ftp://x:1/metrics", "localhost:9100", "http://h:70000/metrics",
                                      "999=http://h:1/metrics", "x=http://h:1"])
def test_bad_endpoints_are_refused_and_nothing_is_written(cluster_url: str, endpoint: str) -> None:  # noqa: F811
    gpu = _spare_gpu(cluster_url)
    assert_usage_error(cluster_url, [*REGISTER, "--gpu-ids", str(gpu), "--endpoint", endpoint], r"^error: endpoint: ")
