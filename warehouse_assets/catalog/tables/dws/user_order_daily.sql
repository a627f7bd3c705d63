/* ---
table: dws.user_order_daily
period: daily
description: Per-user order activity of the day (Set 0 on the order facts).
owner: trade-data
primary_key: [user_id]
depends_on:
  dwd.order_detail: {set: [0]}
checks:
  unique: true
  not_null: [user_id]
  references: {user_id: dwd.order_detail.user_id}
  range: {orders: [1, null], paid_orders: [0, null]}
--- */
SELECT
  user_id,
  count(*) AS orders,
  count_if(status = 'paid') AS paid_orders,
  coalesce(sum(CASE WHEN status = 'paid' THEN amount END), 0) AS paid_amount,
  count_if(status = 'refunded') AS refunded_orders
FROM dwd.order_detail
GROUP BY user_id
