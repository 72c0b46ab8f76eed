"""The IMDS rate budget: polls, approvals and name lookups share 5 requests a second."""

from __future__ import annotations

import bisect
from dataclasses import replace
from typing import Optional

from .. import approval
from ..lifecycle import Phase
from ..poll import names, timing
from ..state import State
from ..vocabulary.constants import IMDS_RATE, RATE_WINDOW
from ..vocabulary.effects import Effect


def _allowed_at(state: State, now: float, sent: Optional[tuple[float, ...]] = None) -> float:
    """When the next IMDS request fits in the rate limit (`now` if it does now)."""
    recent = [t for t in (state.sent if sent is None else sent) if t > now - RATE_WINDOW]
    if len(recent) < IMDS_RATE:
        return now
    return recent[len(recent) - IMDS_RATE] + RATE_WINDOW


def _allowed_first(state: State, now: float) -> float:
    """When a request that goes before an ordered poll (`_make_room`) fits in the rate limit."""
    ordered = timing._pending_poll(state, now)
    if ordered is None:
        return _allowed_at(state, now)
    return _allowed_at(state, now, tuple(t for t in state.sent if t != ordered))


def _spend(state: State, now: float) -> State:
    return replace(state, sent=_spent(state.sent, now, now))


def _spent(sent: tuple[float, ...], now: float, at: float) -> tuple[float, ...]:
    """The requests of the rate limit's window and one more `at` (a poll is ordered for its
    instant); in order, so a poll's future slot counts against an approval sent before it."""
    recent = [t for t in sent if t > now - RATE_WINDOW]
    bisect.insort(recent, at)
    return tuple(recent)


def _make_room(state: State, now: float, out: list[Effect]) -> State:
    """An approval or a name lookup that is due goes first: a poll ordered for later is taken
    back, and none is ordered until it has gone (`_timers`). At 4 Hz the polls alone fill IMDS'
    5 requests a second; an approval that waited for room among them queued behind them
    (measured: 10 s at p50 with an event a second). Polls then start from where the limit put
    them, so each approval costs the polls one slot, not a tick of delay for ever after."""
    if timing._pending_poll(state, now) is None or not _others_due(state, now):
        return state
    return timing._take_back(state, out)


def _others_due(state: State, now: float) -> bool:
    """An approval or a name lookup waits for its turn (not for a retry's backoff): due by
    their own `due`, the rate limit aside."""
    if any(at <= now for at in names.due(state, now, now)):
        return True
    due_for = approval.due_for
    for event_id, t in state.events.items():
        if t.phase is Phase.APPROVING:
            at = due_for(state, event_id, t, now, now)
            if at is not None and at <= now:
                return True
    return False
