"""A Pacemaker node's drain in the pure engine, with a fake clock: drained or held before the
before-hooks, never approved early when held, held at its deadline (never past NotBefore),
restored before the after- and cancelled-hooks, and after restarts and reboots."""

from __future__ import annotations

import dataclasses
import datetime as dt

from scheduledeventsd import engine
from scheduledeventsd.config import (
    ApprovePolicy,
    Concurrency,
    Coordination,
    DrainMethod,
    Etcd,
    EventRule,
    Pacemaker,
)
from scheduledeventsd.config.schema import WEBHOOK_EVENTS
from scheduledeventsd.engine import (
    CLUSTER_CHECK,
    GATE_LATER,
    AcquireSlot,
    ApprovalSent,
    Boot,
    CheckCluster,
    ClusterChecked,
    ClusterDrained,
    ClusterDraining,
    ClusterHeld,
    ClusterMark,
    ClusterMarked,
    ClusterRestored,
    DocumentFetched,
    Drain,
    DrainNode,
    Exit,
    GateAnswered,
    HoldSlot,
    HooksFinished,
    Outcome,
    Persist,
    Phase,
    PostApproval,
    ReleaseSlot,
    Reloaded,
    RestoreNode,
    SlotGranted,
    SpawnHooks,
    StopDraining,
    StopRequested,
    Tracked,
    compose,
    initial,
    stages,
)
from scheduledeventsd.engine.gates import drain as drain_gate
from scheduledeventsd.engine.gates import restore as restore_gate
from scheduledeventsd.engine.vocabulary.constants import RESTORE_TIMEOUT
from scheduledeventsd.observe.webhooks import kind_of
from scheduledeventsd.records import Level, Record, What
from tests.engine.test_engine import VM, Machine, config, doc, event, logs, of

WALL0 = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.timezone.utc).timestamp()
MONO0 = 100.0
EVENTS = {
    "Reboot": EventRule(("drain",), ("undrain",), ("undrain",)),
    "Freeze": EventRule(("checkpoint",)),
    "Preempt": EventRule(()),
}


MARK = ClusterMark(DrainMethod.HEALTH, "#health-scheduledevents")
STANDBY = ClusterMark(DrainMethod.STANDBY, "#health-scheduledevents")


def machine(
    loaded=None,
    boot="boot-1",
    approve=ApprovePolicy.ALWAYS,
    mark=None,
    mark_unrecorded=False,
    events=EVENTS,
    **pacemaker,
):
    """`mark`: what the state file says this daemon set on its node."""
    overrides = pacemaker.pop("config", {})
    settings = Pacemaker(drain_timeout=pacemaker.pop("drain_timeout", 60), **pacemaker)
    cfg = config(events=events, approve=approve, cluster=settings, **overrides)
    m = Machine.__new__(Machine)
    m.now = MONO0
    m.state = initial(cfg, None, strict=True)
    m.effects = m.send(Boot(loaded or {}, "", boot, mark, mark_unrecorded=mark_unrecorded))
    return m


def due_in(seconds, event_id="E1", event_type="Reboot", resources=(VM,), status="Scheduled"):
    when = dt.datetime.fromtimestamp(WALL0 + seconds, dt.timezone.utc)
    return dataclasses.replace(event(event_id, event_type, status, resources), not_before=when)


def seen(m, *events, incarnation=2, at=None):
    at = m.now if at is None else at
    return m.send(DocumentFetched(doc(*events, incarnation=incarnation), WALL0 + at - MONO0), at=at)


def drained(m, event_id):
    """The drainer marked the node (ClusterMarked, ours), then the resources left."""
    m.send(ClusterMarked(event_id, ours=True))
    return m.send(ClusterDrained(event_id))


def restored_first(m, event_id="E1", mark=MARK):
    """The step that ends an event asks for its node's restore (the coupling
    drain._restore_first) and starts no hook; its answer starts them: that run."""
    assert of(m.effects, RestoreNode) == [RestoreNode(event_id, mark)]
    assert not of(m.effects, SpawnHooks), "no hook before the node is restored"
    assert m.state.events[event_id].drain is Drain.RESTORING
    (spawn,) = of(m.send(ClusterRestored(event_id)), SpawnHooks)
    return spawn


def test_a_reboot_drains_first_then_its_hooks_run_then_it_is_approved():
    m = machine()
    seen(m, due_in(600))
    (drain,) = of(m.effects, DrainNode)
    assert drain.going == ()
    assert not of(m.effects, SpawnHooks), "no hook before the cluster agrees"
    assert m.phase() is Phase.DRAINING
    assert m.state.events["E1"].drain is Drain.ASKED
    m.send(ClusterDraining("E1", ("d1", "d2")))
    assert logs(m.effects, "cluster_draining")[0].fields["resources"] == ["d1", "d2"]
    (spawn,) = of(drained(m, "E1"), SpawnHooks)
    assert logs(m.effects, "cluster_drained")
    assert m.state.events["E1"].drain is Drain.DONE
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED))
    assert of(m.effects, PostApproval)


def test_a_held_drain_runs_the_hooks_but_never_approves_early():
    m = machine()
    seen(m, due_in(600))
    (spawn,) = of(m.send(ClusterHeld("E1", "too_few_healthy")), SpawnHooks)
    assert logs(m.effects, "cluster_hold")[0].fields["reason"] == "too_few_healthy"
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED))
    assert not of(m.effects, PostApproval)
    assert m.phase() is Phase.NOT_APPROVED
    assert logs(m.effects, "event_not_approved")[0].fields["cause"] == "cluster_hold"


