"""A concurrency slot held through the whole maintenance (issue 28), in the pure engine with a
fake clock: a daemon that stops holding one leaves it held for `hold_max` (HoldSlot), unless its
VM does not come back; after-hooks that fail keep it held and run again every `after_retry`
until they succeed; a restart in the middle runs them again, the slot taken back."""

from __future__ import annotations

import dataclasses

from scheduledeventsd.config import Concurrency, EventRule
from scheduledeventsd.engine import (
    AcquireSlot,
    ApprovalSent,
    Exit,
    HoldSlot,
    HooksFinished,
    Outcome,
    Persist,
    Phase,
    ReleaseSlot,
    SlotBusy,
    SlotGranted,
    SpawnHooks,
    StopRequested,
)
from scheduledeventsd.engine.lifecycle import Slot, Stage
from tests.engine.test_engine import Machine, logs, of
from tests.engine.test_engine_fleet import ETCD
from tests.engine.test_engine_when import EVENTS, MONO0, due_in, seen
from tests.engine.test_engine_when import machine as when_machine

HOLD = Concurrency("web", 1, 5, hold_max=900, after_retry=60)


def approved(event_type="Reboot", events=EVENTS, concurrency=HOLD):
    """An event of ours with long notice: slot granted, before-hooks succeeded, approved."""
    m = when_machine(events=events, concurrency=concurrency, coordination=ETCD)
    seen(m, due_in(3 * 86400, event_type=event_type))
    m.send(SlotGranted("E1", MONO0 + 1), at=MONO0 + 1)
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    m.send(ApprovalSent("E1"), at=MONO0 + 2.5)
    assert m.phase() is Phase.APPROVED
    return m


def holds(effects):
    """The stop's holds (HoldSlot not `alive`): (event, seconds) each."""
    return [(h.event_id, h.seconds) for h in of(effects, HoldSlot) if not h.alive]


def over_and_after_hooks(m, at):
    """The event leaves the document: its after-hooks start; returns their run."""
    seen(m, incarnation=3, at=at)
    assert m.phase() is Phase.AFTER
    (spawn,) = of(m.effects, SpawnHooks)
    assert spawn.stage is Stage.AFTER
    return spawn


def test_a_daemon_stopping_while_its_event_holds_a_slot_leaves_it_held_for_hold_max():
    """Was: the daemon handed every held slot over under a fixed 15-minute lease of its own
    (slots.HAND_OVER_TTL), whatever the maintenance; now the engine says how long (hold_max),
    before the state is written and the daemon exits."""
    m = approved()
    effects = m.send(StopRequested("SIGTERM"), at=MONO0 + 3)
    assert holds(effects) == [("E1", 900)]
    assert not of(effects, ReleaseSlot), "not given back: the VM is going down for it"
    (hold,) = of(effects, HoldSlot)
    assert not logs(effects, "slot_held"), "said by the daemon once etcd has the key held"
    assert hold.on_held is not None
    assert (hold.on_held.name, hold.on_held.fields["hold_s"]) == ("slot_held", 900)
    assert hold.on_failed is not None
    assert (hold.on_failed.level.value, hold.on_failed.name) == ("warning", "slot_failed")
    assert "lost within ttl" in str(hold.on_failed.fields["reason"])
    kinds = [type(e) for e in effects if isinstance(e, (HoldSlot, Persist, Exit))]
    assert kinds == [HoldSlot, Persist, Exit], "held before the state is written and it exits"
    (persist,) = of(effects, Persist)
    assert persist.events["E1"].slot is Slot.HELD, "taken back after the restart"


def test_a_vm_that_does_not_come_back_frees_its_slot_as_it_goes():
    """A Terminate (or Preempt) approved holding a slot: the VM will not return to run
    after-hooks or take the slot back, so the stop gives it back rather than hold it."""
    events = {**EVENTS, "Terminate": EventRule(("drain",), window=True)}
    m = approved("Terminate", events)
    effects = m.send(StopRequested("SIGTERM"), at=MONO0 + 3)
    assert of(effects, ReleaseSlot) == [ReleaseSlot("E1")]
    assert not of(effects, HoldSlot)
    (released,) = logs(effects, "slot_released")
    assert "does not come back" in released.fields["reason"]
    (persist,) = of(effects, Persist)
    assert persist.events["E1"].slot is Slot.NONE


