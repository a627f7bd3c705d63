/* ---
table: dws.user_learning_cumulative
period: daily
description: >
  Cumulative-to-date learning per user: yesterday's totals (self-dependency on T-1) plus the day's
  learning. One row per user who ever learned; days of a self-dependent table run in order, a backfill
  in one run.
owner: teaching-data
primary_key: [user_id]
columns:
  user_id: bigint
  total_sessions: bigint
  total_attended_sessions: bigint
  total_learning_seconds: bigint
  learning_days: int
  first_learning_dt: string
  last_learning_dt: string
depends_on:
  dws.user_learning_cumulative: {set: [-1]}
  dws.user_learning_daily: {set: [0]}
--- */
SELECT
  coalesce(d.user_id, c.user_id) AS user_id,
  coalesce(c.total_sessions, 0) + coalesce(d.sessions, 0) AS total_sessions,
  coalesce(c.total_attended_sessions, 0) + coalesce(d.attended_sessions, 0) AS total_attended_sessions,
  coalesce(c.total_learning_seconds, 0) + coalesce(d.learning_seconds, 0) AS total_learning_seconds,
  CAST(coalesce(c.learning_days, 0) + CASE WHEN d.user_id IS NULL THEN 0 ELSE 1 END AS int) AS learning_days,
  coalesce(c.first_learning_dt, '${ds}') AS first_learning_dt,
  CASE WHEN d.user_id IS NULL THEN c.last_learning_dt ELSE '${ds}' END AS last_learning_dt
FROM dws.user_learning_cumulative AS c
FULL OUTER JOIN dws.user_learning_daily AS d ON c.user_id = d.user_id
