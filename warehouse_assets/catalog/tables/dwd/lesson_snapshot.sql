/* ---
table: dwd.lesson_snapshot
period: daily
description: >
  Daily lesson dimension snapshot: every lesson created up to the end of the day with its schedule,
  one row per lesson. Yesterday's snapshot (self-dependency on T-1) plus the day's new lessons (the 24
  hours of ods.lesson, partitioned by creation hour), with the schedule ODS held when that day was built.
owner: teaching-data
primary_key: [lesson_id]
columns:
  lesson_id: bigint
  course_id: bigint
  start_time: timestamp
  end_time: timestamp
  create_time: timestamp
depends_on:
  dwd.lesson_snapshot: {set: [-1]}
  ods.lesson: {range: [0, 23]}
--- */
SELECT lesson_id, course_id, start_time, end_time, create_time
FROM dwd.lesson_snapshot
UNION ALL
SELECT id AS lesson_id, course_id, start_time, end_time, create_time
FROM ods.lesson
WHERE id IS NOT NULL
