"""The simulated external producers of the embedded default (an ad partner's daily files, a finance
system's fx_rate Delta table), deterministic and appendable.

* The **ad partner** delivers day D's ``marketing_spend`` as two CSV files and a ``_SUCCESS`` marker the
  next morning (normally D+1 05:00–09:00; some days early, just after midnight, some late, the next
  afternoon or the day after).
* The **finance system** writes day D's ``fx_rate`` (CNY→USD and HKD→USD) into its own Delta table,
  partitioned by ``dt``, normally D+1 09:00 (early: just after midnight; late: D+2 03:00).

Bad deliveries happen on fixed days counted from the simulation's first day, so tests and the dev UI see
them: a duplicate marker (re-sent, same data), a marker written before its data, a malformed partition
directory, a future-dated delivery, a corrected re-delivery (other content), and on the finance side a
duplicate rewrite, a corrected rate, a malformed ``dt`` value and a future ``dt``.

Everything is a pure function of (seed, first day, producer, day); :func:`simulate_external` applies the
events whose time is at or before ``until`` and records which it applied in ``<root>/simulation.json``,
so calling it again later only adds what has arrived since. Marker files get their simulated time as
mtime (what a sensor sees as the delivery time).
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from resources.settings import DEFAULT_TIMEZONE

STATE_FILE = "simulation.json"
CHANNELS = ("douyin", "wechat", "baidu", "huawei", "xiaomi", "app_store")
MARKETING_COLUMNS = ("channel", "campaign_id", "spend", "impressions", "clicks")
CURRENCIES = {"CNY": Decimal("0.1385"), "HKD": Decimal("0.1282")}

# bad cases, by day index from the first simulated day (the partner's and the finance system's)
DUPLICATE_MARKER_DAY = 1  # marker re-sent two hours later, same data
MARKER_BEFORE_DATA_DAY = 2  # marker first, data 40 minutes later with a new marker
MALFORMED_DIR_DAY = 3  # an extra delivery into dt=YYYY-M-D
FUTURE_DAY = 4  # with its delivery, one for two days later (before that day began)
CORRECTION_DAY = 5  # re-delivered six hours later with corrected spend
FX_DUPLICATE_DAY = 1  # the same rates rewritten three hours later
FX_MALFORMED_DAY = 2  # an extra dt written as YYYYMMDD
FX_CORRECTION_DAY = 3  # a corrected rate four hours later
FX_FUTURE_DAY = 4  # a rate for three days later written with it (only while that day is still ahead)


# what each bad case is, by the suffix of its event's identifier: the dev log names them as they are delivered, so
# that the warnings they cause (a rejected or a duplicate delivery) read as what they are, the simulation's tests
BAD_CASES = {
    "marketing_spend": {
        "marker-again": "its _SUCCESS marker re-sent two hours later with the same data (reported once)",
        "marker-only": "a _SUCCESS marker written 40 minutes before its data (waits for the data)",
        "malformed": "an extra delivery into dt={day.year}-{day.month}-{day.day}, a malformed partition directory "
        "(rejected)",
        "future": "a delivery for two days later, before that day began (rejected as future-dated)",
        "corrected": "re-delivered six hours later with corrected spend (reported again, its downstream rebuilt)",
    },
    "fx_rate": {
        "again": "the same rates rewritten three hours later (not reported again)",
        "malformed": "an extra partition dt={day:%Y%m%d}, a malformed dt value (rejected)",
        "corrected": "a corrected rate four hours later (reported again, its downstream rebuilt)",
        "future": "a rate for three days later written with it (waits until that day is over)",
    },
}


def bad_cases(applied: list[str]) -> list[str]:
    """The deliberate bad deliveries among the events ``applied``, each in words: ``fx_rate 2026-11-26: an extra
    partition dt=20261126, a malformed dt value (rejected)``."""
    out = []
    for ident in applied:
        producer, day, *case = ident.split("/")
        if case and case[0] in BAD_CASES.get(producer, {}):
            out.append(f"{producer} {day}: " + BAD_CASES[producer][case[0]].format(day=date.fromisoformat(day)))
    return out


@dataclass(frozen=True)
class Event:
    at: datetime  # aware, business timezone
    producer: str  # "marketing_spend" | "fx_rate"
    ident: str  # unique, stable: recorded once applied
    apply: Callable[[Path], None]


def _rng(seed: int, *parts: object) -> random.Random:
    return random.Random(f"{seed}|" + "|".join(str(p) for p in parts))


def arrival(seed: int, producer: str, day: date, tz: ZoneInfo) -> datetime:
    """When a producer delivers day ``day`` (deterministic): mostly next morning, some early, some late."""
    rng = _rng(seed, producer, day, "arrival")
    after = datetime.combine(day + timedelta(days=1), datetime.min.time(), tz)
    roll = rng.random()
    if producer == "marketing_spend":
        if roll < 0.15:
            return after + timedelta(minutes=rng.randint(20, 59))  # early: just after midnight
        if roll < 0.85:
            return after + timedelta(hours=5, minutes=rng.randint(0, 239))  # the usual morning
        if roll < 0.95:
            return after + timedelta(hours=14, minutes=rng.randint(0, 180))  # late afternoon
        return after + timedelta(days=1, hours=2, minutes=rng.randint(0, 59))  # the day after
    if roll < 0.2:
        return after + timedelta(minutes=rng.randint(5, 40))
    if roll < 0.85:
        return after + timedelta(hours=9, minutes=rng.randint(0, 30))
    return after + timedelta(days=1, hours=3, minutes=rng.randint(0, 30))


# --- the ad partner ------------------------------------------------------------------------------------


def marketing_rows(seed: int, day: date, revision: int = 0) -> list[dict[str, str]]:
    """The spend rows the partner reports for ``day`` (a correction changes some amounts)."""
    rows = []
    for channel in CHANNELS:
        rng = _rng(seed, "marketing_spend", day, channel)
        for n in range(rng.randint(1, 3)):
            spend = Decimal(rng.randint(20_000, 400_000)) / 100
            if revision and n == 0:
                spend = (spend * Decimal("1.1")).quantize(Decimal("0.01"))
            impressions = rng.randint(2_000, 90_000)
            rows.append(
                {
                    "channel": channel,
                    "campaign_id": f"{channel[:2]}-{day:%m%d}-{n}",
                    "spend": f"{spend:.2f}",
                    "impressions": str(impressions),
                    "clicks": str(impressions // rng.randint(20, 80)),
                }
            )
    return rows


def _csv(rows: list[dict[str, str]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(MARKETING_COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _write(path: Path, text: str, at: datetime) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    os.utime(path, (at.timestamp(), at.timestamp()))


def write_marketing(root: Path, dirname: str, rows: list[dict[str, str]], at: datetime, marker: bool = True) -> None:
    """Deliver ``rows`` as two part files (and the marker, written last) into ``dirname``."""
    directory = root / "marketing_spend" / dirname
    half = len(rows) // 2
    for n, part in enumerate((rows[:half], rows[half:])):
        _write(directory / f"part-{n:05d}.csv", _csv(part), at)
    if marker:
        _write(directory / "_SUCCESS", "", at)


def touch_marker(root: Path, dirname: str, at: datetime) -> None:
    _write(root / "marketing_spend" / dirname / "_SUCCESS", "", at)


def _marketing_events(seed: int, index: int, day: date, tz: ZoneInfo) -> list[Event]:
    at = arrival(seed, "marketing_spend", day, tz)
    name = f"dt={day:%Y-%m-%d}"
    rows = marketing_rows(seed, day)
    ident = f"marketing_spend/{day}"
    if index == MARKER_BEFORE_DATA_DAY:
        events = [
            Event(at, "marketing_spend", ident + "/marker-only", lambda r: touch_marker(r, name, at)),
            Event(
                at + timedelta(minutes=40),
                "marketing_spend",
                ident,
                lambda r: write_marketing(r, name, rows, at + timedelta(minutes=40)),
            ),
        ]
    else:
        events = [Event(at, "marketing_spend", ident, lambda r: write_marketing(r, name, rows, at))]
    if index == DUPLICATE_MARKER_DAY:
        again = at + timedelta(hours=2)
        events.append(Event(again, "marketing_spend", ident + "/marker-again", lambda r: touch_marker(r, name, again)))
    if index == MALFORMED_DIR_DAY:
        bad = f"dt={day.year}-{day.month}-{day.day}"
        events.append(Event(at, "marketing_spend", ident + "/malformed", lambda r: write_marketing(r, bad, rows, at)))
    if index == FUTURE_DAY:
        ahead = day + timedelta(days=2)
        early = marketing_rows(seed, ahead, revision=1)
        events.append(
            Event(
                at,
                "marketing_spend",
                ident + "/future",
                lambda r: write_marketing(r, f"dt={ahead:%Y-%m-%d}", early, at),
            )
        )
    if index == CORRECTION_DAY:
        fixed_at, fixed = at + timedelta(hours=6), marketing_rows(seed, day, revision=1)
        events.append(
            Event(
                fixed_at, "marketing_spend", ident + "/corrected", lambda r: write_marketing(r, name, fixed, fixed_at)
            )
        )
    return events


# --- the finance system --------------------------------------------------------------------------------


def fx_rates(seed: int, day: date, revision: int = 0) -> dict[str, Decimal]:
    rng = _rng(seed, "fx_rate", day)
    rates = {}
    for currency, base in CURRENCIES.items():
        drift = Decimal(rng.randint(-150, 150)) / Decimal(100_000)
        rates[currency] = (base + drift + (Decimal("0.0007") if revision else 0)).quantize(Decimal("0.000001"))
    return rates


def write_fx(root: Path, value: str, rates: dict[str, Decimal]) -> None:
    """The finance system's job: replace partition ``dt = value`` of its Delta table."""
    uri = str(root / "fx_rate")
    data = pa.table(
        {
            "currency": pa.array(list(rates), pa.string()),
            "quote": pa.array(["USD"] * len(rates), pa.string()),
            "rate": pa.array(list(rates.values()), pa.decimal128(18, 6)),
            "dt": pa.array([value] * len(rates), pa.string()),
        }
    )
    if DeltaTable.is_deltatable(uri):
        write_deltalake(uri, data, partition_by=["dt"], mode="overwrite", predicate=f"dt = '{value}'")
    else:
        write_deltalake(uri, data, partition_by=["dt"], mode="error")