def test_a_drain_is_held_at_its_timeout_and_stops_being_watched():
    m = machine(drain_timeout=30)
    seen(m, due_in(600))
    assert m.state.events["E1"].start_at == MONO0 + 30
    assert not of(m.tick(MONO0 + 29.9), StopDraining)
    m.tick(MONO0 + 30)
    assert of(m.effects, StopDraining) == [StopDraining("E1")]
    assert logs(m.effects, "cluster_hold")[0].fields["reason"] == "drain_timeout"
    assert of(m.effects, SpawnHooks)
    assert m.state.events["E1"].drain is Drain.HELD


def test_a_drain_never_outlasts_not_before():
    m = machine(drain_timeout=600)
    seen(m, due_in(30, event_type="Preempt"))
    assert m.state.events["E1"].start_at == MONO0 + 30
    m.tick(MONO0 + 30)
    assert m.state.events["E1"].drain is Drain.HELD
    assert m.phase() is Phase.NOT_APPROVED, "no before-hooks: decided at once, not approved"


def test_a_wall_clock_step_moves_a_drains_cap_at_not_before():
    """Issue 26 #15: a drain waits at most drain_timeout and never past NotBefore; that cap is
    wall-clock time, so a step of the wall clock moves it (the drain's own timeout does not).
    The clock 1 h behind at first sight, then corrected: the cap was an hour late."""
    m = machine(drain_timeout=86400)
    behind = 3600.0
    m.send(DocumentFetched(doc(due_in(2 * 3600)), WALL0 - behind), at=MONO0)
    assert m.phase() is Phase.DRAINING
    assert m.state.events["E1"].start_at == MONO0 + 2 * 3600 + behind
    m.send(DocumentFetched(doc(due_in(2 * 3600)), WALL0 + 10), at=MONO0 + 10)  # corrected
    assert logs(m.effects, "clock_moved")
    assert m.state.events["E1"].start_at == MONO0 + 2 * 3600, "NotBefore as the clock now says"
    short = machine(drain_timeout=60)
    short.send(DocumentFetched(doc(due_in(2 * 3600)), WALL0 - behind), at=MONO0)
    short.send(DocumentFetched(doc(due_in(2 * 3600)), WALL0 + 10), at=MONO0 + 10)
    assert short.state.events["E1"].start_at == MONO0 + 60, "its own timeout does not move"
    news = machine(drain_timeout=86400)  # the step comes with a new document
    news.send(DocumentFetched(doc(due_in(2 * 3600)), WALL0 - behind), at=MONO0)
    other = due_in(3 * 86400, "E2", event_type="Freeze")
    news.send(
        DocumentFetched(doc(due_in(2 * 3600), other, incarnation=3), WALL0 + 10), at=MONO0 + 10
    )
    assert news.state.events["E1"].start_at == MONO0 + 2 * 3600


def test_types_not_listed_do_not_drain():
    m = machine()
    seen(m, due_in(600, event_type="Freeze"))
    assert not of(m.effects, DrainNode)
    assert of(m.effects, SpawnHooks)


def test_the_other_named_vms_are_passed_as_cluster_nodes():
    m = machine(nodes={"vm-b": "node-b"}, approve=ApprovePolicy.ALL)
    seen(m, due_in(600, resources=(VM, "VM-B", "vm-c")))
    assert of(m.effects, DrainNode)[0].going == ("node-b", "vm-c")


def test_a_shared_event_asks_the_cluster_and_is_approved_when_it_says_so():
    m = machine(approve=ApprovePolicy.ALL)
    seen(m, due_in(600, resources=(VM, "vm-b")))
    (spawn,) = of(drained(m, "E1"), SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED))
    assert logs(m.effects, "event_coordinating")[0].fields["via"] == "pacemaker"
    (gate,) = [e for e in m.effects if type(e).__name__ == "AskCluster"]
    m.send(GateAnswered(gate.run, GATE_LATER))
    assert m.phase() is Phase.COORDINATING
    assert logs(m.effects, "gate_not_yet")[0].fields["ask_again_in_s"] == 2.0
    (again,) = [e for e in m.tick(m.now + 2) if type(e).__name__ == "AskCluster"]
    m.send(GateAnswered(again.run, 0))
    assert m.phase() is Phase.APPROVING


def test_the_node_is_restored_before_the_after_hooks():
    m = machine()
    seen(m, due_in(600))
    (spawn,) = of(drained(m, "E1"), SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED))
    m.send(ApprovalSent("E1"))
    seen(m, incarnation=3)  # over
    after = restored_first(m)
    assert after.stage.value == "after"
    assert logs(m.effects, "cluster_restored")
    assert m.state.events["E1"].drain is Drain.NONE


def test_an_event_cancelled_while_draining_restores_then_runs_its_cancelled_hooks():
    m = machine()
    seen(m, due_in(600))
    m.send(ClusterMarked("E1", ours=True))
    seen(m, incarnation=3)
    assert restored_first(m).stage.value == "cancelled"


def test_an_event_cancelled_before_its_mark_is_reported_is_restored_once_it_is():
    m = machine()
    seen(m, due_in(600))
    seen(m, incarnation=3)
    assert of(m.effects, SpawnHooks), "nothing of ours is on the node yet: at once"
    assert not of(m.effects, RestoreNode)
    assert of(m.effects, StopDraining) == [StopDraining("E1")]
    m.send(ClusterMarked("E1", ours=True))  # the drainer had marked it meanwhile
    assert of(m.effects, RestoreNode) == [RestoreNode("", MARK)]


