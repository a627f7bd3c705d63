/* ---
table: ads.retention_d1
period: daily
description: >
  D1 retention on the day: of the users who registered 1 day(s) earlier (the cohort, from the user
  snapshot at T-1), how many are active on the day. Null when the cohort is empty.
owner: user-data
primary_key: [ds]
depends_on:
  dwd.user_snapshot: {set: [-1]}
  dws.user_active_daily: {set: [0]}
--- */
SELECT
  '${ds}' AS ds,
  date_format(date_sub(to_date('${ds}'), 1), 'yyyy-MM-dd') AS cohort_dt,
  count(*) AS cohort_users,
  count(a.user_id) AS retained_users,
  CASE WHEN count(*) > 0 THEN count(a.user_id) / count(*) END AS retention_rate
FROM dwd.user_snapshot AS u
LEFT JOIN dws.user_active_daily AS a ON u.user_id = a.user_id
WHERE u.register_dt = date_format(date_sub(to_date('${ds}'), 1), 'yyyy-MM-dd')