def test_a_stop_before_any_slot_is_held_holds_nothing():
    m = when_machine(concurrency=HOLD, coordination=ETCD)
    seen(m, due_in(3 * 86400))
    assert m.state.events["E1"].slot is Slot.ASKED
    assert not of(m.send(StopRequested("SIGTERM"), at=MONO0 + 3), HoldSlot)


def test_failed_after_hooks_keep_the_slot_held_and_run_again_every_after_retry():
    """Was: after-hooks ran at most once and the slot was given back when they ended, failed or
    not, letting the next VM go while this one was not healthy (its undrain failed)."""
    m = approved()
    spawn = over_and_after_hooks(m, MONO0 + 10)
    effects = m.send(HooksFinished(spawn.run, Outcome.FAILED, "exit 1"), at=MONO0 + 11)
    assert not of(effects, ReleaseSlot), "held: the VM is not healthy"
    assert m.phase() is Phase.AFTER
    assert m.state.events["E1"].slot is Slot.HELD
    (failed,) = logs(effects, "after_hooks_failed")
    assert failed.fields["retry_in_s"] == 60
    assert m.wake() == MONO0 + 11 + 60
    assert not of(m.tick(MONO0 + 70.9), SpawnHooks)
    (again,) = of(m.tick(MONO0 + 71), SpawnHooks)
    assert again.stage is Stage.AFTER
    assert again.hooks == ("undrain",)
    m.send(HooksFinished(again.run, Outcome.FAILED, "exit 1"), at=MONO0 + 72)
    (third,) = of(m.tick(MONO0 + 132), SpawnHooks)
    effects = m.send(HooksFinished(third.run, Outcome.SUCCEEDED), at=MONO0 + 133)
    assert of(effects, ReleaseSlot) == [ReleaseSlot("E1")]
    assert logs(effects, "slot_released")
    assert "E1" not in m.state.events, "left the document: forgotten once they succeeded"


def test_without_concurrency_failed_after_hooks_still_run_once():
    m = when_machine()
    seen(m, due_in(3 * 86400))
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    m.send(ApprovalSent("E1"), at=MONO0 + 2.5)
    spawn = over_and_after_hooks(m, MONO0 + 10)
    m.send(HooksFinished(spawn.run, Outcome.FAILED, "exit 1"), at=MONO0 + 11)
    assert "E1" not in m.state.events
    assert not of(m.tick(MONO0 + 500), SpawnHooks)


def test_after_hooks_retried_stop_once_the_slot_is_no_longer_held():
    """Lost (another VM holds it after a restart), or freed by an operator: nothing left to
    guard, so the event is over at its next try instead of retrying for ever."""
    m = approved()
    spawn = over_and_after_hooks(m, MONO0 + 10)
    m.send(HooksFinished(spawn.run, Outcome.FAILED, "exit 1"), at=MONO0 + 11)
    tracked = m.state.events["E1"]
    m.state = dataclasses.replace(
        m.state, events={"E1": dataclasses.replace(tracked, slot=Slot.MISSING)}
    )
    assert not of(m.tick(MONO0 + 71), SpawnHooks)
    assert "E1" not in m.state.events


def test_after_hooks_cut_off_by_a_stop_keep_the_slot_and_run_again_after_the_restart():
    """The undrain was running when the daemon stopped: the slot is held for hold_max, and the
    restarted daemon takes it back and runs the after-hooks again (was: cut off, never run
    again, and the slot given back at boot)."""
    m = approved()
    spawn = over_and_after_hooks(m, MONO0 + 10)
    m.send(StopRequested("SIGTERM"), at=MONO0 + 11)
    effects = m.send(HooksFinished(spawn.run, Outcome.CANCELLED), at=MONO0 + 12)
    assert holds(effects) == [("E1", 900)]
    (persist,) = of(effects, Persist)
    assert persist.events["E1"].phase is Phase.AFTER
    again = Machine(m.state.config, loaded=persist.events, now=MONO0 + 200, boot="boot-2")
    assert [a.event.event_id for a in of(again.effects, AcquireSlot)] == ["E1"]
    (rerun,) = of(again.effects, SpawnHooks)
    assert rerun.stage is Stage.AFTER
    assert rerun.rebooted
    effects = again.send(HooksFinished(rerun.run, Outcome.SUCCEEDED), at=MONO0 + 201)
    assert of(effects, ReleaseSlot) == [ReleaseSlot("E1")]