def test_without_hooks_for_the_stage_the_node_is_still_restored():
    m = machine()
    seen(m, due_in(30, event_type="Preempt"))
    drained(m, "E1")
    seen(m, incarnation=3)
    assert of(m.effects, RestoreNode) == [RestoreNode("E1", MARK)]
    assert not of(m.effects, SpawnHooks)


def test_an_event_started_while_draining_stops_watching_and_restores_once_over():
    m = machine()
    seen(m, due_in(600))
    m.send(ClusterMarked("E1", ours=True))
    seen(m, due_in(600, status="Started"), incarnation=3)
    assert of(m.effects, StopDraining) == [StopDraining("E1")]
    assert m.phase() is Phase.DONE
    seen(m, incarnation=4)
    assert restored_first(m).stage.value == "after"


def test_a_restart_mid_drain_watches_the_drain_again_with_a_new_deadline():
    loaded = {"E1": Tracked(due_in(600), Phase.DRAINING, boot_id="boot-1", drain=Drain.ASKED)}
    m = machine(loaded=loaded, drain_timeout=60)
    assert of(m.effects, DrainNode)
    assert not of(m.effects, RestoreNode), "its event still wants the node drained"
    assert m.state.events["E1"].start_at == MONO0 + 60


def test_a_reboot_mid_drain_restores_and_runs_the_after_hooks_once_it_started():
    loaded = {"E1": Tracked(due_in(600), Phase.DRAINING, boot_id="boot-0", drain=Drain.ASKED)}
    m = machine(loaded=loaded, mark=MARK)
    assert not of(m.effects, SpawnHooks), "judged by the next document"
    assert not of(m.effects, RestoreNode), "its event still wants the node drained"
    seen(m, due_in(600, status="Started"))
    after = restored_first(m)
    assert (after.stage.value, after.rebooted) == ("after", True)


def test_a_reboot_mid_drain_that_was_not_the_maintenance_watches_the_drain_again():
    """Issue 26 #1: still Scheduled after the boot, the node is drained again (the mark is found
    set) before its before-hooks run again; nothing is restored meanwhile."""
    loaded = {"E1": Tracked(due_in(600), Phase.DRAINING, boot_id="boot-0", drain=Drain.ASKED)}
    m = machine(loaded=loaded, drain_timeout=60, mark=MARK)
    seen(m, due_in(600))
    assert of(m.effects, DrainNode)
    assert not of(m.effects, SpawnHooks)
    assert not of(m.effects, RestoreNode)
    assert m.phase() is Phase.DRAINING
    assert m.state.events["E1"].start_at == MONO0 + 60
    m.send(ClusterDrained("E1"))
    assert [s.stage.value for s in of(m.effects, SpawnHooks)] == ["before"]


def test_after_hooks_waiting_for_the_restore_start_when_another_restore_takes_the_mark_off():
    """Found by GatedPromises (random histories): on a new boot an event that had Started is
    over, so two restores of the one mark are asked, the event's and that of the mark no event
    wants (""). The "" one answered first cleared the event's drain, its hooks were taken for
    after-hooks waiting for their next try, and with no slot held it was over without them."""
    started = due_in(600, status="Started")
    loaded = {"E1": Tracked(started, Phase.DONE, boot_id="boot-0", drain=Drain.DONE)}
    m = machine(loaded=loaded, boot="boot-2", mark=MARK)
    assert set(of(m.effects, RestoreNode)) == {RestoreNode("", MARK), RestoreNode("E1", MARK)}
    assert not of(m.effects, SpawnHooks), "no hook before the node is restored"
    (after,) = of(m.send(ClusterRestored("")), SpawnHooks)
    assert (after.stage.value, after.rebooted) == ("after", True)
    assert not of(m.send(ClusterRestored("E1")), SpawnHooks), "the after-hooks run once"


def test_at_start_with_no_drain_wanted_our_recorded_mark_is_taken_off_and_the_cluster_checked():
    m = machine(mark=MARK)
    assert of(m.effects, CheckCluster)
    assert of(m.effects, RestoreNode) == [RestoreNode("", MARK)]
    m.send(ClusterChecked(("the cluster has no quorum",)))
    assert logs(m.effects, "cluster_unready")[0].fields["problems"] == ["the cluster has no quorum"]
    m.send(ClusterRestored(""))
    assert logs(m.effects, "cluster_restored")
    assert m.state.cluster_mark is None
    assert of(m.effects, Persist) == [Persist({}, None)], "the state file no longer holds it"


def test_at_start_without_a_recorded_mark_nothing_is_taken_off():
    """A health attribute (or standby) on the node that this daemon never set is not ours."""
    m = machine()
    assert of(m.effects, CheckCluster)
    assert not of(m.effects, RestoreNode)


def test_after_hooks_cut_off_by_a_restart_still_restore_the_node():
    """They had started (their restore answered, here failed): cut off, never run again; the
    mark left on the node is wanted by no event, so it is taken off."""
    loaded = {"E1": Tracked(due_in(600), Phase.AFTER, boot_id="boot-1")}
    m = machine(loaded=loaded, mark=MARK)
    assert m.phase() is Phase.OVER
    assert logs(m.effects, "after_hooks_interrupted")
    assert of(m.effects, RestoreNode) == [RestoreNode("", MARK)]


def test_a_restore_that_fails_is_reported_and_the_drain_kept_on_record():
    m = machine()
    seen(m, due_in(30, event_type="Preempt"))
    drained(m, "E1")
    seen(m, due_in(30, event_type="Preempt"), incarnation=3)
    m.send(ClusterRestored("E1", "crm_attribute: timed out"))
    assert logs(m.effects, "cluster_restore_failed")[0].fields["error"] == (
        "crm_attribute: timed out"
    )
    assert m.state.events["E1"].drain is Drain.DONE


