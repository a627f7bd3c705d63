"""The dependency center's clock: real time, or a simulated time that runs faster than real time.

Where the sources are simulated faster than real time (the soak feeds a simulated hour every few seconds), the time
rules that wait (a late-data policy's interval, its grace after a window's end, a daily rebuild's hour, the look-again
timers, a window's end, a deadline) must wait in the sources' time: in real time a 60-minute interval outlasts the
whole simulated run, and a grace hour never applies to a window that ended, in real time, days ago.
``WAREHOUSE_CLOCK`` names such a clock as ``START@ANCHOR*SPEED``: it reads ``START`` (an ISO instant with its offset)
at the real instant ``ANCHOR`` (Unix seconds) and runs ``SPEED`` times faster than real time from there (standing at
``START`` before it). Empty: real time.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

EXAMPLE = "2026-11-26T00:00:00+08:00@1796000000*240"


@dataclass(frozen=True)
class Clock:
    """Real time (``start`` None), or ``start`` at the real instant ``anchor``, running ``speed`` times faster."""

    start: datetime | None = None
    anchor: float = 0.0
    speed: float = 1.0

    @classmethod
    def parse(cls, text: str) -> Clock:
        """``START@ANCHOR*SPEED`` (see the module), or '' for real time; ValueError saying what is expected."""
        if not text.strip():
            return cls()
        try:
            start_text, rest = text.strip().split("@", 1)
            anchor_text, speed_text = rest.split("*", 1)
            start, anchor, speed = datetime.fromisoformat(start_text), float(anchor_text), float(speed_text)
        except ValueError:
            start = None
        if start is None or start.tzinfo is None or not (math.isfinite(anchor) and math.isfinite(speed) and speed >= 1):
            raise ValueError(
                f"expected START@ANCHOR*SPEED: an ISO instant with its offset, the Unix time it is read at and how "
                f"many times faster than real time it runs (at least 1), e.g. {EXAMPLE}; got {text!r}"
            )
        return cls(start.astimezone(UTC), anchor, speed)

    @property
    def simulated(self) -> bool:
        return self.start is not None

    def now(self) -> datetime:
        """The clock's time (aware, UTC)."""
        if self.start is None:
            return datetime.now(UTC)
        return self.start + timedelta(seconds=max(0.0, time.time() - self.anchor) * self.speed)

    def describe(self) -> str:
        if self.start is None:
            return "real time"
        return f"simulated: {self.start.isoformat()} at {self.anchor:.0f}, {self.speed:g}x real time"
