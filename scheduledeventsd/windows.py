"""Maintenance windows: when, in wall-clock time, early maintenance may start.

Pure: instants in, instants out (seconds since the epoch); the time zone database is read
through zoneinfo, so daylight saving is the zone's, not ours.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional
from zoneinfo import ZoneInfo

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAY = dt.timedelta(days=1)
_HORIZON_DAYS = 400  # NotBefore is at most days away; this bounds the search whatever is asked


@dataclass(frozen=True)
class Window:
    """Opens at `start` on each of `days` (local to `zone`) and closes at `end`, on the next
    day when `end` is not after `start` ("23:00"-"01:00")."""

    days: frozenset[int]  # 0 = Monday, as date.weekday()
    start: dt.time
    end: dt.time
    zone: ZoneInfo

    def spans(self, since: float) -> Iterator[tuple[float, float]]:
        """Every (opening, closing) whose closing is after `since`, in order, for a year."""
        day = dt.datetime.fromtimestamp(since, self.zone).date() - _DAY
        for _ in range(_HORIZON_DAYS):
            if day.weekday() in self.days:
                opening = _instant(day, self.start, self.zone)
                closing_day = day if self.end > self.start else day + _DAY
                closing = _instant(closing_day, self.end, self.zone)
                if closing > since:
                    yield opening, closing
            day += _DAY

    def describe(self) -> str:
        days = ",".join(DAYS[d] for d in sorted(self.days))
        return f"{days} {self.start:%H:%M}-{self.end:%H:%M} {self.zone.key}"


def _instant(day: dt.date, at: dt.time, zone: ZoneInfo) -> float:
    """A local time as an instant. One that does not exist (02:30 as the clocks go forward)
    is read with the offset before the change, i.e. as the first instant after the gap."""
    return dt.datetime.combine(day, at, tzinfo=zone).timestamp()


def opening(windows: tuple[Window, ...], wall: float, until: float) -> Optional[float]:
    """The first instant in [wall, until) inside a window: `wall` itself while one is open;
    None when none opens before `until` (NotBefore)."""
    best: Optional[float] = None
    for window in windows:
        for start, _ in window.spans(wall):
            first = max(start, wall)
            if first < until and (best is None or first < best):
                best = first
            break
    return best


def current_or_next(windows: tuple[Window, ...], wall: float) -> Optional[tuple[float, float]]:
    """The window open now, or else the next to open: (opening, closing)."""
    spans = [next(window.spans(wall), None) for window in windows]
    found = [span for span in spans if span is not None]
    return min(found) if found else None
