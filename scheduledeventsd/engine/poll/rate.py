"""The IMDS rate budget: polls, approvals and name lookups share 5 requests a second. Whose turn
it is when several are due: poll/turns; a poll ordered for later giving way: poll/timing."""

from __future__ import annotations

import bisect
from typing import Optional

from ..frozen import replace
from ..state import State
from ..vocabulary.constants import IMDS_RATE, RATE_WINDOW


def _allowed_at(state: State, now: float, sent: Optional[tuple[float, ...]] = None) -> float:
    """When the next IMDS request fits in the rate limit (`now` if it does now)."""
    recent = [t for t in (state.sent if sent is None else sent) if t > now - RATE_WINDOW]
    if len(recent) < IMDS_RATE:
        return now
    return recent[len(recent) - IMDS_RATE] + RATE_WINDOW


def _spend(state: State, now: float) -> State:
    return replace(state, sent=_spent(state.sent, now, now))


def _spent(sent: tuple[float, ...], now: float, at: float) -> tuple[float, ...]:
    """The requests of the rate limit's window and one more `at` (a poll is ordered for its
    instant); in order, so a poll's future slot counts against an approval sent before it."""
    recent = [t for t in sent if t > now - RATE_WINDOW]
    bisect.insort(recent, at)
    return tuple(recent)
