"""The drain gate's other end: the node is restored once the event is over, before its after- or
cancelled-hooks (a coupling), and for an event that will never have them; the restore's answer
starts the hooks that waited for it, or its deadline does. The drain's table and its marking:
gates/drain."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

from ...records import Level, Record, What
from .. import runs
from ..lifecycle import Drain, Phase
from ..notes import event_fields
from ..state import State, Tracked, _with
from ..vocabulary.constants import RESTORE_TIMEOUT
from ..vocabulary.effects import Effect, RestoreNode, StopDraining
from ..vocabulary.messages import ClusterRestored
from .drain import _MARKED, DrainOn, _drained_for_another, _restore_unwanted, move


def _restore_first(state: State, out: list[Effect]) -> State:
    """A coupling (compose.COUPLINGS): the node is restored before the after-hooks. An event
    whose after- or cancelled-hooks wait (stages._start_stage) with this daemon's mark on the
    node asks for the restore; its hooks start on the answer (`_cluster_restored`), whatever it
    says (a failed restore is asked again until it works, as it always was), or at its
    deadline (`fire`, placed by the timer: a coupling has no clock)."""
    for event_id, t in state.events.items():
        if t.drain in _MARKED and runs._awaiting_restore(t):
            if state.cluster_mark is None:  # taken off meanwhile: nothing to wait for
                unmarked = move(t, DrainOn.UNMARKED, Drain.NONE)
                state, tracked = runs._run_stage(state, unmarked, out)
            else:
                out.append(RestoreNode(event_id, state.cluster_mark))
                tracked = replace(move(t, DrainOn.RESTORE, Drain.RESTORING), start_at=math.inf)
            state = _with(state, event_id, tracked)
    return state


# Phases that never reach the after-stage (so never `_restore_first`): a mark kept for such an
# event stayed on the node until the next restart or reload.
_NEVER_OVER = frozenset({Phase.UNHANDLED, Phase.MISSED})


def _release_left_alone(state: State, out: list[Effect]) -> State:
    """A coupling (compose.COUPLINGS): an event drained and then left alone (a reload or a
    restart took its type's rule away while it was interrupted or rebooted; it started while
    queued again) gives the mark up: the node is restored unless another event keeps it. And
    a failed restore's error is forgotten once another drain wants the mark."""
    for event_id, t in state.events.items():
        if t.drain in _MARKED and t.phase in _NEVER_OVER:
            if t.drain is Drain.ASKED:
                out.append(StopDraining(event_id))
            state = _with(state, event_id, move(t, DrainOn.LEFT_ALONE, Drain.NONE))
            _restore_unwanted(state, out)
    if state.restore_error and _drained_for_another(state, ""):
        # A drain wants the mark again: the drainer stopped trying the failed restore (its
        # event's end restores the node), so `status` no longer says it is tried again.
        state = replace(state, restore_error="")
    return state


def _cluster_restored(state: State, msg: ClusterRestored, now: float, out: list[Effect]) -> State:
    """The answer starts the hooks of the event it answers for, whatever it says; the node
    back, also those of every other event that waited for it (the restore of the mark no event
    wanted, asked at a boot beside the event's own, took the same mark off: the event's drain
    was cleared, and its hooks, taken for ones waiting for their next try, never ran)."""
    answered = (msg.event_id,) if msg.error else tuple(state.events)
    waiting = [k for k in answered if k in state.events and runs._awaiting_restore(state.events[k])]
    state = _restored(state, msg, out)
    for event_id in waiting:  # their hooks, now
        t = state.events[event_id]
        if t.drain is not Drain.NONE:  # failed: no longer waited for (the state file says so)
            t = move(t, DrainOn.RESTORE_FAILED, Drain.NONE)
        state, tracked = runs._run_stage(state, t, out)
        state = _with(state, event_id, tracked)
    return state


def _restored(state: State, msg: ClusterRestored, out: list[Effect]) -> State:
    tracked = state.events.get(msg.event_id)
    event_fields_ = {} if tracked is None else event_fields(tracked.event)
    if msg.error:
        out.append(
            Record(
                Level.ERROR,
                What.CLUSTER_RESTORE_FAILED,
                {**event_fields_, "error": msg.error, "reason": "asked again until it works"},
            )
        )
        return replace(state, restore_error=msg.error) if state.cluster_mark else state
    # The node is back: no event that is over holds a mark any more.
    state = replace(
        state,
        cluster_mark=None,
        restore_error="",
        events={
            k: move(t, DrainOn.RESTORED, Drain.NONE)
            if t.drain is not Drain.NONE and t.phase in (Phase.AFTER, Phase.OVER)
            else t
            for k, t in state.events.items()
        },
    )
    out.append(
        Record(
            Level.INFO,
            What.CLUSTER_RESTORED,
            event_fields_ or {"reason": "this daemon's mark, which no event wants any more"},
        )
    )
    if tracked is not None and tracked.drain is not Drain.NONE:
        state = _with(state, msg.event_id, move(tracked, DrainOn.RESTORED, Drain.NONE))
    return state


# ---- the restore's timer: its answer's deadline (RESTORE_TIMEOUT)

DUE_PHASES = frozenset({Phase.AFTER})


def _asked(t: Tracked) -> bool:
    """Its hooks wait for the answer to a restore asked for (`start_at`: by when; inf: the
    deadline not placed yet)."""
    return t.drain is Drain.RESTORING and runs._awaiting_restore(t)


def due_for(state: State, event_id: str, t: Tracked, now: float, allowed: float) -> Optional[float]:
    if state.stopping is not None or not _asked(t):
        return None
    return now if math.isinf(t.start_at) else t.start_at  # unplaced: placed now, by `fire`


def fire(state: State, now: float, out: list[Effect]) -> State:
    """Places the deadline of a restore asked for; one not answered by then (the drainer's
    thread hangs) counts as failed: asked again (tried until it works), and the hooks start,
    as on a failed answer. Before, they waited for ever."""
    if state.stopping is not None:
        return state
    for event_id, t in state.events.items():
        if not _asked(t):
            continue
        if math.isinf(t.start_at):
            state = _with(state, event_id, replace(t, start_at=now + RESTORE_TIMEOUT))
        elif t.start_at <= now:
            if state.cluster_mark is not None:
                out.append(RestoreNode(event_id, state.cluster_mark))
            unanswered = ClusterRestored(event_id, f"no answer in {RESTORE_TIMEOUT:g} s")
            state = _cluster_restored(state, unanswered, now, out)
    return state
