/* ---
table: ads.monthly_report
period: monthly
description: >
  The month in figures, from all of its days (the default daily-to-monthly roll-up): GMV, orders, paying
  users, ARPPU, monthly active users and learners, average DAU
  (active user-days / days of the month).
owner: bi
late_data: {rebuild: daily 06:00, lookback: 7d}  # a closed month's report is rebuilt once a night, not hourly
primary_key: [month]
--- */
WITH trade AS (
  SELECT
    CAST(coalesce(sum(paid_amount), 0) AS decimal(18,2)) AS gmv,
    CAST(coalesce(sum(orders), 0) AS bigint) AS orders,
    CAST(coalesce(sum(paid_orders), 0) AS bigint) AS paid_orders,
    count(DISTINCT CASE WHEN paid_orders > 0 THEN user_id END) AS paying_users
  FROM dws.user_order_daily
),
activity AS (
  SELECT
    count(DISTINCT user_id) AS active_users,
    count(DISTINCT CASE WHEN learned THEN user_id END) AS learners,
    count(*) AS active_user_days
  FROM dws.user_active_daily
)
SELECT
  substr('${ds}', 1, 7) AS month,
  t.gmv,
  t.orders,
  t.paid_orders,
  t.paying_users,
  CAST(CASE WHEN t.paying_users > 0 THEN t.gmv / t.paying_users END AS decimal(18,2)) AS arppu,
  a.active_users,
  a.learners,
  a.active_user_days / datediff(to_date('${end}'), to_date('${start}')) AS avg_dau
FROM trade AS t
CROSS JOIN activity AS a
