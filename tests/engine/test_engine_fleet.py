"""Shared events in the pure engine, with a fake clock: approve once every VM named is ready,
never when one failed or coordination is down, never rush a VM that runs no daemon."""

from __future__ import annotations

import dataclasses

from scheduledeventsd import engine
from scheduledeventsd.config import (
    ApprovePolicy,
    Concurrency,
    Coordination,
    Etcd,
    EventRule,
    Gate,
    HealthFrom,
    HookCommand,
    Limit,
)
from scheduledeventsd.engine import (
    AcquireSlot,
    ApprovalFailed,
    ApprovalSent,
    AskGate,
    CancelRuns,
    Coordinate,
    CoordinationFailed,
    Fetch,
    GateAnswered,
    HooksFinished,
    Outcome,
    PeersChanged,
    Persist,
    Phase,
    PostApproval,
    ReleaseSlot,
    Reloaded,
    SlotBusy,
    SlotFailed,
    SlotGranted,
    SlotKept,
    SpawnHooks,
    StopCoordinating,
    Tracked,
    status_text,
)
from scheduledeventsd.engine.lifecycle import Slot
from scheduledeventsd.observe.metrics import Metrics
from scheduledeventsd.observe.observer import Observer
from scheduledeventsd.observe.report import status
from tests.engine.test_engine import VM, Machine, config, doc, event, logs, of
from tests.engine.test_engine_when import EVENTS, MONO0, WALL0, due_in, seen
from tests.engine.test_engine_when import machine as when_machine

ETCD = Coordination(etcd=Etcd(endpoints=("http://127.0.0.1:2379",)))
GATE = Coordination(gate=Gate(HookCommand(("/usr/local/sbin/gate",), 60.0), interval=10.0))
SHARED = (VM, "VM-B", "vm-c")  # Azure names are case-insensitive; keys are lower case


def fleet(coordination=ETCD, **overrides):
    return config(**{"approve": ApprovePolicy.ALL, "coordination": coordination, **overrides})


def prepared(machine, resources=SHARED, at=101.0):
    """The shared Reboot seen, its before-hooks run and succeeded; returns those effects."""
    machine.fetched(doc(event(resources=resources)), at=at)
    (spawn,) = of(machine.effects, SpawnHooks)
    return machine.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=at + 1)


def test_a_shared_event_is_not_approved_when_its_hooks_succeed_but_coordinated():
    m = Machine(fleet())
    effects = prepared(m)
    assert m.phase() is Phase.COORDINATING
    assert not of(effects, PostApproval)
    (coordinate,) = of(effects, Coordinate)
    assert coordinate.ready
    assert coordinate.vm_name == VM
    (note,) = logs(effects, "event_coordinating")
    assert note.fields["via"] == "etcd"
    assert note.fields["other_resources"] == "VM-B vm-c"


def test_coordinating_is_written_ahead_so_a_restart_asks_again():
    m = Machine(fleet())
    effects = prepared(m)
    (persist,) = of(effects, Persist)
    assert persist.events["E1"].phase is Phase.COORDINATING
    restarted = Machine(fleet(), loaded=persist.events)
    (coordinate,) = of(restarted.effects, Coordinate)
    assert coordinate.event.event_id == "E1"
    assert coordinate.ready


def test_approved_only_once_every_named_vm_is_ready_whatever_the_case():
    m = Machine(fleet())
    prepared(m)
    effects = m.send(PeersChanged("E1", {"vm-a": "ready", "vm-b": "ready"}), at=103)
    assert not of(effects, PostApproval)
    (waiting,) = logs(effects, "peers_waiting")
    assert waiting.fields["waiting_for"] == "vm-c"
    assert m.phase() is Phase.COORDINATING
    effects = m.send(PeersChanged("E1", {"vm-a": "ready", "vm-b": "ready", "vm-c": "ready"}))
    assert m.phase() is Phase.APPROVING
    assert [p.event.event_id for p in of(effects, PostApproval)] == ["E1"]
    assert of(effects, StopCoordinating) == [StopCoordinating(("E1",))]


def test_a_ready_from_a_vm_the_event_does_not_name_counts_for_nothing():
    m = Machine(fleet())
    prepared(m)
    states = {"vm-a": "ready", "vm-b": "ready", "vm-x": "ready", "vm-c": "preparing"}
    effects = m.send(PeersChanged("E1", states), at=103)
    assert not of(effects, PostApproval)
    assert m.phase() is Phase.COORDINATING


def test_one_failed_vm_means_nobody_approves():
    m = Machine(fleet())
    prepared(m)
    effects = m.send(PeersChanged("E1", {"vm-a": "ready", "vm-b": "failed"}), at=103)
    assert m.phase() is Phase.NOT_APPROVED
    (note,) = logs(effects, "event_not_approved")
    assert note.fields["failed"] == "vm-b"
    effects = m.send(PeersChanged("E1", {"vm-a": "ready", "vm-b": "ready", "vm-c": "ready"}))
    assert not of(effects, PostApproval), "a decision is not taken back"


