"""Maintenance windows: when, in wall-clock time, early maintenance may start.

Pure: instants in, instants out (seconds since the epoch); the time zone database is read
through zoneinfo, so daylight saving is the zone's, not ours.
"""

from __future__ import annotations

import datetime as dt
import math
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
        """Every (opening, closing) whose closing is after `since`, in order, for a year. A day
        whose window lies wholly in the hour skipped in spring has none: it has no length, so it
        is skipped to the next real opening (one that opened and closed at once could neither
        hold an event nor be told from the next)."""
        day = dt.datetime.fromtimestamp(since, self.zone).date() - _DAY
        for _ in range(_HORIZON_DAYS):
            if day.weekday() in self.days:
                opening = _instant(day, self.start, self.zone)
                closing_day = day if self.end > self.start else day + _DAY
                closing = _instant(closing_day, self.end, self.zone)
                if closing > since and closing > opening:
                    yield opening, closing
            day += _DAY

    def describe(self) -> str:
        days = ",".join(DAYS[d] for d in sorted(self.days))
        return f"{days} {self.start:%H:%M}-{self.end:%H:%M} {self.zone.key}"


def _instant(day: dt.date, at: dt.time, zone: ZoneInfo) -> float:
    """A local time as an instant, never decreasing as the local time grows, so a window never
    has a negative length. A time the clocks show twice (the hour repeated in autumn) is its
    first occurrence: a window opens once. One they never show (the hour skipped in spring) is
    the first instant after the gap. Python reads such a time with the offset before the change
    (02:30 as 03:30 summer time, later than 03:00 itself), so the gap's end is searched for."""
    local = dt.datetime.combine(day, at, tzinfo=zone)
    instant = local.timestamp()
    if dt.datetime.fromtimestamp(instant, zone).replace(tzinfo=None) == local.replace(tzinfo=None):
        return instant
    # In a gap: at `instant` the clocks already read later than `at`; two days before, earlier
    # (no zone skips more than a day). The change itself is the first second reading later.
    shown = local.replace(tzinfo=None)
    before, after = math.floor(instant) - 2 * 86400, math.ceil(instant)
    while after - before > 1:
        middle = (before + after) // 2
        if dt.datetime.fromtimestamp(middle, zone).replace(tzinfo=None) > shown:
            after = middle
        else:
            before = middle
    return float(after)


def first_opening(
    windows: tuple[Window, ...], wall: float, until: float
) -> Optional[tuple[float, Window]]:
    """The first instant in [wall, until) inside a window, and that window: `wall` itself
    while one is open; None when none opens before `until`."""
    best: Optional[tuple[float, Window]] = None
    for window in windows:
        for start, _ in window.spans(wall):
            first = max(start, wall)
            if first < until and (best is None or first < best[0]):
                best = (first, window)
            break
    return best


def opening(windows: tuple[Window, ...], wall: float, until: float) -> Optional[float]:
    """The first instant in [wall, until) inside a window: `wall` itself while one is open;
    None when none opens before `until` (NotBefore)."""
    found = first_opening(windows, wall, until)
    return None if found is None else found[0]


def current_or_next(windows: tuple[Window, ...], wall: float) -> Optional[tuple[float, float]]:
    """The window open now, or else the next to open: (opening, closing)."""
    spans = [next(window.spans(wall), None) for window in windows]
    found = [span for span in spans if span is not None]
    return min(found) if found else None
