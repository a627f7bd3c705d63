/* ---
table: ads.active_users
period: daily
description: >
  DAU, WAU and MAU on the day: distinct active users of the day, of the last 7 days and of the last 30
  days (a 30-day sliding window on the daily active users; the first 29 days of the warehouse have none).
owner: user-data
primary_key: [ds]
depends_on:
  dws.user_active_daily: {range: [-29, 0]}
--- */
SELECT
  '${ds}' AS ds,
  count(DISTINCT CASE WHEN dt = '${ds}' THEN user_id END) AS dau,
  count(DISTINCT CASE WHEN dt >= date_format(date_sub(to_date('${ds}'), 6), 'yyyy-MM-dd') THEN user_id END) AS wau,
  count(DISTINCT user_id) AS mau
FROM dws.user_active_daily
