"""A shared event waiting for its peers (COORDINATING, its `ready` in etcd) whose NotBefore moves
later by more than its lead is put back like a prepared one (engine/postponed.py): it stops
waiting, takes its `ready` back (the watch stopped with a withdraw, its mark deleted now), runs
its cancelled-hooks, and is prepared again at its new lead, where it coordinates again for the
same EventId. Before, it stayed drained, waiting for the others, for the whole delay. Fake clock."""

from __future__ import annotations

import dataclasses
import json

from scheduledeventsd.config import Coordination, Etcd, EventRule
from scheduledeventsd.engine import (
    AskGate,
    CancelRuns,
    Coordinate,
    ForgetShared,
    GateAnswered,
    HooksFinished,
    Outcome,
    PeersChanged,
    Phase,
    PostApproval,
    Reloaded,
    SharedForgotten,
    SpawnHooks,
    StopCoordinating,
)
from scheduledeventsd.host import store
from tests.engine.test_engine import VM, Machine, logs, of
from tests.engine.test_engine_fleet import GATE, SHARED, fleet
from tests.engine.test_engine_postponed import LEAD, MONO0
from tests.engine.test_engine_when import due_in, seen

RULE = EventRule(("drain",), cancelled=("undrain",), start_before=LEAD)
ALL_READY = dict.fromkeys(("vm-a", "vm-b", "vm-c"), "ready")


def shared(seconds):
    """A Reboot naming this VM (vm-a) and two others, NotBefore `seconds` after WALL0."""
    return dataclasses.replace(due_in(seconds), resources=SHARED)


def coordinating(m, first):
    """Seen within its lead: drained, its `ready` written, vm-b ready too, vm-c not yet."""
    (drain,) = of(seen(m, first, at=MONO0), SpawnHooks)
    effects = m.send(HooksFinished(drain.run, Outcome.SUCCEEDED), at=MONO0 + 1)
    (ready,) = of(effects, Coordinate)
    assert ready.ready
    m.send(PeersChanged("E1", {"vm-a": "ready", "vm-b": "ready"}), at=MONO0 + 2)
    assert m.phase() is Phase.COORDINATING


def test_a_shared_event_waiting_for_its_peers_moved_days_later_is_put_back_then_coordinates_again():
    """Moved 3 days later while vm-c's hooks still run: this VM stops waiting, its ready is
    taken back (StopCoordinating withdraws it, ForgetShared deletes its mark now), its
    cancelled-hook runs, and the others' late answer (all ready) approves nothing. At its new
    lead it is drained again and writes ready again for the same EventId; approved only once
    every VM said ready in that round. Before: the move changed nothing, the node stayed
    drained waiting for its peers for 3 days, and that late answer approved it."""
    m = Machine(fleet(events={"Reboot": RULE}), now=MONO0)
    coordinating(m, shared(30 * 60))
    moved = shared(3 * 86400)
    effects = seen(m, moved, incarnation=3, at=MONO0 + 60)
    (cancelled,) = logs(effects, "event_cancelled")
    assert cancelled.fields["phase"] == "coordinating"
    assert cancelled.fields["stage"] == "cancelled"
    assert cancelled.fields["moved_s"] == 3 * 86400 - 30 * 60
    assert cancelled.fields["hooks_start_at"] == "2026-11-29T11:00:00Z", "its new lead"
    assert of(effects, StopCoordinating) == [StopCoordinating(("E1",))], "its ready withdrawn"
    assert of(effects, ForgetShared) == [ForgetShared("E1", VM)], "and its mark deleted now"
    assert not of(effects, SpawnHooks), "its undo waits for etcd to confirm that delete"
    assert not of(effects, Coordinate)
    effects = m.send(PeersChanged("E1", ALL_READY), at=MONO0 + 61)  # read before the withdraw
    assert not of(effects, PostApproval), "not approved on a ready taken back"
    (undrain,) = of(m.send(SharedForgotten("E1"), at=MONO0 + 61.5), SpawnHooks)
    assert (undrain.stage.value, undrain.hooks) == ("cancelled", ("undrain",))
    m.send(HooksFinished(undrain.run, Outcome.SUCCEEDED), at=MONO0 + 62)
    assert "E1" not in m.state.events, "forgotten: judged anew at the next poll"
    effects = seen(m, moved, incarnation=3, at=MONO0 + 63)
    assert m.phase() is Phase.WAITING
    assert not of(effects, SpawnHooks)
    assert not of(effects, Coordinate)
    lead_at = MONO0 + 3 * 86400 - LEAD
    assert m.state.events["E1"].start_at == lead_at
    assert not of(m.tick(lead_at - 1), SpawnHooks), "not before its new lead"
    (drain,) = of(m.tick(lead_at), SpawnHooks)
    assert (drain.stage.value, drain.hooks) == ("before", ("drain",))
    effects = m.send(HooksFinished(drain.run, Outcome.SUCCEEDED), at=lead_at + 1)
    (ready,) = of(effects, Coordinate)
    assert (ready.event.event_id, ready.ready) == ("E1", True), "the same EventId, again"
    assert ready.event.not_before == moved.not_before
    effects = m.send(PeersChanged("E1", {"vm-a": "ready", "vm-b": "ready"}), at=lead_at + 2)
    assert not of(effects, PostApproval)
    effects = m.send(PeersChanged("E1", ALL_READY), at=lead_at + 3)
    assert [p.event.event_id for p in of(effects, PostApproval)] == ["E1"]


