/* ---
table: dwd.order_detail
period: daily
description: Cleaned order facts of the day (orders created that local day), one row per order.
owner: trade-data
primary_key: [order_id]
depends_on:
  ods.order: {range: [0, 23]}
# analysts look orders up by learner and course; a day of orders at the example's scale (about 50 MiB of Parquet)
# Z-orders into a dozen files, each spanning a small box of (user_id, course_id) that a lookup skips by its min/max
zorder: {by: [user_id, course_id], file_size: 4MB}
checks:
  unique: true
  not_null: [order_id, user_id, create_time]
  range: {amount: [0, null]}
  row_count: {upstream: ods.order, min_ratio: 0.99, max_ratio: 1.0}
--- */
SELECT
  id AS order_id,
  user_id,
  course_id,
  amount,
  lower(trim(status)) AS status,
  pay_time,
  create_time
FROM ods.order
WHERE id IS NOT NULL AND amount >= 0
