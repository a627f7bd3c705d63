"""Partition states beyond "materialized": a table declares named states in order (``estimated`` then ``completed``),
each with what it needs; a partition is built as soon as it can reach its first state and built again, once, when it
can reach a later one; a downstream accepts the upstream's last state unless it says which earlier ones it takes.

The gate is asked on plain sets; the dependency center (state store + resolver) is stepped at pinned times on a
temp-dir instance: no Spark, no code location.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance, MetadataValue

from resources.delta_lake import DeltaStore
from resources.landing import Landing
from tests.center.test_center import Center, hours, requested
from tests.materialize.test_gate import FakeStates
from tests.support.small_catalog import ODS, assert_refused, sql_catalog, write
from warehouse_assets.catalog import Catalog, Table, load_catalog
from warehouse_assets.explain.status import status_lines
from warehouse_assets.explain.why import explain
from warehouse_assets.materialize.buildable import first_buildable
from warehouse_assets.materialize.gate import EARLIER_STATE, STATE, decide

TZ = ZoneInfo("Asia/Shanghai")
NOW = datetime(2026, 3, 10, 12, tzinfo=TZ)
REVENUE = """period: daily
depends_on:
  dwd.day: {set: [0]}
  dwd.rate: {range: [-1, 0]}
states:
  estimated: {dwd.rate: {set: [-1]}}   # the previous day's rate
  completed: {dwd.rate: {set: [0]}}    # the day's own
"""
# the readers' late-data policy: an interval, which tells late data (it waits) from the next state (at once); under
# the default a whole rebuild of this long-closed day would be at once too
READERS = "late_data: {rebuild: every 60m}\n"
TABLES = {  # path → (header, SQL)
    "dwd/day.sql": ("period: daily\n", "SELECT id FROM ods.src"),
    "dwd/rate.sql": ("period: daily\n", "SELECT 1 AS id"),
    "dws/rev.sql": (REVENUE, "SELECT d.id FROM dwd.day d LEFT JOIN dwd.rate r ON d.id = r.id"),
    "ads/strict.sql": (f"period: daily\n{READERS}", "SELECT id FROM dws.rev"),  # the last state only, by default
    "ads/early.sql": (
        "period: daily\n" + READERS + "depends_on:\n  dws.rev: {set: [0], state: [estimated, completed]}\n",
        "SELECT id FROM dws.rev",
    ),
}


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    return sql_catalog(tmp_path_factory.mktemp("states"), TABLES)


class StatedFakes(FakeStates):
    """The gate's fake reader, with the state each materialized partition reached."""

    def __init__(self, reached: dict[str, dict[str, str]] | None = None, **kwargs: object):
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.reached = reached or {}

    def reached_states(self, table: Table, keys: Sequence[str]) -> dict[str, str | None]:
        return {k: self.reached.get(table.fqn, {}).get(k) for k in keys}


# --- the declaration ------------------------------------------------------------------------------------------


def test_states_are_declared_in_order_with_their_windows(catalog: Catalog) -> None:
    rev = catalog["dws.rev"]
    assert rev.state_names == ("estimated", "completed")
    windows = {s.name: {d.table: (d.start_offset, d.end_offset) for d in s.deps} for s in rev.states}  # type: ignore[attr-defined]
    assert windows == {
        "estimated": {"dwd.day": (0, 0), "dwd.rate": (-1, -1)},
        "completed": {"dwd.day": (0, 0), "dwd.rate": (0, 0)},
    }
    assert [d.states for d in catalog["ads.early"].deps] == [("estimated", "completed")]
    assert [d.states for d in catalog["ads.strict"].deps] == [None]


HEADER = "period: daily\ndepends_on:\n  ods.src: {range: [0, 23]}\n  dwd.up: {range: [-1, 0]}\n"


@pytest.mark.parametrize(
    ("states", "message"),
    [
        ("states: {completed: {}}\n", "states lists at least two states"),
        ("states: {estimated: {dwd.other: none}, completed: {}}\n", "dwd.other is not a dependency of the table"),
        ("states: {estimated: {dwd.up: {set: [-2]}}, completed: {}}\n", r"must lie within the declared one"),
        ("states: {Estimated: {}, completed: {}}\n", "a state is named in lower case"),
    ],
)
def test_a_wrong_state_declaration_is_refused_naming_what_is_wrong(tmp_path: Path, states: str, message: str) -> None:
    up = "/* ---\ntable: dwd.up\nperiod: daily\n--- */\nSELECT id FROM ods.src\n"
    sql = f"/* ---\ntable: dws.x\n{HEADER}{states}--- */\nSELECT s.id FROM ods.src s JOIN dwd.up u ON s.id = u.id\n"
    assert_refused(tmp_path, {"dwd/up.sql": up, "dws/x.sql": sql}, message)