def _fx_events(seed: int, index: int, day: date, tz: ZoneInfo, until: datetime) -> list[Event]:
    at = arrival(seed, "fx_rate", day, tz)
    value, rates = f"{day:%Y-%m-%d}", fx_rates(seed, day)
    ident = f"fx_rate/{day}"
    events = [Event(at, "fx_rate", ident, lambda r: write_fx(r, value, rates))]
    if index == FX_DUPLICATE_DAY:
        events.append(Event(at + timedelta(hours=3), "fx_rate", ident + "/again", lambda r: write_fx(r, value, rates)))
    if index == FX_CORRECTION_DAY:
        fixed = fx_rates(seed, day, revision=1)
        events.append(
            Event(at + timedelta(hours=4), "fx_rate", ident + "/corrected", lambda r: write_fx(r, value, fixed))
        )
    if index == FX_MALFORMED_DAY:
        events.append(Event(at, "fx_rate", ident + "/malformed", lambda r: write_fx(r, f"{day:%Y%m%d}", rates)))
    ahead = day + timedelta(days=3)
    if index == FX_FUTURE_DAY and datetime.combine(ahead, datetime.min.time(), tz) > until:
        # a forecast written ahead of its day; only while that day is still in the future of the clock
        events.append(
            Event(at, "fx_rate", ident + "/future", lambda r: write_fx(r, f"{ahead:%Y-%m-%d}", fx_rates(seed, ahead)))
        )
    return events


