/* ---
table: ads.lesson_catalog
period: daily
description: >-
  Lessons scheduled per course, from the freshest lesson snapshot of the last three days: the catalogue page
  needs a recent picture, not the day's own, so any one of the three daily snapshots lets the day run (and
  a newer one arriving later rebuilds it).
owner: teaching-data
primary_key: [course_id]
depends_on:
  dwd.lesson_snapshot: {range: [-2, 0], mode: any}
checks:
  unique: true
  not_null: [course_id]
--- */
SELECT
  course_id,
  count(*) AS lessons,
  max(dt) AS snapshot_of
FROM dwd.lesson_snapshot
WHERE dt = (SELECT max(dt) FROM dwd.lesson_snapshot)
GROUP BY course_id
