"""The drain gate: the Pacemaker cluster moves this node's resources away before the before-hooks,
and the node is restored once the event is over."""

from __future__ import annotations

import enum
import math
from typing import Optional

from ...config import Config, Pacemaker
from ...model import Event
from ...records import Level, Record, What
from .. import runs
from ..component import Gate, Timers
from ..frozen import replace
from ..lifecycle import Drain, On, Phase, Slot
from ..machine import Table, row
from ..notes import _note, event_fields
from ..state import Events, State, Tracked, _move, _with, mark_of, ours
from ..vocabulary.effects import CheckCluster, DrainNode, Effect, RestoreNode, StopDraining
from ..vocabulary.messages import (
    ClusterChecked,
    ClusterDrained,
    ClusterDraining,
    ClusterHeld,
    ClusterMarked,
    ClusterRestored,
)
from . import cluster_check, onward


class DrainOn(str, enum.Enum):
    """What happens to this node's drain for an event: the triggers of its table."""

    MARK = "the event drains this node"
    DRAINED = "its resources left"
    HELD = "the cluster cannot spare it, or the drain timed out"
    REMARK = "a new boot, the event still Scheduled"
    RESTORE = "over: its after- or cancelled-hooks are due"
    RESTORED = "the node is back"
    RESTORE_FAILED = "its restore failed (or was not answered in time): its hooks start anyway"
    UNMARKED = "over: another event keeps the mark, or it is not ours"
    LEFT_ALONE = "it will never be over for this VM: its type lost its rule, or it was missed"


_ = Drain
_MARKED = (_.ASKED, _.DONE, _.HELD)
TABLE = Table(
    "drain",
    "this node in its Pacemaker cluster for an event (cluster.pacemaker): marked as going "
    "away before the before-hooks, restored once the event is over, before its after-hooks",
    (
        row([_.NONE], DrainOn.MARK, _.ASKED, "DrainNode: cluster_draining; the event is draining"),
        # none: a restore (of another event's mark, the same node) answered while it drained
        row([_.ASKED, _.NONE], DrainOn.DRAINED, _.DONE, "cluster_drained: its before-hooks start"),
        row([_.ASKED, _.NONE], DrainOn.HELD, _.HELD, "cluster_hold: before-hooks, not early"),
        row(_MARKED, DrainOn.REMARK, _.ASKED, "DrainNode: watched again (marked once)"),
        row(_MARKED, DrainOn.RESTORE, _.RESTORING, "RestoreNode; the hooks start on its answer"),
        row([*_MARKED, _.RESTORING], DrainOn.RESTORED, _.NONE, "cluster_restored"),
        row([*_MARKED, _.RESTORING], DrainOn.RESTORE_FAILED, _.NONE, "retried until it works"),
        # restoring: a restart runs its after-hooks again (a held slot) while another event
        # drains the node: that one restores it at its end
        row([*_MARKED, _.RESTORING], DrainOn.UNMARKED, _.NONE, "nothing restored (StopDraining)"),
        row(_MARKED, DrainOn.LEFT_ALONE, _.NONE, "RestoreNode, unless another event keeps it"),
    ),
)
del _


NAME = TABLE.name


def move(tracked: Tracked, on: DrainOn, target: Drain) -> Tracked:
    """The one place an event's drain changes: only as `TABLE` declares."""
    TABLE.check(tracked.drain, on, target)
    return replace(tracked, drain=target)