def test_a_dependency_accepting_a_state_its_upstream_does_not_have_is_refused(tmp_path: Path) -> None:
    sql = "/* ---\ntable: dws.x\nperiod: daily\ndepends_on:\n  dwd.up: {set: [0], state: [estimated]}\n--- */\n"
    up = "/* ---\ntable: dwd.up\nperiod: daily\n--- */\nSELECT id FROM ods.src\n"
    files = {"dwd/up.sql": up, "dws/x.sql": sql + "SELECT id FROM dwd.up\n"}
    assert_refused(tmp_path, files, "dws.x accepts state estimated of dwd.up: it declares no states")


def test_a_self_dependent_table_has_no_states(tmp_path: Path) -> None:
    header = (
        "period: daily\ncolumns: {id: bigint}\ndepends_on:\n  dws.cum: {set: [-1]}\n"
        "states: {estimated: {dws.cum: none}, completed: {}}\n"
    )
    sql = f"/* ---\ntable: dws.cum\n{header}--- */\nSELECT id FROM dws.cum UNION ALL SELECT id FROM ods.src\n"
    assert_refused(tmp_path, {"dws/cum.sql": sql}, "a self-dependent table has no states")


# --- the gate ---------------------------------------------------------------------------------------------------


def test_a_partition_reaches_the_latest_state_its_inputs_allow(catalog: Catalog) -> None:
    rev = catalog["dws.rev"]
    states = StatedFakes(materialized={"dwd.day": {"2026-03-05"}})
    nothing = decide(catalog, rev, "2026-03-05", states, current_time=NOW)
    assert not nothing.may_run and nothing.state is None
    assert nothing.reasons == [
        "dws.rev 2026-03-05 waits for 1 partition(s) of dwd.rate that are not materialized: 2026-03-04"
    ]  # what the first state waits for
    states.done["dwd.rate"] = {"2026-03-04"}  # the previous day's rate
    estimated = decide(catalog, rev, "2026-03-05", states, current_time=NOW)
    assert estimated.may_run and estimated.state == "estimated"
    assert [e.upstream.keys for e in estimated.edges] == [["2026-03-05"], ["2026-03-04"]]  # what it reads
    assert estimated.later == [
        "dws.rev 2026-03-05 waits for 1 partition(s) of dwd.rate that are not materialized: 2026-03-05"
    ]
    states.done["dwd.rate"] = {"2026-03-05"}  # the day's own rate: completed, whether or not T-1 is there
    completed = decide(catalog, rev, "2026-03-05", states, current_time=NOW)
    assert completed.may_run and completed.state == "completed" and completed.later == []
    assert [e.upstream.keys for e in completed.edges] == [["2026-03-05"], ["2026-03-05"]]


def test_a_downstream_takes_the_last_state_unless_it_accepts_earlier_ones(catalog: Catalog) -> None:
    states = StatedFakes(materialized={"dws.rev": {"2026-03-05"}}, reached={"dws.rev": {"2026-03-05": "estimated"}})
    strict = decide(catalog, catalog["ads.strict"], "2026-03-05", states, current_time=NOW)
    assert not strict.may_run
    [edge] = strict.edges
    assert edge.state("2026-03-05") == EARLIER_STATE
    assert strict.reasons == [
        "ads.strict 2026-03-05 waits for 1 partition(s) of dws.rev to reach completed (2026-03-05; 2026-03-05 is "
        "estimated)"
    ]
    assert decide(catalog, catalog["ads.early"], "2026-03-05", states, current_time=NOW).may_run
    states.reached["dws.rev"]["2026-03-05"] = "completed"
    assert decide(catalog, catalog["ads.strict"], "2026-03-05", states, current_time=NOW).may_run


def test_the_first_day_is_buildable_through_its_last_state(catalog: Catalog) -> None:
    """On the warehouse's first day the previous day's rate can never exist: estimated cannot be reached, but
    completed can, so the day is buildable (and is built completed)."""
    assert first_buildable(catalog, catalog["dws.rev"]).partition == "2026-01-01"
    states = StatedFakes(materialized={"dwd.day": {"2026-01-01"}, "dwd.rate": {"2026-01-01"}})
    verdict = decide(catalog, catalog["dws.rev"], "2026-01-01", states, current_time=NOW)
    assert verdict.may_run and verdict.state == "completed"


