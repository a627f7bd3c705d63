/* ---
table: dwd.city_tier
kind: static
description: >-
  Reference data: the tier and region of each city users register from. One unpartitioned table, spelled out
  below; every partition of a table that reads it needs it built and valid. Changing the rows here rebuilds it
  (the static_tables sensor); partitions built before read the version they read.
owner: user-data
primary_key: [city]
columns:
  city: string
  tier: string
  region: string
--- */
SELECT city, tier, region
FROM VALUES
  ('北京', 'tier 1', 'north'),
  ('上海', 'tier 1', 'east'),
  ('广州', 'tier 1', 'south'),
  ('深圳', 'tier 1', 'south'),
  ('杭州', 'new tier 1', 'east'),
  ('成都', 'new tier 1', 'west'),
  ('武汉', 'new tier 1', 'central'),
  ('南京', 'new tier 1', 'east'),
  ('西安', 'new tier 1', 'west'),
  ('重庆', 'new tier 1', 'west'),
  ('长沙', 'new tier 1', 'central'),
  ('郑州', 'new tier 1', 'central'),
  ('苏州', 'new tier 1', 'east'),
  ('天津', 'new tier 1', 'north'),
  ('青岛', 'new tier 1', 'north'),
  ('合肥', 'new tier 1', 'east')
  AS t(city, tier, region)
