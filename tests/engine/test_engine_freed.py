"""An operator's free of a held slot (`scheduledeventsd fleet free VM`), as the engine takes it
(SlotFreed): said once (slot_freed_by_operator), given back, never asked for again for that
event, and an event not approved yet is not approved early. Fake clock, no I/O."""

from __future__ import annotations

from scheduledeventsd.engine import (
    AcquireSlot,
    ApprovalSent,
    HooksFinished,
    Outcome,
    Phase,
    PostApproval,
    ReleaseSlot,
    SlotFreed,
    SlotGranted,
    SpawnHooks,
)
from tests.engine.test_engine import Machine, logs, of
from tests.engine.test_engine_when import MONO0, due_in, seen, slotted


def test_freed_during_the_before_hooks_is_said_given_back_and_not_approved_early():
    m = slotted()
    seen(m, due_in(3 * 86400))
    m.send(SlotGranted("E1"), at=MONO0 + 1)
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(SlotFreed("E1", "ops@bastion", "2026-11-26T12:00:02Z"), at=MONO0 + 2)
    (said,) = logs(m.effects, "slot_freed_by_operator")
    assert said.level.value == "warning"
    assert (said.fields["by"], said.fields["group"]) == ("ops@bastion", "web")
    assert of(m.effects, ReleaseSlot) == [ReleaseSlot("E1")]
    assert m.state.events["E1"].slot.value == "missing"
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 3)
    assert not of(m.effects, PostApproval), "its slot is another VM's now"
    (refused,) = logs(m.effects, "event_not_approved")
    assert refused.fields["cause"] == "slot_unavailable"


def test_freed_while_the_after_hooks_fail_is_never_asked_for_again():
    """The after-hooks keep failing (the VM is not healthy) and an operator frees the slot:
    the daemon does not take it again, neither when they end nor after a restart."""
    m = slotted()
    seen(m, due_in(3 * 86400))
    m.send(SlotGranted("E1"), at=MONO0 + 1)
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    m.send(ApprovalSent("E1"))
    seen(m, incarnation=3, at=MONO0 + 3)  # over: the after-hooks run, holding the slot
    (after,) = of(m.effects, SpawnHooks)
    m.send(SlotFreed("E1", "ops@bastion", ""), at=MONO0 + 4)
    assert logs(m.effects, "slot_freed_by_operator")
    m.send(HooksFinished(after.run, Outcome.FAILED), at=MONO0 + 5)
    assert not of(m.effects, AcquireSlot)
    assert not of(m.effects, ReleaseSlot), "given back once, when freed"
    again = Machine(m.state.config, loaded=dict(m.state.events), now=MONO0 + 10)
    assert not of(again.effects, AcquireSlot), "a restart does not take it again"


def test_freed_before_a_restarted_daemon_took_it_back_is_not_taken_and_prepares_now():
    """Held before a restart, its before-hooks cut off: the worker finds the operator's mark
    instead of the slot. Said, and the hooks start now, without a slot (not approved early)."""
    m = slotted()
    seen(m, due_in(3 * 86400))
    m.send(SlotGranted("E1"), at=MONO0 + 1)
    again = Machine(m.state.config, loaded={"E1": m.state.events["E1"]}, now=MONO0 + 10)
    assert len(of(again.effects, AcquireSlot)) == 1, "taking it back"
    seen(again, due_in(3 * 86400), at=MONO0 + 11)
    assert again.phase() is Phase.QUEUED
    again.send(SlotFreed("E1", "ops@bastion", ""), at=MONO0 + 12)
    assert logs(again.effects, "slot_freed_by_operator")
    (spawn,) = of(again.effects, SpawnHooks)
    again.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 13)
    assert not of(again.effects, PostApproval)
    assert not logs(again.effects, "transition_refused")


def test_a_freed_message_for_an_event_without_a_slot_changes_nothing():
    m = slotted()
    seen(m, due_in(300))  # too close: prepared at once, without a slot
    before = m.state.events["E1"]
    m.send(SlotFreed("E1", "", ""), at=MONO0 + 1)
    assert m.state.events["E1"] == before
    assert not logs(m.effects, "slot_freed_by_operator")
    assert not of(m.effects, ReleaseSlot)
