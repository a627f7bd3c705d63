/* ---
table: ads.daily_gmv
period: daily
description: Gross merchandise value of the day (paid orders created that day), paying users and orders.
owner: trade-data
primary_key: [ds]
depends_on:
  dws.user_order_daily: {set: [0]}
--- */
SELECT
  '${ds}' AS ds,
  CAST(coalesce(sum(paid_amount), 0) AS decimal(18,2)) AS gmv,
  count_if(paid_orders > 0) AS paying_users,
  CAST(coalesce(sum(orders), 0) AS bigint) AS orders
FROM dws.user_order_daily
