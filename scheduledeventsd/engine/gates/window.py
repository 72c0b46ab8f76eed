"""The window gate: when an event's before-hooks start: maintenance windows, within the lead time
(gates/lead); which hooks then (the fast path): runs. `hold` is pure and on the wall clock; the
engine places its answer on the monotonic clock. What holds an event back is its slice
`Tracked.window`, moved only through `TABLE`, as the slot and drain gates' are."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Optional

from ...config import EventRule
from ...model import Event
from ...records import Level, Record, What
from ...windows import Window, first_opening
from ..component import Gate, Timers
from ..frozen import replace
from ..lifecycle import On, Phase
from ..machine import Table, row
from ..notes import _iso_wall, _note
from ..state import Hold, State, Tracked, _move, _with, ours
from ..vocabulary.effects import Effect
from . import drain, onward, slot
from .lead import WINDOW_LEAD, lead


class WindowOn(str, enum.Enum):
    """What happens to an event's wait for its start instant: the triggers of its table."""

    HELD = "first seen: its before-hooks are held back"
    PLACED = "placed again (a document, a clock step, a reload)"
    RESTARTED = "the daemon restarted while it waited"
    OPENED = "its start instant came"
    DROPPED = "it started, or a reload (or a restart) removed its type, while it waited"
    CLOSED = "its slot came after its window closed (gates/slot)"


_ = Hold
_HELD = (_.LEAD, _.WINDOW, _.UNPLACED)
TABLE = Table(
    "window",
    "what holds an event's before-hooks back, before the slot and drain gates (start_before, "
    "windows): its phase is waiting meanwhile; not in the state file, a restart places it again",
    (
        row([_.NONE], WindowOn.HELD, _.LEAD, "event_waiting reason=start_before"),
        row([_.NONE], WindowOn.HELD, _.WINDOW, "event_waiting reason=window"),
        row(_HELD, WindowOn.PLACED, _.LEAD, "event_waiting again if it moved by over 1 s"),
        row(_HELD, WindowOn.PLACED, _.WINDOW, "event_waiting again if it moved by over 1 s"),
        row([_.NONE], WindowOn.RESTARTED, _.UNPLACED, "no start instant until the next document"),
        row(_HELD, WindowOn.OPENED, _.OPEN, "on to the slot and drain gates (gates/pipeline)"),
        row(_HELD, WindowOn.DROPPED, _.NONE, "event_missed, or event_unhandled"),
        row([_.NONE, _.OPEN], WindowOn.CLOSED, _.WINDOW, "the slot given back: event_waiting"),
        row([_.NONE, _.OPEN], WindowOn.CLOSED, _.LEAD, "the slot given back: event_waiting"),
    ),
)
del _


NAME = "window"


def move(tracked: Tracked, on: WindowOn, target: Hold) -> Tracked:
    """The one place an event's window slice changes: only as `TABLE` declares."""
    TABLE.check(tracked.window, on, target)
    return replace(tracked, window=target)


@dataclass(frozen=True)
class Held:
    """Why and until when an event's before-hooks wait."""

    at: float  # wall clock
    reason: str  # "start_before" | "window"
    window: Optional[str] = None  # the window that opens then, as configured


def hold(event: Event, rule: EventRule, windows: tuple[Window, ...], now: float) -> Optional[Held]:
    """When a lead time or a window holds back the before-hooks, the instant they start; None
    when they start now. Windows choose within what start_before allows: the first instant in
    a window that is no earlier than start_before before NotBefore and no later than the window
    lead (`window_lead`); a window that opens only after that gives way to the lead (start_before,
    else WINDOW_LEAD); none opening before NotBefore at all: as without windows."""
    if event.not_before is None:
        return None
    not_before = event.not_before.timestamp()
    held: Optional[Held] = None
    earliest = now
    if rule.start_before is not None and rule.before:
        held = Held(not_before - rule.start_before, "start_before")
        earliest = max(now, held.at)
    if windows and rule.obeys_windows(event.event_type):
        found = first_opening(windows, earliest, not_before)
        if found is not None:
            opens, window = found
            if opens > not_before - window_lead(rule):  # the window opens too late: the lead
                held = Held(not_before - lead(rule), "start_before")
            else:
                held = Held(opens, "window", window.describe())
    return held if held is not None and held.at > now else None


def window_lead(rule: EventRule) -> float:
    """How long before NotBefore a window must open to start the before-hooks: WINDOW_LEAD,
    or start_before when that is shorter (then only a window open at the lead counts)."""
    return min(lead(rule), WINDOW_LEAD)


def _holding(held: Held) -> Hold:
    return Hold.WINDOW if held.reason == "window" else Hold.LEAD


def _hold_back(tracked: Tracked, on: On, held: Held) -> Tracked:
    """A new event whose before-hooks a lead time or a window holds back: it waits."""
    waiting = move(tracked, WindowOn.HELD, _holding(held))
    return _move(waiting, on, Phase.WAITING, start_at=held.at)