def test_our_own_failed_hooks_are_announced_and_never_approved():
    m = Machine(fleet())
    m.fetched(doc(event(resources=SHARED)), at=101)
    (spawn,) = of(m.effects, SpawnHooks)
    effects = m.send(HooksFinished(spawn.run, Outcome.FAILED), at=102)
    assert m.phase() is Phase.HOOKS_FAILED
    (coordinate,) = of(effects, Coordinate)
    assert not coordinate.ready
    m.send(PeersChanged("E1", {VM: "failed"}), at=103)
    effects = m.tick(200)
    assert not of(effects, Coordinate), "a failed event is announced, not watched"


def test_a_failed_announcement_is_written_again_until_the_keys_come_back():
    """etcd down when our hooks failed: the others would wait for NotBefore without knowing."""
    m = Machine(fleet())
    m.fetched(doc(event(resources=SHARED)), at=101)
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.FAILED), at=102)
    m.send(CoordinationFailed("E1", "unreachable", "connection refused"), at=102.1)
    assert not of(m.effects, Coordinate), "not at once: after the backoff"
    retry_at = m.wake()
    (again,) = of(m.tick(retry_at), Coordinate)
    assert not again.ready
    m.send(PeersChanged("E1", {VM: "failed", "vm-b": "ready"}), at=retry_at + 0.1)
    assert m.phase() is Phase.HOOKS_FAILED
    assert "E1" not in m.state.peers, "announced: nothing more to write"
    assert not of(m.tick(retry_at + 60), Coordinate)


def test_a_failed_announcement_stops_when_its_event_leaves():
    m = Machine(fleet())
    m.fetched(doc(event(resources=SHARED)), at=101)
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.FAILED), at=102)
    effects = m.fetched(doc(incarnation=3), at=103)
    assert of(effects, StopCoordinating)[0].event_ids == ("E1",)
    assert not m.state.peers


def test_an_event_naming_only_this_vm_is_approved_as_with_sole():
    m = Machine(fleet())
    effects = prepared(m, resources=(VM,))
    assert m.phase() is Phase.APPROVING
    assert of(effects, PostApproval)
    assert not of(effects, Coordinate)


def test_coordination_down_is_never_a_reason_to_approve_and_is_retried_with_backoff():
    m = Machine(fleet())
    prepared(m)  # at 102: Coordinate
    effects = m.send(CoordinationFailed("E1", "unreachable", "connection refused"), at=102.1)
    (failed,) = logs(effects, "coordination_failed")
    assert failed.fields["kind"] == "unreachable"
    assert failed.fields["retry_in_s"] == 0.5
    assert not of(effects, PostApproval)
    assert m.phase() is Phase.COORDINATING
    assert "COORDINATION FAILING: unreachable" in engine_status(m)
    assert m.wake() == 102.6
    assert of(m.tick(102.6), Coordinate)
    effects = m.send(CoordinationFailed("E1", "unreachable", "connection refused"), at=102.7)
    assert not logs(effects, "coordination_failed"), "logged on change, not every time"
    assert m.wake() == 103.7  # doubled
    for _ in range(10):
        m.tick(m.wake())
        m.send(CoordinationFailed("E1", "unreachable", "connection refused"))
    assert m.wake() - m.now == 10.0  # capped
    m.tick(m.wake())
    effects = m.send(PeersChanged("E1", {"vm-a": "ready"}))
    assert logs(effects, "coordination_recovered")
    assert "COORDINATION" not in engine_status(m)


def test_an_event_that_starts_while_coordinating_stops_the_watch():
    m = Machine(fleet())
    prepared(m)
    effects = m.fetched(doc(event(status="Started", resources=SHARED), incarnation=3), at=110)
    assert m.phase() is Phase.DONE
    assert of(effects, StopCoordinating) == [StopCoordinating(("E1",))]
    assert not of(effects, PostApproval)


def test_an_event_that_leaves_while_coordinating_is_cancelled_and_its_watch_stopped():
    cfg = fleet(events={"Reboot": EventRule(("drain",), ("undrain",), ("undrain",))})
    m = Machine(cfg)
    prepared(m)
    effects = m.fetched(doc(incarnation=3), at=110)
    assert of(effects, StopCoordinating) == [StopCoordinating(("E1",))]
    (spawn,) = of(effects, SpawnHooks)
    assert spawn.stage == "cancelled"
    assert spawn.hooks == ("undrain",)