def test_webhooks_carry_the_cluster_records():
    for what, kind in (
        (What.CLUSTER_DRAINED, "cluster_drained"),
        (What.CLUSTER_HOLD, "cluster_hold"),
        (What.CLUSTER_RESTORED, "cluster_restored"),
    ):
        assert kind_of(Record(Level.INFO, what, {})) == kind
        assert kind in WEBHOOK_EVENTS, "on by default"
    assert kind_of(Record(Level.INFO, What.CLUSTER_DRAINING, {})) is None, "not every reading"


def test_with_method_standby_nothing_is_taken_off_at_start_an_operators_standby_stays():
    m = machine(method=DrainMethod.STANDBY)
    assert of(m.effects, CheckCluster)
    assert not of(m.effects, RestoreNode)


def test_two_events_draining_the_node_restore_it_only_when_the_last_is_over():
    m = machine()
    seen(m, due_in(600, "E1"), due_in(900, "E2"))
    for event_id in ("E1", "E2"):
        (spawn,) = of(drained(m, event_id), SpawnHooks)
        m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED))
    seen(m, due_in(900, "E2"), incarnation=3)  # E1 cancelled, E2 still on
    (cancelled,) = of(m.effects, SpawnHooks)
    assert cancelled.event.event_id == "E1"
    assert not of(m.effects, RestoreNode), "E2 still wants the node drained"
    seen(m, incarnation=4)
    assert restored_first(m, "E2").event.event_id == "E2"


def over_after_drain(m, event_type="Preempt"):
    """An event drained with this daemon's mark, then gone from the document."""
    seen(m, due_in(30, event_type=event_type))
    drained(m, "E1")
    seen(m, incarnation=3)


def test_a_mark_found_set_by_someone_else_is_never_taken_off():
    """Issue 26 #7: an operator's standby (or attribute) on the node before the event stays."""
    m = machine(method=DrainMethod.STANDBY)
    seen(m, due_in(600))
    (drain,) = of(m.effects, DrainNode)
    assert not drain.ours
    m.send(ClusterMarked("E1", ours=False))
    assert logs(m.effects, "cluster_draining")[0].fields["marked_by"] == "someone else"
    assert m.state.cluster_mark is None
    (spawn,) = of(m.send(ClusterDrained("E1")), SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED))
    m.send(ApprovalSent("E1"))
    seen(m, incarnation=3)
    assert of(m.effects, SpawnHooks), "not ours: left on, the hooks at once"
    assert not of(m.effects, RestoreNode)
    assert m.state.events["E1"].drain is Drain.NONE


def test_the_mark_set_is_persisted_until_a_restore_takes_it_off():
    m = machine()
    seen(m, due_in(600))
    m.send(ClusterMarked("E1", ours=True))
    (persist,) = of(m.effects, Persist)
    assert persist.mark == MARK
    m.send(ClusterDrained("E1"))
    assert of(m.effects, Persist)[0].mark == MARK, "every write keeps it"


def test_a_failed_restore_keeps_the_mark_and_a_restart_takes_it_off():
    """Issue 26 #8a: the failure was held only in memory; after a restart nothing retried."""
    m = machine(method=DrainMethod.STANDBY)
    over_after_drain(m)
    assert of(m.effects, RestoreNode) == [RestoreNode("E1", STANDBY)]
    m.send(ClusterRestored("E1", "crm_attribute: exit 102"))
    assert m.state.cluster_mark == STANDBY
    assert m.state.restore_error == "crm_attribute: exit 102"
    kept = m.state.events
    again = machine(loaded=engine.durable_events(kept), mark=STANDBY, method=DrainMethod.STANDBY)
    assert of(again.effects, RestoreNode) == [RestoreNode("", STANDBY)]
    again.send(ClusterRestored(""))
    assert again.state.cluster_mark is None
    assert of(again.effects, Persist)[0].mark is None


def test_a_reload_removing_pacemaker_still_takes_our_mark_off_at_the_event_end():
    """Issue 26 #8b: with `cluster.pacemaker` reloaded away, the mark is taken off the way
    it was set (the effect carries it), not forgotten."""
    m = machine()
    seen(m, due_in(600))
    (spawn,) = of(drained(m, "E1"), SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED))
    m.send(Reloaded(config(events=EVENTS)))
    assert not of(m.effects, RestoreNode), "its event still wants the node drained"
    seen(m, incarnation=3)  # gone before it started: cancelled
    assert restored_first(m).stage.value == "cancelled"


def test_a_reload_takes_off_a_mark_whose_restore_failed():
    m = machine()
    over_after_drain(m)
    m.send(ClusterRestored("E1", "crm_attribute: timed out"))
    m.send(Reloaded(config(events=EVENTS)))  # the old drainer's retries stop with it
    assert of(m.effects, RestoreNode) == [RestoreNode("", MARK)]


def test_the_cluster_is_checked_again_every_minute_and_logged_on_change():
    m = machine()
    m.send(ClusterChecked(("no quorum",)))
    assert m.state.cluster_problems == ("no quorum",)
    assert not of(m.tick(MONO0 + CLUSTER_CHECK - 0.1), CheckCluster)
    assert of(m.tick(MONO0 + CLUSTER_CHECK), CheckCluster)
    assert not of(m.tick(MONO0 + CLUSTER_CHECK + 1), CheckCluster), "one at a time"
    m.send(ClusterChecked(("no quorum",)))
    assert not logs(m.effects, "cluster_unready"), "unchanged: not logged again"
    m.send(ClusterChecked(()))
    assert logs(m.effects, "cluster_ready")
    assert m.state.cluster_problems == ()