def test_a_shared_event_moved_while_its_before_hooks_ran_never_writes_its_ready():
    """vm-c's case: the move is seen while its drain hook runs; when it ends, the event is put
    back at once, before its ready is ever written (no Coordinate). Before: it wrote ready
    and waited, drained, for 3 days (and completed the set of the others' readies)."""
    m = Machine(fleet(events={"Reboot": RULE}), now=MONO0)
    (drain,) = of(seen(m, shared(30 * 60), at=MONO0), SpawnHooks)
    seen(m, shared(3 * 86400), incarnation=3, at=MONO0 + 5)
    assert not of(m.effects, SpawnHooks)
    effects = m.send(HooksFinished(drain.run, Outcome.SUCCEEDED), at=MONO0 + 10)
    assert not of(effects, Coordinate), "never ready for a NotBefore 3 days away"
    (undrain,) = of(effects, SpawnHooks)
    assert undrain.stage.value == "cancelled"
    assert logs(effects, "event_cancelled")[0].fields["phase"] == "coordinating"


def test_a_shared_event_moved_within_its_lead_keeps_waiting_for_its_peers():
    """Moved by less than its lead: no churn; it still waits, its ready kept, and the others'
    readies approve it."""
    m = Machine(fleet(events={"Reboot": RULE}), now=MONO0)
    coordinating(m, shared(30 * 60))
    effects = seen(m, shared(30 * 60 + LEAD - 60), incarnation=3, at=MONO0 + 60)
    assert not of(effects, SpawnHooks)
    assert not of(effects, StopCoordinating)
    assert not of(effects, ForgetShared)
    assert m.phase() is Phase.COORDINATING
    effects = m.send(PeersChanged("E1", ALL_READY), at=MONO0 + 61)
    assert of(effects, PostApproval)


def test_a_shared_event_asking_the_gate_command_when_moved_days_later_stops_asking_it():
    """Coordinated by the gate command, not etcd: the gate run in progress is cancelled (its
    late answer approves nothing), no mark to delete; cancelled-hooks, then judged anew."""
    m = Machine(fleet(GATE, events={"Reboot": RULE}), now=MONO0)
    (drain,) = of(seen(m, shared(30 * 60), at=MONO0), SpawnHooks)
    (ask,) = of(m.send(HooksFinished(drain.run, Outcome.SUCCEEDED), at=MONO0 + 1), AskGate)
    effects = seen(m, shared(3 * 86400), incarnation=3, at=MONO0 + 60)
    assert of(effects, CancelRuns) == [CancelRuns((ask.run,))]
    assert not of(effects, ForgetShared)
    (undrain,) = of(effects, SpawnHooks)
    assert undrain.stage.value == "cancelled"
    effects = m.send(GateAnswered(ask.run, 0), at=MONO0 + 61)
    assert not of(effects, PostApproval)


def test_a_shared_event_waiting_across_a_restart_moved_days_later_deletes_its_mark_from_before():
    """The daemon restarted while the event waited for its peers (its ready from before on
    etcd, kept by its lease for `ttl`); the first document after shows the move: put back, its
    mark deleted at once (ForgetShared), its ready never written again."""
    m = Machine(fleet(events={"Reboot": RULE}), now=MONO0)
    coordinating(m, shared(30 * 60))
    loaded = store._decode(json.loads(json.dumps(store._encode(m.state.events))))
    again = Machine(fleet(events={"Reboot": RULE}), loaded=loaded, now=MONO0 + 10)
    assert again.phase() is Phase.COORDINATING
    effects = seen(again, shared(3 * 86400), incarnation=3, at=MONO0 + 11)
    assert of(effects, ForgetShared) == [ForgetShared("E1", VM)]
    assert not of(effects, Coordinate)
    assert not of(effects, SpawnHooks), "undone once etcd confirmed that delete"
    (undrain,) = of(again.send(SharedForgotten("E1"), at=MONO0 + 12), SpawnHooks)
    assert undrain.stage.value == "cancelled"


