/* ---
table: ads.attendance_rate_daily
period: daily
description: >
  Attendance rate (到课率) of the day: attended sessions / sessions joined (a session is attended when the
  user stayed at least half of the lesson). Null on a day without sessions.
owner: teaching-data
primary_key: [ds]
depends_on:
  dws.user_learning_daily: {set: [0]}
--- */
SELECT
  '${ds}' AS ds,
  CAST(coalesce(sum(sessions), 0) AS bigint) AS sessions,
  CAST(coalesce(sum(attended_sessions), 0) AS bigint) AS attended_sessions,
  count(*) AS learners,
  count_if(attended_sessions > 0) AS attending_learners,
  CASE WHEN sum(sessions) > 0 THEN sum(attended_sessions) / sum(sessions) END AS attendance_rate
FROM dws.user_learning_daily
