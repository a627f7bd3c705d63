/* ---
table: dws.course_attendance_weekly
period: weekly
description: Attendance per course over an ISO week (Monday to Sunday, the 7 days of the attendance facts).
owner: teaching-data
primary_key: [course_id]
depends_on:
  dwd.attendance_detail: {range: [0, 6]}
--- */
SELECT
  course_id,
  count(*) AS sessions,
  count_if(attended) AS attended_sessions,
  count(DISTINCT user_id) AS learners,
  count(DISTINCT lesson_id) AS lessons,
  CAST(sum(duration_sec) AS bigint) AS learning_seconds,
  count(DISTINCT dt) AS days_with_sessions
FROM dwd.attendance_detail
GROUP BY course_id
