/* ---
table: dwd.course_daily
period: daily
kind: snapshot
description: >
  The courses as they stood at the end of each day (title, grade, price, teacher): yesterday's picture with the
  day's changes applied (the 24 hours of ods.course, a change stream), the newest change per course; a course
  deleted that day is gone. A price as of any past day is one partition away.
owner: teaching-data
primary_key: [course_id]
columns:
  course_id: bigint
  title: string
  subject: string
  grade: tinyint
  price: decimal(10,2)
  teacher_id: bigint
  create_time: timestamp
  update_time: timestamp
depends_on:
  dwd.course_daily: {set: [-1]}
  ods.course: {range: [0, 23]}
checks:
  unique: true
  not_null: [course_id, price]
--- */
SELECT course_id, title, subject, grade, price, teacher_id, create_time, update_time
FROM (
  SELECT *, row_number() OVER (PARTITION BY course_id ORDER BY changed_ms DESC, change_pos DESC) AS newest
  FROM (
    SELECT course_id, title, subject, grade, price, teacher_id, create_time, update_time,
           false AS removed, -1L AS changed_ms, -1L AS change_pos
    FROM dwd.course_daily
    UNION ALL
    SELECT id AS course_id, title, subject, grade, price, teacher_id, create_time, update_time,
           _deleted AS removed, _es AS changed_ms, _pos AS change_pos
    FROM ods.course
  )
)
WHERE newest = 1 AND NOT removed
