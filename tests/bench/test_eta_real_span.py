"""The real-stack ETA bench's run never stops in the first minutes of an hour, when the hour just ended is still
being built: stopped there, the finishes its 1 h samples come from (the hour's ODS partitions, then their readers)
would fall after its end and none would be scored."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from bench.eta_real import past_the_hours_finishes

TZ = ZoneInfo("Asia/Shanghai")


def test_a_run_ending_just_after_an_hour_lasts_until_that_hours_finishes_are_built() -> None:
    assert past_the_hours_finishes(datetime(2026, 11, 30, 20, 0, 38, tzinfo=TZ)) == datetime(
        2026, 11, 30, 20, 10, tzinfo=TZ
    )
    # one ending well inside an hour ends as asked
    inside = datetime(2026, 11, 30, 19, 40, tzinfo=TZ)
    assert past_the_hours_finishes(inside) == inside
