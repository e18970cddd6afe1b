-- title: Online latency per day and service
-- description: Per UTC day, online service and data source: the requests its replicas served, their request-weighted mean latency and the same alone, the slowdown over all requests and over the requests of shared minutes (an offline job co-located), beside the service's slowdown allowance and budget; a budget is kept when slowdown_all_requests stays within it. Minutes without a request rate, a latency or a solo latency (labelled gaps) are left out.
--
-- The slowdown is request-weighted: SUM(rate x latency) / SUM(rate x latency alone) - 1, the
-- quantity a slowdown budget bounds (scheduler_core/online/latency_budget.py). Portable across
-- PostgreSQL and SQLite; the day is the first 10 characters of the timestamp's text form (see
-- utilization_per_hour.sql).
SELECT
    substr(CAST(m.minute_utc AS TEXT), 1, 10) AS day_utc,
    svc.name AS service,
    m.source AS source,
    COUNT(*) AS gpu_minutes,
    SUM(m.online_qps) * 60.0 AS requests,
    SUM(m.online_qps * m.online_latency_ms) / NULLIF(SUM(m.online_qps), 0) AS mean_latency_ms,
    SUM(m.online_qps * m.online_solo_latency_ms) / NULLIF(SUM(m.online_qps), 0) AS mean_solo_latency_ms,
    SUM(m.online_qps * m.online_latency_ms) / NULLIF(SUM(m.online_qps * m.online_solo_latency_ms), 0) - 1.0
        AS slowdown_all_requests,
    SUM(CASE WHEN m.offline_job_id IS NOT NULL THEN 1 ELSE 0 END) AS shared_minutes,
    SUM(CASE WHEN m.offline_job_id IS NOT NULL THEN m.online_qps * m.online_latency_ms END)
        / NULLIF(SUM(CASE WHEN m.offline_job_id IS NOT NULL THEN m.online_qps * m.online_solo_latency_ms END), 0)
        - 1.0 AS slowdown_shared_requests,
    svc.slowdown_allowance AS slowdown_allowance,
    svc.slowdown_budget AS slowdown_budget
FROM gpu_metrics_minute AS m
JOIN service_instances AS si ON si.gpu_id = m.gpu_id
JOIN online_services AS svc ON svc.id = si.service_id
WHERE m.online_qps IS NOT NULL AND m.online_latency_ms IS NOT NULL AND m.online_solo_latency_ms IS NOT NULL
GROUP BY substr(CAST(m.minute_utc AS TEXT), 1, 10), svc.name, m.source, svc.slowdown_allowance, svc.slowdown_budget
ORDER BY day_utc, service, source
