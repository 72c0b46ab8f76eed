"""A shared event waiting for its peers (COORDINATING, its `ready` in etcd) whose NotBefore moves
later by more than its lead is put back like a prepared one (engine/postponed.py): it stops
waiting, takes its `ready` back (the watch stopped with a withdraw, its mark deleted now), runs
its cancelled-hooks, and is prepared again at its new lead, where it coordinates again for the
same EventId. Before, it stayed drained, waiting for the others, for the whole delay. Fake clock."""

from __future__ import annotations

import dataclasses
import json

from scheduledeventsd.config import EventRule
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
    (undrain,) = of(effects, SpawnHooks)
    assert (undrain.stage.value, undrain.hooks) == ("cancelled", ("undrain",))
    assert not of(effects, Coordinate)
    effects = m.send(PeersChanged("E1", ALL_READY), at=MONO0 + 61)  # read before the withdraw
    assert not of(effects, PostApproval), "not approved on a ready taken back"
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
    assert of(effects, SpawnHooks)[0].stage.value == "cancelled"
