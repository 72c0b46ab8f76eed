"""The engine model (test_promises.Promises) with one step more: the type of an event changes
(the same EventId listed with another EventType). A subclass, not a step of `Promises` itself:
a step more there would change every derandomized history its mutants are caught on.

(l) nothing is approved on the hooks of another type: an approval is posted for a type a
    complete success of its current before-run prepared it for (or a rule decided it for).

With every promise of `Promises` besides: (b) the old type's stage is owed, runs once, and the
event may be prepared again afterwards (judged anew); (i) that stage runs only once the old type
is over for this VM (the change ends it)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule, run_state_machine_as_test

from scheduledeventsd.config import Config
from scheduledeventsd.engine import Outcome, PostApproval, SpawnHooks, Stage, events
from tests.engine.test_promises import (
    GATED_SETTINGS,
    MUTANT_SETTINGS,
    RULES,
    SETTINGS,
    GatedPromises,
    Promises,
    mutated,
)


class RetypedPromises(Promises):
    def __init__(self) -> None:
        self.run_types: dict[int, str] = {}  # before-run -> the type it prepares for
        self.approvable: dict[str, set[str]] = {}  # event -> the types it may be approved as
        self.stage_types: dict[str, str] = {}  # event -> the type its last stage ran for
        self.fresh: set[str] = set()  # its type changed since its last stage ran
        super().__init__()

    def check(self, effect: object, message: object) -> None:
        if isinstance(effect, SpawnHooks) and effect.stage is Stage.BEFORE:
            self.run_types[effect.run] = effect.event.event_type
        elif isinstance(effect, SpawnHooks):
            # (b) per event: the stage of the one of another type (judged anew, with or
            # without a before-run) is its own, once.
            event_id, event_type = effect.event.event_id, effect.event.event_type
            if self.stage_types.get(event_id, event_type) != event_type or event_id in self.fresh:
                self.staged.pop(event_id, None)
            self.stage_types[event_id] = event_type
            self.fresh.discard(event_id)
        elif isinstance(effect, PostApproval):
            event_id, event_type = effect.event.event_id, effect.event.event_type
            # Decided by a rule for the type it has (judged anew under today's rules: Promises)
            listed = self.doc.get(event_id, {}).get("EventType")
            decided = event_id in self.decided and listed == event_type
            assert decided or event_type in self.approvable.get(event_id, set()), (
                f"(l) {event_id} approved as {event_type}, on the hooks of another type"
            )
        super().check(effect, message)

    def finish_run(self, run: int, outcome: Outcome) -> None:
        event_id, stage = self.live[run]
        tracked = self.state.events.get(event_id)
        if (
            stage is Stage.BEFORE
            and outcome is Outcome.SUCCEEDED
            and run not in self.cancelled
            and tracked is not None
            and tracked.run == run
        ):
            self.approvable.setdefault(event_id, set()).add(self.run_types[run])
        super().finish_run(run, outcome)

    def add_event(
        self, event_type, resources, status, lead, duration=-1, source="Platform", far=False
    ) -> None:
        raw = {"EventType": event_type, "EventSource": source, "DurationInSeconds": duration}
        if status == "Scheduled" and not far and self.decided_without_hooks(raw):
            self.approvable.setdefault(f"E{self.next_id}", set()).add(event_type)  # posted at once
        super().add_event(event_type, resources, status, lead, duration, source, far)

    @precondition(lambda self: not self.exited and self.doc)
    @rule(index=st.integers(0, 9), event_type=st.sampled_from([*sorted(RULES), "Hibernate"]))
    def type_changes(self, index, event_type) -> None:
        """A Freeze become a Reboot, a type with no rule become one with hooks, and back."""
        event_id = self._pick(index)
        raw = self.doc[event_id]
        old = raw["EventType"]
        if old == event_type:
            return
        owed = event_id in self.prepared()  # by the old type's rule: its stage is owed
        self.doc[event_id] = raw = dict(raw, EventType=event_type)
        self.types[event_id] = event_type
        self.ended.add(event_id)  # the old type is over for this VM
        self.returned.add(event_id)  # judged anew: prepared again after its stage
        self.fresh.add(event_id)
        if not owed:  # nothing is owed for the old type: its preparation is over
            self.before_started.discard(event_id)
        elif not self.stopping:  # seen at once: its stage runs (or once its before-run ends)
            self.owed.add(event_id)
        # A stop takes no document: a decision's approval is posted again at the restart (from
        # the state file), before the change is seen; it is judged after.
        if not self.stopping:
            self.approvable[event_id] = set()
            self.decided.discard(event_id)
        if raw["EventStatus"] == "Scheduled" and self.decided_without_hooks(raw):
            self.decided.add(event_id)
            self.approvable.setdefault(event_id, set()).add(event_type)
        self.changed()


def test_the_engine_keeps_its_promises_when_the_type_of_an_event_changes():
    """(a)-(i) and (l) hold after every step of every generated history."""
    run_state_machine_as_test(RetypedPromises, settings=settings(SETTINGS, max_examples=300))


def _retype_ignored(original):
    """The engine as it was: a listed event of another type is only listed again."""

    def retyped(state, before, event, incarnation, now, out):
        return events._listed(state, before, event, incarnation, now, out)

    return retyped


class WithoutStages(RetypedPromises):
    """No type has after- or cancelled-hooks (and no reload brings them back): the engine as it
    was also skipped the old type's stage, (b), which would catch it first."""

    reload = reload_with_slots = None  # type: ignore[assignment]

    def configured(self) -> Config:
        events = {k: dataclasses.replace(r, after=(), cancelled=()) for k, r in RULES.items()}
        return dataclasses.replace(super().configured(), events=events)


def test_the_model_catches_an_approval_on_the_hooks_of_the_type_an_event_had():
    with mutated(events, "_retyped", _retype_ignored), pytest.raises(AssertionError) as caught:
        run_state_machine_as_test(
            WithoutStages, settings=settings(MUTANT_SETTINGS, max_examples=2000)
        )
    assert "(l)" in str(caught.value), f"caught for another reason: {caught.value}"


class GatedRetypedPromises(RetypedPromises, GatedPromises):
    """The same step through the gates (test_promises.GatedPromises): a slot held, a node drained
    for the old type are given back and restored as when an event leaves, (j) and (k) kept."""


def test_the_engine_keeps_its_promises_through_the_gates_when_the_type_of_an_event_changes():
    """(a)-(l) through windows, slots, drains and restores."""
    run_state_machine_as_test(
        GatedRetypedPromises, settings=settings(GATED_SETTINGS, max_examples=100)
    )
