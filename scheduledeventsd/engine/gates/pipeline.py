"""The gates an event passes in order before its before-hooks: a slot, then the drain (a maintenance
window holds it before: gates/window). `_prepare` enters the slot gate; each gate hands the event
on to the next (slot -> drain._enter -> runs._before_hooks), so none imports this module."""

from __future__ import annotations

from ...config import EventRule
from ...records import Level, What
from ..gates import drain, slot
from ..lifecycle import On, Phase, Slot
from ..notes import _note
from ..state import State, Tracked, _move
from ..vocabulary.constants import SLOT_GRACE
from ..vocabulary.effects import AcquireSlot, Effect, ReleaseSlot


def _prepare(
    state: State, tracked: Tracked, on: On, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """Enter the gates: the slot's (asked for, or a held one taken back, the event waits in
    QUEUED), then the drain's (drain._enter), then the before-hooks (runs._before_hooks)."""
    event = tracked.event
    rule = state.config.events.get(event.event_type, EventRule())
    if slot._slot_awaited(state, tracked):
        # After a restart or a crash its slot may be another VM's by now: the hooks wait in
        # the queue until it is taken back (or lost, then granted), or until the lead, as any
        # queued event (`max` counts VMs from before-hooks start).
        deadline = slot._slot_deadline(event, rule, state)
        if deadline is not None and now < deadline + SLOT_GRACE:  # etcd's answer, at the lead
            deadline = max(deadline, now + SLOT_GRACE)
            out.append(slot._slot_waiting(event, deadline, state.slot_holders, state))
            return state, _move(tracked, on, Phase.QUEUED, start_at=deadline)
        if tracked.slot is Slot.ASKED:  # past its lead: prepared without it
            out.append(ReleaseSlot(event.event_id))
            tracked = slot.move(tracked, slot.SlotOn.GIVEN_UP, Slot.NONE)
    if slot._needs_slot(state, tracked):
        deadline = slot._slot_deadline(event, rule, state)
        if deadline is not None and now < deadline + SLOT_GRACE:  # at the lead itself, too
            deadline = max(deadline, now + SLOT_GRACE)
            out.append(AcquireSlot(event, tracked.vm_name or state.vm_name or ""))
            out.append(slot._slot_waiting(event, deadline, (), state))
            asked = slot.move(tracked, slot.SlotOn.ASK, Slot.ASKED)
            return state, _move(asked, on, Phase.QUEUED, start_at=deadline)
        out.append(
            _note(
                Level.WARNING,
                What.SLOT_UNAVAILABLE,
                event,
                reason="too close to NotBefore to wait for a concurrency slot: its hooks start "
                "now, and it is not approved early",
            )
        )
        tracked = slot.move(tracked, slot.SlotOn.TOO_LATE, Slot.MISSING)
    return drain._enter(state, tracked, on, now, out)
