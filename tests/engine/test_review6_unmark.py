"""Review 6 of the put-back's wait for etcd (engine/postponed: `unmarking`, SharedForgotten):
what that wait misses. Fake clock."""

from __future__ import annotations

import dataclasses
import json

from scheduledeventsd.config import EventRule, HealthFrom, Pacemaker
from scheduledeventsd.engine import (
    Boot,
    ClusterDrained,
    ClusterMarked,
    Coordinate,
    DrainNode,
    ForgetShared,
    HooksFinished,
    Outcome,
    PeersChanged,
    Phase,
    RestoreNode,
    SharedForgotten,
    SpawnHooks,
    initial,
)
from scheduledeventsd.host import store
from scheduledeventsd.observe.observer import Observer
from scheduledeventsd.observe.report import status
from tests.engine.test_engine import VM, Machine, logs, of
from tests.engine.test_engine_fleet import fleet
from tests.engine.test_engine_postponed import LEAD, MONO0
from tests.engine.test_engine_postponed_shared import RULE, coordinating, shared
from tests.engine.test_engine_when import WALL0, seen

DAY = 86400.0
PACEMAKER = Pacemaker(drain_timeout=60)


def put_back(m):
    """Moved 3 days later while it waited for vm-c: its undo waits for etcd (`unmarking`)."""
    effects = seen(m, shared(3 * DAY), incarnation=3, at=MONO0 + 60)
    assert of(effects, ForgetShared) == [ForgetShared("E1", VM)]
    assert not of(effects, SpawnHooks)
    assert m.state.events["E1"].unmarking
    return effects


def drained_and_coordinating(m):
    """As `coordinating`, with the node drained through Pacemaker first."""
    assert of(seen(m, shared(30 * 60), at=MONO0), DrainNode)
    m.send(ClusterMarked("E1", ours=True), at=MONO0 + 0.5)
    (drain,) = of(m.send(ClusterDrained("E1"), at=MONO0 + 0.6), SpawnHooks)
    assert of(m.send(HooksFinished(drain.run, Outcome.SUCCEEDED), at=MONO0 + 1), Coordinate)
    m.send(PeersChanged("E1", {"vm-a": "ready", "vm-b": "ready"}), at=MONO0 + 2)
    assert m.phase() is Phase.COORDINATING


def restarted_without_etcd(m):
    """The daemon restarted (same boot) with etcd taken out of its configuration."""
    loaded = store._decode(json.loads(json.dumps(store._encode(m.state.events))))
    cfg = dataclasses.replace(m.state.config, coordination=None)
    again = Machine.__new__(Machine)
    again.now = m.now + 100
    again.state = initial(cfg, None, strict=True)
    again.effects = again.send(Boot(loaded, "", "boot-1", m.state.cluster_mark))
    return again


def test_a_restart_without_etcd_ends_the_wait_for_the_delete_as_a_reload_does():
    """Put back while its ready stood in etcd, then the daemon restarted with etcd removed
    from its file (not reloaded): nothing can confirm the delete any more, as after a reload
    that removes etcd (postponed.reloaded), so its cancelled-hooks run, with a warning. Before:
    ForgetShared at boot (no coordinator: dropped), and the event stays `unmarking` for ever,
    its cancelled-hooks never run, nothing said, a week later still."""
    m = Machine(fleet(events={"Reboot": RULE}), now=MONO0)
    coordinating(m, shared(30 * 60))
    put_back(m)
    again = restarted_without_etcd(m)
    effects = list(again.effects)
    effects += seen(again, shared(3 * DAY), incarnation=3, at=again.now + 1)
    effects += again.tick(again.now + 7 * DAY)
    assert not again.state.events["E1"].unmarking, "still waiting for etcd a week later"
    assert [s.stage.value for s in of(effects, SpawnHooks)] == ["cancelled"]
    (unmarked,) = logs(effects, "event_unmarked")
    assert unmarked.level.value == "warning"


def test_a_restart_without_etcd_restores_the_node_of_a_put_back_shared_event():
    """With Pacemaker too: drained, waiting for vm-c, put back (the node kept marked until
    etcd confirms the delete), restarted with etcd removed: the node is restored (RestoreNode)
    and not left marked for good. Before: no RestoreNode, ever: the event keeps the mark
    (runs._keeps_mark: unmarking), so not even the boot's restore of an unwanted mark."""
    m = Machine(fleet(events={"Reboot": RULE}, cluster=PACEMAKER), now=MONO0)
    drained_and_coordinating(m)
    put_back(m)
    assert m.state.cluster_mark is not None
    again = restarted_without_etcd(m)
    effects = list(again.effects) + again.tick(again.now + 7 * DAY)
    assert of(effects, RestoreNode), "the node left marked"


def test_status_says_a_put_back_shared_event_waits_for_etcd():
    """`scheduledeventsd status` for an event whose undo waits for etcd to confirm its ready
    deleted (for as long as this VM is cut off from etcd): it says it waits, and for etcd.
    Today: `Reboot E1: after, Scheduled, NotBefore ...` and waiting_for null: an operator
    reads a stage under way, yet no hook runs and the node stays drained."""
    m = Machine(fleet(events={"Reboot": RULE}), now=MONO0)
    coordinating(m, shared(30 * 60))
    put_back(m)
    wall = WALL0 + 70
    shown = Observer(WALL0).document(m.state, wall, HealthFrom.DETECTED)
    (event,) = shown["events"]
    assert event["waiting_for"] == "etcd"
    assert "etcd" in status(shown, wall, [])


BOTH = EventRule(("drain",), ("after-undrain",), ("cancelled-undrain",), start_before=LEAD)


def test_a_put_back_event_that_starts_while_its_undo_waits_gets_its_after_hooks_once_over():
    """Cut off from etcd when it saw the move, this VM stays prepared (its ready may complete
    the others' set); they are approved, and the event Starts: the maintenance is on and this
    node is still prepared for it (docs/explanation/fleets.md: "the event start for every VM:
    that VM stays prepared until etcd answers"). etcd's answer must not undo the node under the
    maintenance: no cancelled-hooks then; once the event is over, its after-hooks, as for a
    COORDINATING event that Starts (DONE). Today the stage was fixed at the put-back: etcd's
    answer runs the cancelled-hooks at once (with Pacemaker, the node restored while it goes
    down), and the after-hooks never run for a maintenance this node was prepared for."""
    m = Machine(fleet(events={"Reboot": BOTH}), now=MONO0)
    coordinating(m, shared(30 * 60))
    put_back(m)
    started = dataclasses.replace(shared(3 * DAY), status="Started")
    seen(m, started, incarnation=4, at=MONO0 + 70)
    effects = m.send(SharedForgotten("E1"), at=MONO0 + 80)
    assert not [s for s in of(effects, SpawnHooks) if s.stage.value == "cancelled"]
    effects = seen(m, incarnation=5, at=MONO0 + 600)  # over: it left the document
    assert [s.hooks for s in of(effects, SpawnHooks)] == [("after-undrain",)]
