/* ---
table: ads.revenue_flash
period: daily
description: >-
  The morning flash of the day's revenue in USD: it takes dws.revenue_usd_daily as soon as it is estimated (the
  previous day's rate) and is built again when that day is completed; `final` says which it is.
owner: finance-data
primary_key: [ds]
depends_on:
  dws.revenue_usd_daily: {set: [0], state: [estimated, completed]}
--- */
SELECT ds, revenue_usd, rate_of, rate_of = ds AS final
FROM dws.revenue_usd_daily
