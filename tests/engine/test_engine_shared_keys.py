"""A shared event's etcd mark is deleted once it is over for this VM (issue 28): ForgetShared,
once, when the engine forgets the event (its after-hooks have run and it left the document, or
it is judged anew under the same EventId), never while another VM may still read the mark to
decide. Fake clock; the daemon's side is tests/system/test_shared_keys.py."""

from __future__ import annotations

from scheduledeventsd.config import ApprovePolicy, EventRule
from scheduledeventsd.engine import (
    ApprovalSent,
    Coordinate,
    ForgetShared,
    HooksFinished,
    Outcome,
    PeersChanged,
    Persist,
    Phase,
    PostApproval,
    SpawnHooks,
    StopCoordinating,
)
from tests.engine.test_engine import VM, Machine, config, doc, event, of
from tests.engine.test_engine_fleet import ETCD, GATE, SHARED

EVENTS = {"Reboot": EventRule(("drain",), ("undrain",))}
ALL_READY = {"vm-a": "ready", "vm-b": "ready", "vm-c": "ready"}


def fleet(coordination=ETCD):
    return config(approve=ApprovePolicy.ALL, coordination=coordination, events=EVENTS)


class History(Machine):
    """A Machine that keeps every step's effects, to count an effect over a whole history."""

    def send(self, message, at=None):
        effects = super().send(message, at)
        self.__dict__.setdefault("steps", []).append(effects)
        return effects

    def forgets(self):
        return [e for step in self.steps for e in of(step, ForgetShared)]


def coordinated(m, at=101.0):
    m.fetched(doc(event(resources=SHARED)), at=at)
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=at + 1)
    assert of(m.effects, Coordinate)
    assert m.phase() is Phase.COORDINATING


def over_and_gone(m, at=110.0):
    """Approved by every VM, Started, gone from the document; the after-hooks' run number."""
    m.send(PeersChanged("E1", ALL_READY), at=at)
    assert of(m.effects, PostApproval)
    assert of(m.effects, StopCoordinating)
    m.send(ApprovalSent("E1"), at=at + 1)
    m.fetched(doc(event(status="Started", resources=SHARED), incarnation=3), at=at + 2)
    assert m.phase() is Phase.APPROVED  # Started: nothing to do until it is over
    m.fetched(doc(incarnation=4), at=at + 60)
    assert m.phase() is Phase.AFTER
    (after,) = of(m.effects, SpawnHooks)
    return after.run


def test_the_mark_is_forgotten_once_after_the_after_hooks_of_an_event_that_left_not_before():
    """Not when every VM is ready (another VM may still be reading our ready to decide), not
    at the approval, Started or its leaving while its after-hooks run: once they have run and
    it is forgotten, and never again."""
    m = History(fleet())
    coordinated(m)
    m.send(PeersChanged("E1", {"vm-a": "ready", "vm-b": "ready"}), at=105)
    run = over_and_gone(m)
    assert not m.forgets(), "not while the event is not over for this VM"
    m.send(HooksFinished(run, Outcome.SUCCEEDED), at=175)
    assert "E1" not in m.state.events
    assert of(m.effects, ForgetShared) == [ForgetShared("E1", VM)]
    m.fetched(doc(incarnation=5), at=180)
    m.tick(m.wake())
    assert m.forgets() == [ForgetShared("E1", VM)], "once"


def test_a_daemon_restarted_on_a_new_boot_forgets_the_mark_of_the_event_it_approved():
    """The mark was written by the process before the maintenance: the state file brings the
    event back, and its end deletes the mark all the same (by key, whatever lease it is on)."""
    m = Machine(fleet())
    coordinated(m)
    m.send(PeersChanged("E1", ALL_READY), at=110)
    m.send(ApprovalSent("E1"), at=111)
    saved = of(m.effects, Persist)[-1].events
    again = History(fleet(), loaded=saved, boot="boot-2", now=500.0)
    assert again.phase() is Phase.REBOOTED
    again.fetched(doc(incarnation=4), at=501)
    (after,) = of(again.effects, SpawnHooks)
    assert not again.forgets()
    again.send(HooksFinished(after.run, Outcome.SUCCEEDED), at=502)
    assert again.forgets() == [ForgetShared("E1", VM)]


