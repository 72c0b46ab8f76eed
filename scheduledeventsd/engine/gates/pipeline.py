"""The gates an event passes in order before its before-hooks: a maintenance window or lead time
(gates/window), a slot, then the drain. Each hands the event on to the next (window ->
slot._enter -> drain._enter -> runs._before_hooks), so none of them imports this module. What
couples two gates the other way (a slot granted after the window closed) is decided here."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ...config import EventRule
from ..gates import drain, slot, window
from ..lifecycle import On, Phase, Slot
from ..state import State, Tracked, _with
from ..vocabulary.effects import Effect, ReleaseSlot
from ..vocabulary.messages import SlotGranted

# Every gate, in the order an event passes them: each module declares its `TABLE` (its slice
# of the event, machine.Table), which docs/lifecycle.py draws from here.
GATES = (window, slot, drain)


def _prepare(
    state: State, tracked: Tracked, on: On, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """Enter the gates after the window (events first seen, or judged again): the slot's, which
    hands the event on to the drain's, which starts the before-hooks."""
    return slot._enter(state, tracked, on, now, out)


def _slot_granted(state: State, msg: SlotGranted, now: float, out: list[Effect]) -> State:
    """The window bounds when preparation starts: a slot granted to a queued event after its
    window closed is given back; any other grant is the slot gate's."""
    tracked = state.events.get(msg.event_id)
    if tracked is not None and tracked.phase is Phase.QUEUED and tracked.slot is Slot.ASKED:
        # One queued again after a restart goes on: its preparation started in its window.
        held = None if tracked.prepared else _window_closed(state, tracked, now)
        if held is not None:
            return _wait_for_window(state, tracked, held, out)
    return slot._slot_granted(state, msg, now, out)


def _window_closed(state: State, tracked: Tracked, now: float) -> Optional[window.Held]:
    """The window gate's answer for a queued event granted its slot now: None when its hooks may
    start now (in a window, no window before NotBefore, its lead come); else when they may."""
    if not state.config.windows:
        return None
    rule = state.config.events.get(tracked.event.event_type, EventRule())
    return window._start_at(tracked.event, rule, state, now)


def _wait_for_window(state: State, tracked: Tracked, held: window.Held, out: list[Effect]) -> State:
    """The window bounds when preparation starts: a slot granted after the window closed (the
    VM waited for it past the window's end) is given back, and the event waits for the next
    window, or its lead, then asks again."""
    event = tracked.event
    rule = state.config.events.get(event.event_type, EventRule())
    out.append(ReleaseSlot(event.event_id))
    waiting = window._waiting(event, rule, held, state)
    out.append(replace(waiting, fields={**waiting.fields, "slot": "given back: its window closed"}))
    given_back = slot.move(tracked, slot.SlotOn.OUT_OF_WINDOW, Slot.NONE)
    return _with(state, event.event_id, window._hold_again(given_back, On.SLOT, held))
