/* ---
table: ads.gmv_usd_daily
period: daily
description: >-
  The day's GMV in CNY and in USD for the finance morning report. The report goes out at 10:00 on D+1
  whether or not the finance system's rate for D has arrived: past the deadline it is built without the
  rate (amount_usd null, marked degraded) and built again, whole, when the rate arrives.
owner: finance-data
# the finance report's figure: rebuilt whole (a join on no key), it would show a refund two days late under the
# default; it reads one row of ads.daily_gmv, so every 15 minutes costs nothing
late_data: {whole: every 15m}
primary_key: [ds]
depends_on:
  ads.daily_gmv: {set: [0]}
  ext.fx_rate: {set: [0], mode: deadline, deadline: "10:00"}
checks:
  unique: true
  range: {gmv: [0, null]}
--- */
SELECT
  g.ds,
  g.gmv,
  CAST(g.gmv * r.rate AS decimal(18,2)) AS gmv_usd,
  r.rate AS cny_usd_rate
FROM ads.daily_gmv g
LEFT JOIN (SELECT rate FROM ext.fx_rate WHERE currency = 'CNY' AND quote = 'USD') r ON true