def _enter(
    state: State, tracked: Tracked, on: On, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """The first gate (an event first seen): a lead time or a window holds its before-hooks
    back, and it waits; else it goes on (gates/onward)."""
    event = tracked.event
    rule = state.config.events.get(event.event_type, EventRule())
    held = _start_at(event, rule, state, now)
    if held is None:
        return onward.after(NAME, state, tracked, on, now, out)
    out.append(_waiting(event, rule, held, state))
    return state, _hold_back(tracked, on, held)


def _hold_again(tracked: Tracked, on: On, held: Held) -> Tracked:
    """A queued event whose slot came after its window closed (gates/slot): it waits again."""
    waiting = move(tracked, WindowOn.CLOSED, _holding(held))
    return _move(waiting, on, Phase.WAITING, start_at=held.at)


def _restarted(tracked: Tracked, on: On) -> Tracked:
    """A waiting event after a restart: placed again by the next document (the clock may have
    jumped meanwhile)."""
    unplaced = move(tracked, WindowOn.RESTARTED, Hold.UNPLACED)
    return _move(unplaced, on, Phase.WAITING, start_at=math.inf)


def _dropped(tracked: Tracked) -> Tracked:
    """A waiting event leaves the gate another way than by its start instant."""
    if tracked.phase is not Phase.WAITING:
        return tracked
    return move(tracked, WindowOn.DROPPED, Hold.NONE)


def _start_at(event: Event, rule: EventRule, state: State, now: float) -> Optional[Held]:
    """`when.hold` on the monotonic clock: the instant the before-hooks start, None for now."""
    if state.wall_offset is None:
        return None
    held = hold(event, rule, state.config.windows, now + state.wall_offset)
    return None if held is None else replace(held, at=held.at - state.wall_offset)


def _waiting(event: Event, rule: EventRule, held: Held, state: State) -> Record:
    wall = held.at + (state.wall_offset or 0.0)
    fields: dict[str, object] = {
        "hooks_start_at": _iso_wall(wall),
        "reason": held.reason,
    }
    if held.window is not None:
        fields["window"] = held.window
    if rule.start_before is not None:
        fields["start_before"] = rule.start_before
    return _note(Level.INFO, What.EVENT_WAITING, event, **fields)


def _still_waiting(tracked: Tracked, state: State, now: float, out: list[Effect]) -> Tracked:
    """A NotBefore that moves, a clock that steps, a reload that changes the windows: the wait
    is placed again."""
    event = tracked.event
    rule = state.config.events.get(event.event_type, EventRule())
    held = _start_at(event, rule, state, now)
    if held is None:  # its instant is now: the gate opens when the timers fire, in this step
        return replace(tracked, start_at=now)
    if abs(held.at - tracked.start_at) > 1:
        out.append(_waiting(event, rule, held, state))
    return replace(move(tracked, WindowOn.PLACED, _holding(held)), start_at=held.at)


def _start_waiting(state: State, now: float, out: list[Effect]) -> State:
    """Events whose lead time has come start their before-hooks (RUNNING is written first)."""
    for event_id, t in ours(state.events):
        if t.phase is not Phase.WAITING or t.start_at > now:
            continue
        if t.event.event_type not in state.config.events:
            continue  # a reload removed it (handled there); never an empty run by accident
        opened = move(t, WindowOn.OPENED, Hold.OPEN)
        state, tracked = onward.after(NAME, state, opened, On.LEAD_TIME, now, out)
        state = _with(state, event_id, tracked)
    return state


# ---- the window gate's timer: when a WAITING event's before-hooks start

DUE_PHASES = frozenset({Phase.WAITING})


def due_for(state: State, event_id: str, t: Tracked, now: float, allowed: float) -> Optional[float]:
    """A WAITING event's start instant (none while stopping)."""
    return None if state.stopping is not None else t.start_at


def fire(state: State, now: float, out: list[Effect]) -> State:
    return _start_waiting(state, now, out)


def _replace_waiting(
    state: State, now: float, out: list[Effect], moved: Optional[float] = None
) -> State:
    """The clock moved within one document (by `moved` s), or a reload: every timer taken from
    the wall clock is placed again: WAITING events' lead or window, QUEUED events' slot
    deadline, and, after a step, a drain's cap at NotBefore; a GATED event's, by its gate."""
    for event_id, t in state.events.items():
        if t.phase is Phase.WAITING:
            state = _with(state, event_id, _still_waiting(t, state, now, out))
        elif t.phase is Phase.QUEUED and math.isfinite(t.start_at):
            state = _with(state, event_id, replace(t, start_at=slot._queued_until(t, state, now)))
        elif t.phase is Phase.DRAINING and moved is not None and t.event.not_before is not None:
            state = _with(state, event_id, replace(t, start_at=drain._drain_moved(state, t, moved)))
        elif t.phase is Phase.GATED:
            state, t = onward.clock_moved(state, t, now, out)  # noqa: PLW2901
            state = _with(state, event_id, t)
    return state


GATE = Gate(
    NAME,
    TABLE,
    _enter,
    timers=(Timers("window", fire, None, due_for, DUE_PHASES),),
)