# --- the clock -----------------------------------------------------------------------------------------


def events_until(seed: int, first: date, until: datetime, timezone: str = DEFAULT_TIMEZONE) -> list[Event]:
    """Every event of both producers at or before ``until`` (aware), in time order; days are ``timezone``'s."""
    tz = ZoneInfo(timezone)
    events: list[Event] = []
    day, index = first, 0
    while datetime.combine(day, datetime.min.time(), tz) < until:
        events += _marketing_events(seed, index, day, tz)
        events += _fx_events(seed, index, day, tz, until)
        day, index = day + timedelta(days=1), index + 1
    return sorted((e for e in events if e.at <= until), key=lambda e: (e.at, e.ident))


def simulate_external(
    root: Path, first: date, until: datetime, seed: int = 7, timezone: str = DEFAULT_TIMEZONE
) -> list[str]:
    """Apply every producer event up to ``until`` not applied yet; returns the identifiers applied now."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    state_path = root / STATE_FILE
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    if state and (state.get("first") != first.isoformat() or state.get("seed") != seed):
        raise ValueError(f"{root} was simulated from {state.get('first')} with seed {state.get('seed')}; refusing")
    applied = set(state.get("applied", []))
    done = []
    for event in events_until(seed, first, until, timezone):
        if event.ident in applied:
            continue
        event.apply(root)
        applied.add(event.ident)
        done.append(event.ident)
    if done or not state:
        tmp = state_path.with_name(f".{STATE_FILE}.tmp")
        tmp.write_text(json.dumps({"first": first.isoformat(), "seed": seed, "applied": sorted(applied)}, indent=1))
        os.replace(tmp, state_path)
    return done


def simulate_external_for_landing(landing: Path, external_root: Path, until: datetime | None = None) -> list[str]:
    """Follow the CDC simulation recorded in ``landing``: same seed, same first day, its clock by default."""
    from simulator.cdc import read_simulation

    recorded = read_simulation(landing)
    if recorded is None:
        raise ValueError(f"{landing} was not made by the simulator")
    config, start, end = recorded
    return simulate_external(external_root, start.date(), until or end, config.seed, config.tz)
