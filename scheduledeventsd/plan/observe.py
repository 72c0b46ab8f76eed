"""What the engine's steps say happened to each VM's event, as the report reads it: read from
the messages it is fed and the effects and records it returns, never from its internals but
for one question, whether it has anything left to do for an event."""

from __future__ import annotations

from collections.abc import Mapping

from ..engine import (
    AcquireSlot,
    ApprovalSent,
    ClusterDrained,
    DrainNode,
    Effect,
    HooksFinished,
    Message,
    Outcome,
    Phase,
    Record,
    SlotBusy,
    SlotGranted,
    SpawnHooks,
    Stage,
    What,
)
from .timeline import Seen
from .vm import Vm

SeenBy = Mapping[tuple[str, str], Seen]


def message(seen_by: SeenBy, vm: Vm, msg: Message, t: float) -> None:
    """What a message fed to the engine says happened."""
    seen_of = seen_by.get
    if isinstance(msg, ApprovalSent):
        seen = seen_of((vm.name, msg.event_id))
        if seen is not None and seen.approved is None:
            seen.approved = t
    elif isinstance(msg, HooksFinished):
        run = vm.runs.pop(msg.run, None)
        seen = seen_of((vm.name, run.event_id)) if run is not None else None
        if seen is not None and run is not None and run.stage is Stage.BEFORE:
            seen.hooks_end = t
            seen.hooks_failed = msg.outcome is not Outcome.SUCCEEDED
        elif seen is not None and run is not None and msg.outcome is Outcome.FAILED:
            seen.after_failed.append(t)
    elif isinstance(msg, SlotBusy):
        seen = seen_of((vm.name, msg.event_id))
        if seen is not None:
            seen.slot_busy = True
    elif isinstance(msg, SlotGranted):
        seen = seen_of((vm.name, msg.event_id))
        if seen is not None and seen.slot_from is None:
            seen.slot_from = t
    elif isinstance(msg, ClusterDrained):
        seen = seen_of((vm.name, msg.event_id))
        if seen is not None:
            seen.drain_to = t


def effect(seen_by: SeenBy, vm: Vm, asked: Effect, t: float) -> None:
    """What an effect the engine asked for says happened."""
    if isinstance(asked, Record):
        event_id = asked.fields.get("event_id")
        seen = seen_by.get((vm.name, str(event_id)))
        if seen is not None:
            _recorded(seen, asked, t)
        return
    if isinstance(asked, SpawnHooks):
        seen = seen_by.get((vm.name, asked.event.event_id))
        if seen is None:
            return
        if asked.stage is Stage.BEFORE and seen.hooks_start is None:
            seen.hooks_start = t
        elif asked.stage is not Stage.BEFORE:
            seen.after_start = t if seen.after_start is None else seen.after_start
            seen.after_runs.append(t)
    elif isinstance(asked, AcquireSlot):
        seen = seen_by.get((vm.name, asked.event.event_id))
        if seen is not None and seen.asked_slot is None:
            seen.asked_slot = t
    elif isinstance(asked, DrainNode):
        seen = seen_by.get((vm.name, asked.event.event_id))
        if seen is not None and seen.drain_from is None:
            seen.drain_from = t


def _recorded(seen: Seen, record: Record, t: float) -> None:
    """What a record of its event tells: a wait, no slot, or that it started unprepared."""
    if record.what is What.EVENT_WAITING:
        _waiting(seen, record.fields, t)
    elif record.what is What.SLOT_UNAVAILABLE:
        seen.no_slot = True
    elif record.what is What.EVENT_MISSED:
        seen.missed = True


def _waiting(seen: Seen, fields: Mapping[str, object], t: float) -> None:
    """event_waiting: what holds it back; held at a gate (reason=gate), from when."""
    seen.waits.append(str(fields.get("reason", "")))
    if fields.get("gate") and seen.gated_from is None:
        seen.gated_from = t


def done(seen_by: SeenBy, vm: Vm, t: float) -> int:
    """Events of a VM back up that the engine has nothing left to do for (over, or forgotten):
    their after-hooks are done now. How many."""
    count = 0
    for event_id in sorted(vm.waiting_after):
        tracked = vm.state.events.get(event_id)
        if tracked is None or tracked.phase is Phase.OVER:
            vm.waiting_after.discard(event_id)
            seen_by[(vm.name, event_id)].after_done = t
            count += 1
    return count