def test_a_result_for_an_event_no_longer_coordinating_is_ignored():
    m = Machine(fleet())
    prepared(m)
    m.fetched(doc(incarnation=3), at=110)
    effects = m.send(PeersChanged("E1", {n.casefold(): "ready" for n in SHARED}))
    assert not of(effects, PostApproval)


def test_gate_75_asks_again_after_interval_then_0_approves():
    m = Machine(fleet(GATE))
    effects = prepared(m)
    (ask,) = of(effects, AskGate)
    assert m.state.runs[ask.run] == "E1"
    effects = m.send(GateAnswered(ask.run, 75), at=103)
    assert logs(effects, "gate_not_yet")
    assert not of(effects, PostApproval)
    assert m.wake() == 113
    assert not of(m.tick(112.9), AskGate)
    (again,) = of(m.tick(113), AskGate)
    effects = m.send(GateAnswered(again.run, 0), at=114)
    assert m.phase() is Phase.APPROVING
    assert of(effects, PostApproval)
    assert again.run not in m.state.runs


def test_gate_other_exit_never_approves():
    m = Machine(fleet(GATE))
    (ask,) = of(prepared(m), AskGate)
    effects = m.send(GateAnswered(ask.run, 1), at=103)
    assert m.phase() is Phase.NOT_APPROVED
    assert logs(effects, "event_not_approved")
    assert not of(m.tick(500), AskGate)


def test_gate_timing_out_is_a_coordination_failure_retried_with_backoff():
    m = Machine(fleet(GATE))
    (ask,) = of(prepared(m), AskGate)
    effects = m.send(GateAnswered(ask.run, None, timed_out=True), at=165)
    (failed,) = logs(effects, "coordination_failed")
    assert failed.fields["kind"] == "gate_timeout"
    assert m.phase() is Phase.COORDINATING
    assert not of(effects, PostApproval)
    assert of(m.tick(m.wake()), AskGate)


def test_the_gate_is_stopped_when_its_event_starts():
    m = Machine(fleet(GATE))
    (ask,) = of(prepared(m), AskGate)
    effects = m.fetched(doc(event(status="Started", resources=SHARED), incarnation=3), at=110)
    assert of(effects, CancelRuns) == [CancelRuns((ask.run,))]
    assert ask.run not in m.state.runs
    effects = m.send(GateAnswered(ask.run, 0, cancelled=True), at=111)
    assert not of(effects, PostApproval)


def test_a_vm_that_never_writes_ready_is_never_rushed():
    """No approval however long we wait; the event proceeds at NotBefore (it starts)."""
    m = Machine(fleet())
    prepared(m)
    m.send(PeersChanged("E1", {"vm-a": "ready", "vm-b": "ready"}), at=103)
    for t in range(104, 1000, 37):
        assert not of(m.tick(t), PostApproval)
    m.fetched(doc(event(status="Started", resources=SHARED), incarnation=3))
    assert m.phase() is Phase.DONE


def test_a_per_type_all_policy_coordinates_only_that_type():
    cfg = fleet(
        approve=ApprovePolicy.SOLE,
        events={
            "Reboot": EventRule(("drain",), approve=ApprovePolicy.ALL),
            "Freeze": EventRule(("drain",)),
        },
    )
    m = Machine(cfg)
    m.fetched(doc(event(resources=SHARED), event("E2", "Freeze", resources=SHARED)), at=101)
    for spawn in of(m.effects, SpawnHooks):
        m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED))
    assert m.phase("E1") is Phase.COORDINATING
    assert m.phase("E2") is Phase.NOT_APPROVED


def test_a_reload_that_changes_coordination_asks_again_through_the_new_one():
    m = Machine(fleet())
    prepared(m)
    effects = m.send(Reloaded(fleet(GATE)), at=105)
    assert of(effects, StopCoordinating) == [StopCoordinating(("E1",))]
    assert of(effects, AskGate)


def test_a_restart_keeps_a_shared_event_waiting_not_approved():
    loaded = {"E1": Tracked(event(resources=SHARED), Phase.COORDINATING, boot_id="boot-1")}
    m = Machine(fleet(), loaded=loaded)
    assert not of(m.effects, PostApproval)
    m.fetched(doc(event(resources=SHARED)), at=101)
    assert m.phase() is Phase.COORDINATING


def engine_status(m):
    return status_text(m.state)


# ---- concurrency slots: a slot counts only while etcd confirms it ----------------------------

TTL = 5
SLOTS = Concurrency("web", 1, TTL)


def holding(at=MONO0 + 1, confirmed=None, **overrides):
    """A Reboot of ours with long notice, its slot granted at `at` (lease confirmed as sent
    at `confirmed`): its before-hooks run. Returns the machine and the hooks' run."""
    m = when_machine(concurrency=SLOTS, coordination=ETCD, **overrides)
    seen(m, due_in(3 * 86400))
    assert m.phase() is Phase.QUEUED
    m.send(SlotGranted("E1", at if confirmed is None else confirmed), at=at)
    (spawn,) = of(m.effects, SpawnHooks)
    return m, spawn