def test_a_drained_event_from_a_state_file_older_than_marks_is_taken_as_our_mark():
    """Upgraded mid-drain: the old daemon set the mark, so the event's end takes it off."""
    loaded = {"E1": Tracked(due_in(600), Phase.APPROVED, boot_id="boot-1", drain=Drain.DONE)}
    m = machine(loaded=loaded, mark_unrecorded=True)
    assert m.state.cluster_mark == MARK
    seen(m, incarnation=3)  # over
    assert restored_first(m).stage.value == "after"


def test_with_slots_too_the_slot_comes_first_then_the_drain_then_the_hooks_and_approval():
    """Issue 27: `cluster` beside `coordination` lets a node take a concurrency slot and be
    drained. The engine does both in order: the slot, holding it the drain, then the hooks and
    the early approval; once over, the node is restored before the after-hooks, and the slot
    given back after them."""
    etcd = Coordination(etcd=Etcd(endpoints=("http://127.0.0.1:2379",)))
    m = machine(config={"coordination": etcd, "concurrency": Concurrency("web", 1)})
    seen(m, due_in(3 * 86400))
    (ask,) = of(m.effects, AcquireSlot)
    assert ask.event.event_id == "E1"
    assert not of(m.effects, DrainNode), "no drain before the slot"
    assert m.phase() is Phase.QUEUED
    m.send(SlotGranted("E1"), at=MONO0 + 1)
    (drain,) = of(m.effects, DrainNode)
    assert drain.event.event_id == "E1"
    assert not of(m.effects, SpawnHooks), "no hook before the cluster agrees"
    assert m.phase() is Phase.DRAINING
    (spawn,) = of(drained(m, "E1"), SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    assert of(m.effects, PostApproval), "slot held and node drained: approved early"
    m.send(ApprovalSent("E1"))
    seen(m, incarnation=3, at=MONO0 + 3)  # over
    after = restored_first(m)
    assert not of(m.effects, ReleaseSlot), "the slot is held through the after-hooks"
    m.send(HooksFinished(after.run, Outcome.SUCCEEDED), at=MONO0 + 4)
    assert of(m.effects, ReleaseSlot) == [ReleaseSlot("E1")]


def _over_holding_a_slot() -> Machine:
    """E1 drained holding a slot, prepared and approved, then over: its restore asked first."""
    etcd = Coordination(etcd=Etcd(endpoints=("http://127.0.0.1:2379",)))
    m = machine(config={"coordination": etcd, "concurrency": Concurrency("web", 1)})
    seen(m, due_in(3 * 86400))
    m.send(SlotGranted("E1"), at=MONO0 + 1)
    (spawn,) = of(drained(m, "E1"), SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    m.send(ApprovalSent("E1"))
    seen(m, incarnation=3, at=MONO0 + 3)  # over: the restore first
    return m


def test_with_a_slot_a_failed_restore_keeps_the_after_hooks_and_the_slot_until_one_works():
    """Restore, then release (issue 28): the after-hooks started on a failed restore's answer,
    their success ended the event and gave its slot back with the node still marked, so the
    next VM of the group drained its node meanwhile (two nodes out under `max: 1`; found by
    tests/system/test_slot_drain.py). Holding a slot, they wait for a restore that works."""
    m = _over_holding_a_slot()
    assert of(m.effects, RestoreNode) == [RestoreNode("E1", MARK)]
    m.send(ClusterRestored("E1", "crm_attribute: exit 102"), at=MONO0 + 4)
    assert logs(m.effects, "cluster_restore_failed")
    assert not of(m.effects, SpawnHooks), "no after-hooks while the node is still marked"
    m.send(ClusterRestored("E1", "crm_attribute: exit 102"), at=MONO0 + 6)  # the retry
    assert not of(m.effects, SpawnHooks)
    m.tick(MONO0 + 600)
    assert not of(m.effects, (SpawnHooks, ReleaseSlot)), "held while the node is marked"
    (after,) = of(m.send(ClusterRestored("E1"), at=MONO0 + 601), SpawnHooks)
    assert after.stage.value == "after"
    assert not of(m.effects, ReleaseSlot), "held through the after-hooks"
    m.send(HooksFinished(after.run, Outcome.SUCCEEDED), at=MONO0 + 602)
    assert of(m.effects, ReleaseSlot) == [ReleaseSlot("E1")]


def test_with_a_slot_a_restore_never_answered_is_asked_again_at_each_deadline_hooks_held():
    """Restore, then release, when no answer comes either: at each RESTORE_TIMEOUT the restore
    counts as failed and is asked again; the after-hooks wait for one that works."""
    m = _over_holding_a_slot()
    m.tick(MONO0 + 3)  # its deadline placed
    for deadline in (MONO0 + 3 + RESTORE_TIMEOUT, MONO0 + 3 + 2 * RESTORE_TIMEOUT):
        assert m.state.events["E1"].start_at == deadline
        m.tick(deadline)
        assert logs(m.effects, "cluster_restore_failed")
        assert of(m.effects, RestoreNode) == [RestoreNode("E1", MARK)], "asked again"
        assert not of(m.effects, (SpawnHooks, ReleaseSlot)), "held while the node is marked"
    (after,) = of(m.send(ClusterRestored("E1"), at=m.now + 1), SpawnHooks)
    assert after.stage.value == "after"


def test_a_stop_while_a_failed_restore_holds_the_slot_exits_at_once_and_leaves_it_held():
    """The after-hooks wait for a retry of the restore that works; the daemon's stop ends the
    retries, so it does not wait for them (shutdown_grace for nothing): it exits, its slot
    held for hold_max, and the restart asks for the restore again."""
    m = _over_holding_a_slot()
    m.send(ClusterRestored("E1", "crm_attribute: exit 102"), at=MONO0 + 4)
    m.send(StopRequested("SIGTERM"), at=MONO0 + 5)
    assert of(m.effects, Exit)
    assert [h.event_id for h in of(m.effects, HoldSlot)] == ["E1"]
    loaded = engine.durable_events(m.state.events)
    again = machine(
        loaded=loaded,
        mark=MARK,
        config={
            "coordination": m.state.config.coordination,
            "concurrency": m.state.config.concurrency,
        },
    )
    assert [r.mark for r in of(again.effects, RestoreNode)] == [MARK], "asked again"
    assert not of(again.effects, SpawnHooks), "the after-hooks wait for it"
    (after,) = of(again.send(ClusterRestored(""), at=again.now + 1), SpawnHooks)
    assert after.stage.value == "after", "then the after-hooks, the slot still held"
    assert not of(again.effects, ReleaseSlot)


def test_with_a_slot_and_no_after_hooks_the_slot_is_given_back_once_the_node_is_restored():
    """Restore, then release (issue 28), where the cluster is all the preparation: without
    after-hooks the event's end asked for the restore and was over in the same step, so its
    slot went with it and the next VM drained its node while this one's restore ran (found by
    tests/system/test_slot_drain.py). It now waits for the restore's answer, as hooks do."""
    etcd = Coordination(etcd=Etcd(endpoints=("http://127.0.0.1:2379",)))
    m = machine(
        config={"coordination": etcd, "concurrency": Concurrency("web", 1)},
        events={"Reboot": EventRule(("drain",))},
    )
    seen(m, due_in(3 * 86400))
    m.send(SlotGranted("E1"), at=MONO0 + 1)
    (spawn,) = of(drained(m, "E1"), SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    m.send(ApprovalSent("E1"))
    seen(m, incarnation=3, at=MONO0 + 3)  # over: the restore first
    assert of(m.effects, RestoreNode) == [RestoreNode("E1", MARK)]
    assert not of(m.effects, ReleaseSlot), "the slot is held until the node is back"
    m.send(ClusterRestored("E1"), at=MONO0 + 4)
    assert of(m.effects, ReleaseSlot) == [ReleaseSlot("E1")]
    assert not of(m.effects, SpawnHooks)


def test_a_mark_reported_after_a_reload_removed_pacemaker_is_kept_and_taken_off_at_the_end():
    """The drainer reports its mark just before its command runs; a SIGHUP removing
    coordination.pacemaker can be handled in between (the daemon stops the old drainer, too
    late for a command under way). The engine ignored a mark reported with no pacemaker
    configured: the node stayed marked, in no state file, never taken off. The report carries
    how the drainer set it, so it is kept, written, and taken off at the event's end."""
    m = machine(method=DrainMethod.STANDBY)
    seen(m, due_in(600))
    assert of(m.effects, DrainNode)
    m.send(Reloaded(config(events=EVENTS)))
    m.send(ClusterMarked("E1", ours=True, mark=STANDBY))
    assert m.state.cluster_mark == STANDBY
    assert of(m.effects, Persist)[0].mark == STANDBY, "in the state file"
    m.tick(m.now + 61)  # the drain's deadline: held, the hooks run
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED))
    assert not of(m.effects, PostApproval), "held: never approved early"
    seen(m, incarnation=3)  # over
    assert restored_first(m, mark=STANDBY).stage.value == "cancelled", "taken off as it was set"


# ---- the restore before the after-hooks: a declared coupling, its own effect (issue 27) -----


def test_the_restore_is_the_engines_effect_from_a_declared_coupling_not_a_part_of_a_hook_run():
    """The daemon restored the node because SpawnHooks carried the mark; now the engine asks
    for it (RestoreNode, from compose.COUPLINGS) and the run carries nothing of the cluster."""
    assert drain_gate._restore_first in compose.COUPLINGS
    assert "restore" not in {f.name for f in dataclasses.fields(SpawnHooks)}


def test_a_restore_never_answered_counts_as_failed_at_its_deadline():
    """The drainer's thread hangs: no ClusterRestored ever comes. Before, the after-hooks waited
    for ever; now at RESTORE_TIMEOUT the restore counts as failed, as on a failed answer: it is
    logged, asked again (the drainer tries it until it works), and the hooks start, once."""
    m = machine()
    seen(m, due_in(600))
    (spawn,) = of(drained(m, "E1"), SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED))
    m.send(ApprovalSent("E1"))
    seen(m, incarnation=3)  # over: the restore is asked for
    assert of(m.effects, RestoreNode) == [RestoreNode("E1", MARK)]
    asked_at = m.now
    assert engine.next_wakeup(m.state, m.now) == m.now, "its deadline is placed at once"
    m.tick(m.now)
    deadline = m.state.events["E1"].start_at
    assert deadline == asked_at + RESTORE_TIMEOUT
    assert restore_gate.due_for(m.state, "E1", m.state.events["E1"], m.now, m.now) == deadline
    assert not of(m.tick(deadline - 1), SpawnHooks)
    m.tick(deadline)
    (failed,) = logs(m.effects, "cluster_restore_failed")
    assert failed.fields["error"] == f"no answer in {RESTORE_TIMEOUT:g} s"
    assert of(m.effects, RestoreNode) == [RestoreNode("E1", MARK)], "asked again"
    (after,) = of(m.effects, SpawnHooks)
    assert after.stage.value == "after"
    assert (m.state.restore_error, m.state.cluster_mark) == (failed.fields["error"], MARK)
    m.send(ClusterRestored("E1"), at=deadline + 5)  # the retry works, at last
    assert not of(m.effects, SpawnHooks), "the after-hooks run once"
    assert (m.state.cluster_mark, m.state.restore_error) == (None, "")