def test_on_the_first_day_nothing_reached_says_what_the_reachable_state_waits_for(catalog: Catalog) -> None:
    """Before the day's rate arrives on the warehouse's first day, the partition waits for that rate: the state that
    can never be reached (its previous day's rate does not exist) is not what it waits for."""
    states = StatedFakes(materialized={"dwd.day": {"2026-01-01"}})
    verdict = decide(catalog, catalog["dws.rev"], "2026-01-01", states, current_time=NOW)
    assert not verdict.may_run and verdict.state is None
    assert verdict.reasons == [
        "dws.rev 2026-01-01 waits for 1 partition(s) of dwd.rate that are not materialized: 2026-01-01"
    ]
    [rate] = [e for e in verdict.edges if e.dep.table == "dwd.rate"]
    assert rate.missing == ["2026-01-01"] and not rate.nonexistent and verdict.later == []


# --- the dependency center -----------------------------------------------------------------------------------------


@pytest.fixture
def instance(consolidated: DagsterInstance) -> DagsterInstance:
    return consolidated


def built(instance: DagsterInstance, table: str, partition: str, state: str | None = None) -> None:
    """A run built ``partition`` of ``table`` (in ``state``), as the runner reports it."""
    metadata = {STATE: MetadataValue.json({partition: state})} if state else {}
    key = AssetKey(table.split("."))
    instance.report_runless_asset_event(AssetMaterialization(key, partition=partition, metadata=metadata))


