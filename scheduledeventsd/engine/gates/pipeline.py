"""The gates an event passes in order before its before-hooks: a maintenance window or lead time
(gates/window), a slot, then the drain."""

from __future__ import annotations

from ...config import EventRule
from ...records import Level, What
from .. import stages
from ..gates import drain, slot, window
from ..lifecycle import Drain, On, Phase, Slot
from ..notes import _note
from ..state import State, Tracked, _move
from ..vocabulary.constants import SLOT_GRACE
from ..vocabulary.effects import AcquireSlot, Effect, ReleaseSlot

# Every gate, in the order an event passes them: each module declares its `TABLE` (its slice
# of the event, machine.Table), which docs/lifecycle.py draws from here.
GATES = (window, slot, drain)


def _prepare(
    state: State, tracked: Tracked, on: On, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """Start the before-stage: `fast` instead of `before` when fewer than `fast_below` seconds
    are left; with no hooks to run, approval per policy at once."""
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
    settings = drain._pacemaker(state)
    if settings is not None and settings.drains(event.event_type) and tracked.drain is Drain.NONE:
        out.append(drain._drain_effect(state, tracked))
        out.append(
            _note(
                Level.INFO,
                What.CLUSTER_DRAINING,
                event,
                method=settings.method.value,
                reason="this node is marked as going away once the cluster can spare it",
            )
        )
        deadline = drain._drain_deadline(state, event, now)
        marked = drain.move(tracked, drain.DrainOn.MARK, Drain.ASKED)
        return state, _move(marked, on, Phase.DRAINING, start_at=deadline)
    return stages._before_hooks(state, tracked, on, now, out)
