/* ---
table: ads.gmv_vs_month
period: daily
description: >-
  The day's GMV against the average day of the latest month reported: a month's report is built after the
  month ends, so the first days of a month compare with the month before last until the last month's report
  lands, and are then built again once.
owner: bi
# a dashboard figure: rebuilt whole (a join on no key), it would show a refund two days late under the
# default; it reads one row of ads.daily_gmv and a month's report, so every 15 minutes costs nothing
late_data: {whole: every 15m}
primary_key: [ds]
depends_on:
  ads.daily_gmv: {set: [0]}
  ads.monthly_report: {latest: true}  # the most recent month built, of the month holding the day and the two before
checks:
  unique: true
  not_null: [month]
--- */
WITH month AS (
  SELECT month, gmv / day(last_day(to_date(concat(month, '-01')))) AS avg_daily_gmv
  FROM ads.monthly_report
)
SELECT
  d.ds,
  d.gmv,
  m.month,
  CAST(m.avg_daily_gmv AS decimal(18,2)) AS month_avg_daily_gmv,
  CAST(d.gmv / nullif(m.avg_daily_gmv, 0) AS double) AS vs_month
FROM ads.daily_gmv AS d
CROSS JOIN month AS m
