/* ---
table: dws.user_learning_daily
period: daily
description: Per-user learning of the day (Set 0 on the attendance facts) — sessions, attended sessions, lessons, seconds.
owner: teaching-data
primary_key: [user_id]
depends_on:
  dwd.attendance_detail: {set: [0]}
--- */
SELECT
  user_id,
  count(*) AS sessions,
  count_if(attended) AS attended_sessions,
  count(DISTINCT lesson_id) AS lessons,
  CAST(sum(duration_sec) AS bigint) AS learning_seconds
FROM dwd.attendance_detail
GROUP BY user_id
