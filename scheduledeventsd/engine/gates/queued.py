"""The slot gate as the composition reads it (`GATE`): an event enters it and waits in QUEUED for
a concurrency slot, and goes on (gates/onward) once etcd grants it or its deadline comes. Its
table and what it keeps: slot; the lease of a held slot: lease; the hold through the maintenance:
hold; an operator's free: freed. The window bounds when preparation starts: a slot granted after
the window closed is given back here."""

from __future__ import annotations

from typing import Optional

from ...config import EventRule
from ...records import Level, What
from ..component import Gate, Timers
from ..frozen import replace
from ..lifecycle import On, Phase, Slot
from ..notes import _note
from ..state import State, Tracked, _move, _with, ours
from ..vocabulary.constants import SLOT_GRACE
from ..vocabulary.effects import AcquireSlot, Effect, HoldSlot, ReleaseSlot
from ..vocabulary.messages import (
    SlotBusy,
    SlotFailed,
    SlotFreed,
    SlotGranted,
    SlotKept,
    SlotMoved,
)
from . import freed, hold, lease, onward, slot, through, window
from .slot import (
    SlotOn,
    _groups,
    _needs_slot,
    _slot_awaited,
    _slot_confirmed,
    _slot_deadline,
    _slot_waiting,
    move,
)

NAME = slot.TABLE.name


