-- title: GPU utilization per hour
-- description: Per UTC hour and data source: GPU-minutes, average GPU utilization, SM activity and memory used (% of total) over all minutes, and split into shared minutes (an offline job co-located) and online-only minutes (docs/DESIGN.md §9, cluster metrics).
--
-- Portable across PostgreSQL and SQLite. The hour is the first 13 characters
-- of the timestamp's text form ('YYYY-MM-DD HH', shown with ':00'): SQLite
-- stores UTC text, and PostgreSQL renders timestamptz the same way when the
-- session runs with TimeZone=UTC and DateStyle=ISO, which
-- executors.store.reports sets (in psql: SET TIME ZONE 'UTC').
SELECT
    substr(CAST(m.minute_utc AS TEXT), 1, 13) || ':00' AS hour_utc,
    m.source AS source,
    COUNT(*) AS gpu_minutes,
    AVG(m.gpu_util_pct) AS gpu_util_pct,
    AVG(m.sm_activity_pct) AS sm_activity_pct,
    AVG(m.mem_used_bytes * 100.0 / NULLIF(m.mem_total_bytes, 0)) AS mem_used_pct,
    SUM(CASE WHEN m.offline_job_id IS NOT NULL THEN 1 ELSE 0 END) AS shared_minutes,
    AVG(CASE WHEN m.offline_job_id IS NOT NULL THEN m.gpu_util_pct END) AS shared_gpu_util_pct,
    AVG(CASE WHEN m.offline_job_id IS NOT NULL THEN m.sm_activity_pct END) AS shared_sm_activity_pct,
    AVG(CASE WHEN m.offline_job_id IS NOT NULL
        THEN m.mem_used_bytes * 100.0 / NULLIF(m.mem_total_bytes, 0) END) AS shared_mem_used_pct,
    SUM(CASE WHEN m.offline_job_id IS NULL THEN 1 ELSE 0 END) AS online_only_minutes,
    AVG(CASE WHEN m.offline_job_id IS NULL THEN m.gpu_util_pct END) AS online_only_gpu_util_pct,
    AVG(CASE WHEN m.offline_job_id IS NULL THEN m.sm_activity_pct END) AS online_only_sm_activity_pct,
    AVG(CASE WHEN m.offline_job_id IS NULL
        THEN m.mem_used_bytes * 100.0 / NULLIF(m.mem_total_bytes, 0) END) AS online_only_mem_used_pct
FROM gpu_metrics_minute AS m
GROUP BY substr(CAST(m.minute_utc AS TEXT), 1, 13), m.source
ORDER BY hour_utc, source
