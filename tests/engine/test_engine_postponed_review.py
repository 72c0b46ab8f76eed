"""A reviewer's attacks on engine/postponed.py (a prepared event put back when its NotBefore
moves later by more than its lead), fake clock: a move seen while the node is being prepared is
not lost, small moves add up, and a held slot or a shared event's mark is given back."""

from __future__ import annotations

import dataclasses
import json

from scheduledeventsd.config import EventRule
from scheduledeventsd.config.provider import Provider
from scheduledeventsd.engine import (
    ForgetShared,
    HooksFinished,
    Outcome,
    PeersChanged,
    Phase,
    SharedForgotten,
    SpawnHooks,
)
from scheduledeventsd.host import store
from scheduledeventsd.providers.gcp import UPCOMING_ID
from tests.engine.test_engine import VM, Machine, config, logs, of
from tests.engine.test_engine_fleet import SHARED, fleet
from tests.engine.test_engine_postponed import EVENTS, LEAD, MONO0, gcp, seen, window_at
from tests.engine.test_engine_when import due_in
from tests.engine.test_engine_when import seen as when_seen


def test_a_move_seen_while_the_before_hooks_run_puts_it_back_once_they_end():
    """The window moved 3 days later while the drain hook ran; the document does not change
    after that. Before: the move was taken as the event's NotBefore while it ran, so once
    prepared nothing had moved, and the node stayed drained for 3 days."""
    m = gcp()
    (before,) = of(seen(m, window_at(30 * 60), incarnation=2, at=MONO0), SpawnHooks)
    moved = window_at(3 * 86400)
    seen(m, moved, incarnation=3, at=MONO0 + 5)  # while the drain hook runs
    assert not of(m.effects, SpawnHooks)
    (undrain,) = of(m.send(HooksFinished(before.run, Outcome.SUCCEEDED), at=MONO0 + 10), SpawnHooks)
    assert (undrain.stage.value, undrain.hooks) == ("cancelled", ("undrain",))
    (cancelled,) = logs(m.effects, "event_cancelled")
    assert cancelled.fields["moved_s"] == 257400
    m.send(HooksFinished(undrain.run, Outcome.SUCCEEDED), at=MONO0 + 11)
    seen(m, moved, incarnation=3, at=MONO0 + 12)
    assert m.phase(UPCOMING_ID) is Phase.WAITING
    assert m.state.events[UPCOMING_ID].start_at == MONO0 + 3 * 86400 - LEAD


def test_moves_each_within_the_lead_that_add_up_to_more_put_it_back():
    """Two moves of 40 min each (lead 60 min): 80 min later than it was prepared for. Before:
    each was measured from the last, neither exceeded the lead, and it stayed prepared."""
    m = gcp()
    seen(m, window_at(30 * 60), incarnation=2, at=MONO0)
    (before,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(before.run, Outcome.SUCCEEDED), at=MONO0 + 1)
    seen(m, window_at(70 * 60), incarnation=3, at=MONO0 + 10)
    assert not of(m.effects, SpawnHooks), "within its lead of the NotBefore prepared for"
    (undrain,) = of(seen(m, window_at(110 * 60), incarnation=4, at=MONO0 + 20), SpawnHooks)
    assert undrain.stage.value == "cancelled"
    assert logs(m.effects, "event_cancelled")[0].fields["moved_s"] == 80 * 60


def test_the_notbefore_it_was_prepared_for_survives_a_restart():
    """Moved 40 min, the daemon restarted (the state file), moved 40 min more: 80 min later
    than it was prepared for, more than its lead. Before: the state file kept only the last
    NotBefore, so the restarted daemon measured 40 min and kept the node drained."""
    m = gcp()
    (before,) = of(seen(m, window_at(30 * 60), incarnation=2, at=MONO0), SpawnHooks)
    m.send(HooksFinished(before.run, Outcome.SUCCEEDED), at=MONO0 + 1)
    seen(m, window_at(70 * 60), incarnation=3, at=MONO0 + 10)
    loaded = store._decode(json.loads(json.dumps(store._encode(m.state.events))))
    again = Machine(config(events=EVENTS, provider=Provider.GCP), loaded=loaded, now=MONO0 + 20)
    assert again.phase(UPCOMING_ID) is Phase.NOT_APPROVED
    (undrain,) = of(seen(again, window_at(110 * 60), incarnation=4, at=MONO0 + 21), SpawnHooks)
    assert undrain.stage.value == "cancelled"


def test_a_shared_event_moved_while_it_waited_for_its_peers_is_put_back_before_one_fails():
    """Azure, a shared Reboot prepared (ready written), waiting for the other VMs; its NotBefore
    moved 3 days later meanwhile; then a peer's `failed`. Before (first): the move was taken
    while it waited, so nothing had moved, and the node stayed drained for 3 days. Then: put
    back only once that `failed` came. Now: put back as the move is seen (it stops waiting,
    test_engine_postponed_shared), and the `failed` after it changes nothing; its mark is
    deleted then, and once its cancelled-hooks end."""
    rule = EventRule(("drain",), cancelled=("undrain",), start_before=LEAD)
    m = Machine(fleet(events={"Reboot": rule}), now=MONO0)
    shared = dataclasses.replace(due_in(30 * 60), resources=SHARED)
    (before,) = of(when_seen(m, shared, at=MONO0), SpawnHooks)
    m.send(HooksFinished(before.run, Outcome.SUCCEEDED), at=MONO0 + 1)
    assert m.phase() is Phase.COORDINATING
    later = dataclasses.replace(due_in(3 * 86400), resources=SHARED)
    assert not of(when_seen(m, later, incarnation=3, at=MONO0 + 5), SpawnHooks)
    assert of(m.effects, ForgetShared) == [ForgetShared("E1", VM)]
    effects = m.send(PeersChanged("E1", {VM: "ready", "vm-b": "failed"}), at=MONO0 + 6)
    assert not of(effects, SpawnHooks)
    assert not logs(effects, "event_not_approved")
    (undrain,) = of(m.send(SharedForgotten("E1"), at=MONO0 + 6.5), SpawnHooks)  # etcd confirmed
    assert (undrain.stage.value, undrain.hooks) == ("cancelled", ("undrain",))
    effects = m.send(HooksFinished(undrain.run, Outcome.SUCCEEDED), at=MONO0 + 7)
    assert of(effects, ForgetShared) == [ForgetShared("E1", VM)]
