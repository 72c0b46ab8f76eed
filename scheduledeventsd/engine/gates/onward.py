"""The hand-on between gates: a gate lets an event go on with `after(its name, ...)`, which enters
the gate after it in gates/pipeline.GATES (after the last: the before-hooks, runs), so no gate
names the one after it. The gates cannot import the pipeline, which lists them: it links them
here once, as it is imported (`link`). What becomes of an event a gate holds (`gated`) beyond
that gate's messages, the other components ask here (`left`, `restarted`, `clock_moved`): each
gate declares it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from .. import runs
from ..component import Enter, Gate
from ..frozen import replace
from ..lifecycle import On
from ..state import State, Tracked
from ..vocabulary.effects import Effect

_ENTER: dict[str, Enter] = {}  # gate name -> its entry
_NEXT: dict[str, Enter] = {}  # gate name -> what an event it lets go enters next
_GATES: dict[str, Gate] = {}  # gate name -> its declaration


def link(gates: Sequence[Gate]) -> None:
    """Each gate is followed by the next in `gates`, the last by the before-hooks."""
    nexts: list[Enter] = [gate.enter for gate in gates[1:]]
    nexts.append(runs._before_hooks)
    _ENTER.clear()
    _ENTER.update({gate.name: gate.enter for gate in gates})
    _NEXT.clear()
    _NEXT.update({gate.name: then for gate, then in zip(gates, nexts)})
    _GATES.clear()
    _GATES.update({gate.name: gate for gate in gates})


def after(  # noqa: PLR0917 - the gate it passed, beside the usual five
    gate: str, state: State, tracked: Tracked, on: On, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """The event passed `gate`: on to the next gate, or its before-hooks."""
    if tracked.gated == gate:
        tracked = replace(tracked, gated="")
    return _NEXT[gate](state, tracked, on, now, out)


def enter(  # noqa: PLR0917 - the gate it enters, beside the usual five
    gate: str, state: State, tracked: Tracked, on: On, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """The event enters `gate` (again: a queued event whose slot an operator freed)."""
    return _ENTER[gate](state, tracked, on, now, out)


def left(state: State, tracked: Tracked, out: list[Effect]) -> tuple[State, Tracked]:
    """The event stops waiting at the gate that holds it without passing it (it left the
    document, Started, or lost its rule): that gate lets it go (`Gate.left`). Any other event
    is as it was."""
    if not tracked.gated:
        return state, tracked
    gate = _GATES.get(tracked.gated)
    if gate is not None and gate.left is not None:
        state, tracked = gate.left(state, tracked, out)
    return state, replace(tracked, gated="")


def restarted(
    state: State, tracked: Tracked, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """The daemon restarted with the event held at a gate: that gate asks again
    (`Gate.restarted`); a gate no longer in the pipeline keeps it until it starts or leaves."""
    gate = _GATES.get(tracked.gated)
    if gate is not None and gate.restarted is not None:
        return gate.restarted(state, tracked, now, out)
    return state, tracked


def clock_moved(
    state: State, tracked: Tracked, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """The wall clock stepped, or a reload: the gate holding the event places again what it
    took from the wall clock (`Gate.clock_moved`), as the slot's and the drain's deadlines are
    (gates/window._replace_waiting)."""
    gate = _GATES.get(tracked.gated)
    if gate is not None and gate.clock_moved is not None:
        return gate.clock_moved(state, tracked, now, out)
    return state, tracked


def states_of(gate: str) -> Optional[frozenset[str]]:
    """The states `gate`'s slice in `Tracked.gates` can take (its table's), None for a gate not
    in the pipeline (kept as it is: "a gate no longer in the pipeline keeps it"): the state
    file's edge (host/store) drops a slice no step could read (component.gate_state raises)."""
    declared = _GATES.get(gate)
    if declared is None or not declared.table.rows:
        return None
    kind = type(declared.table.rows[0].target)
    return frozenset(str(state.value) for state in kind)
