-- title: Evictions per day
-- description: Per UTC day and data source: evictions, distinct jobs and GPUs affected, offline executions started that day, and the eviction rate = evictions / executions started (NULL on days without executions; the paper reports 1.5%, docs/DESIGN.md §9).
--
-- Portable across PostgreSQL and SQLite: days are the first 10 characters of
-- the UTC timestamp text (see utilization_per_hour.sql). Days come from both
-- tables, so a day with executions and no eviction shows a rate of 0.
WITH eviction_days AS (
    SELECT
        substr(CAST(v.at_utc AS TEXT), 1, 10) AS day_utc,
        v.source AS source,
        COUNT(*) AS evictions,
        COUNT(DISTINCT v.job_id) AS jobs_evicted,
        COUNT(DISTINCT v.gpu_id) AS gpus_affected
    FROM evictions AS v
    GROUP BY substr(CAST(v.at_utc AS TEXT), 1, 10), v.source
),
execution_days AS (
    SELECT
        substr(CAST(x.start_utc AS TEXT), 1, 10) AS day_utc,
        x.source AS source,
        COUNT(*) AS executions_started
    FROM job_executions AS x
    GROUP BY substr(CAST(x.start_utc AS TEXT), 1, 10), x.source
),
days AS (
    SELECT day_utc, source FROM eviction_days
    UNION
    SELECT day_utc, source FROM execution_days
)
SELECT
    d.day_utc AS day_utc,
    d.source AS source,
    COALESCE(v.evictions, 0) AS evictions,
    COALESCE(v.jobs_evicted, 0) AS jobs_evicted,
    COALESCE(v.gpus_affected, 0) AS gpus_affected,
    COALESCE(x.executions_started, 0) AS executions_started,
    CASE WHEN COALESCE(x.executions_started, 0) = 0 THEN NULL
        ELSE CAST(COALESCE(v.evictions, 0) AS DOUBLE PRECISION) / x.executions_started
    END AS eviction_rate
FROM days AS d
LEFT JOIN eviction_days AS v ON v.day_utc = d.day_utc AND v.source = d.source
LEFT JOIN execution_days AS x ON x.day_utc = d.day_utc AND x.source = d.source
ORDER BY d.day_utc, d.source
