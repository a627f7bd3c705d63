/* ---
table: dws.revenue_usd_daily
period: daily
description: >-
  Paid revenue of the day in CNY and in USD. Estimated as soon as the day's orders are in, with the previous
  day's CNY→USD rate; completed, and built again once, when the finance system's rate for the day arrives.
  The state each day reached is in its materialization (state) and in `warehouse why`.
owner: finance-data
# the morning flash (ads.revenue_flash) reads it: rebuilt whole (it passes through states), it would take a
# refund to the flash two days late under the default; a day's sum over its users is cheap to read again
late_data: {whole: every 60m}
primary_key: [ds]
depends_on:
  dws.user_order_daily: {set: [0]}
  ext.fx_rate: {range: [-1, 0]}
states:
  estimated: {ext.fx_rate: {set: [-1]}}   # the previous day's rate
  completed: {ext.fx_rate: {set: [0]}}    # the day's own
checks:
  unique: true
  range: {revenue_cny: [0, null]}
--- */
SELECT
  '${ds}' AS ds,
  CAST(coalesce(sum(o.paid_amount), 0) AS decimal(18,2)) AS revenue_cny,
  CAST(coalesce(sum(o.paid_amount), 0) * max(r.rate) AS decimal(18,2)) AS revenue_usd,
  max(r.rate) AS cny_usd_rate,
  max(r.dt) AS rate_of
FROM dws.user_order_daily o
CROSS JOIN (SELECT rate, dt FROM ext.fx_rate WHERE currency = 'CNY' AND quote = 'USD') r
