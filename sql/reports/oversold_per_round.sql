-- title: Oversold GPU per scheduling round
-- description: Per scheduling round: its window, placements and predicted objective, and the realised oversold GPU = sum of solo-equivalent time / sum of wall time over the executions booked to its window, those of jobs its fills started included (docs/DESIGN.md §9; 1 = as fast as on a dedicated GPU, NULL without executions).
--
-- Portable across PostgreSQL and SQLite; window_start_utc is rendered as
-- 'YYYY-MM-DD HH:MM:SS' UTC text (see utilization_per_hour.sql for why the
-- session must run with TimeZone=UTC on PostgreSQL).
SELECT
    r.id AS round_id,
    substr(CAST(r.window_start_utc AS TEXT), 1, 19) AS window_start_utc,
    r.status AS status,
    r.placements AS placements,
    r.objective AS objective,
    r.predicted_oversold AS predicted_oversold,
    COUNT(e.id) AS executions,
    SUM(e.wall_s) AS wall_s,
    SUM(e.solo_equiv_s) AS solo_equiv_s,
    SUM(e.solo_equiv_s) / NULLIF(SUM(e.wall_s), 0) AS oversold_gpu,
    CASE WHEN r.simulated THEN 'simulated' ELSE 'measured' END AS source
FROM scheduling_rounds AS r
LEFT JOIN job_executions AS e ON e.round_id = r.id
WHERE r.seq = 0
GROUP BY r.id, r.window_start_utc, r.status, r.placements, r.objective,
    r.predicted_oversold, r.simulated
ORDER BY r.window_start_utc