def test_a_slot_etcd_has_not_confirmed_for_its_ttl_is_lost_and_not_approved_early():
    """Issue 26 #3: counted from the last acknowledged keep-alive (when it was sent), not from
    when its answer or a failure arrived: the hooks go on, no early approval."""
    m, spawn = holding(at=MONO0 + 1.5, confirmed=MONO0 + 1)
    m.send(SlotKept("E1", MONO0 + 2.5), at=MONO0 + 4)  # acknowledged late: sent at 2.5
    m.send(SlotFailed("E1", "timeout", "keep-alive timed out"), at=MONO0 + 6)
    assert m.wake() == MONO0 + 2.5 + TTL, "a timer is placed at the loss"
    assert not logs(m.tick(MONO0 + 2.5 + TTL - 0.01), "slot_lost")
    effects = m.tick(MONO0 + 2.5 + TTL)
    assert logs(effects)[:2] == ["slot_lost", "slot_unavailable"]
    assert of(effects, ReleaseSlot) == [ReleaseSlot("E1")]
    assert not of(effects, CancelRuns), "its hooks go on"
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 9)
    assert not of(m.effects, PostApproval)
    assert m.phase() is Phase.NOT_APPROVED
    (refused,) = logs(m.effects, "event_not_approved")
    assert refused.fields["cause"] == "slot_unavailable"
    m.send(SlotGranted("E1", MONO0 + 9.5), at=MONO0 + 10)  # the partition healed: too late
    assert of(m.effects, ReleaseSlot) == [ReleaseSlot("E1")]
    assert not of(m.effects, PostApproval)


def test_keep_alives_acknowledged_in_time_keep_the_slot_and_it_is_approved_early():
    m, spawn = holding()
    for k in range(1, 7):  # every third of the ttl, for 10 s: twice the ttl
        m.send(SlotKept("E1", MONO0 + 1 + k * TTL / 3), at=MONO0 + 1.01 + k * TTL / 3)
        assert not logs(m.effects, "slot_lost")
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 11.1)
    assert of(m.effects, PostApproval)


def test_a_slot_lost_while_its_approval_waits_for_a_retry_is_not_approved():
    m, spawn = holding()
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    assert of(m.effects, PostApproval)
    m.send(ApprovalFailed("E1", "http", "HTTP 500"), at=MONO0 + 2.1)
    m.tick(MONO0 + 1 + TTL)
    assert logs(m.effects, "slot_lost")
    assert m.phase() is Phase.NOT_APPROVED
    assert logs(m.effects, "event_not_approved")[0].fields["cause"] == "slot_unavailable"
    assert not of(m.tick(MONO0 + 60), PostApproval), "never retried"


def test_an_approval_under_way_when_the_slot_is_lost_is_judged_when_it_ends():
    """The POST went out while the slot was ours: accepted, the event is approved and keeps
    asking for its slot (it guards the undrain); refused, it is not retried."""
    m, spawn = holding()
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    assert of(m.effects, PostApproval)
    assert not logs(m.tick(MONO0 + 1 + TTL), "slot_lost"), "in flight: judged at its answer"
    m.send(ApprovalSent("E1"), at=MONO0 + 6.5)
    assert m.phase() is Phase.APPROVED
    assert not logs(m.tick(MONO0 + 20), "slot_lost"), "approved: nothing left to refuse"
    assert not of(m.effects, ReleaseSlot), "held until the event is over"


def test_a_lease_that_ends_while_the_approval_is_on_its_way_wakes_nobody_until_its_answer():
    """Review of issue 27: the slot gate's due() kept the lease's end due while `fire` waited
    for the approval's answer: next_wakeup was `now` after every step, a daemon woken at once
    for as long as the POST took (its timeouts: seconds of a core)."""
    m, spawn = holding()
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    assert of(m.effects, PostApproval)
    m.tick(MONO0 + 1 + TTL + 0.5)
    assert not logs(m.effects, "slot_lost")
    assert m.wake() > m.now, "not woken at once while the answer is awaited"
    m.send(ApprovalFailed("E1", "http", "HTTP 500"), at=MONO0 + 7)
    assert logs(m.effects, "slot_lost"), "judged at its answer"
    assert m.phase() is Phase.NOT_APPROVED