def test_a_failed_restore_still_starts_the_after_hooks_once_and_the_retry_ends_the_mark():
    """As before: the after-hooks run after the first try, whatever it said; the drainer's
    retry that works later takes the mark off and starts nothing again."""
    m = machine()
    seen(m, due_in(600))
    (spawn,) = of(drained(m, "E1"), SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED))
    m.send(ApprovalSent("E1"))
    seen(m, incarnation=3)  # over
    assert of(m.effects, RestoreNode) == [RestoreNode("E1", MARK)]
    assert m.phase() is Phase.AFTER
    (after,) = of(m.send(ClusterRestored("E1", "crm_attribute: timed out")), SpawnHooks)
    assert logs(m.effects, "cluster_restore_failed")
    # No longer waited for: the state file says its hooks started (a restart cuts them off).
    assert (after.stage.value, m.state.events["E1"].drain) == ("after", Drain.NONE)
    m.send(ClusterRestored("E1"))
    assert not of(m.effects, SpawnHooks), "the after-hooks run once"
    assert (m.state.cluster_mark, m.state.events["E1"].drain) == (None, Drain.NONE)
    m.send(HooksFinished(after.run, Outcome.SUCCEEDED))
    assert "E1" not in m.state.events, "over, and no longer listed: forgotten"


