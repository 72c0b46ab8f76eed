"""An operator's free of this VM's slot (`scheduledeventsd fleet free`), as the slot gate takes
it: said, given back, and never asked for again for that event (slot.py's FREED row)."""

from __future__ import annotations

from ...records import Level, What
from ..lifecycle import On, Phase, Slot
from ..notes import _note
from ..state import State, _with
from ..vocabulary.effects import Effect, ReleaseSlot
from ..vocabulary.messages import SlotFreed
from . import onward
from .slot import TABLE, SlotOn, _without_lease, move


def _slot_freed(state: State, msg: SlotFreed, now: float, out: list[Effect]) -> State:
    """An operator freed this VM's slot (the VM is down for good, or its after-hooks keep
    failing): said, given up, and never taken again for this event, not even after a restart
    (the worker finds the operator's mark). Before its approval: not approved early; queued
    (taking it back after a restart): prepared now, without it."""
    tracked = state.events.get(msg.event_id)
    if tracked is None or tracked.slot not in (Slot.ASKED, Slot.HELD):
        return state
    concurrency = state.config.concurrency
    out.append(
        _note(
            Level.WARNING,
            What.SLOT_FREED_BY_OPERATOR,
            tracked.event,
            group=concurrency.group if concurrency else None,
            by=msg.by or None,
            freed_at=msg.at or None,
            reason="an operator freed this VM's slot: not taken again for this event",
        )
    )
    out.append(ReleaseSlot(msg.event_id))
    state = _without_lease(state, msg.event_id)
    tracked = move(tracked, SlotOn.FREED, Slot.MISSING)
    if tracked.phase is Phase.QUEUED and tracked.event.event_type in state.config.events:
        state, tracked = onward.enter(TABLE.name, state, tracked, On.LEAD_TIME, now, out)
    return _with(state, msg.event_id, tracked)