def test_after_a_restart_a_held_slot_is_confirmed_before_an_approval_and_lost_after_its_ttl():
    m, spawn = holding()
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    m.send(ApprovalFailed("E1", "timeout", "IMDS"), at=MONO0 + 2.1)
    assert m.phase() is Phase.APPROVING
    loaded = {"E1": m.state.events["E1"]}
    again = Machine(m.state.config, loaded=loaded, now=MONO0 + 30)
    assert of(again.effects, AcquireSlot)
    assert not of(again.effects, PostApproval), "not at start: the slot may be another VM's"
    seen(again, due_in(3 * 86400), at=MONO0 + 30.2)
    assert not of(again.effects, PostApproval), "not before etcd says the slot is still ours"
    assert of(again.effects, Fetch), "polling goes on meanwhile"
    again.send(SlotGranted("E1", MONO0 + 31), at=MONO0 + 31.1)
    assert of(again.effects, PostApproval), "taken back: approved"
    lost = Machine(m.state.config, loaded=loaded, now=MONO0 + 30)
    lost.tick(MONO0 + 30 + TTL)
    assert logs(lost.effects, "slot_lost")
    assert lost.phase() is Phase.NOT_APPROVED
    assert not of(lost.effects, PostApproval)


def test_a_reload_that_changes_concurrency_asks_again_for_held_and_queued_slots():
    """Issue 26, suspected: the new keeper is asked for every slot (held ones are taken
    back under its renewed lease); without concurrency any more, held ones are given back."""
    m, _ = holding()
    seen(m, due_in(3 * 86400), due_in(3 * 86400, "E2"), incarnation=3, at=MONO0 + 2)
    assert m.state.events["E2"].slot.value == "asked"
    cfg = m.state.config
    m.send(Reloaded(dataclasses.replace(cfg, concurrency=Concurrency("web", 2, TTL))), at=MONO0 + 3)
    assert {a.event.event_id for a in of(m.effects, AcquireSlot)} == {"E1", "E2"}
    m.send(Reloaded(dataclasses.replace(cfg, concurrency=Concurrency("web", 2, TTL))), at=MONO0 + 3)
    assert not of(m.effects, AcquireSlot), "the same settings: the same keeper, nothing asked"
    m.send(Reloaded(dataclasses.replace(cfg, concurrency=None)), at=MONO0 + 4)
    assert of(m.effects, ReleaseSlot) == [ReleaseSlot("E1")]
    assert m.state.events["E1"].slot.value == ""


def test_a_slot_asked_again_by_a_reload_is_not_approved_early_until_etcd_answers():
    """A reload that changes `concurrency` asks the new keeper for a held slot again; it may
    find that slot is no slot any more (`max` lowered). Until the keeper answers, the slot is
    unconfirmed: before-hooks that end meanwhile are not approved early (the suite's real-etcd
    test saw both VMs approved at once when the answer came after the hooks' end); granted
    again, the approval goes; told busy, none."""
    for answer in ("granted", "busy"):
        m, spawn = holding()
        cfg = m.state.config
        m.send(
            Reloaded(dataclasses.replace(cfg, concurrency=Concurrency("web", 2, TTL))), at=MONO0 + 2
        )
        assert [a.event.event_id for a in of(m.effects, AcquireSlot)] == ["E1"]
        m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2.5)
        assert not of(m.effects, PostApproval), "unconfirmed since the reload: not yet"
        if answer == "granted":
            m.send(SlotGranted("E1", MONO0 + 2.6), at=MONO0 + 2.7)
            assert of(m.effects, PostApproval), "taken back: approved early"
        else:
            m.send(SlotBusy("E1", ("vm-b",)), at=MONO0 + 2.7)
            assert not of(m.effects, PostApproval)
            assert not of(m.tick(MONO0 + 60), PostApproval)
            assert m.phase() is Phase.NOT_APPROVED


def test_a_decided_event_whose_slot_etcd_says_went_elsewhere_is_never_approved():
    """After a restart in `approving` (a kill -9 between the decision and the POST), etcd says
    the slot is another VM's (or that its lease expired): the approval is not sent, ever."""
    m, spawn = holding()
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    m.send(ApprovalFailed("E1", "timeout", "IMDS"), at=MONO0 + 2.1)
    loaded = {"E1": m.state.events["E1"]}
    for holders in (("vm-b",), ("(lease expired)",)):
        again = Machine(m.state.config, loaded=loaded, now=MONO0 + 30)
        again.send(SlotBusy("E1", holders), at=MONO0 + 30.5)
        assert logs(again.effects, "slot_unavailable")
        assert again.phase() is Phase.NOT_APPROVED
        assert logs(again.effects, "event_not_approved")[0].fields["cause"] == "slot_unavailable"
        assert not of(again.tick(MONO0 + 90), PostApproval)


