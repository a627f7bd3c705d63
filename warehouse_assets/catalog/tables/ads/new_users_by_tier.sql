/* ---
table: ads.new_users_by_tier
period: daily
description: >-
  The day's registrations per city tier, from the day's user snapshot and the static dwd.city_tier (a city it
  does not list counts as 'unlisted'). Every day waits for the static table to be built.
owner: user-data
primary_key: [tier]
checks:
  unique: true
  not_null: [tier, new_users]
--- */
SELECT
  coalesce(c.tier, 'unlisted') AS tier,
  count(*) AS new_users
FROM dwd.user_snapshot u
LEFT JOIN dwd.city_tier c ON u.city = c.city
WHERE u.register_dt = '${ds}'
GROUP BY coalesce(c.tier, 'unlisted')
