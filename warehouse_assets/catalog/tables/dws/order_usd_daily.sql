/* ---
table: dws.order_usd_daily
period: daily
description: >-
  Order amounts of the day per status in CNY and in USD, converted with that day's CNY→USD rate from the
  finance system (external fx_rate, Set 0: the day's own rate, never a neighbour's).
owner: finance-data
primary_key: [status]
depends_on:
  dwd.order_detail: {set: [0]}
  ext.fx_rate: {set: [0]}
--- */
WITH rate AS (
  SELECT rate FROM ext.fx_rate WHERE currency = 'CNY' AND quote = 'USD'
)
SELECT
  o.status,
  count(*) AS orders,
  CAST(sum(o.amount) AS decimal(18,2)) AS amount_cny,
  CAST(sum(o.amount) * max(r.rate) AS decimal(18,2)) AS amount_usd,
  max(r.rate) AS cny_usd_rate
FROM dwd.order_detail o CROSS JOIN rate r
GROUP BY o.status