def test_a_shared_event_whose_slot_is_lost_while_coordinating_takes_its_ready_back():
    """Its `ready` is in etcd: left there, the other VMs would approve the shared event (for
    this VM too) once all are ready. `failed` is written instead: nobody approves early."""
    m = Machine(fleet(concurrency=SLOTS), now=MONO0)
    seen(m, dataclasses.replace(due_in(3 * 86400), resources=SHARED))
    m.send(SlotGranted("E1", MONO0), at=MONO0)
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 1)
    assert m.phase() is Phase.COORDINATING
    m.tick(MONO0 + TTL)
    assert logs(m.effects, "slot_lost")
    assert m.phase() is Phase.NOT_APPROVED
    assert of(m.effects, StopCoordinating)
    (retract,) = of(m.effects, Coordinate)
    assert not retract.ready
    m.send(PeersChanged("E1", dict.fromkeys(("vm-a", "vm-b", "vm-c"), "ready")), at=MONO0 + 6)
    assert not of(m.effects, PostApproval)


def test_two_events_of_the_vm_holding_its_one_slot_show_as_one_slot_held():
    """Issue 26 #6: a VM holds one slot, whatever the number of its events sharing it."""
    m, _ = holding()
    seen(m, due_in(3 * 86400), due_in(3 * 86400, "E2"), incarnation=3, at=MONO0 + 2)
    before = m.state
    m.send(SlotGranted("E2", MONO0 + 2), at=MONO0 + 2)
    assert [t.slot.value for t in m.state.events.values()] == ["held", "held"]
    metrics = Metrics(m.state.config)
    metrics.observe(before, SlotGranted("E2", MONO0 + 2), m.state, MONO0 + 2)
    assert metrics.registry.get_sample_value("scheduledeventsd_slot_held") == 1


def test_an_approval_is_sent_only_while_the_slot_is_confirmed_for_a_margin_more():
    """The POST must reach IMDS before the lease can expire: with less than SLOT_MARGIN left
    it waits for the next keep-alive (then goes), or for the loss (then never)."""
    m, spawn = holding(at=MONO0 + 1)  # the slot is ours until MONO0 + 1 + TTL
    late = MONO0 + 1 + TTL - engine.SLOT_MARGIN / 2
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=late)
    assert m.phase() is Phase.APPROVING
    assert not of(m.effects, PostApproval)
    m.send(SlotKept("E1", late), at=late + 0.01)
    assert of(m.effects, PostApproval), "confirmed again: sent"
    other, spawn = holding(at=MONO0 + 1)
    other.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=late)
    other.tick(MONO0 + 1 + TTL)
    assert other.phase() is Phase.NOT_APPROVED
    assert not of(other.effects, PostApproval)


def test_an_event_that_ends_while_another_of_the_vm_holds_the_slot_says_it_is_kept():
    """Issue 26 #6 in the record: the slot stays the VM's for the other event (kept_for)."""
    m, _ = holding()
    seen(m, due_in(3 * 86400), due_in(3 * 86400, "E2"), incarnation=3, at=MONO0 + 2)
    (spawn,) = of(m.send(SlotGranted("E2", MONO0 + 2), at=MONO0 + 2), SpawnHooks)
    seen(m, due_in(3 * 86400), incarnation=4, at=MONO0 + 3)  # E2 withdrawn: its hooks stop
    m.send(HooksFinished(spawn.run, Outcome.CANCELLED), at=MONO0 + 4)
    ended = [r for r in logs(m.effects, "slot_released") if r.fields["event_id"] == "E2"]
    assert [r.fields["kept_for"] for r in ended] == [["E1"]]
    assert of(m.effects, ReleaseSlot) == [ReleaseSlot("E2")]


# ---- review of issue 26: an approval POST that outlives its slot ------------------------------


def test_an_approval_carries_its_slots_confirmed_end_as_the_deadline_for_its_answer():
    """The margin is checked when the POST is submitted; the POST itself must also end within
    the lease: PostApproval carries the lease's confirmed end, which the lane enforces (not
    sent after it, given up at it). An event without a slot has no deadline."""
    m, spawn = holding(at=MONO0 + 1)  # the slot is ours until MONO0 + 1 + TTL
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    (post,) = of(m.effects, PostApproval)
    assert post.deadline == MONO0 + 1 + TTL
    m.send(SlotKept("E1", MONO0 + 2.5), at=MONO0 + 2.6)
    m.send(ApprovalFailed("E1", "timeout", "no answer by the deadline"), at=MONO0 + 3)
    (again,) = of(m.tick(MONO0 + 3 + engine.APPROVAL_BACKOFF.first), PostApproval)
    assert again.deadline == MONO0 + 2.5 + TTL, "a renewed lease moves the deadline"
    m.send(ApprovalFailed("E1", "timeout", "no answer by the deadline"), at=again.deadline)
    (lost,) = logs(m.effects, "slot_lost")
    assert lost.fields["approval"] == "unanswered", "it may still reach IMDS: said"
    assert m.phase() is Phase.NOT_APPROVED
    plain = when_machine()
    seen(plain, due_in(3 * 86400))
    (spawn,) = of(plain.effects, SpawnHooks)
    plain.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    assert [p.deadline for p in of(plain.effects, PostApproval)] == [None]