def _enter(
    state: State, tracked: Tracked, on: On, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """The slot gate, after the window's: a slot asked for (or a held one being taken back)
    holds the event in QUEUED until it comes or its deadline; else the drain's gate is next."""
    event = tracked.event
    rule = state.config.events.get(event.event_type, EventRule())
    if _slot_awaited(state, tracked):
        # After a restart or a crash its slot may be another VM's by now: the hooks wait in
        # the queue until it is taken back (or lost, then granted), or until the lead, as any
        # queued event (`max` counts VMs from before-hooks start).
        deadline = _slot_deadline(event, rule, state)
        if deadline is not None and now < deadline + SLOT_GRACE:  # etcd's answer, at the lead
            deadline = max(deadline, now + SLOT_GRACE)
            out.append(_slot_waiting(event, deadline, state.slot_holders, state))
            return state, _move(tracked, on, Phase.QUEUED, start_at=deadline)
        if tracked.slot is Slot.ASKED:  # past its lead: prepared without it
            out.append(ReleaseSlot(event.event_id))
            tracked = move(tracked, SlotOn.GIVEN_UP, Slot.NONE)
    if _needs_slot(state, tracked):
        deadline = _slot_deadline(event, rule, state)
        if deadline is not None and now < deadline + SLOT_GRACE:  # at the lead itself, too
            deadline = max(deadline, now + SLOT_GRACE)
            out.append(AcquireSlot(event, tracked.vm_name or state.vm_name or ""))
            out.append(_slot_waiting(event, deadline, (), state))
            asked = move(tracked, SlotOn.ASK, Slot.ASKED)
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
        tracked = move(tracked, SlotOn.TOO_LATE, Slot.MISSING)
    return onward.after(NAME, state, tracked, on, now, out)


def _granted(state: State, msg: SlotGranted, now: float, out: list[Effect]) -> State:
    tracked = state.events.get(msg.event_id)
    if tracked is None or tracked.slot not in (Slot.ASKED, Slot.HELD):
        out.append(ReleaseSlot(msg.event_id))  # it went meanwhile, or gave up waiting
        return state
    back = tracked.slot is Slot.HELD  # after a restart: the slot it held, under a new lease
    if msg.holders:  # who holds the slots now: this VM, and those it shares them with
        state = replace(state, slot_holders=msg.holders)
    groups = _groups(state)
    out.append(_note(Level.INFO, What.SLOT_ACQUIRED, tracked.event, **groups, taken_back=back))
    tracked = move(tracked, SlotOn.GRANTED, Slot.HELD)
    confirmed = now if msg.confirmed is None else msg.confirmed
    state = _slot_confirmed(state, msg.event_id, confirmed)
    if tracked.phase is not Phase.QUEUED:
        return _with(state, msg.event_id, tracked)
    state, tracked = onward.after(NAME, state, tracked, On.SLOT, now, out)  # past the gate
    return _with(state, msg.event_id, tracked)


def _slot_granted(state: State, msg: SlotGranted, now: float, out: list[Effect]) -> State:
    """The window bounds when preparation starts: a slot granted to a queued event after its
    window closed is given back; any other grant lets the event go on (`_granted`)."""
    tracked = state.events.get(msg.event_id)
    if tracked is not None and tracked.phase is Phase.QUEUED and tracked.slot is Slot.ASKED:
        # One queued again after a restart goes on: its preparation started in its window.
        held = None if tracked.prepared else _window_closed(state, tracked, now)
        if held is not None:
            return _wait_for_window(state, tracked, held, out)
    return _granted(state, msg, now, out)


def _window_closed(state: State, tracked: Tracked, now: float) -> Optional[window.Held]:
    """The window gate's answer for a queued event granted its slot now: None when its hooks may
    start now (in a window, no window before NotBefore, its lead come); else when they may."""
    if not state.config.windows:
        return None
    rule = state.config.events.get(tracked.event.event_type, EventRule())
    return window._start_at(tracked.event, rule, state, now)


def _wait_for_window(state: State, tracked: Tracked, held: window.Held, out: list[Effect]) -> State:
    """A slot granted after the window closed (the VM waited for it past the window's end) is
    given back, and the event waits for the next window, or its lead, then asks again."""
    event = tracked.event
    rule = state.config.events.get(event.event_type, EventRule())
    out.append(ReleaseSlot(event.event_id))
    waiting = window._waiting(event, rule, held, state)
    out.append(replace(waiting, fields={**waiting.fields, "slot": "given back: its window closed"}))
    given_back = move(tracked, SlotOn.OUT_OF_WINDOW, Slot.NONE)
    return _with(state, event.event_id, window._hold_again(given_back, On.SLOT, held))


def _deadlines(state: State, now: float, out: list[Effect]) -> State:
    """QUEUED events whose deadline came without a slot: prepared anyway, never approved early."""
    for event_id, t in ours(state.events):
        if t.phase is not Phase.QUEUED or t.start_at > now:
            continue
        out.append(ReleaseSlot(event_id))
        out.append(
            _note(
                Level.WARNING,
                What.SLOT_UNAVAILABLE,
                t.event,
                reason="no concurrency slot by its deadline: its hooks start now, and it "
                "is not approved early (it proceeds at NotBefore)",
            )
        )
        missing = move(t, SlotOn.DEADLINE, Slot.MISSING)
        if t.event.event_type not in state.config.events:
            continue  # a reload removed it (handled there); never an empty run by accident
        state, tracked = onward.after(NAME, state, missing, On.LEAD_TIME, now, out)  # without
        state = _with(state, event_id, tracked)
    return state


# ---- the slot gate's timer: a QUEUED event's deadline (a held slot's lease: gates/lease)

DUE_PHASES = frozenset({Phase.QUEUED})


def due_for(state: State, event_id: str, t: Tracked, now: float, allowed: float) -> Optional[float]:
    """A QUEUED event's deadline (none while stopping)."""
    return None if state.stopping is not None else t.start_at


def fire(state: State, now: float, out: list[Effect]) -> State:
    return _deadlines(state, now, out)


GATE = Gate(
    NAME,
    slot.TABLE,
    _enter,
    handlers={
        SlotGranted: _slot_granted,
        SlotKept: slot._slot_kept,
        SlotBusy: hold._slot_busy,
        SlotFailed: slot._slot_failed,
        SlotFreed: freed._slot_freed,
        SlotMoved: through._slot_moved,
    },
    effects=(AcquireSlot, ReleaseSlot, HoldSlot),
    timers=(
        Timers("lease", lease.fire, None, lease.due_for, lease.DUE_PHASES),
        Timers("slot", fire, None, due_for, DUE_PHASES),
        Timers("hold", hold.fire, None, hold.due_for, hold.DUE_PHASES),
    ),
    couplings=(
        slot._release_when_over,  # the slot is given back once its event is over
        through._hold_through,  # and held through its VM's maintenance (HoldSlot alive)
    ),
)
