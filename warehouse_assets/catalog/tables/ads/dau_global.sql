/* ---
table: ads.dau_global
period: daily
description: >
  Daily active users of all regions on the date: the sum of every region's day of it (ads.dau_by_region), so it is
  complete only when the last region's day is (Los Angeles', which ends at 15:00 or 16:00 the next day, business
  time).
owner: user-data
primary_key: [ds]
checks:
  range: {regions: [4, 4]}  # every region's day was read
--- */
SELECT '${ds}' AS ds, CAST(coalesce(sum(dau), 0) AS bigint) AS dau, count(*) AS regions
FROM ads.dau_by_region
