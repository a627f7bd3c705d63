/* ---
table: dws.order_hourly
period: hourly
description: Orders created in the hour per course (hourly Set 0 on ODS), for campaign monitoring.
owner: trade-data
late_data: {rebuild: every 15m, lookback: 1d}  # campaign hours: late orders show within 15 minutes
primary_key: [course_id]
depends_on:
  ods.order: {set: [0]}
--- */
SELECT
  course_id,
  count(*) AS orders,
  count_if(lower(trim(status)) = 'paid') AS paid_orders,
  CAST(coalesce(sum(CASE WHEN lower(trim(status)) = 'paid' THEN amount END), 0) AS decimal(18,2)) AS paid_amount,
  count(DISTINCT user_id) AS buyers
FROM ods.order
WHERE id IS NOT NULL AND amount >= 0
GROUP BY course_id
