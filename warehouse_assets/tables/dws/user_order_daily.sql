/* ---
table: dws.user_order_daily
period: daily
description: Per-user order activity of the day (Set 0 on the order facts).
owner: trade-data
primary_key: [user_id]
depends_on:
  dwd.order_detail: {set: [0]}
--- */
SELECT
  user_id,
  count(*) AS orders,
  count_if(status = 'paid') AS paid_orders,
  coalesce(sum(CASE WHEN status = 'paid' THEN amount END), 0) AS paid_amount,
  count_if(status = 'refunded') AS refunded_orders
FROM dwd.order_detail
GROUP BY user_id
