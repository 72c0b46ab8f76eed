"""The gates an event passes in order before its before-hooks: a maintenance window or lead time
(gates/window), a slot, then the drain. Each hands the event on to the next (window ->
slot._enter -> drain._enter -> runs._before_hooks), so none of them imports this module."""

from __future__ import annotations

from ..gates import drain, slot, window
from ..lifecycle import On
from ..state import State, Tracked
from ..vocabulary.effects import Effect

# Every gate, in the order an event passes them: each module declares its `TABLE` (its slice
# of the event, machine.Table), which docs/lifecycle.py draws from here.
GATES = (window, slot, drain)


def _prepare(
    state: State, tracked: Tracked, on: On, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """Enter the gates after the window (events first seen, or judged again): the slot's, which
    hands the event on to the drain's, which starts the before-hooks."""
    return slot._enter(state, tracked, on, now, out)