def test_a_stop_while_the_restore_is_answered_waits_for_the_after_hooks_as_for_a_run():
    m = machine()
    seen(m, due_in(30, event_type="Reboot"))
    drained(m, "E1")
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED))
    m.send(ApprovalSent("E1"))
    seen(m, incarnation=3)  # over: restore, then its after-hooks
    m.send(StopRequested("SIGTERM"))
    assert not of(m.effects, Exit), "the after-stage is not over yet"
    (after,) = of(m.send(ClusterRestored("E1")), SpawnHooks)
    assert after.stage.value == "after"
    m.send(HooksFinished(after.run, Outcome.SUCCEEDED))
    assert of(m.effects, Exit)


def _over_waiting_for_the_restore():
    m = machine()
    seen(m, due_in(30, event_type="Reboot"))
    (spawn,) = of(drained(m, "E1"), SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED))
    m.send(ApprovalSent("E1"))
    seen(m, incarnation=3)  # over
    assert of(m.effects, RestoreNode) == [RestoreNode("E1", MARK)]
    return m


def test_after_hooks_that_waited_for_the_restore_when_the_daemon_was_killed_run_after_it():
    """They never started: the restarted daemon asks for the restore again, then runs them
    (before, they were logged as cut off, after_hooks_interrupted, and never ran)."""
    m = _over_waiting_for_the_restore()
    again = machine(loaded=engine.durable_events(m.state.events), mark=MARK)
    assert RestoreNode("E1", MARK) in of(again.effects, RestoreNode)
    assert not logs(again.effects, "after_hooks_interrupted")
    assert not of(again.effects, SpawnHooks), "the node first"
    (after,) = of(again.send(ClusterRestored("E1")), SpawnHooks)
    assert after.stage.value == "after"


def test_after_hooks_that_waited_for_the_restore_through_a_whole_stop_run_after_the_restart():
    """The stop waits its grace for the restore's answer, which does not come: nothing is
    logged as cut off (no hook ran), and the restarted daemon restores the node, then runs them."""
    m = _over_waiting_for_the_restore()
    m.send(StopRequested("SIGTERM"))
    m.tick(m.now + m.state.config.shutdown_grace)
    assert not logs(m.effects, "hooks_cancelled")
    assert of(m.tick(m.now + engine.KILL_WAIT), Exit)
    assert not logs(m.effects, "after_hooks_interrupted")
    (saved,) = of(m.effects, Persist)
    again = machine(loaded=saved.events, mark=saved.mark)
    assert not logs(again.effects, "after_hooks_interrupted")
    (after,) = of(again.send(ClusterRestored("E1")), SpawnHooks)
    assert after.stage.value == "after"


def test_a_waiting_after_stage_whose_mark_is_gone_starts_its_hooks_without_a_restore():
    """The coupling never leaves the hooks waiting for an answer that will not come."""
    m = machine()
    t = Tracked(due_in(600), Phase.AFTER, stage=engine.Stage.AFTER, drain=Drain.DONE)
    state = dataclasses.replace(m.state, events={"E1": t}, cluster_mark=None)
    out: list = []
    state = drain_gate._restore_first(state, out)
    (after,) = of(out, SpawnHooks)
    assert (after.hooks, after.stage.value) == (("undrain",), "after")
    assert not of(out, RestoreNode)
    assert (state.events["E1"].drain, state.events["E1"].run) == (Drain.NONE, after.run)