def test_our_failed_mark_is_forgotten_too_once_the_event_is_over():
    m = History(fleet())
    m.fetched(doc(event(resources=SHARED)), at=101)
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.FAILED), at=102)
    assert m.phase() is Phase.HOOKS_FAILED
    assert not of(m.effects, Coordinate)[0].ready
    m.fetched(doc(event(status="Started", resources=SHARED), incarnation=3), at=110)
    m.fetched(doc(incarnation=4), at=170)
    assert not m.forgets()
    (after,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(after.run, Outcome.SUCCEEDED), at=171)
    assert m.forgets() == [ForgetShared("E1", VM)]


def test_an_event_back_under_its_eventid_forgets_the_old_mark_before_it_is_coordinated_anew():
    """Google Cloud reuses EventIds: the old ready is deleted as the event comes back (review1:
    not only once its after-hooks ended, test below) and again, idempotent, when the old event
    is forgotten; both before the new one writes its own, so a ready from before never counts
    for the new one."""
    m = History(fleet())
    coordinated(m)
    run = over_and_gone(m)
    m.fetched(doc(event(resources=SHARED), incarnation=5), at=171)  # back while they run
    assert m.forgets() == [ForgetShared("E1", VM)]
    m.send(HooksFinished(run, Outcome.SUCCEEDED), at=172)
    assert m.forgets() == [ForgetShared("E1", VM)] * 2
    m.fetched(doc(event(resources=SHARED), incarnation=5), at=173)
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=174)
    assert of(m.effects, Coordinate), "the new one writes its ready again"
    assert m.forgets() == [ForgetShared("E1", VM)] * 2


def test_nothing_is_forgotten_for_what_wrote_no_mark():
    """A sole event, a shared one asked through the gate command, one that left before its
    before-hooks: nothing of theirs is in etcd."""
    m = History(fleet())
    m.fetched(doc(event(resources=(VM,))), at=101)
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=102)
    m.send(ApprovalSent("E1"), at=103)
    m.fetched(doc(incarnation=3), at=160)
    (after,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(after.run, Outcome.SUCCEEDED), at=161)
    assert "E1" not in m.state.events
    gate = History(fleet(GATE))
    gate.fetched(doc(event(resources=SHARED)), at=101)
    (spawn,) = of(gate.effects, SpawnHooks)
    gate.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=102)
    gate.fetched(doc(incarnation=3), at=160)
    for spawned in of(gate.effects, SpawnHooks):
        gate.send(HooksFinished(spawned.run, Outcome.SUCCEEDED), at=161)
    assert "E1" not in gate.state.events
    assert not m.forgets()
    assert not gate.forgets()


def test_an_event_back_while_its_after_hooks_run_has_its_mark_from_before_deleted_at_once():
    """Review: it left, its after-hooks (undrain) still run, and it is listed again under its
    EventId: the mark from before is deleted now, once, so the other VMs coordinating the event
    back do not count that `ready` while this VM's hooks have not run again. Before: only once
    the after-hooks ended (and the event was forgotten)."""
    m = History(fleet())
    coordinated(m)
    over_and_gone(m)
    m.fetched(doc(event(resources=SHARED), incarnation=5), at=175)
    assert m.phase() is Phase.AFTER, "its after-hooks still run"
    assert of(m.effects, ForgetShared) == [ForgetShared("E1", VM)]
    m.fetched(doc(event(resources=SHARED), incarnation=6), at=176)
    assert len(m.forgets()) == 1, "once as it comes back, not at every poll"