def test_a_put_back_shared_event_is_undone_only_once_etcd_confirmed_its_ready_deleted():
    """Its `ready` stands in etcd until the delete goes through (a VM cut off from etcd: up to
    its lease's ttl, or hold_max), and another VM's ready may complete the set with it: the
    node stays prepared (no cancelled-hooks, no timer fires them, however long) until etcd
    confirms the delete (SharedForgotten). A restart meanwhile asks for the delete again and
    keeps waiting (the state file says so). Before: the cancelled-hooks (the undrain) started
    at once, with that ready still counted by the others."""
    m = Machine(fleet(events={"Reboot": RULE}), now=MONO0)
    coordinating(m, shared(30 * 60))
    effects = seen(m, shared(3 * 86400), incarnation=3, at=MONO0 + 60)
    assert of(effects, ForgetShared) == [ForgetShared("E1", VM)]
    assert not of(effects, SpawnHooks), "not undone while its ready may still count"
    (cancelled,) = logs(effects, "event_cancelled")
    assert cancelled.fields["waits_for"] == "etcd"
    assert "once etcd confirmed this VM's ready deleted" in cancelled.fields["reason"]
    waiting = m.state.events["E1"]
    assert (waiting.phase, waiting.stage.value, waiting.run) == (Phase.AFTER, "cancelled", None)
    assert waiting.unmarking
    assert not of(m.tick(MONO0 + 3600), SpawnHooks), "no timer starts them meanwhile"
    assert m.state.events["E1"].unmarking
    loaded = store._decode(json.loads(json.dumps(store._encode(m.state.events))))
    assert loaded["E1"].unmarking, "kept in the state file"
    again = Machine(fleet(events={"Reboot": RULE}), loaded=loaded, now=MONO0 + 3700)
    assert of(again.effects, ForgetShared) == [ForgetShared("E1", VM)], "asked again"
    assert not of(again.effects, SpawnHooks)
    assert not logs(again.effects, "after_hooks_interrupted"), "nothing was cut off"
    assert again.wake() > MONO0 + 3700, "no busy loop while it waits"
    effects = seen(again, shared(3 * 86400), incarnation=3, at=MONO0 + 3701)
    assert not of(effects, SpawnHooks)
    assert again.phase() is Phase.AFTER
    effects = again.send(SharedForgotten("E1"), at=MONO0 + 3702)
    (unmarked,) = logs(effects, "event_unmarked")
    assert "etcd confirmed" in unmarked.fields["reason"]
    (undrain,) = of(effects, SpawnHooks)
    assert (undrain.stage.value, undrain.hooks) == ("cancelled", ("undrain",))
    assert not again.state.events["E1"].unmarking
    assert not of(again.send(SharedForgotten("E1"), at=MONO0 + 3703), SpawnHooks), "once"


def test_a_reload_that_removes_etcd_ends_the_wait_for_the_delete():
    """Nothing can confirm the delete any more (the mark goes with the old lease, within its
    ttl): the wait ends at once, said by a warning, rather than the node kept prepared for
    days."""
    m = Machine(fleet(events={"Reboot": RULE}), now=MONO0)
    coordinating(m, shared(30 * 60))
    seen(m, shared(3 * 86400), incarnation=3, at=MONO0 + 60)
    assert not of(m.effects, SpawnHooks)
    effects = m.send(
        Reloaded(dataclasses.replace(m.state.config, coordination=None)), at=MONO0 + 61
    )
    (unmarked,) = logs(effects, "event_unmarked")
    assert unmarked.level.value == "warning"
    assert "a reload removed etcd coordination" in unmarked.fields["reason"]
    (undrain,) = of(effects, SpawnHooks)
    assert undrain.stage.value == "cancelled"


def test_a_reload_to_another_etcd_asks_for_the_delete_again_and_still_waits():
    """The old coordinator's delete, tried again while etcd did not answer, ends with it: the
    new one is asked (ForgetShared again), and the undo still waits for its answer."""
    m = Machine(fleet(events={"Reboot": RULE}), now=MONO0)
    coordinating(m, shared(30 * 60))
    seen(m, shared(3 * 86400), incarnation=3, at=MONO0 + 60)
    other = Coordination(etcd=Etcd(endpoints=("http://10.0.0.9:2379",)))
    effects = m.send(
        Reloaded(dataclasses.replace(m.state.config, coordination=other)), at=MONO0 + 61
    )
    assert of(effects, ForgetShared) == [ForgetShared("E1", VM)]
    assert not of(effects, SpawnHooks)
    assert m.state.events["E1"].unmarking
    assert of(m.send(SharedForgotten("E1"), at=MONO0 + 62), SpawnHooks)
