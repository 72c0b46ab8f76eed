"""Shared events in the pure engine, with a fake clock: approve once every VM named is ready,
never when one failed or coordination is down, never rush a VM that runs no daemon."""

from __future__ import annotations

from scheduledeventsd.config import (
    ApprovePolicy,
    Coordination,
    Etcd,
    EventRule,
    Gate,
    HookCommand,
)
from scheduledeventsd.engine import (
    AskGate,
    CancelRuns,
    Coordinate,
    CoordinationFailed,
    GateAnswered,
    HooksFinished,
    Outcome,
    PeersChanged,
    Persist,
    Phase,
    PostApproval,
    Reloaded,
    SpawnHooks,
    StopCoordinating,
    Tracked,
    status_text,
)
from tests.test_engine import VM, Machine, config, doc, event, logs, of

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
