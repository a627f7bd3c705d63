"""A source's declared delivery span (an external producer's ``external.usual_delay``, an ODS table's
``usual_delay``) is what the predicted finish assumes until the table has taught its own delays: on a fresh stack the
ad partner's usual morning delivery is expected, not called overdue ten minutes after midnight, and its reader's SLA is
warned only once the delivery runs out of its span. Pinned times, figures by hand."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import pytest

from warehouse_assets.catalog import Catalog, CatalogError, ExternalTable, OdsTable, business_zone, load_catalog
from warehouse_assets.catalog.loader import TABLES_DIR as TABLES
from warehouse_assets.catalog.model import External
from warehouse_assets.explain.eta import NOT_BUILT, History, Node, Prediction, Predictor, RunTime, Seen
from warehouse_assets.explain.eta_instance import declared_delays
from warehouse_assets.explain.forecast import sla_warning

ZONE = business_zone()
DAY = "2026-03-02"
SPEND: Node = ("ext.marketing_spend", DAY)
ROI: Node = ("ads.marketing_roi", DAY)


def at(hour: int, minute: int = 0) -> float:
    """A time on the morning after DAY: the delivery's and the deadline's (09:00)."""
    return datetime(2026, 3, 3, hour, minute, tzinfo=ZONE).timestamp()


class Graph:
    def upstream(self, node: Node) -> Sequence[Node]:
        return [SPEND] if node == ROI else []

    def is_source(self, table: str) -> bool:
        return table == SPEND[0]

    def window_end(self, node: Node) -> float:
        return at(0)


class States:
    def seen(self, table: str, keys: Sequence[str]) -> dict[str, Seen]:
        return dict.fromkeys(keys, NOT_BUILT)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def predicted(history: History, now: float) -> tuple[Prediction, Prediction]:
    predictor = Predictor(Graph(), States(), history, now)
    return predictor.predict(*SPEND), predictor.predict(*ROI)


def test_a_fresh_stack_expects_the_partners_morning_delivery_and_warns_only_once_it_runs_out_of_its_span(
    catalog: Catalog,
) -> None:
    roi = catalog["ads.marketing_roi"]
    runs = {"ads.marketing_roi": [RunTime(120.0)] * 3}
    declared = History(runs=runs, declared_delays=declared_delays(catalog))
    assert declared.lateness(SPEND[0]) == 9 * 3600.0

    # 05:01, nothing delivered yet: within the declared 05:00-09:00, expected at 07:15 (the median of the span's rest)
    source, reader = predicted(declared, at(5, 1))
    assert (source.finish, source.latest) == (at(7, 15), at(7, 15))
    assert sla_warning(roi, DAY, reader, at(5, 1)) is None
    # the same moment with only the default ten minutes to go by (before the declaration): overdue for 4 h 51 min,
    # as late again it would come at 09:52, and the 09:00 deadline was warned four hours ahead of a normal morning
    source, reader = predicted(History(runs=runs), at(5, 1))
    assert source.latest == at(9, 52)
    assert sla_warning(roi, DAY, reader, at(5, 1)) is not None

    # 08:40, still nothing: only the span's end is left, the report comes 09:00, built 09:02: warned 20 min ahead
    _, reader = predicted(declared, at(8, 40))
    assert reader.finish == at(9, 2)
    warning = sla_warning(roi, DAY, reader, at(8, 40))
    assert warning is not None and warning.late_by_s == 120

    # 09:30: past the span, overdue: as late again past it, 10:00
    source, _ = predicted(declared, at(9, 30))
    assert source.latest == at(10, 0)


def test_the_tables_own_deliveries_once_learned_replace_the_declaration(catalog: Catalog) -> None:
    learned = History(arrivals={SPEND[0]: [1200.0, 1800.0, 2400.0]}, declared_delays=declared_delays(catalog))
    assert learned.lateness(SPEND[0]) == 2400.0
    source, _ = predicted(learned, at(0, 10))
    assert source.finish == at(0, 30)


def test_the_example_externals_declare_their_producers_usual_mornings(catalog: Catalog) -> None:
    spans = {t.fqn: t.external.usual_delay_minutes for t in catalog if isinstance(t, ExternalTable)}
    assert spans == {"ext.marketing_spend": (300, 540), "ext.fx_rate": (540, 600)}
    assert declared_delays(catalog)["ext.fx_rate"][0] == 9 * 3600.0


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("soon", "external.usual_delay must be a duration like 90m, 1h or 2d, got 'soon'"),
        (["9h", "5h"], "external.usual_delay's earliest must come before its latest"),
        (["1h", "2h", "3h"], "external.usual_delay must be a duration or [earliest, latest]"),
    ],
)
def test_a_bad_usual_delay_is_refused_naming_it(spec: object, words: str) -> None:
    with pytest.raises(ValueError) as refused:
        External.parse({"format": "csv_files", "location": "x", "usual_delay": spec})
    assert words in str(refused.value)


def test_one_declared_delay_is_taken_as_it_is() -> None:
    assert External.parse({"format": "delta", "location": "x", "usual_delay": "2h"}).usual_delay_minutes == (120,)


def test_the_example_ods_tables_declare_their_hours_landing_and_a_fresh_stack_expects_it(catalog: Catalog) -> None:
    spans = {t.fqn: t.usual_delay_minutes for t in catalog if isinstance(t, OdsTable)}
    assert spans and set(spans.values()) == {(0, 2)}
    hour: Node = ("ods.order", "2026-03-02-10:00")
    end = datetime(2026, 3, 2, 11, 0, tzinfo=ZONE).timestamp()

    class HourGraph(Graph):
        def is_source(self, table: str) -> bool:
            return table == hour[0]

        def window_end(self, node: Node) -> float:
            return end

    def arrives(history: History) -> float:
        return Predictor(HourGraph(), States(), history, end).predict(*hour).finish

    # an hour just ended on a fresh stack: the median of the declared 0-2 min still ahead, 67.5 s after its end; before
    # the declaration the default ten minutes, which made every hourly reader's prediction ten minutes late
    assert arrives(History(declared_delays=declared_delays(catalog))) == end + 67.5
    assert arrives(History()) == end + 600
    # its own reported hours, once it has them, replace the declaration
    learned = History(arrivals={hour[0]: [30.0, 40.0, 50.0]}, declared_delays=declared_delays(catalog))
    assert arrives(learned) == end + 40


def test_a_bad_ods_usual_delay_is_refused_naming_the_file_and_the_key(tmp_path: Path) -> None:
    declaration = (TABLES / "ods" / "user.yaml").read_text()
    (tmp_path / "ods").mkdir()
    (tmp_path / "ods" / "user.yaml").write_text(declaration.replace("usual_delay: [0m, 2m]", "usual_delay: [2m, 0m]"))
    with pytest.raises(CatalogError) as refused:
        load_catalog(tmp_path)
    assert "user.yaml" in str(refused.value) and "usual_delay's earliest must come before its latest" in str(
        refused.value
    )
