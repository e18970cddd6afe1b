-- title: Placements per scheduling round
-- description: Per scheduling round and each fill after it (fill 0: the round; 1, 2, ...: waiting jobs started on GPUs that freed up between rounds): GPUs considered, pending jobs, placements and how many of them start, keep or migrate a job, evictions dispatched, and the predicted objective (docs/DESIGN.md §3, step 5).
--
-- Portable across PostgreSQL and SQLite. Evictions come from dispatch_log
-- because a plan's evictions have no placement row and action_counts is JSON,
-- which the two dialects query differently.
SELECT
    r.id AS round_id,
    substr(CAST(r.window_start_utc AS TEXT), 1, 19) AS window_start_utc,
    r.seq AS fill,
    r.status AS status,
    r.gpus_considered AS gpus_considered,
    r.jobs_pending AS jobs_pending,
    r.placements AS placements,
    COALESCE(p.starts, 0) AS starts,
    COALESCE(p.keeps, 0) AS keeps,
    COALESCE(p.migrates, 0) AS migrates,
    COALESCE(d.evictions, 0) AS evictions,
    r.objective AS objective,
    CASE WHEN r.simulated THEN 'simulated' ELSE 'measured' END AS source
FROM scheduling_rounds AS r
LEFT JOIN (
    SELECT
        round_id,
        SUM(CASE WHEN action = 'start' THEN 1 ELSE 0 END) AS starts,
        SUM(CASE WHEN action = 'keep' THEN 1 ELSE 0 END) AS keeps,
        SUM(CASE WHEN action = 'migrate' THEN 1 ELSE 0 END) AS migrates
    FROM placements
    GROUP BY round_id
) AS p ON p.round_id = r.id
LEFT JOIN (
    SELECT round_id, COUNT(*) AS evictions
    FROM dispatch_log
    WHERE action = 'evict'
    GROUP BY round_id
) AS d ON d.round_id = r.id
ORDER BY r.window_start_utc, r.seq
