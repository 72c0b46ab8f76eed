"""An event seen for the first time: not ours, missed, unhandled, decided by a rule before any
hook runs (events a person asked for, short Freezes), or on into the gates."""

from __future__ import annotations

from typing import Optional

from ..config import EventRule, UserEvents
from ..model import SCHEDULED, STARTED, Event
from ..records import Level, What
from . import approval
from .gates import pipeline
from .lifecycle import On, Phase, Rule
from .notes import _note, _unhandled
from .state import State, Tracked, _move
from .vocabulary.effects import Effect


def first_sight(
    event: Event, state: State, incarnation: int, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    new = Tracked(
        event, Phase.NEW, boot_id=state.boot_id, vm_name=state.vm_name, incarnation=incarnation
    )
    on = On.SEEN
    vm_name = state.vm_name
    if not event.names(vm_name):
        out.append(
            _note(Level.INFO, What.EVENT_IGNORED, event, reason="not for this VM", vm_name=vm_name)
        )
        return state, _move(new, on, Phase.NOT_OURS)
    out.append(_note(Level.INFO, What.EVENT_DETECTED, event))
    if event.status == STARTED:
        out.append(
            _note(
                Level.WARNING,
                What.EVENT_MISSED,
                event,
                reason="first seen already Started; no hooks run",
            )
        )
        return state, _move(new, on, Phase.MISSED)
    if event.status != SCHEDULED:
        out.append(_unhandled(event, f"unknown status {event.status!r}"))
        return state, _move(new, on, Phase.UNHANDLED)
    rule = state.config.events.get(event.event_type)
    if rule is None:
        out.append(_unhandled(event, f"no hooks configured for {event.event_type}; left alone"))
        return state, _move(new, on, Phase.UNHANDLED)
    decided = _rule(event, rule, state, out)
    if decided is not None:
        phase, why = decided
        return state, _move(new, on, phase, rule=why)
    return pipeline.enter(state, new, on, now, out)


def _rule(
    event: Event, rule: EventRule, state: State, out: list[Effect]
) -> Optional[tuple[Phase, Rule]]:
    """Rules that decide before any hook runs: events a person asked for, short Freezes."""
    user = state.config.user_events
    if event.source.casefold() == "user" and user is not UserEvents.HOOKS:
        out.append(
            _note(
                Level.INFO,
                What.EVENT_RULE,
                event,
                rule=Rule.USER.value,
                decision=user.value,
                reason=f"EventSource User and user_events: {user.value}",
            )
        )
        if user is UserEvents.IGNORE:
            return Phase.UNHANDLED, Rule.USER
        return Phase.APPROVING, Rule.USER
    duration = event.duration_seconds
    short = rule.short_seconds
    if short is not None and duration is not None and 0 <= duration <= short:
        out.append(
            _note(
                Level.INFO,
                What.EVENT_RULE,
                event,
                rule=Rule.SHORT.value,
                reason=f"DurationInSeconds {duration} <= short_seconds {short}: no hooks",
            )
        )
        phase, note = approval._approval(event, state)
        if note is not None:
            out.append(note)
        return phase, Rule.SHORT
    return None