def test_a_restarted_daemon_keeps_its_slot_while_its_after_hooks_run():
    """Back on a new boot, the event gone: the slot is taken back and given back only once the
    undrain succeeded, so the next VM's before-hooks never overlap it."""
    m = approved()
    (persist,) = of(m.send(StopRequested("SIGTERM"), at=MONO0 + 3), Persist)
    again = Machine(m.state.config, loaded=persist.events, now=MONO0 + 300, boot="boot-2")
    assert of(again.effects, AcquireSlot)
    spawn = over_and_after_hooks(again, MONO0 + 301)
    assert not of(again.effects, ReleaseSlot)
    effects = again.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 302)
    assert of(effects, ReleaseSlot) == [ReleaseSlot("E1")]


def test_a_slot_that_went_elsewhere_while_after_hooks_wait_ends_their_retries():
    m = approved()
    spawn = over_and_after_hooks(m, MONO0 + 10)
    m.send(HooksFinished(spawn.run, Outcome.FAILED, "exit 1"), at=MONO0 + 11)
    m.send(SlotBusy("E1", ("vm-b",)), at=MONO0 + 12)
    assert m.state.events["E1"].slot is not Slot.HELD
    assert not of(m.tick(MONO0 + 71), SpawnHooks)
    assert "E1" not in m.state.events


def test_a_stop_while_after_hooks_wait_for_their_retry_exits_at_once_holding_the_slot():
    """Waiting for a retry is not a run to wait for (nor a node's restore): the stop exits at
    once, the slot held, and the restarted daemon runs them again."""
    m = approved()
    spawn = over_and_after_hooks(m, MONO0 + 10)
    m.send(HooksFinished(spawn.run, Outcome.FAILED, "exit 1"), at=MONO0 + 11)
    effects = m.send(StopRequested("SIGTERM"), at=MONO0 + 12)
    assert holds(effects) == [("E1", 900)]
    assert of(effects, Exit)


def test_a_lease_expired_after_the_approval_asks_for_the_slot_again_not_gives_it_back():
    """Reviewed (issue 28): the daemon's lease expired in a partition while its VM was in the
    maintenance it approved (SlotBusy expired): the slot was given back (ReleaseSlot, missing),
    so after the healing the next VM's hooks started while this one was still down. Now it is
    asked for again, held once granted, and given back only when the event is over."""
    m = approved()
    effects = m.send(SlotBusy("E1", ("(lease expired)",), (), True), at=MONO0 + 5)
    assert not of(effects, ReleaseSlot), "not given back: its VM is in its maintenance"
    assert m.state.events["E1"].slot is Slot.ASKED
    assert logs(effects, "slot_lost")
    m.send(SlotGranted("E1", MONO0 + 6), at=MONO0 + 6)
    assert m.state.events["E1"].slot is Slot.HELD
    spawn = over_and_after_hooks(m, MONO0 + 10)
    effects = m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 11)
    assert of(effects, ReleaseSlot) == [ReleaseSlot("E1")]


def test_failed_after_hooks_keep_a_slot_asked_for_again_after_its_lease_expired():
    """The undrain failed and waits for its retry when the lease expires: the retry still runs
    (was: over at the next try, the slot given back while the VM is not healthy)."""
    m = approved()
    spawn = over_and_after_hooks(m, MONO0 + 10)
    m.send(HooksFinished(spawn.run, Outcome.FAILED, "exit 1"), at=MONO0 + 11)
    effects = m.send(SlotBusy("E1", ("(lease expired)",), (), True), at=MONO0 + 12)
    assert not of(effects, ReleaseSlot)
    (again,) = of(m.tick(MONO0 + 71), SpawnHooks)
    assert again.stage is Stage.AFTER
    effects = m.send(HooksFinished(again.run, Outcome.FAILED, "exit 1"), at=MONO0 + 72)
    assert not of(effects, ReleaseSlot), "still kept: asked for again"
    m.send(SlotGranted("E1", MONO0 + 80), at=MONO0 + 80)
    (third,) = of(m.tick(MONO0 + 132), SpawnHooks)
    effects = m.send(HooksFinished(third.run, Outcome.SUCCEEDED), at=MONO0 + 133)
    assert of(effects, ReleaseSlot) == [ReleaseSlot("E1")]
