"""The slot gate's lease: a held slot etcd did not confirm within its ttl is lost, and its event is
not approved early. Until when it is known to be this VM's: slot (`_slot_confirmed`); the
approval that waits for that: poll/turns."""

from __future__ import annotations

from typing import Optional

from ...records import Cause, Level, What
from .. import peers
from ..frozen import replace
from ..lifecycle import On, Phase, Slot
from ..notes import _note
from ..state import NO_FAILURES, SlotLease, State, Tracked, _move, _with, ours
from ..vocabulary.effects import Coordinate, Effect, ReleaseSlot
from . import slot


def _slots_lost(state: State, now: float, out: list[Effect]) -> State:
    """A slot etcd has not confirmed for `ttl` may be another VM's by now (its lease expired
    in a partition, or was not taken back after a restart): its event is not approved early.
    Counted from the last acknowledged keep-alive on the monotonic clock, not from when a
    failure is noticed (a keep-alive that hangs would notice it late). Hooks go on; an
    approval already under way is judged when it ends. After the approval the slot is kept
    asked for: it guards the undrain, and etcd says if it went (SlotBusy)."""
    for event_id, lease in list(state.slot_leases.items()):
        t = state.events.get(event_id)
        if t is None or t.slot is not Slot.HELD:  # over, given back, or lost otherwise
            leases = {k: v for k, v in state.slot_leases.items() if k != event_id}
            state = replace(state, slot_leases=leases)
        elif (
            lease.until <= now
            and t.phase in _BEFORE_APPROVAL
            and event_id not in state.approvals.posting
        ):
            state = _slot_lost(state, t, lease, out)
    for event_id, t in ours(state.events):
        # Lost by any path (the timer above, etcd saying the lease expired or the slot is
        # another VM's) once the event had been decided: an approval not sent is never sent.
        if (
            t.slot is Slot.MISSING
            and t.phase in (Phase.COORDINATING, Phase.APPROVING)
            and event_id not in state.approvals.posting
        ):
            state = _not_approved_without_slot(state, t, out)
    return state


def _slot_lost(state: State, t: Tracked, lease: SlotLease, out: list[Effect]) -> State:
    event_id = t.event.event_id
    # An approval sent and given up unanswered at the lease's end (PostApproval.deadline) may
    # still reach IMDS late: said, not hidden.
    unanswered = state.approvals.failures.get(event_id, NO_FAILURES).kind == "timeout"
    out.append(
        _note(
            Level.WARNING,
            What.SLOT_LOST,
            t.event,
            reason="etcd did not confirm the slot within its ttl (its lease may have expired)"
            if lease.confirmed
            else "the slot was not taken back within its ttl after the restart",
            **({"approval": "unanswered"} if unanswered else {}),
        )
    )
    out.append(
        _note(
            Level.WARNING,
            What.SLOT_UNAVAILABLE,
            t.event,
            reason="its slot was lost: its hooks go on, and it is not approved early (it "
            "proceeds at NotBefore)",
        )
    )
    out.append(ReleaseSlot(event_id))
    leases = {k: v for k, v in state.slot_leases.items() if k != event_id}
    state = replace(state, slot_leases=leases)
    return _with(state, event_id, slot.move(t, slot.SlotOn.LOST, Slot.MISSING))


def _not_approved_without_slot(state: State, t: Tracked, out: list[Effect]) -> State:
    """A shared event waiting for its peers, or an approval not sent yet, whose slot went.
    A shared event's `ready` in etcd is taken back (`failed`: nobody approves it early), or
    another VM could approve, for this one too, once every VM said ready."""
    if t.phase is Phase.COORDINATING:
        state, t = peers._stop_asking(state, t, out)
        if peers._etcd(state):
            out.append(Coordinate(t.event, t.vm_name or state.vm_name, False, t.incarnation))
    out.append(
        _note(
            Level.WARNING,
            What.EVENT_NOT_APPROVED,
            t.event,
            cause=Cause.SLOT_UNAVAILABLE.value,
            reason="its concurrency slot was lost: it proceeds at NotBefore",
        )
    )
    return _with(state, t.event.event_id, _move(t, On.SLOT_LOST, Phase.NOT_APPROVED))


# Phases in which an event may still be approved early: a slot lost then means it is not.
_BEFORE_APPROVAL = frozenset(
    {Phase.GATED, Phase.DRAINING, Phase.RUNNING, Phase.INTERRUPTED}
    | {Phase.COORDINATING, Phase.APPROVING}
)


# ---- the lease's timer: the end of a held slot's lease

DUE_PHASES = _BEFORE_APPROVAL


def due_for(state: State, event_id: str, t: Tracked, now: float, allowed: float) -> Optional[float]:
    """The end of a held slot's lease (its event is then not approved early); none while its
    approval is on its way (judged at its answer, as `_slots_lost` does)."""
    held = state.slot_leases.get(event_id)
    return None if held is None or event_id in state.approvals.posting else held.until


def fire(state: State, now: float, out: list[Effect]) -> State:
    return _slots_lost(state, now, out)