def test_an_approval_answered_after_its_slots_lease_could_expire_says_the_slot_was_lost():
    """Review of issue 26 #3: the POST went with the lease confirmed for more than the margin,
    IMDS answered after the lease's end (another VM may have taken the slot and been approved
    meanwhile). The event is approved (IMDS has it), but not as a plain event_approved:
    slot_lost first, and the approval is marked slot_lost."""
    m, spawn = holding(at=MONO0 + 1)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    assert of(m.effects, PostApproval)
    m.tick(MONO0 + 1 + TTL + 0.5)  # under way: the answer decides
    assert not logs(m.effects, "slot_lost")
    m.send(ApprovalSent("E1", 4.0), at=MONO0 + 1 + TTL + 1)  # answered now
    assert logs(m.effects)[:2] == ["slot_lost", "event_approved"]
    assert logs(m.effects, "event_approved")[0].fields["slot_lost"] is True
    assert m.phase() is Phase.APPROVED
    timely, spawn = holding(at=MONO0 + 1)
    timely.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    timely.send(ApprovalSent("E1", 0.5, MONO0 + 2.5), at=MONO0 + 2.6)
    assert logs(timely.effects) == ["event_approved"]
    assert "slot_lost" not in logs(timely.effects, "event_approved")[0].fields


# ---- review of issue 26: an interrupted drain does not run again before its slot -------------


def restarted_mid_drain(boot):
    """A Reboot an hour away whose before-hooks held the slot and ran when the daemon stopped
    (`boot` "boot-0": a crash restart; else a new boot), and the first document after."""
    loaded = {"E1": Tracked(due_in(3600), Phase.RUNNING, boot_id="boot-0", slot=Slot.HELD)}
    cfg = config(events=EVENTS, approve=ApprovePolicy.ALWAYS, concurrency=SLOTS, coordination=ETCD)
    m = Machine(cfg, loaded=loaded, now=MONO0, boot=boot)
    assert of(m.effects, AcquireSlot), "the slot is taken back"
    return m


def test_after_a_restart_or_crash_an_interrupted_drain_waits_for_its_slot_to_be_taken_back():
    """Review of issue 26 #1/#3: the event is still Scheduled, NotBefore an hour ahead; its
    before-hooks run again only once etcd gives the slot back (`max` counts VMs from their
    before-hooks' start), not at once beside the VM that may hold it now."""
    for boot in ("boot-0", "boot-1"):
        m = restarted_mid_drain(boot)
        seen(m, due_in(3600), at=MONO0 + 0.2)
        assert not of(m.effects, SpawnHooks), boot
        assert m.phase() is Phase.QUEUED
        assert logs(m.effects, "event_waiting")[0].fields["reason"] == "slot"
        m.send(SlotGranted("E1", MONO0 + 0.3), at=MONO0 + 0.4)
        assert logs(m.effects, "slot_acquired")[0].fields["taken_back"] is True
        assert of(m.effects, SpawnHooks), "taken back: its hooks run again"


def test_after_a_crash_a_drain_whose_slot_went_to_another_vm_queues_for_one():
    """The slot was another VM's when the daemon came back (SlotBusy before the document):
    the before-hooks wait in the queue as any event's, and run once a slot is granted (or at
    the lead, without one, not approved early)."""
    m = restarted_mid_drain("boot-1")
    m.send(SlotBusy("E1", ("vm-b",)), at=MONO0 + 0.1)
    seen(m, due_in(3600), at=MONO0 + 0.2)
    assert not of(m.effects, SpawnHooks)
    assert m.phase() is Phase.QUEUED
    assert logs(m.effects, "event_waiting")[0].fields["holders"] == ["vm-b"]
    m.send(SlotGranted("E1", MONO0 + 9), at=MONO0 + 9)
    assert of(m.effects, SpawnHooks)
    m.send(HooksFinished(of(m.effects, SpawnHooks)[0].run, Outcome.SUCCEEDED), at=MONO0 + 10)
    assert of(m.effects, PostApproval), "holding a slot granted: approved early"
    late = restarted_mid_drain("boot-0")
    late.send(SlotBusy("E1", ("vm-b",)), at=MONO0 + 0.1)
    seen(late, due_in(3600), at=MONO0 + 0.2)
    late.tick(MONO0 + 3600 - 600)  # the lead (10 minutes): prepared without a slot
    assert of(late.effects, SpawnHooks)
    assert logs(late.effects, "slot_unavailable")