def _enter(
    state: State, tracked: Tracked, on: On, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """The last gate before the before-hooks (after the slot's, gates/pipeline): a node of a
    cluster that drains for this event type is marked and the event waits in DRAINING; else its
    before-hooks start (runs)."""
    event = tracked.event
    settings = _pacemaker(state)
    if settings is not None and settings.drains(event.event_type) and tracked.drain is Drain.NONE:
        out.append(_drain_effect(state, tracked))
        out.append(
            _note(
                Level.INFO,
                What.CLUSTER_DRAINING,
                event,
                method=settings.method.value,
                reason="this node is marked as going away once the cluster can spare it",
            )
        )
        deadline = _drain_deadline(state, event, now)
        marked = move(tracked, DrainOn.MARK, Drain.ASKED)
        return state, _move(marked, on, Phase.DRAINING, start_at=deadline)
    return onward.after(NAME, state, tracked, on, now, out)


def _pacemaker(state: State) -> Optional[Pacemaker]:
    """`cluster.pacemaker` (an older file's `coordination.pacemaker` loads the same)."""
    return state.config.cluster


def _cluster_reloaded(state: State, old: Config, out: list[Effect]) -> State:
    """A reload may change or remove `cluster.pacemaker`: the cluster is checked again,
    and a mark of ours that no event wants any more is taken off (the old configuration's
    restore stopped with it), the way it was set."""
    settings = _pacemaker(state)
    old_settings = old.cluster
    if settings != old_settings:
        state = replace(state, cluster_problems=None, cluster_check_at=math.inf)
        if settings is not None:
            out.append(CheckCluster())
    _restore_unwanted(state, out)
    return state


def _restore_unwanted(state: State, out: list[Effect]) -> None:
    """This daemon's mark is on the node and no event wants it drained (a restore failed, or
    the daemon stopped before it): take it off, whether pacemaker is still configured or not."""
    mark = state.cluster_mark
    if mark is None or _drained_for_another(state, ""):
        return
    if not any(isinstance(e, RestoreNode) for e in out):
        out.append(RestoreNode("", mark))


def _cluster_marked(state: State, msg: ClusterMarked, now: float, out: list[Effect]) -> State:
    """The mark set (ours) is in the state file from now until it is taken off; one found set
    by someone else is left as it is."""
    settings = _pacemaker(state)
    tracked = state.events.get(msg.event_id)
    mark = msg.mark if msg.mark is not None else mark_of(settings) if settings else None
    if msg.ours and mark is not None:
        state = replace(state, cluster_mark=mark)
        _restore_unwanted(state, out)  # its event ended while the mark was being set
        return state
    if not msg.ours and tracked is not None and state.cluster_mark is None:
        out.append(
            _note(
                Level.INFO,
                What.CLUSTER_DRAINING,
                tracked.event,
                marked_by="someone else",
                reason="this node was already marked as going away (an operator's standby?): "
                "it is left as it is when the event is over",
            )
        )
    return state


def _draining(state: State, event_id: str) -> Optional[Tracked]:
    tracked = state.events.get(event_id)
    return tracked if tracked is not None and tracked.phase is Phase.DRAINING else None


def _cluster_draining(state: State, msg: ClusterDraining, now: float, out: list[Effect]) -> State:
    tracked = _draining(state, msg.event_id)
    if tracked is not None:
        out.append(
            _note(Level.INFO, What.CLUSTER_DRAINING, tracked.event, resources=list(msg.resources))
        )
    return state


def _cluster_drained(state: State, msg: ClusterDrained, now: float, out: list[Effect]) -> State:
    tracked = _draining(state, msg.event_id)
    if tracked is None:
        return state
    out.append(_note(Level.INFO, What.CLUSTER_DRAINED, tracked.event))
    drained = move(tracked, DrainOn.DRAINED, Drain.DONE)
    state, tracked = onward.after(NAME, state, drained, On.DRAINED, now, out)
    return _with(state, msg.event_id, tracked)


def _cluster_held(state: State, msg: ClusterHeld, now: float, out: list[Effect]) -> State:
    tracked = _draining(state, msg.event_id)
    if tracked is None:
        return state
    state, tracked = _hold(state, tracked, msg.reason, msg.detail, now, out)
    return _with(state, msg.event_id, tracked)


def _hold(  # noqa: PLR0917 - the reason and its detail, beside the usual four
    state: State, tracked: Tracked, reason: str, detail: str, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """The cluster cannot spare this node: its before-hooks run, and it is not approved early;
    whatever was marked stays for the maintenance and is restored once the event is over."""
    out.append(
        _note(
            Level.WARNING,
            What.CLUSTER_HOLD,
            tracked.event,
            reason=reason,
            error=detail or None,
        )
    )
    held = move(tracked, DrainOn.HELD, Drain.HELD)
    return onward.after(NAME, state, held, On.DRAIN_HELD, now, out)


def _restore_first(state: State, out: list[Effect]) -> State:
    """A coupling (compose.COUPLINGS): the node is restored before the after-hooks. An event
    whose after- or cancelled-hooks wait (stages._start_stage) with this daemon's mark on the
    node asks for the restore; its hooks start on the answer (`_cluster_restored`), whatever it
    says (asked again until it works), or holding a slot on the one that says it worked; or
    at its deadline (gates/restore: placed by its timer, a coupling has no clock)."""
    for event_id, t in ours(state.events):
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
    for event_id, t in ours(state.events):
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
    """The answer starts the hooks of the event it answers for, whatever it says (holding a
    slot, only a restore that worked: restore, then release; issue 28); the node back, also
    those of every other event that waited for it (the restore of the mark no event wanted,
    asked at a boot beside the event's own, took the same mark off: before, the event's drain
    was cleared and its hooks, taken for ones waiting for their next try, never ran)."""
    answered = (msg.event_id,) if msg.error else tuple(state.events)
    waiting = [k for k in answered if k in state.events and runs._awaiting_restore(state.events[k])]
    state = _restored(state, msg, out)
    for event_id in waiting:  # their hooks, now
        t = state.events[event_id]
        if t.drain is not Drain.NONE:  # failed
            if t.slot in (Slot.HELD, Slot.ASKED):
                continue
            t = move(t, DrainOn.RESTORE_FAILED, Drain.NONE)  # the state file: no longer waited for
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
        events=Events(
            {
                k: move(t, DrainOn.RESTORED, Drain.NONE)
                if t.drain is not Drain.NONE and t.phase in (Phase.AFTER, Phase.OVER)
                else t
                for k, t in state.events.items()
            }
        ),
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


def _drained_for_another(state: State, event_id: str) -> bool:
    return any(
        t.drain is not Drain.NONE and k != event_id and runs._keeps_mark(t)
        for k, t in state.events.items()
    )


def _drain_deadline(state: State, event: Event, now: float) -> float:
    """drain_timeout from now, and never past NotBefore: its before-hooks still need to run."""
    settings = _pacemaker(state)
    deadline = now + (settings.drain_timeout if settings is not None else 0.0)
    if event.not_before is not None and state.wall_offset is not None:
        deadline = min(deadline, event.not_before.timestamp() - state.wall_offset)
    return deadline


def _drain_effect(state: State, tracked: Tracked) -> DrainNode:
    settings = _pacemaker(state)
    me = (tracked.vm_name or state.vm_name).casefold()
    going = tuple(
        settings.node_of(r) if settings is not None else r
        for r in tracked.event.resources
        if r.casefold() != me
    )
    return DrainNode(tracked.event, going, ours=state.cluster_mark is not None)


def _drain_timeouts(state: State, now: float, out: list[Effect]) -> State:
    for event_id, t in ours(state.events):
        if t.phase is Phase.DRAINING and t.start_at <= now:
            out.append(StopDraining(event_id))
            settings = _pacemaker(state)
            timeout = settings.drain_timeout if settings is not None else 0
            state, tracked = _hold(
                state,
                t,
                "drain_timeout",
                f"resources still on this node after {timeout:g} s (or at NotBefore)",
                now,
                out,
            )
            state = _with(state, event_id, tracked)
    return state


def _drain_moved(state: State, tracked: Tracked, moved: float) -> float:
    """A drain's deadline after the wall clock moved by `moved` s: its cap at NotBefore moves
    on the monotonic clock; drain_timeout counts from when it started and does not. Where the
    cap was what held (within a second), the new cap holds; else the sooner of the two."""
    not_before = tracked.event.not_before
    offset = state.wall_offset
    if not_before is None or offset is None:
        return tracked.start_at
    cap = not_before.timestamp() - offset
    was_cap = not_before.timestamp() - (offset - moved)
    return cap if abs(tracked.start_at - was_cap) <= 1.0 else min(tracked.start_at, cap)


# ---- the drain gate's timers: the cluster's next check, a DRAINING event's deadline

DUE_PHASES = frozenset({Phase.DRAINING})


def due(state: State, now: float, allowed: float) -> tuple[float, ...]:
    return () if state.stopping is not None else (state.cluster_check_at,)


def due_for(state: State, event_id: str, t: Tracked, now: float, allowed: float) -> Optional[float]:
    return None if state.stopping is not None else t.start_at


def fire(state: State, now: float, out: list[Effect]) -> State:
    state = _drain_timeouts(state, now, out)
    return cluster_check._recheck_cluster(state, now, out)


GATE = Gate(
    NAME,
    TABLE,
    _enter,
    handlers={
        ClusterChecked: cluster_check._cluster_checked,
        ClusterMarked: _cluster_marked,
        ClusterDraining: _cluster_draining,
        ClusterDrained: _cluster_drained,
        ClusterHeld: _cluster_held,
        ClusterRestored: _cluster_restored,
    },
    effects=(CheckCluster, DrainNode, StopDraining, RestoreNode),
    timers=(Timers("drain", fire, due, due_for, DUE_PHASES),),
    couplings=(
        _restore_first,  # the node is restored before the after-hooks (RestoreNode)
        _release_left_alone,  # and restored for an event that will never have them
    ),
)
