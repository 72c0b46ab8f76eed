"""The step function: one message in, the new state and the effects out, and the timers that run
after every message."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Callable, Optional

from ..records import Level, Record, What
from ..retry import Failures
from . import approval, events, lifetime, peers, reload, stages
from .gates import drain, slot, window
from .lifecycle import IllegalTransitionError, Phase
from .notes import _durable_view, _persist, _status
from .poll import names, rate, timing
from .state import State
from .vocabulary.constants import CLOCK_STEP, POLL_BACKOFF_CAP, STALL_MARGIN
from .vocabulary.effects import Effect, Exit, Persist, ResolveName, SpawnHooks, WakeAt
from .vocabulary.messages import (
    ApprovalFailed,
    ApprovalSent,
    Boot,
    ClusterChecked,
    ClusterDrained,
    ClusterDraining,
    ClusterHeld,
    ClusterMarked,
    ClusterRestored,
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
    SlotBusy,
    SlotFailed,
    SlotGranted,
    SlotKept,
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
        or rate._others_due(state, now)
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
        new = slot._release_slots(state, new, out)
    except IllegalTransitionError as e:
        if state.strict:
            raise
        out = [
            Record(
                Level.ERROR,
                What.TRANSITION_REFUSED,
                {"message": type(message).__name__, "error": str(e)},
            )
        ]
        new = _refused(state, message, now, out)
        refused = True
    changed = new.events is not state.events and _durable_view(new.events) != _durable_view(
        state.events
    )
    changed = changed or new.cluster_mark != state.cluster_mark
    if changed and not any(isinstance(e, Persist) for e in out):
        # Written ahead of any hook it starts, so a crash mid-hook is always known after the
        # restart (hooks_interrupted); written after an approval's POST, which need not wait.
        spawn = [i for i, e in enumerate(out) if isinstance(e, SpawnHooks)]
        out.insert(spawn[0] if spawn else len(out), _persist(new))
    new = _status(new, out)
    if not any(isinstance(e, Exit) for e in out):
        wake = next_wakeup(new, now)
        if refused:  # a due timer that raises is not tried again at once, in a busy loop
            wake = max(wake, now + POLL_BACKOFF_CAP)
        out.append(WakeAt(wake))
    return new, tuple(out)


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
    if state.ready and state.stopping is None and state.poll.in_flight_since is None:
        state = timing._order_poll(state, state.poll, now, out)
    return state


_HANDLERS: Mapping[type, Callable[[State, Any, float, list[Effect]], State]] = {
    Boot: lifetime._boot,
    DocumentFetched: events._document_fetched,
    PollFailed: timing._poll_failed,
    NameResolved: names._name_resolved,
    HooksFinished: stages._hooks_finished,
    ApprovalSent: approval._approval_sent,
    ApprovalFailed: approval._approval_failed,
    Persisted: lifetime._persisted,
    Tick: lifetime._tick,
    ReloadRequested: reload._reload_requested,
    Reloaded: reload._reloaded,
    ReloadFailed: reload._reload_failed,
    StopRequested: lifetime._stop_requested,
    PeersChanged: peers._peers_changed,
    CoordinationFailed: peers._coordination_failed,
    GateAnswered: peers._gate_answered,
    Faulted: lifetime._faulted,
    SlotGranted: slot._slot_granted,
    SlotKept: slot._slot_kept,
    SlotBusy: slot._slot_busy,
    SlotFailed: slot._slot_failed,
    ClusterChecked: drain._cluster_checked,
    ClusterMarked: drain._cluster_marked,
    ClusterDraining: drain._cluster_draining,
    ClusterDrained: drain._cluster_drained,
    ClusterHeld: drain._cluster_held,
    ClusterRestored: drain._cluster_restored,
}


def _timers(state: State, now: float, out: list[Effect]) -> State:
    """Start whatever is due; runs after every message, so no timer waits for a Tick."""
    state = lifetime._watchdog(state, now, out)
    if state.stopping is not None:
        return lifetime._shutdown(state, now, out)
    state = slot._slots_lost(state, now, out)
    state = window._start_waiting(state, now, out)
    state = drain._drain_timeouts(state, now, out)
    state = drain._recheck_cluster(state, now, out)
    state = peers._coordinate(state, now, out)
    state = rate._make_room(state, now, out)
    state = approval._retry_approvals(state, now, out)
    if names._name_due(state, now) and rate._allowed_at(state, now) <= now:
        out.append(ResolveName())
        state = replace(rate._spend(state, now), resolving=True)
    if state.ready and state.poll.in_flight_since is None and not rate._others_due(state, now):
        state = timing._order_poll(state, state.poll, now, out)
    return state


def next_wakeup(state: State, now: float) -> float:  # noqa: PLR0912 - one branch per timer
    """The earliest instant a timer of this state is due (never in the past)."""
    times: list[float] = []
    allowed = rate._allowed_first(state, now)  # none is due before the rate limit allows it
    if state.watchdog_every is not None:
        times.append(state.watchdog_at)
    if state.stopping is not None:
        s = state.stopping
        times.append(s.kill_until if s.kill_until is not None else s.grace_until)
    else:
        if state.ready and state.poll.in_flight_since is None:
            times.append(max(state.poll.next_at, allowed))
        if state.name_source == "hostname" and not state.resolving:
            times.append(max(state.name_failures.retry_at, allowed))
        md = state.config.metadata
        if state.poll.in_flight_since is not None and state.watchdog_every is not None:
            times.append(
                state.poll.in_flight_since + md.first_call_timeout + md.timeout + STALL_MARGIN
            )
    if state.stopping is None:
        times.append(state.cluster_check_at)
    for event_id, t in state.events.items():
        phase = t.phase
        if phase is Phase.NOT_OURS:  # most of them under churn, and never a timer
            continue
        if (
            phase is Phase.APPROVING
            and event_id not in state.approvals.posting
            and not slot._slot_pending(state, event_id, now)
        ):
            times.append(max(state.approvals.failures.get(event_id, Failures()).retry_at, allowed))
        lease = state.slot_leases.get(event_id)
        if lease is not None and phase in slot._BEFORE_APPROVAL:
            times.append(lease.until)
        if phase in (Phase.WAITING, Phase.QUEUED, Phase.DRAINING) and state.stopping is None:
            times.append(t.start_at)
        asked = state.peers.get(event_id)
        announce = phase is Phase.HOOKS_FAILED and asked is not None
        if (phase is Phase.COORDINATING or announce) and state.stopping is None:
            if asked is None:
                times.append(now)
            elif not asked.asking:
                times.append(asked.next_at)
    due = [t for t in times if math.isfinite(t)]  # an event waiting for a document is not
    return max(now, min(due)) if due else now + 3600.0
