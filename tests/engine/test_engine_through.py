"""The hold through the maintenance while the daemon lives (issue 28, gates/through.py), in the
pure engine with a fake clock: once an event holding its slot is approved, the slot moves to the
daemon's hold lease (HoldSlot `alive`), once; not before its approval (a daemon killed then
loses it within ttl), not for a VM that does not come back; a restart or a reload in the
maintenance takes it back under the hold lease (AcquireSlot `hold`)."""

from __future__ import annotations

import dataclasses

import pytest

from scheduledeventsd.config import ApprovePolicy, Concurrency, EventRule, Limit
from scheduledeventsd.engine import (
    AcquireSlot,
    ApprovalSent,
    HoldSlot,
    HooksFinished,
    Outcome,
    Persist,
    ReleaseSlot,
    Reloaded,
    SlotBusy,
    SlotGranted,
    SlotMoved,
    SpawnHooks,
    StopRequested,
)
from scheduledeventsd.engine.lifecycle import Phase, Slot
from tests.engine.test_engine import Machine, logs, of
from tests.engine.test_engine_fleet import ETCD
from tests.engine.test_engine_hold import HOLD, approved, over_and_after_hooks
from tests.engine.test_engine_when import EVENTS, MONO0, due_in, seen
from tests.engine.test_engine_when import machine as when_machine


def kept(effects):
    return [(h.event_id, h.seconds) for h in of(effects, HoldSlot) if h.alive]


def test_an_approval_moves_the_slot_to_the_hold_lease_once_and_not_before():
    """Was: the slot stayed on the daemon's lease of `ttl` until a clean stop, so a daemon
    killed (or a VM pulled away) between its approval and its stop lost it within ttl and the
    next VM went while this one was down."""
    m = when_machine(concurrency=HOLD, coordination=ETCD)
    seen(m, due_in(3 * 86400))
    before = list(m.effects)
    before += m.send(SlotGranted("E1", MONO0 + 1), at=MONO0 + 1)
    (spawn,) = of(m.effects, SpawnHooks)
    before += m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    assert not of(before, HoldSlot), "before its approval a killed daemon loses it within ttl"
    effects = m.send(ApprovalSent("E1"), at=MONO0 + 2.5)
    assert kept(effects) == [("E1", 900)]
    assert not kept(m.tick(MONO0 + 30)), "moved once, not at every step"
    spawn = over_and_after_hooks(m, MONO0 + 40)
    assert not kept(m.effects), "still on the hold lease while its after-hooks run"


def test_a_vm_that_does_not_come_back_is_not_held_through():
    """A Terminate's VM never takes its slot back: a daemon killed then loses it within ttl."""
    events = {**EVENTS, "Terminate": EventRule(("drain",), window=True)}
    m = when_machine(events=events, concurrency=HOLD, coordination=ETCD)
    seen(m, due_in(3 * 86400, event_type="Terminate"))
    m.send(SlotGranted("E1", MONO0 + 1), at=MONO0 + 1)
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    assert not of(m.send(ApprovalSent("E1"), at=MONO0 + 2.5), HoldSlot)


def test_a_slot_held_again_after_its_lease_expired_is_moved_again():
    """A partition longer than ttl after the approval: asked for again, and once granted put
    on the hold lease again (the keeper took it anew)."""
    m = approved()
    m.send(SlotBusy("E1", ("(lease expired)",), (), True), at=MONO0 + 5)
    effects = m.send(SlotGranted("E1", MONO0 + 6), at=MONO0 + 6)
    assert kept(effects) == [("E1", 900)]


def test_a_restart_in_the_maintenance_takes_the_slot_back_under_the_hold_lease():
    """Was: taken back under the daemon's lease of ttl, so a daemon killed after a restart in
    its maintenance (the same boot: its VM not down yet) lost the slot within ttl."""
    m = approved()
    (persist,) = of(m.send(StopRequested("SIGTERM"), at=MONO0 + 3), Persist)
    again = Machine(m.state.config, loaded=persist.events, now=MONO0 + 300)
    (acquire,) = of(again.effects, AcquireSlot)
    assert acquire.hold == 900


def test_back_on_a_new_boot_the_slot_is_taken_back_under_the_hold_lease_at_once():
    """Was: on a new boot the slot was taken back under the daemon's lease of ttl while the
    event waited in REBOOTED for the next document, and moved to the hold lease only once its
    after-hooks started: a daemon killed in that window lost it within ttl while its VM was
    still in its maintenance. Now taken back under the hold lease at once, and moved once."""
    m = approved()
    (persist,) = of(m.send(StopRequested("SIGTERM"), at=MONO0 + 3), Persist)
    again = Machine(m.state.config, loaded=persist.events, now=MONO0 + 300, boot="boot-2")
    assert again.phase() is Phase.REBOOTED
    (acquire,) = of(again.effects, AcquireSlot)
    assert acquire.hold == 900, "in its maintenance until its after-hooks succeed"
    assert kept(again.effects) == [("E1", 900)]
    moved = again.send(SlotGranted("E1", MONO0 + 300.5), at=MONO0 + 300.5)
    over_and_after_hooks(again, MONO0 + 301)
    assert not kept(moved + again.effects), "moved once, not again at its after-hooks"


