"""The gates an event passes in order before its before-hooks: a maintenance window or lead time
(gates/window), a slot (gates/queued), then the drain (gates/drain). Each declares its `GATE`
(component.Gate): compose builds `step`'s handlers, timers and couplings from `GATES`, and
docs/lifecycle.py draws their tables from it. A gate lets an event go on through gates/onward,
which this module links in this order, so no gate names the one after it."""

from __future__ import annotations

from ..lifecycle import On
from ..state import State, Tracked
from ..vocabulary.effects import Effect
from . import drain, onward, queued, window

# Every gate, in the order an event passes them.
GATES = (window.GATE, queued.GATE, drain.GATE)
onward.link(GATES)


def enter(
    state: State, tracked: Tracked, on: On, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """An event first seen enters the first gate."""
    return GATES[0].enter(state, tracked, on, now, out)


def _prepare(
    state: State, tracked: Tracked, on: On, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """Enter the gates after the window (before-hooks cut off by a stop, run again)."""
    return onward.after(window.NAME, state, tracked, on, now, out)