def test_a_restoring_after_stage_run_again_while_another_event_keeps_the_mark_gives_it_up():
    """Found by GatedPromises (Python 3.9 run): after-hooks held by a slot run again after a
    restart (issue 28) while their restore was being answered (restoring) and another event
    drains the node. The drain table had no move from restoring for "another event keeps the
    mark": the step raised. Now the stage drops its claim; the other event restores at its end."""
    m = machine()
    first = Tracked(due_in(600), Phase.AFTER, stage=engine.Stage.AFTER, drain=Drain.RESTORING)
    other = Tracked(due_in(900), Phase.DRAINING, drain=Drain.ASKED)
    state = dataclasses.replace(m.state, events={"E1": first, "E2": other})
    out: list = []
    state, tracked = stages._start_stage(state, first, engine.On.RESTARTED, engine.Stage.AFTER, out)
    assert tracked.drain is Drain.NONE
    assert not of(out, RestoreNode), "the other event keeps the node marked"


def test_a_drained_event_left_alone_after_its_rule_went_gives_the_mark_up_at_once():
    """Review of issue 27: the node drained for an event whose before-hooks a stop cut off, the
    daemon started again without a rule for its type: the next document left it alone
    (unhandled), a phase with no after-stage, so its mark was never restored, not even once it
    left the document; the node stayed out of its cluster until some later restart or reload.
    Now the mark is given up as soon as it is left alone (the coupling
    drain._release_left_alone), unless another event keeps it."""
    no_reboot = {k: v for k, v in EVENTS.items() if k != "Reboot"}
    kept = {"E1": Tracked(due_in(600), Phase.RUNNING, boot_id="boot-1", drain=Drain.DONE)}
    m = machine(loaded=kept, mark=MARK, events=no_reboot)
    assert not of(m.effects, RestoreNode), "interrupted: it still wanted the drain at boot"
    seen(m, due_in(600), at=MONO0 + 1)
    assert m.phase() is Phase.UNHANDLED
    assert of(m.effects, RestoreNode) == [RestoreNode("", MARK)]
    assert m.state.events["E1"].drain is Drain.NONE
    m.send(ClusterRestored(""))
    assert m.state.cluster_mark is None
    seen(m, incarnation=3, at=MONO0 + 2)
    assert "E1" not in m.state.events
    freeze = due_in(900, "E2", "Freeze")
    also = {**kept, "E2": Tracked(freeze, Phase.APPROVED, boot_id="boot-1", drain=Drain.DONE)}
    two = machine(loaded=also, mark=MARK, events=no_reboot)
    seen(two, due_in(600), freeze, at=MONO0 + 1)
    assert two.phase() is Phase.UNHANDLED
    assert not of(two.effects, RestoreNode), "E2 keeps the node drained"
    assert two.state.cluster_mark == MARK


def test_a_restore_error_is_cleared_once_a_new_drain_wants_the_mark_and_restored_at_its_end():
    """Review of issue 27: the drainer stops trying a failed restore when a new drain wants the
    node marked (the retry took the mark off under it); `status` said the restore was 'tried
    again' for as long as that drain lasted. The new event's end restores the node."""
    m = machine()
    seen(m, due_in(600))
    (spawn,) = of(drained(m, "E1"), SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED))
    m.send(ApprovalSent("E1"))
    seen(m, incarnation=3)  # over: its restore fails, its after-hooks run
    (after,) = of(m.send(ClusterRestored("E1", "crm_attribute: exit 102")), SpawnHooks)
    assert m.state.restore_error == "crm_attribute: exit 102"
    m.send(HooksFinished(after.run, Outcome.SUCCEEDED))
    seen(m, due_in(900, "E2"), incarnation=4, at=MONO0 + 10)
    assert of(m.effects, DrainNode)[0].ours, "the mark found set is ours"
    assert (m.state.restore_error, m.state.cluster_mark) == ("", MARK)
    (spawn,) = of(m.send(ClusterDrained("E2")), SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED))
    m.send(ApprovalSent("E2"))
    seen(m, incarnation=5, at=MONO0 + 20)
    assert of(m.effects, RestoreNode) == [RestoreNode("E2", MARK)]


def test_a_reload_that_removes_the_type_of_an_event_draining_leaves_it_alone_and_restores():
    """Review of issue 27: a reload took the Reboot rule away while its node drained; once
    drained, its before-hooks were looked up under the default rule (none) and it was approved
    early at once, though a waiting or queued event of a removed type is left alone. Now it is
    left alone too (unhandled), its drain stopped and its mark taken off."""
    no_reboot = {k: v for k, v in EVENTS.items() if k != "Reboot"}
    m = machine()
    seen(m, due_in(600))
    m.send(ClusterMarked("E1", ours=True))
    assert m.phase() is Phase.DRAINING
    m.send(Reloaded(dataclasses.replace(m.state.config, events=no_reboot)))
    assert m.phase() is Phase.UNHANDLED
    assert logs(m.effects, "event_unhandled")
    assert StopDraining("E1") in of(m.effects, StopDraining)
    assert of(m.effects, RestoreNode) == [RestoreNode("", MARK)]
    m.send(ClusterDrained("E1"))
    assert not of(m.effects, PostApproval), "never approved early without its hooks"
    assert not of(m.effects, SpawnHooks)
    m.send(ClusterRestored(""))
    assert m.state.cluster_mark is None
    kept = {"E1": Tracked(due_in(600), Phase.DRAINING, boot_id="boot-1", drain=Drain.ASKED)}
    again = machine(loaded=kept, mark=MARK, events=no_reboot)
    assert again.phase() is Phase.UNHANDLED, "a restart without the rule: the same"
    assert not of(again.effects, DrainNode)
    assert of(again.effects, RestoreNode) == [RestoreNode("", MARK)]