def test_estimated_then_completed_each_once_and_each_consumer_when_it_accepts(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    day = "2026-03-05"
    center.report("ods.src", hours(day))
    center.report("dwd.rate", ["2026-03-04"])
    assert requested(center.step()) == {"dwd.day": [[day]]}
    center.report("dwd.day", [day])
    # the day and the previous day's rate: estimated
    assert requested(center.step()) == {"dws.rev": [[day]]}
    built(instance, "dws.rev", day, "estimated")
    # the consumer accepting estimated runs now, the one needing completed waits
    assert requested(center.step()) == {"ads.early": [[day]]}
    built(instance, "ads.early", day)
    assert center.step() == []
    # the day's rate arrives: rev is built again, completed
    center.report("dwd.rate", [day])
    assert requested(center.step()) == {"dws.rev": [[day]]}
    assert center.store.states(AssetKey(["dws", "rev"]), [day])[day].state == "estimated"
    built(instance, "dws.rev", day, "completed")
    # now the strict consumer runs, and the early one again on the completed figure
    assert requested(center.step()) == {"ads.early": [[day]], "ads.strict": [[day]]}
    assert center.store.states(AssetKey(["dws", "rev"]), [day])[day].state == "completed"
    built(instance, "ads.early", day)
    built(instance, "ads.strict", day)
    assert center.step() == []
    center.restart()  # exactly once, across a restart
    assert center.step() == []


def test_a_partition_whose_last_state_is_reachable_at_once_is_built_once_completed(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    center = Center(instance, catalog)
    day = "2026-03-05"
    center.report("dwd.rate", ["2026-03-04", day])
    center.report("dwd.day", [day])
    [plan] = center.step()
    assert (plan.table, plan.partitions) == ("dws.rev", (day,))
    built(instance, "dws.rev", day, "completed")
    assert requested(center.step()) == {"ads.early": [[day]], "ads.strict": [[day]]}


def test_a_rebuild_within_the_state_its_readers_read_is_late_data_not_the_next_state(
    instance: DagsterInstance, catalog: Catalog
) -> None:
    """A table reaching its next state is planned: its readers are built again at once. Rebuilt again in the state they
    read (late data reached it), its readers follow their late-data policy (an hour, declared) like any reader."""
    center = Center(instance, catalog)
    day = "2026-03-05"
    minutes = iter(range(100))

    def step(after: timedelta = timedelta()) -> dict[str, list[list[str]]]:
        return requested(center.step(NOW + after + timedelta(minutes=next(minutes))))

    center.report("ods.src", hours(day))
    center.report("dwd.rate", ["2026-03-04"])
    center.report("dwd.day", [day])
    assert step() == {"dws.rev": [[day]]}
    built(instance, "dws.rev", day, "estimated")
    assert step() == {"ads.early": [[day]]}
    built(instance, "ads.early", day)
    center.report("dwd.rate", [day])
    assert step() == {"dws.rev": [[day]]}
    built(instance, "dws.rev", day, "completed")
    assert step() == {"ads.early": [[day]], "ads.strict": [[day]]}  # the next state: at once
    built(instance, "ads.early", day)
    built(instance, "ads.strict", day)
    assert step() == {}

    built(instance, "dws.rev", day, "completed")  # late data rebuilt it, completed as before
    assert step() == {}  # not at once: the readers' policy
    stale = center.resolver.ledger.stale("ads.strict", [day])[day]
    assert stale.due is not None and stale.policy.startswith("every 1 h")
    assert step(timedelta(hours=1)) == {"ads.early": [[day]], "ads.strict": [[day]]}


def test_status_shows_the_state_each_partition_reached(instance: DagsterInstance, catalog: Catalog) -> None:
    center = Center(instance, catalog)
    built(instance, "dws.rev", "2026-03-04", "completed")
    built(instance, "dws.rev", "2026-03-05", "estimated")
    center.store.update()
    lines = status_lines(catalog, center.store.view(), "dws.rev", ["2026-03-04", "2026-03-05", "2026-03-06"])
    assert lines[0] == "dws.rev (daily): 3 partition(s), 2 materialized, 0 tainted"
    assert "  valid, completed" in lines[1] and "  valid, estimated" in lines[2]
    assert lines[3].endswith("missing")
    # when, in the partition keys' time zone, named: the UI and `warehouse sql` show instants in UTC
    assert re.search(r" materialized \d{4}-\d\d-\d\d \d\d:\d\d\+08:00 \(", lines[1]), lines[1]


PREVIOUS_DAY = (  # estimated on the previous day alone: nothing upstream changes when it can be reached
    "/* ---\ntable: dws.prev\nperiod: daily\ndepends_on:\n  dwd.rate: {range: [-1, 0]}\n"
    "states: {estimated: {dwd.rate: {set: [-1]}}, completed: {dwd.rate: {set: [0]}}}\n--- */\nSELECT id FROM dwd.rate\n"
)


def test_a_state_needing_only_the_previous_day_is_reached_when_the_day_ends(
    instance: DagsterInstance, tmp_path: Path
) -> None:
    """dws.prev is estimated on the previous day's rate alone: that rate arrived before the day ended, so no change
    names the day; the engine's clock does, at the day's end."""
    root = tmp_path / "catalog"
    write(root, "ods/src.yaml", ODS)
    write(root, "dwd/rate.sql", "/* ---\ntable: dwd.rate\nperiod: daily\n--- */\nSELECT 1 AS id\n")
    write(root, "dws/prev.sql", PREVIOUS_DAY)
    center = Center(instance, load_catalog(root))
    center.step(datetime(2026, 3, 5, 23, tzinfo=TZ))
    center.report("dwd.rate", ["2026-03-04"])
    # the rate completes 03-04 (its own day) at once; 03-05 has not ended
    assert requested(center.step(datetime(2026, 3, 5, 23, 30, tzinfo=TZ))) == {"dws.prev": [["2026-03-04"]]}
    assert requested(center.step(datetime(2026, 3, 6, 0, 1, tzinfo=TZ))) == {"dws.prev": [["2026-03-05"]]}


def test_why_says_the_state_reached_and_what_the_last_one_waits_for(
    instance: DagsterInstance, catalog: Catalog, tmp_path: Path
) -> None:
    center = Center(instance, catalog)
    day = "2026-03-05"
    center.report("dwd.day", [day])
    center.report("dwd.rate", ["2026-03-04"])
    built(instance, "dws.rev", day, "estimated")
    args = (instance, catalog, DeltaStore(str(tmp_path / "lake")), Landing(tmp_path / "landing"))
    rev = explain(*args, "dws.rev", day, current_time=NOW)
    assert rev.own_state == "materialized, state estimated"
    assert rev.verdict == (
        "all 2 upstream partition(s) are materialized and it is built, as estimated;"
        " completed waits: dws.rev 2026-03-05 waits for 1 partition(s) of dwd.rate that are not"
        " materialized: 2026-03-05 (the engine builds it as completed once they are)"
    )
    strict = explain(*args, "ads.strict", day, current_time=NOW)
    [upstream] = strict.upstream
    assert (upstream.state, upstream.detail) == (EARLIER_STATE, "it is estimated; the dependency takes completed")
    assert strict.verdict == "waiting for 1 of 1 upstream partition(s); first: dws.rev 2026-03-05 (earlier state)"
