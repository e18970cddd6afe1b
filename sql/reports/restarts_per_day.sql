-- title: Restarts per day
-- description: Per UTC day and data source: the offline jobs the rounds placed (start, keep or migrate) and the restarts the rounds caused them: moves to another GPU and new shares on their own GPU (MPS fixes a job's share when it starts, so either restarts the job from its checkpoint), in all, per job placed, and for the most restarted job. A KEEP costs nothing and is not a restart; evictions are in evictions_per_day; one job's own moves: muxflow jobs show.
--
-- Portable across PostgreSQL and SQLite (window functions: SQLite 3.25+). A
-- migration is a move when the job's previous placement (by round window,
-- then fill) was on another GPU, a new share when it was on the same GPU.
WITH placed AS (
    SELECT
        p.job_id AS job_id,
        p.gpu_id AS gpu_id,
        p.action AS action,
        substr(CAST(r.window_start_utc AS TEXT), 1, 10) AS day_utc,
        CASE WHEN r.simulated THEN 'simulated' ELSE 'measured' END AS source,
        LAG(p.gpu_id) OVER (PARTITION BY p.job_id ORDER BY r.window_start_utc, r.seq, r.id) AS previous_gpu
    FROM placements AS p
    JOIN scheduling_rounds AS r ON r.id = p.round_id
),
per_job AS (
    SELECT
        day_utc,
        source,
        job_id,
        SUM(CASE WHEN action = 'migrate' AND (previous_gpu IS NULL OR previous_gpu <> gpu_id)
            THEN 1 ELSE 0 END) AS moves,
        SUM(CASE WHEN action = 'migrate' AND previous_gpu = gpu_id THEN 1 ELSE 0 END) AS new_shares
    FROM placed
    GROUP BY day_utc, source, job_id
)
SELECT
    day_utc,
    source,
    COUNT(*) AS jobs_placed,
    SUM(moves + new_shares) AS restarts,
    SUM(moves) AS moves,
    SUM(new_shares) AS new_shares,
    CAST(SUM(moves + new_shares) AS DOUBLE PRECISION) / COUNT(*) AS restarts_per_job,
    MAX(moves + new_shares) AS most_restarts_of_a_job
FROM per_job
GROUP BY day_utc, source
ORDER BY day_utc, source
