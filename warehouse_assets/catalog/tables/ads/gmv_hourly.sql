/* ---
table: ads.gmv_hourly
period: hourly
description: GMV of the hour (paid orders created in the hour) for campaign dashboards.
owner: trade-data
late_data: {rebuild: every 15m, lookback: 1d}  # campaign hours: late orders show within 15 minutes
primary_key: [hour_start]
depends_on:
  dws.order_hourly: {set: [0]}
--- */
SELECT
  '${start}' AS hour_start,
  CAST(coalesce(sum(paid_amount), 0) AS decimal(18,2)) AS gmv,
  CAST(coalesce(sum(paid_orders), 0) AS bigint) AS paid_orders,
  CAST(coalesce(sum(orders), 0) AS bigint) AS orders
FROM dws.order_hourly
