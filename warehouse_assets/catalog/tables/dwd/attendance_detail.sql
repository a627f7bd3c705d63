/* ---
table: dwd.attendance_detail
period: daily
description: >
  Cleaned attendance facts of the day (sessions joined that local day), one row per session, with the
  lesson's schedule. A session counts as attended (到课) when the user stayed at least half of the
  lesson's scheduled length; a session still open (no leave time yet) has lasted 0 seconds.
owner: teaching-data
primary_key: [attendance_id]
# analysts look a learner's attendance of a course up; 4 MiB files split a day's partition into enough files
# for that lookup to skip most of them
zorder: {by: [user_id, course_id], file_size: 4MB}
depends_on:
  ods.attendance: {range: [0, 23]}
  dwd.lesson_snapshot: {set: [0]}
--- */
SELECT
  a.id AS attendance_id,
  a.user_id,
  a.lesson_id,
  a.course_id,
  a.join_time,
  a.leave_time,
  CAST(coalesce(a.duration_sec, 0) AS int) AS duration_sec,
  l.start_time AS lesson_start,
  l.end_time AS lesson_end,
  CAST(unix_timestamp(l.end_time) - unix_timestamp(l.start_time) AS int) AS lesson_seconds,
  coalesce(coalesce(a.duration_sec, 0) * 2 >= unix_timestamp(l.end_time) - unix_timestamp(l.start_time), false)
    AS attended
FROM ods.attendance AS a
LEFT JOIN dwd.lesson_snapshot AS l ON a.lesson_id = l.lesson_id
WHERE a.id IS NOT NULL AND a.user_id IS NOT NULL
