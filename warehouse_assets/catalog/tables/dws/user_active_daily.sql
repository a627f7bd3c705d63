/* ---
table: dws.user_active_daily
period: daily
description: The users active on the day — who joined a lesson or placed an order — one row per user.
owner: user-data
primary_key: [user_id]
depends_on:
  dwd.attendance_detail: {set: [0]}
  dwd.order_detail: {set: [0]}
--- */
SELECT user_id, bool_or(learned) AS learned, bool_or(ordered) AS ordered
FROM (
  SELECT user_id, true AS learned, false AS ordered FROM dwd.attendance_detail
  UNION ALL
  SELECT user_id, false AS learned, true AS ordered FROM dwd.order_detail
) AS activity
WHERE user_id IS NOT NULL
GROUP BY user_id
