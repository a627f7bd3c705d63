/* ---
table: ads.gmv_week_to_date
period: daily
kind: cumulative
resets: weekly  # Monday starts afresh: Monday, Monday + Tuesday, ..., the whole week on Sunday
description: >-
  GMV and orders of the week so far: each day adds its own figures to the day before's, and each Monday
  starts a new week (it reads nothing of the Sunday before).
owner: bi
# a dashboard figure: rebuilt whole (it reads its own day before), it would show a refund two days late under
# the default; it reads two one-row days, so every 15 minutes costs nothing
late_data: {whole: every 15m}
primary_key: [ds]
columns:
  ds: string
  week_gmv: decimal(18,2)
  week_orders: bigint
  days: int
depends_on:
  ads.gmv_week_to_date: {set: [-1]}
  ads.daily_gmv: {set: [0]}
checks:
  unique: true
  range: {week_gmv: [0, null], days: [1, 7]}
--- */
SELECT
  '${ds}' AS ds,
  CAST(coalesce(w.week_gmv, 0) + d.gmv AS decimal(18,2)) AS week_gmv,
  coalesce(w.week_orders, 0) + d.orders AS week_orders,
  CAST(coalesce(w.days, 0) + 1 AS int) AS days
FROM ads.daily_gmv AS d
LEFT JOIN ads.gmv_week_to_date AS w ON true