def test_a_vm_that_booted_while_its_before_hooks_ran_takes_its_slot_back_on_the_hold_lease():
    """Prepared, not approved yet, and its VM booted (the platform may start a prepared event
    at NotBefore without our approval): until the next document says whether that boot was its
    maintenance, the tier's availability wins and a daemon killed meanwhile leaves it held."""
    m = when_machine(concurrency=HOLD, coordination=ETCD)
    seen(m, due_in(3 * 86400))
    m.send(SlotGranted("E1", MONO0 + 1), at=MONO0 + 1)
    assert m.phase() is Phase.RUNNING
    again = Machine(m.state.config, loaded=m.state.events, now=MONO0 + 300, boot="boot-2")
    assert again.phase() is Phase.REBOOTED
    (acquire,) = of(again.effects, AcquireSlot)
    assert acquire.hold == 900


@pytest.mark.parametrize("outcome", [Outcome.FAILED, Outcome.SUCCEEDED])
def test_an_event_started_by_the_platform_without_our_approval_is_held_through(outcome):
    """Its before-hooks failed (hooks_failed), or it was not approved (approve: never): the
    platform starts it at NotBefore anyway, and those phases stay as they are when it is
    listed Started. Was: its slot stayed on the daemon's lease (a daemon killed in the
    maintenance lost it within ttl), and a lease expired in a partition then gave it back."""
    m = when_machine(concurrency=HOLD, coordination=ETCD)
    if outcome is Outcome.SUCCEEDED:
        cfg = dataclasses.replace(m.state.config, approve=ApprovePolicy.NEVER)
        m = Machine(cfg, now=MONO0)
    seen(m, due_in(3 * 86400))
    m.send(SlotGranted("E1", MONO0 + 1), at=MONO0 + 1)
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, outcome, "exit 1"), at=MONO0 + 2)
    decided = m.phase()
    assert decided in (Phase.HOOKS_FAILED, Phase.NOT_APPROVED)
    assert not kept(m.effects), "not approved, not started: lost within ttl if killed now"
    assert not kept(seen(m, due_in(3 * 86400), incarnation=3, at=MONO0 + 10))
    started = dataclasses.replace(due_in(3 * 86400), status="Started")
    effects = seen(m, started, incarnation=4, at=MONO0 + 20)
    assert m.phase() is decided
    assert kept(effects) == [("E1", 900)]
    effects = m.send(SlotBusy("E1", ("(lease expired)",), (), True), at=MONO0 + 30)
    assert not of(effects, ReleaseSlot), "asked for again, not given back in its maintenance"
    assert m.state.events["E1"].slot is Slot.ASKED


def test_a_restart_before_the_approval_takes_the_slot_back_under_the_daemons_lease():
    m = when_machine(concurrency=HOLD, coordination=ETCD)
    seen(m, due_in(3 * 86400))
    m.send(SlotGranted("E1", MONO0 + 1), at=MONO0 + 1)
    again = Machine(m.state.config, loaded=m.state.events, now=MONO0 + 300)
    (acquire,) = of(again.effects, AcquireSlot)
    assert acquire.hold == 0


def test_a_reload_in_the_maintenance_takes_the_slot_back_under_the_hold_lease():
    """Issue 28 #4. Was: the new keeper took a held slot back under the daemon's lease of ttl
    (the old one handed it over under a lease of ttl): a daemon killed after a reload in its
    maintenance lost the slot within ttl. With a group added (#3), AcquireSlot `hold` also
    tells the keeper to take back only the keys it holds."""
    m = approved()
    zone = Concurrency("web", 1, 5, hold_max=900, after_retry=60, more=(Limit("zone-1", 1),))
    wider = dataclasses.replace(m.state.config, concurrency=zone)
    effects = m.send(Reloaded(wider), at=MONO0 + 4)
    (acquire,) = of(effects, AcquireSlot)
    assert acquire.hold == 900


def test_the_move_to_the_hold_lease_is_said_once_it_is_there_or_loudly_when_it_fails():
    """Was: the move was silent (`slot_held` only at a stop) and a move that failed was tried
    again every third of ttl without a word, so nothing said a daemon that died then lost its
    slot within ttl. The keeper says each (SlotMoved); the engine logs it."""
    m = approved()
    keys = ("/sed/slots/web/0",)
    effects = m.send(SlotMoved("E1", keys, 900, "unavailable: connection refused"), at=MONO0 + 3)
    (failed,) = logs(effects, "slot_failed")
    assert failed.level.value == "warning"
    assert failed.fields["kind"] == "hold_through"
    assert failed.fields["slots"] == list(keys)
    assert failed.fields["error"] == "unavailable: connection refused"
    assert "lost within ttl" in str(failed.fields["reason"])
    effects = m.send(SlotMoved("E1", keys, 900), at=MONO0 + 4)
    (held,) = logs(effects, "slot_held_through")
    assert held.level.value == "info"
    assert (held.fields["slots"], held.fields["hold_s"]) == (list(keys), 900)
    assert not logs(m.send(SlotMoved("gone", keys, 900), at=MONO0 + 5)), "an event forgotten"
