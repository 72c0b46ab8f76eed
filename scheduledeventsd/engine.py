"""What to do about a document: which events are ours, which hooks to run, whether to approve.

Pure functions of (document or hook result, what we already know, policy): no I/O, no clock.
They return the new knowledge and a list of actions; the daemon carries the actions out.
Log records are actions too (`Note`), so the reasoning is testable without capturing logs.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Union

from .model import SCHEDULED, STARTED, Document, Event


class Phase(str, enum.Enum):
    """Where an event stands for this VM; persisted, so values are stable strings."""

    NOT_OURS = "not_ours"  # Resources does not name this VM
    UNHANDLED = "unhandled"  # no `events` entry for its type
    MISSED = "missed"  # first seen already Started: no chance to prepare
    RUNNING = "running"  # hooks are running
    APPROVING = "approving"  # hooks succeeded, StartRequests not yet accepted
    APPROVED = "approved"
    NOT_APPROVED = "not_approved"  # hooks succeeded, policy says it proceeds at NotBefore
    HOOKS_FAILED = "hooks_failed"
    DONE = "done"  # ours, handled, and already Started: nothing left to do


@dataclass(frozen=True)
class Policy:
    vm_name: str
    approve: str  # sole | always | never
    events: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class Tracked:
    event: Event
    phase: Phase


@dataclass(frozen=True)
class RunHooks:
    event: Event
    hooks: tuple[str, ...]


@dataclass(frozen=True)
class Approve:
    event: Event


@dataclass(frozen=True)
class Note:
    """A log record the daemon should emit: `name` is the structlog event name."""

    level: str
    name: str
    event: Event
    fields: Mapping[str, object] = field(default_factory=dict)


Action = Union[RunHooks, Approve, Note]
Known = Mapping[str, Tracked]


@dataclass(frozen=True)
class Decision:
    known: Known
    actions: tuple[Action, ...]


def _approval(event: Event, policy: Policy) -> tuple[Phase, Action]:
    """Approving lets the event proceed for every VM it names, hence the `sole` default."""
    if event.status != SCHEDULED:
        return Phase.DONE, Note("info", "approval_not_needed", event, {"reason": "already started"})
    if policy.approve == "never":
        return Phase.NOT_APPROVED, Note(
            "info",
            "approval_skipped",
            event,
            {"reason": "approve: never; it proceeds at NotBefore"},
        )
    others = [r for r in event.resources if r.casefold() != policy.vm_name.casefold()]
    if policy.approve == "sole" and others:
        return Phase.NOT_APPROVED, Note(
            "info",
            "approval_skipped",
            event,
            {
                "reason": f"shared with {len(others)} other VM(s), approving would rush them; "
                "it proceeds at NotBefore (approve: sole)",
                "other_resources": " ".join(others),
            },
        )
    return Phase.APPROVING, Approve(event)


def _first_sight(event: Event, policy: Policy) -> tuple[Phase, list[Action]]:
    if not event.names(policy.vm_name):
        return Phase.NOT_OURS, [
            Note(
                "info",
                "event_ignored",
                event,
                {"reason": "not for this VM", "vm_name": policy.vm_name},
            )
        ]
    detected = Note("info", "event_detected", event)
    if event.status == STARTED:
        return Phase.MISSED, [
            detected,
            Note(
                "warning",
                "event_missed",
                event,
                {"reason": "first seen already Started; no hooks run"},
            ),
        ]
    if event.status != SCHEDULED:
        return Phase.UNHANDLED, [
            detected,
            Note(
                "warning", "event_unhandled", event, {"reason": f"unknown status {event.status!r}"}
            ),
        ]
    hooks = policy.events.get(event.event_type)
    if hooks is None:
        return Phase.UNHANDLED, [
            detected,
            Note(
                "warning",
                "event_unhandled",
                event,
                {"reason": f"no hooks configured for {event.event_type}; left alone"},
            ),
        ]
    if hooks:
        return Phase.RUNNING, [detected, RunHooks(event, hooks)]
    phase, action = _approval(event, policy)
    return phase, [detected, action]


def on_document(doc: Document, known: Known, policy: Policy) -> Decision:
    """Compare a new document with what we know; events that left it are finished."""
    actions: list[Action] = []
    new: dict[str, Tracked] = {}
    for event in doc.events:
        before = known.get(event.event_id)
        if before is None:
            phase, first = _first_sight(event, policy)
            actions.extend(first)
            new[event.event_id] = Tracked(event, phase)
            continue
        phase = before.phase
        if before.event.status != event.status and phase is not Phase.NOT_OURS:
            actions.append(
                Note(
                    "info", "event_status_changed", event, {"previous_status": before.event.status}
                )
            )
            if phase is Phase.APPROVING and event.status == STARTED:
                phase = Phase.DONE
        new[event.event_id] = Tracked(event, phase)
    for event_id, gone in known.items():
        if event_id in new:
            continue
        if gone.phase is Phase.NOT_OURS:
            actions.append(Note("debug", "event_gone", gone.event))
        elif gone.phase is Phase.RUNNING:
            actions.append(
                Note(
                    "warning",
                    "event_gone_while_hooks_running",
                    gone.event,
                    {"phase": gone.phase.value},
                )
            )
        else:
            actions.append(Note("info", "event_completed", gone.event, {"phase": gone.phase.value}))
    return Decision(new, tuple(actions))


def on_hooks_finished(event_id: str, succeeded: bool, known: Known, policy: Policy) -> Decision:
    """Approve (per policy) only when every hook succeeded and the event still waits."""
    tracked = known.get(event_id)
    if tracked is None or tracked.phase is not Phase.RUNNING:
        return Decision(known, ())
    event = tracked.event
    if not succeeded:
        note = Note(
            "error",
            "event_not_approved",
            event,
            {"reason": "a hook failed; the event proceeds at NotBefore without this VM's approval"},
        )
        return Decision(_with(known, event_id, Phase.HOOKS_FAILED), (note,))
    phase, action = _approval(event, policy)
    return Decision(_with(known, event_id, phase), (action,))


def on_approved(event_id: str, known: Known) -> Decision:
    tracked = known.get(event_id)
    if tracked is None or tracked.phase is not Phase.APPROVING:
        return Decision(known, ())
    return Decision(
        _with(known, event_id, Phase.APPROVED), (Note("info", "event_approved", tracked.event),)
    )


def pending_approvals(known: Known) -> tuple[Event, ...]:
    return tuple(t.event for t in known.values() if t.phase is Phase.APPROVING)


def resume(known: Known) -> Decision:
    """After a restart: hooks cut off mid-run did not prepare anything, so they run again."""
    actions: list[Action] = []
    kept: dict[str, Tracked] = {}
    for event_id, tracked in known.items():
        if tracked.phase is Phase.RUNNING:
            actions.append(
                Note(
                    "warning",
                    "hooks_interrupted",
                    tracked.event,
                    {"reason": "cut off by a stop; they run again if the event is still Scheduled"},
                )
            )
        else:
            kept[event_id] = tracked
    return Decision(kept, tuple(actions))


def _with(known: Known, event_id: str, phase: Phase) -> dict[str, Tracked]:
    updated = dict(known)
    updated[event_id] = replace(known[event_id], phase=phase)
    return updated
