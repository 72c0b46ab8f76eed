"""What a component declares to the composition (compose): its timers, and, for a gate, all the
composition needs of it: its table, its entry, the handlers of its messages, its timers and its
couplings. compose builds `step`'s dispatch, timers and couplings from these declarations and
`gates/pipeline.GATES`, so adding a gate edits neither compose nor the gates beside it."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypeVar

from ..records import Level, What
from .frozen import replace
from .lifecycle import On, Phase
from .machine import Table
from .notes import _note
from .state import State, Tracked, _move
from .vocabulary.effects import Effect

Handler = Callable[[State, Any, float, list[Effect]], State]
Coupling = Callable[[State, list[Effect]], State]
# A gate's entry: hold the event (its waiting phase) or hand it on (gates/onward).
Enter = Callable[[State, Tracked, On, float, list[Effect]], tuple[State, Tracked]]
# What a gate does for an event it holds after a restart (with the time), or when the event
# stops waiting there without passing (it left, Started, or lost its rule).
Restarted = Callable[[State, Tracked, float, list[Effect]], tuple[State, Tracked]]
Left = Callable[[State, Tracked, list[Effect]], tuple[State, Tracked]]


@dataclass(frozen=True)
class Timers:
    """One component's timers. `due` and `due_for` say when they are due (an instant for the
    component, one for an event in `phases`), `fire` does what is due, in this table's order.
    `next_wakeup` is derived from every `due`, so a timer cannot be fired and never waited for."""

    name: str
    fire: Optional[Callable[[State, float, list[Effect]], State]]
    due: Optional[Callable[[State, float, float], tuple[float, ...]]] = None
    due_for: Optional[Callable[[State, str, Tracked, float, float], Optional[float]]] = None
    phases: frozenset[Phase] = frozenset()


@dataclass(frozen=True)
class Gate:
    """A gate as the composition reads it (gates/pipeline lists them in the order an event passes
    them): its `table` (its slice of the event, drawn by docs/lifecycle.py), `enter` (hold the
    event, or hand it on), the handlers of the messages it owns (GateMessage), the effects it
    asks for (GateEffect, each carried out by the daemon's executor that declares it), its
    timers (fired in the order of GATES, each gate's in its own order) and its couplings (rules
    on the state, run after every message). A gate that holds events (`wait_at`: the phase
    `gated`) says what becomes of one it holds beyond its own messages: after a restart
    (`restarted`: ask again, as the slot and the drain do; its deadline in `start_at` was the
    old process's clock and is none now), when it stops waiting without passing (`left`:
    undo what the entry did), and when the wall clock stepped or a reload came (`clock_moved`:
    place again a deadline taken from the wall clock, such as NotBefore, and read the new
    settings). events, reload, lifetime and the window's re-placing call them (gates/onward)."""

    name: str
    table: Table[Any, Any]
    enter: Enter
    handlers: Mapping[type, Handler] = field(default_factory=dict)
    effects: tuple[type, ...] = ()
    timers: tuple[Timers, ...] = ()
    couplings: tuple[Coupling, ...] = ()
    restarted: Optional[Restarted] = None
    left: Optional[Left] = None
    clock_moved: Optional[Restarted] = None


def wait_at(
    gate: str,
    tracked: Tracked,
    on: On,
    out: list[Effect],
    **changes: Any,  # noqa: ANN401
) -> Tracked:
    """The event waits at `gate` (the phase `gated`, shown with the gate's name; logged as
    event_waiting reason=gate) until the gate lets it on (onward.after, with `On.PASSED`);
    `changes` as for a phase move (`start_at`: its deadline, read by the gate's `due_for`)."""
    out.append(_note(Level.INFO, What.EVENT_WAITING, tracked.event, reason="gate", gate=gate))
    return _move(tracked, on, Phase.GATED, gated=gate, **changes)


S = TypeVar("S", bound=enum.Enum)


def gate_state(tracked: Tracked, table: Table[S, Any]) -> S:
    """A gate's slice of the event, kept in `Tracked.gates` under its table's name (a gate with
    no field of its own in Tracked): its states are an enum whose none is the value ""."""
    kind = type(table.rows[0].target)
    return kind(dict(tracked.gates).get(table.name, ""))


def gate_move(tracked: Tracked, table: Table[S, Any], on: enum.Enum, target: S) -> Tracked:
    """The one place a slice kept in `Tracked.gates` changes: only as its table declares."""
    table.check(gate_state(tracked, table), on, target)
    kept = {**dict(tracked.gates), table.name: target.value}
    return replace(tracked, gates=tuple(sorted((k, v) for k, v in kept.items() if v != "")))
