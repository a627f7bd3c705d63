/* ---
table: ads.dau_by_region
period: daily
regions: {shanghai: Asia/Shanghai, karachi: Asia/Karachi, utc: UTC, los_angeles: America/Los_Angeles}
description: >
  Daily active users of each region (users who joined a lesson), each region's day from its own midnight to the
  next: one partition per region and day, built as soon as the hours of that region's day are in. A user's region is
  their id modulo 4, in the order the regions are declared: the simulated company's rule, as no source
  table carries a region.
owner: user-data
primary_key: [ds]
--- */
SELECT '${ds}' AS ds, count(DISTINCT user_id) AS dau
FROM ods.attendance
WHERE element_at(array('shanghai', 'karachi', 'utc', 'los_angeles'), CAST(pmod(user_id, 4) + 1 AS INT)) = '${region}'
