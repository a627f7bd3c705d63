/* ---
table: ads.daily_gmv
period: daily
description: Gross merchandise value of the day (paid orders created that day), paying users, their share of ordering users, and orders.
owner: trade-data
primary_key: [ds]
sla: {deadline: "09:00"}  # the day D materialized by 09:00 on D+1 (business timezone)
depends_on:
  dws.user_order_daily: {set: [0]}
checks:
  unique: true
  range: {gmv: [0, null], paying_rate: [0, 1]}
  row_count: {min_rows: 1}
  # a warning, not a gate: sales may legitimately jump (a campaign); on-call sees the numbers
  anomaly: {metric: sum(gmv), max_deviation: 0.8, periods: 7, min_periods: 3, blocking: false}
--- */
SELECT
  '${ds}' AS ds,
  CAST(coalesce(sum(paid_amount), 0) AS decimal(18,2)) AS gmv,
  count_if(paid_orders > 0) AS paying_users,
  CAST(coalesce(count_if(paid_orders > 0) / nullif(count(*), 0), 0) AS double) AS paying_rate,
  CAST(coalesce(sum(orders), 0) AS bigint) AS orders
FROM dws.user_order_daily