# ---- issue 28: several limits at once -----------------------------------------------------------

LIMITS = Concurrency("web", 1, TTL, more=(Limit("zone-a", 2),))


def test_with_several_groups_the_hooks_wait_for_a_slot_in_every_one_and_say_which_is_full():
    """Issue 28: `concurrency` as a list (a tier and a zone). The VM asks once (the keeper
    takes a slot in every group in one transaction, or none); while a group is full its
    event waits, and the record says which group and who holds it; granted, its hooks start
    holding both, and one ReleaseSlot gives both back once it is over."""
    m = when_machine(concurrency=LIMITS, coordination=ETCD)
    seen(m, due_in(3 * 86400))
    assert m.phase() is Phase.QUEUED
    assert len(of(m.effects, AcquireSlot)) == 1
    (waiting,) = logs(m.effects, "event_waiting")
    assert (waiting.fields["group"], waiting.fields["groups"]) == ("web", ["web", "zone-a"])
    m.send(SlotBusy("E1", ("vm-c", "vm-d"), ("zone-a",)), at=MONO0 + 1)
    (waiting,) = logs(m.effects, "event_waiting")
    assert waiting.fields["full"] == ["zone-a"]
    assert waiting.fields["holders"] == ["vm-c", "vm-d"]
    shown = Observer(WALL0).document(m.state, WALL0 + 1, HealthFrom.DETECTED)["concurrency"]
    assert shown["groups"] == [{"group": "web", "max": 1}, {"group": "zone-a", "max": 2}]
    assert shown["last_seen_holders"] == ["vm-c", "vm-d"]
    assert not of(m.effects, SpawnHooks)
    m.send(SlotGranted("E1", MONO0 + 2), at=MONO0 + 2)
    (acquired,) = logs(m.effects, "slot_acquired")
    assert acquired.fields["groups"] == ["web", "zone-a"]
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 3)
    assert of(m.effects, PostApproval), "holding a slot in every group: approved early"
    m.send(ApprovalSent("E1"), at=MONO0 + 3.1)
    seen(m, incarnation=3, at=MONO0 + 4)  # over: the after-hooks run, still holding both
    (after,) = of(m.effects, SpawnHooks)
    assert not of(m.effects, ReleaseSlot)
    m.send(HooksFinished(after.run, Outcome.SUCCEEDED), at=MONO0 + 5)
    assert of(m.effects, ReleaseSlot) == [ReleaseSlot("E1")], "both groups' slots, together"


def test_the_holders_the_keeper_saw_as_it_took_the_slot_are_the_last_seen_and_include_this_vm():
    """Told busy by vm-c, then granted with vm-c gone: `status` said "last seen holders vm-c"
    (or "-" when it never waited) while this VM held the slot; SlotGranted now carries who
    holds the group's slots as it took its own (this VM among them), and the status shows
    them."""
    m = when_machine(concurrency=Concurrency("web", 2, TTL), coordination=ETCD)
    seen(m, due_in(3 * 86400))
    m.send(SlotBusy("E1", ("vm-c", "vm-d")), at=MONO0 + 1)
    m.send(SlotGranted("E1", MONO0 + 2, (VM, "vm-d")), at=MONO0 + 2)
    assert m.state.events["E1"].slot is Slot.HELD
    shown = Observer(WALL0).document(m.state, WALL0 + 3, HealthFrom.DETECTED)
    assert shown["concurrency"]["last_seen_holders"] == [VM, "vm-d"]
    assert f"held for E1; last seen holders {VM}, vm-d" in status(shown, WALL0 + 3, [])


def test_a_reload_that_adds_a_group_asks_again_and_approves_only_once_every_group_is_held():
    """A held slot of `web` and a reload that adds the zone's limit: the new keeper is asked
    (it takes the web slot back and a zone slot with it, or says the zone is full); until it
    answers no early approval, and told the zone is full, none at all."""
    for answer in ("granted", "busy"):
        m, spawn = holding()
        cfg = m.state.config
        m.send(Reloaded(dataclasses.replace(cfg, concurrency=LIMITS)), at=MONO0 + 2)
        assert [a.event.event_id for a in of(m.effects, AcquireSlot)] == ["E1"]
        m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2.5)
        assert not of(m.effects, PostApproval), "the zone's slot not held yet"
        if answer == "granted":
            m.send(SlotGranted("E1", MONO0 + 2.6), at=MONO0 + 2.7)
            assert of(m.effects, PostApproval)
        else:
            m.send(SlotBusy("E1", ("vm-c", "vm-d"), ("zone-a",)), at=MONO0 + 2.7)
            assert m.phase() is Phase.NOT_APPROVED
            assert not of(m.tick(MONO0 + 60), PostApproval)
