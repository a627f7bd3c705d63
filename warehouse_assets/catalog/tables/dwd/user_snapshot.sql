/* ---
table: dwd.user_snapshot
period: daily
description: >
  Daily user dimension snapshot: every user registered up to the end of the day, one row per user.
  Built as yesterday's snapshot (self-dependency on T-1) plus the day's registrations (the 24 hours of
  ods.user, which is partitioned by registration hour). A user carries the attributes ODS held when its
  registration day was built; users deleted at the source by then are absent. The first partition of the
  warehouse starts from an empty T-1.
owner: user-data
primary_key: [user_id]
columns:
  user_id: bigint
  city: string
  grade: tinyint
  channel: string
  register_time: timestamp
  register_dt: string
depends_on:
  dwd.user_snapshot: {set: [-1]}
  ods.user: {range: [0, 23]}
--- */
SELECT user_id, city, grade, channel, register_time, register_dt
FROM dwd.user_snapshot
UNION ALL
SELECT
  id AS user_id,
  city,
  grade,
  channel,
  create_time AS register_time,
  date_format(create_time, 'yyyy-MM-dd') AS register_dt
FROM ods.user
WHERE id IS NOT NULL
