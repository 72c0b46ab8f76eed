"""What the engine says: the records of an event, the state file's view, the status line."""

from __future__ import annotations

import datetime as dt
from typing import Optional

from ..model import Event, iso_utc
from ..records import Level, Record, What
from .frozen import replace
from .lifecycle import DURABLE, Phase
from .state import Hold, Known, State, ours
from .vocabulary.effects import Effect, Notify, Persist, SpawnHooks


def event_fields(event: Event) -> dict[str, object]:
    return {
        "event_id": event.event_id,
        "event_type": event.event_type,
        "event_status": event.status,
        "not_before": iso_utc(event.not_before) or None,
        "resources": " ".join(event.resources),
    }


def _unhandled(event: Event, reason: str) -> Record:
    return _note(Level.WARNING, What.EVENT_UNHANDLED, event, reason=reason)


def _note(level: Level, what: What, event: Event, **fields: object) -> Record:
    return Record(level, what, {**event_fields(event), **fields})


def _state_warning(problem: str) -> Record:
    return Record(
        Level.WARNING,
        What.STATE_DEGRADED,
        {
            "error": problem,
            "reason": "events are still handled, but a restart may run their hooks again",
        },
    )


def _iso_wall(wall: float) -> Optional[str]:
    """A wall-clock instant as the records show it; None where it is none (inf: not placed yet)
    or beyond what a datetime holds."""
    try:
        return iso_utc(dt.datetime.fromtimestamp(wall, dt.timezone.utc))
    except (OverflowError, ValueError, OSError):
        return None


def _why(detail: str) -> dict[str, str]:
    """A run that ended without any hook's own result (no thread for it, a defect in starting
    its commands) says why in the record, as `hook_failed` says it for a command."""
    return {"error": detail} if detail else {}


def _durable_view(events: Known) -> Known:
    """What decides whether the state file must be written: a new incarnation listing the same
    events is not worth an fsync (the file gets it with the next real change)."""
    return {
        k: replace(t, run=None, start_at=0.0, incarnation=0, window=Hold.NONE)
        for k, t in ours(events)
        if t.phase in DURABLE
    }


def durable_events(events: Known) -> Known:
    """What the state file keeps: events for other VMs cost a write a second under churn; the
    window gate's slice is placed again after a restart."""
    return {
        k: replace(t, run=None, start_at=0.0, window=Hold.NONE)
        for k, t in events.items()
        if t.phase in DURABLE
    }


def _persist(state: State) -> Persist:
    return Persist(durable_events(state.events), state.cluster_mark)


def _persist_on_change(before: State, after: State, out: list[Effect]) -> None:
    """Run by compose.full_step after the couplings: what the state file keeps changed in this
    step, so it is written, ahead of any hook the step starts, so a crash mid-hook is always
    known after the restart (hooks_interrupted); after an approval's POST, which need not wait.
    A comparison with the step before, which is what "on change" means; it changes no state."""
    events = after.events
    changed = after.cluster_mark != before.cluster_mark or (
        events is not before.events and _durable_view(events) != _durable_view(before.events)
    )
    if changed and not any(isinstance(e, Persist) for e in out):
        spawn = [i for i, e in enumerate(out) if isinstance(e, SpawnHooks)]
        out.insert(spawn[0] if spawn else len(out), _persist(after))


def status_text(state: State) -> str:
    events = [t for _, t in ours(state.events)]
    incarnation = state.incarnation if state.incarnation is not None else "-"
    text = (
        f"incarnation {incarnation}; {len(events)} event(s) for {state.vm_name or '?'}; "
        f"{len(state.runs)} running hook run(s); last poll {state.poll.last}"
    )
    waiting = [t for t in events if t.phase is Phase.WAITING]
    if waiting:
        text += f"; {len(waiting)} waiting for their lead time"
    queued = [t for t in events if t.phase is Phase.QUEUED]
    if queued:
        text += f"; {len(queued)} waiting for a concurrency slot"
    gated = [t.gated for t in events if t.phase is Phase.GATED]
    if gated:
        text += f"; {len(gated)} held at a gate ({', '.join(sorted(set(gated)))})"
    coordinating = [t for t in events if t.phase is Phase.COORDINATING]
    if coordinating:
        text += f"; {len(coordinating)} waiting for the other VMs"
    if state.coordination.count:
        text += f"; COORDINATION FAILING: {state.coordination.kind}"
    if state.poll.rejected:
        text += f"; IMDS REJECTS OUR REQUEST: {state.poll.rejected[:120]}"
    if state.state_problem:
        text += "; DEGRADED: state not saved"
    if state.faults:
        text += f"; DEGRADED: {state.faults} internal error(s), see the journal"
    return text


def _status(state: State, out: list[Effect]) -> State:
    if not state.ready or state.stopping is not None:
        return state
    text = status_text(state)
    if text == state.status_sent:
        return state
    out.append(Notify({"STATUS": text}))
    return replace(state, status_sent=text)
