"""An event that left the document and came back under the same EventId (Google Cloud's are fixed):
a new maintenance, judged as first seen once the stage it owes (after- or cancelled-hooks, its
node's restore) has ended, never cut short."""

from __future__ import annotations

from typing import Optional

from ..model import SCHEDULED, Event
from .frozen import replace
from .lifecycle import On, Phase, Stage
from .state import State, Tracked, _forget, _marked, _move


def left(tracked: Tracked) -> Tracked:
    """It left while its stage is owed (AFTER, ENDING): remembered (and kept in the state file),
    so that a document listing it again is taken as news, not as the maintenance just over."""
    if tracked.phase in (Phase.AFTER, Phase.ENDING) and not tracked.left:
        return replace(tracked, left=True)
    return tracked


def came_back(state: State, tracked: Tracked) -> bool:
    """Its stage ends while the document lists it again after it left (or, cancelled, lists it
    Scheduled again): forgotten, and judged anew as at first sight (before-hooks, drain,
    approval; Started: missed), not kept over while listed."""
    if tracked.event.event_id not in state.listed:
        return False
    return tracked.left or (tracked.stage is Stage.CANCELLED and tracked.event.status == SCHEDULED)


def over_and_back(
    state: State, before: Optional[Tracked], listed: Event, on: On
) -> tuple[State, Optional[Tracked]]:
    """Over (its stage cut off by a restart) after it left, and listed again; or cancelled
    (put back: postponed.py) and listed Scheduled: forgotten (None), so the document's event
    is judged at once as first seen, as `came_back` does when that stage ends."""
    if before is None or before.phase is not Phase.OVER:
        return state, before
    put_back = before.stage is Stage.CANCELLED and listed.status == SCHEDULED
    if not (before.left or put_back):
        return state, before
    return _forget(state, _move(before, on, Phase.GONE)), None


def mark_taken_back(state: State, before: Optional[Tracked], was_listed: frozenset[str]) -> State:
    """Listed again after it left while its stage still runs: a shared event's mark from before
    is deleted now (ForgetShared), not once that stage ends; the other VMs coordinating the
    event back would count that `ready` (the event it was for is over for every VM)."""
    if before is None or not before.left or before.event.event_id in was_listed:
        return state
    if not _marked(state, before):
        return state
    return replace(state, unmarked=(*state.unmarked, before))
