"""The plan's time axis: instants to x, with long idle stretches cut short.

A wave posted with 7 days' notice and taken in a 3-hour Saturday window is a week of waiting
around minutes of work: drawn to scale, the work is a pixel wide. Every stretch longer than
BREAK_AFTER in which nothing starts or ends is drawn BREAK_W wide instead (marked as a break);
the rest shares the chart to scale. Ticks fall on round UTC instants.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

UTC = dt.timezone.utc
BREAK_AFTER = 6 * 3600.0  # an idle stretch longer than this is cut short
BREAK_W = 28.0  # how wide a cut stretch is drawn
MIN_TICK_GAP = 90.0  # pixels between two ticks, at least
STEPS = (
    60, 120, 300, 600, 900, 1800, 3600, 7200, 3 * 3600, 6 * 3600, 12 * 3600,
    86400, 2 * 86400, 7 * 86400, 14 * 86400, 28 * 86400,
)  # fmt: skip


@dataclass(frozen=True)
class Piece:
    """A stretch of time and where it is drawn; `cut` if it is an idle stretch cut short."""

    start: float  # seconds since the epoch
    end: float
    x0: float
    x1: float
    cut: bool

    def x(self, t: float) -> float:
        if t >= self.end:
            return self.x1 if self.end > self.start else self.x0
        return self.x0 + (t - self.start) / (self.end - self.start) * (self.x1 - self.x0)


class Scale:
    """Instants to x across [left, left + width]: idle stretches cut, the rest to scale."""

    def __init__(self, instants: Iterable[dt.datetime], left: float, width: float) -> None:
        points = sorted({t.timestamp() for t in instants}) or [0.0]
        if len(points) == 1:
            points.append(points[0] + 60.0)
        gaps = [(b - a, a, b) for a, b in zip(points, points[1:])]
        # The longest idle stretches are cut, as many as leave half the chart to the rest.
        cuts = sorted((g for g in gaps if g[0] > BREAK_AFTER), reverse=True)
        cuts = sorted(cuts[: int(width / 2 // BREAK_W)], key=lambda g: g[1])
        kept = (points[-1] - points[0]) - sum(g[0] for g in cuts)
        self.per_second = (width - len(cuts) * BREAK_W) / kept if kept > 0 else 0.0
        pieces = []
        at, x = points[0], left
        for _, a, b in cuts:
            pieces.append(Piece(at, a, x, x + (a - at) * self.per_second, cut=False))
            x = pieces[-1].x1
            pieces.append(Piece(a, b, x, x + BREAK_W, cut=True))
            at, x = b, x + BREAK_W
        pieces.append(Piece(at, points[-1], x, left + width, cut=False))
        self.pieces = tuple(pieces)
        self._starts = [p.start for p in pieces]
        self.start = dt.datetime.fromtimestamp(points[0], UTC)

    def x(self, when: dt.datetime) -> float:
        t = when.timestamp()
        k = max(bisect.bisect_right(self._starts, t) - 1, 0)
        piece = self.pieces[k]
        return piece.x(min(max(t, piece.start), piece.end))

    def step(self) -> int:
        """The tick step: the first round one at least MIN_TICK_GAP apart when drawn."""
        if self.per_second <= 0:
            return STEPS[-1]
        need = MIN_TICK_GAP / self.per_second
        return next((s for s in STEPS if s >= need), -(-int(need) // 86400) * 86400)

    def ticks(self) -> list[dt.datetime]:
        """Round UTC instants (midnights for a day or more) in the stretches drawn to scale."""
        step = self.step()
        found = []
        for piece in self.pieces:
            if piece.cut:
                continue
            first = -(-int(piece.start) // step) * step
            found += [
                dt.datetime.fromtimestamp(t, UTC) for t in range(first, int(piece.end) + 1, step)
            ]
        return found

    def cuts(self) -> list[Piece]:
        return [p for p in self.pieces if p.cut]


def duration(seconds: float) -> str:
    """A cut stretch's length as a reader says it: 2d 3h, 7h, 45m."""
    minutes = int(seconds // 60)
    days, rest = divmod(minutes, 1440)
    hours, minutes = divmod(rest, 60)
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else ""]
    parts.append(f"{minutes}m" if minutes and not days else "")
    return " ".join(p for p in parts if p) or "0m"
