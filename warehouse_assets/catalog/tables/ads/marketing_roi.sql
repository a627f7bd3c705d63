/* ---
table: ads.marketing_roi
period: daily
description: >-
  Return on the ad partner's spend of the day: paid GMV of the day over the day's marketing spend (both CNY),
  with impressions, clicks and cost per paying user. Waits for the partner's delivery (external) and the GMV.
owner: marketing-data
# a dashboard figure: rebuilt whole (the partner's spend has no change feed), it would show a refund two
# days late under the default; it reads one row of each input, so every 15 minutes costs nothing
late_data: {whole: every 15m}
primary_key: [ds]
sla: {deadline: "09:00"}  # the day D materialized by 09:00 on D+1 (business timezone)
depends_on:
  ext.marketing_spend: {set: [0]}
  ads.daily_gmv: {set: [0]}
--- */
WITH spend AS (
  SELECT
    CAST(coalesce(sum(spend), 0) AS decimal(18,2)) AS spend,
    CAST(coalesce(sum(impressions), 0) AS bigint) AS impressions,
    CAST(coalesce(sum(clicks), 0) AS bigint) AS clicks,
    count(DISTINCT channel) AS channels
  FROM ext.marketing_spend
),
gmv AS (
  SELECT gmv, paying_users FROM ads.daily_gmv
)
SELECT
  '${ds}' AS ds,
  spend.spend,
  spend.impressions,
  spend.clicks,
  spend.channels,
  CAST(coalesce(gmv.gmv, 0) AS decimal(18,2)) AS gmv,
  CAST(coalesce(gmv.paying_users, 0) AS bigint) AS paying_users,
  CAST(CASE WHEN spend.spend > 0 THEN coalesce(gmv.gmv, 0) / spend.spend END AS decimal(18,4)) AS roi,
  CAST(CASE WHEN gmv.paying_users > 0 THEN spend.spend / gmv.paying_users END AS decimal(18,2)) AS cost_per_paying_user
FROM spend LEFT JOIN gmv ON true
