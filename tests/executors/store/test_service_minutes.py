"""A budget's pacing reads each service-minute of its replicas, summed in the database, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt

import pytest

from executors.store import models as m
from executors.store.db import Store
from executors.store.summary import service_minutes
from tests.executors.store.test_reports import _three_gpus

T0 = dt.datetime(2026, 3, 2, 8, 0, tzinfo=dt.timezone.utc)


def _minute(gpu: int, k: int, qps: float | None, lat: float | None, solo: float | None, job: int | None):
    return m.GpuMetricMinute(gpu_id=gpu, minute_utc=T0 + dt.timedelta(minutes=k), gpu_util_pct=50.0,
                             sm_activity_pct=40.0, sm_occupancy_pct=30.0, mem_used_bytes=1e9, mem_total_bytes=16e9,
                             sm_clock_mhz=1400.0, online_qps=qps, online_latency_ms=lat, online_solo_latency_ms=solo,
                             offline_job_id=job, source="measured", health="Healthy")


def test_each_service_minute_weighs_its_replicas_requests_and_only_an_offline_job_makes_them_spend(
        store: Store) -> None:
    with store.session() as s:
        gpus = _three_gpus(s, m.GpuType(name="T4", sm_count=40, memory_bytes=16 << 30, max_sm_clock_mhz=1590))
        svc = m.OnlineService(name="svc", model_family="cnn", qps_min=1, qps_max=50, latency_slo_ms=100,
                              mem_bytes=1 << 30)
        other = m.OnlineService(name="other", model_family="cnn", qps_min=1, qps_max=50, latency_slo_ms=100,
                                mem_bytes=1 << 30)
        job = m.OfflineJob(name="j", job_type="resnet50", command="train", mem_bytes=1 << 30,
                           allowed_gpu_types=["T4"], checkpoint_dir="/ckpt", total_steps=100)
        s.add_all(gpus + [svc, other, job])
        s.flush()
        a, b, c = (g.id for g in gpus)
        s.add_all([m.ServiceInstance(service_id=svc.id, gpu_id=a), m.ServiceInstance(service_id=svc.id, gpu_id=b),
                   m.ServiceInstance(service_id=other.id, gpu_id=c)])
        s.add_all([
            # minute 0: replica a shared (+50 %, 10 requests/s), replica b alone (slower than its model: spends 0)
            _minute(a, 0, 10.0, 12.0, 8.0, job.id), _minute(b, 0, 30.0, 9.0, 8.0, None),
            # minute 1: a shared but faster than alone (spends 0); b shared with no latency (spends 0)
            _minute(a, 1, 10.0, 7.0, 8.0, job.id), _minute(b, 1, 10.0, None, 8.0, job.id),
            # minute 2: no requests on a, no latency alone on b: no weight, not a minute of requests
            _minute(a, 2, 0.0, 12.0, 8.0, job.id), _minute(b, 2, 10.0, 12.0, None, job.id),
            # the other service, and a minute outside the window
            _minute(c, 0, 5.0, 16.0, 8.0, job.id), _minute(a, 9, 10.0, 80.0, 8.0, job.id),
        ])
    with store.session() as s:
        got = service_minutes(s, T0, T0 + dt.timedelta(minutes=5))
    slow, weight, stamps, counts = got["svc"]
    assert stamps == [T0, T0 + dt.timedelta(minutes=1)] and list(counts) == [2, 2]
    # minute 0: (12 − 8) × 10 spent over 10 × 8 + 30 × 8 of weight
    assert slow == pytest.approx([1.0 + 40.0 / 320.0, 1.0]) and weight == pytest.approx([320.0, 160.0])
    slow, weight, stamps, counts = got["other"]
    assert slow == pytest.approx([2.0]) and weight == pytest.approx([40.0]) and list(counts) == [1]
