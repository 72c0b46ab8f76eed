"""The composition: `step` (re-exported as `engine.step`) takes one message and returns the new
state and the effects; after every message the components' timers fire (`TIMERS`) and the
couplings between the machines run (`COUPLINGS`). What the gates add to each is read from their
declarations (component.Gate) through gates/pipeline.GATES, never listed here. Named `compose`,
not `step`, so the module is never shadowed by the function the package re-exports."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Callable, Optional

from ..records import Level, Record, What
from . import approval, events, lifetime, peers, postponed, reload
from .component import Coupling, Gate, Handler, Timers
from .frozen import replace
from .gates import pipeline, restore
from .lifecycle import IllegalTransitionError, Phase
from .notes import _persist_on_change, _status
from .poll import names, timing, turns
from .state import State, Tracked, ours
from .vocabulary.constants import CLOCK_STEP, POLL_BACKOFF_CAP
from .vocabulary.effects import Effect, Exit, WakeAt
from .vocabulary.messages import (
    ApprovalFailed,
    ApprovalSent,
    Boot,
    CoordinationFailed,
    DocumentFetched,
    Faulted,
    GateAnswered,
    HooksFinished,
    Message,
    NameResolved,
    PeersChanged,
    Persisted,
    PollFailed,
    Reloaded,
    ReloadFailed,
    ReloadRequested,
    SharedForgotten,
    StopRequested,
    Tick,
)


def step(state: State, message: Message, now: float) -> tuple[State, tuple[Effect, ...]]:
    """Apply one message at monotonic time `now`; returns the new state and what to do.

    A transition the lifecycle table does not declare raises in strict mode (tests); otherwise
    the message is refused whole (`transition_refused`) and the state stays as it was.
    """
    if type(message) is DocumentFetched:
        quiet = _quiet_answer(state, message, now)
        if quiet is not None:
            return quiet
    return full_step(state, message, now)


def _quiet_answer(
    state: State, msg: DocumentFetched, now: float
) -> Optional[tuple[State, tuple[Effect, ...]]]:
    """The same incarnation again, on time, while no timer is due: all a step would do is
    order the next poll, so that is all this does (at rest, at 4 Hz, the walk over every timer
    was most of the daemon's CPU). test_promises checks it equals `full_step` in every history.
    None: take the whole step."""
    wall, offset = msg.wall, state.wall_offset
    if (
        msg.document.incarnation != state.incarnation
        or state.stopping is not None
        or state.poll.failures.count
        or wall is None
        or offset is None
        or abs(wall - now - offset) > CLOCK_STEP
        or next_wakeup(state, now) <= now
        or turns._others_due(state, now)
    ):
        return None
    out: list[Effect] = []
    new = timing._order_next_poll(state, now, out)
    out.append(WakeAt(next_wakeup(new, now)))
    return new, tuple(out)


def full_step(state: State, message: Message, now: float) -> tuple[State, tuple[Effect, ...]]:
    """`step` without its shortcut for a quiet answer."""
    out: list[Effect] = []
    refused = False
    try:
        new = _HANDLERS[type(message)](state, message, now, out)
        if type(message) is Faulted:
            new, refused = _timers_after_fault(new, now, out)
        else:
            new = _timers(new, now, out)
        new = _couple(new, out)
    except IllegalTransitionError as e:
        if state.strict:
            raise
        document = _document_of(message)
        out = [
            Record(
                Level.ERROR,
                What.TRANSITION_REFUSED,
                {"message": type(message).__name__, "error": str(e), **document},
            )
        ]
        if document and document["incarnation"] == state.refused_document:
            out = []  # said once for this document: refused again quietly (counted: faults)
        new = _refused(state, message, now, out)
        refused = True
    _persist_on_change(state, new, out)
    new = _status(new, out)
    if any(isinstance(e, Exit) for e in out):
        # Last: what the couplings and the persisting did after the stop ended comes first.
        out.sort(key=lambda e: isinstance(e, Exit))
    else:
        wake = next_wakeup(new, now)
        if refused:  # a due timer that raises is not tried again at once, in a busy loop
            wake = max(wake, now + POLL_BACKOFF_CAP)
        out.append(WakeAt(wake))
    return new, tuple(out)


# Couplings between the machines: rules on the state alone, each declared by its gate (and the
# peers' own, first: a forgotten shared event's mark deleted; then the approvals': one asked for
# and no longer wanted is withdrawn), run after every message until
# none changes anything (h11's state-triggered transitions).
# After them, what the step changed is persisted (notes._persist_on_change), then the status.
_ROUNDS = 8  # a fixed point comes in one or two; never a loop that cannot end
_OWN_COUPLINGS = (peers._forget_marks, approval._withdraw)


def _couple(state: State, out: list[Effect]) -> State:
    for _ in range(_ROUNDS):
        new = state
        for coupling in COUPLINGS:
            new = coupling(new, out)
        if new is state:
            break
        state = new
    return state


def _timers_after_fault(state: State, now: float, out: list[Effect]) -> tuple[State, bool]:
    """`_timers` after a fault, whose cause may be a due timer that raises again: then the poll
    is ordered all the same (True: wake no sooner than the poll backoff's cap). Otherwise the
    daemon, which drops a Faulted step that raises, woke at once for ever and never polled."""
    mark = len(out)
    try:
        return _timers(state, now, out), False
    except Exception:  # the daemon logged this defect (internal_error) for the first message
        if state.strict:
            raise
        del out[mark:]
        state = lifetime._watchdog(state, now, out)  # it still polls: systemd need not restart it
        if state.ready and state.stopping is None and state.poll.in_flight_since is None:
            state = timing._order_poll(state, state.poll, now, out)
        return state, True


def _refused(state: State, message: Message, now: float, out: list[Effect]) -> State:
    """A refused message changes nothing, except that what it held is released as for a
    `Faulted` one: a document refused whole once left its poll "in flight" for ever, so no
    poll was ordered again (issue 26 #16). The next poll is ordered here, not by `_timers`,
    whose own due timer may be what raised."""
    state = lifetime._faulted(state, Faulted("transition", "", message), now, out)
    if isinstance(message, DocumentFetched):  # served again every poll: said once (full_step)
        state = replace(state, refused_document=message.document.incarnation)
    if state.ready and state.stopping is None and state.poll.in_flight_since is None:
        state = timing._order_poll(state, state.poll, now, out)
    return state


def _document_of(message: Message) -> dict[str, int]:
    """The refused document's incarnation, as its record says it (none for other messages)."""
    if isinstance(message, DocumentFetched):
        return {"incarnation": message.document.incarnation}
    return {}


# The messages of the components that are not gates; the gates' come from their declarations.
_OWN_HANDLERS: Mapping[type, Handler] = {
    Boot: lifetime._boot,
    DocumentFetched: events._document_fetched,
    PollFailed: timing._poll_failed,
    NameResolved: names._name_resolved,
    HooksFinished: postponed._hooks_finished,
    ApprovalSent: approval._approval_sent,
    ApprovalFailed: approval._approval_failed,
    Persisted: lifetime._persisted,
    Tick: lifetime._tick,
    ReloadRequested: reload._reload_requested,
    Reloaded: reload._reloaded,
    ReloadFailed: reload._reload_failed,
    StopRequested: lifetime._stop_requested,
    PeersChanged: postponed._peers_changed,
    CoordinationFailed: peers._coordination_failed,
    SharedForgotten: postponed._shared_forgotten,
    GateAnswered: peers._gate_answered,
    Faulted: lifetime._faulted,
}


# ---- timers --------------------------------------------------------------------------------


# In the order they fire after every message: the lifetime's, each gate's in the order of
# pipeline.GATES, then the rest. The daemon's own (the watchdog, the stop) fire first, in
# `_timers`: while stopping nothing else does.
_FIRST_TIMERS = (Timers("lifetime", None, lifetime.due),)
_LAST_TIMERS = (
    Timers("restore", restore.fire, None, restore.due_for, restore.DUE_PHASES),
    Timers("peers", peers.fire, None, peers.due_for, peers.DUE_PHASES),
    Timers("approval", approval.fire, None, turns.approval_due, approval.DUE_PHASES),
    Timers("names", names.fire, names.due),
    Timers("poll", timing.fire, timing.due),
)
DueFor = Callable[[State, str, Tracked, float, float], Optional[float]]
Composed = tuple[
    Mapping[type, Handler],
    tuple[Timers, ...],
    tuple[Coupling, ...],
    tuple[Callable[[State, float, float], tuple[float, ...]], ...],
    Mapping[Phase, tuple[DueFor, ...]],
]


def composed(gates: Sequence[Gate]) -> Composed:
    """The handlers, timers and couplings of the components with these gates, and what
    `next_wakeup` reads of the timers. A message two components claim is a defect: it raises."""
    handlers = dict(_OWN_HANDLERS)
    for gate in gates:
        for message, handler in gate.handlers.items():
            if message in handlers:
                raise ValueError(f"{message.__name__}: handled twice ({gate.name})")
            handlers[message] = handler
    timers = (*_FIRST_TIMERS, *(t for gate in gates for t in gate.timers), *_LAST_TIMERS)
    couplings = (*_OWN_COUPLINGS, *(c for gate in gates for c in gate.couplings))
    if any(Phase.NOT_OURS in t.phases for t in timers):
        raise ValueError("a timer for another VM's event: next_wakeup reads only ours")
    due = tuple(t.due for t in timers if t.due is not None)
    by_phase = {
        phase: tuple(t.due_for for t in timers if t.due_for is not None and phase in t.phases)
        for phase in Phase
    }
    return handlers, timers, couplings, due, by_phase


_HANDLERS, TIMERS, COUPLINGS, _DUE, _DUE_BY_PHASE = composed(pipeline.GATES)


def _timers(state: State, now: float, out: list[Effect]) -> State:
    """Start whatever is due; runs after every message, so no timer waits for a Tick."""
    state = lifetime._watchdog(state, now, out)
    if state.stopping is not None:
        return lifetime._shutdown(state, now, out)
    for timers in TIMERS:
        if timers.fire is not None:
            state = timers.fire(state, now, out)
    return state


def next_wakeup(state: State, now: float) -> float:
    """The earliest instant a timer of this state is due (never in the past): the soonest of
    every component's `due`."""
    allowed = timing._allowed_first(state, now)  # none is due before the rate limit allows it
    times: list[float] = []
    for due in _DUE:
        times.extend(due(state, now, allowed))
    by_phase = _DUE_BY_PHASE
    for event_id, t in ours(state.events):  # no timer is another VM's (`composed`)
        for due_for in by_phase[t.phase]:
            at = due_for(state, event_id, t, now, allowed)
            if at is not None:
                times.append(at)
    due_at = [t for t in times if math.isfinite(t)]  # an event waiting for a document is not
    return max(now, min(due_at)) if due_at else now + 3600.0
