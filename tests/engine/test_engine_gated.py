"""A gate that HOLDS events, declared in this test as a new gate module would declare it, runs
with no edit outside its declaration (issue 27, "adding a gate"): it keeps the event in the one
generic waiting phase (`gated`, shown with its name), its answer lets the event on, an event
that leaves, starts or loses its rule while it waits is let go by the gate, a restart (or a new
boot) has the gate ask again, and `scheduledeventsd plan` plans a fleet through it from what
its effect declares. On the old code there was no such phase: a gate that held events needed
its own phase in lifecycle.py, its own branches in events, reload and lifetime, and an executor
in plan/executors.py."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from typing import Optional

import pytest

from scheduledeventsd.config import EventRule, HealthFrom, Pacemaker
from scheduledeventsd.engine import (
    Boot,
    ClusterDrained,
    ClusterMarked,
    ClusterRestored,
    DrainNode,
    HooksFinished,
    Outcome,
    Phase,
    PostApproval,
    RestoreNode,
    Slot,
    SlotGranted,
    Tracked,
    compose,
    durable_events,
    machine,
)
from scheduledeventsd.engine.component import Gate, gate_move, gate_state, wait_at
from scheduledeventsd.engine.gates import onward, pipeline
from scheduledeventsd.engine.lifecycle import On
from scheduledeventsd.engine.state import _with
from scheduledeventsd.engine.vocabulary.effects import GateEffect, Notify, Persist, SpawnHooks
from scheduledeventsd.engine.vocabulary.messages import DocumentFetched, GateMessage, Reloaded
from scheduledeventsd.observe.observer import Observer
from scheduledeventsd.observe.report import status
from tests.engine.test_engine import Machine, config, doc, event, logs, of
from tests.engine.test_engine_fleet import ETCD, SLOTS, TTL
from tests.engine.test_engine_when import MONO0, WALL0, due_in
from tests.engine.test_engine_when import machine as when_machine
from tests.engine.test_engine_when import seen as first_seen

NAME = "toyhold"
PACEMAKER = Pacemaker(drain_timeout=60)


class HeldOn(str, enum.Enum):
    ASK = "the event reached the toy gate"
    ASK_AGAIN = "the daemon restarted while it waited"
    ANSWER = "the toy's answer came"
    LET_GO = "it stopped waiting without passing"


class Held(str, enum.Enum):
    NONE = ""
    ASKED = "asked"
    PASSED = "passed"


TABLE = machine.Table(
    NAME,
    "a gate declared in a test that holds an event until its answer",
    (
        machine.row([Held.NONE, Held.PASSED], HeldOn.ASK, Held.ASKED, "AskHold; gated"),
        machine.row([Held.ASKED], HeldOn.ASK_AGAIN, Held.ASKED, "AskHold again"),
        machine.row([Held.ASKED], HeldOn.ANSWER, Held.PASSED, "on"),
        machine.row([Held.ASKED], HeldOn.LET_GO, Held.NONE, "let go"),
    ),
)


@dataclasses.dataclass(frozen=True)
class HoldAnswered(GateMessage):
    """The toy's executor answers: the event may go on (an error: it still waits)."""

    event_id: str
    error: str = ""


@dataclasses.dataclass(frozen=True)
class AskHold(GateEffect):
    """The toy gate's question. The planner answers it as it declares (`planned`)."""

    event_id: str
    answers_in_plan: bool = True

    def failed(self, detail: str) -> GateMessage:
        return HoldAnswered(self.event_id, detail)

    def planned(self) -> Optional[GateMessage]:
        return HoldAnswered(self.event_id) if self.answers_in_plan else None


def holding_gate(seen: list[str], answers_in_plan: bool = True) -> Gate:
    """The gate, as its module would declare it: nothing of the engine is edited for it."""

    def enter(state, tracked, on, now, out):
        seen.append(f"asked {tracked.event.event_id}")
        out.append(AskHold(tracked.event.event_id, answers_in_plan))
        return state, wait_at(NAME, gate_move(tracked, TABLE, HeldOn.ASK, Held.ASKED), on, out)

    def answered(state, msg, now, out):
        t = state.events.get(msg.event_id)
        if t is None or t.phase is not Phase.GATED or t.gated != NAME or msg.error:
            return state
        passed = gate_move(t, TABLE, HeldOn.ANSWER, Held.PASSED)
        state, t = onward.after(NAME, state, passed, On.PASSED, now, out)
        return _with(state, msg.event_id, t)

    def restarted(state, tracked, now, out):
        seen.append(f"asked again {tracked.event.event_id}")
        out.append(AskHold(tracked.event.event_id, answers_in_plan))
        return state, gate_move(tracked, TABLE, HeldOn.ASK_AGAIN, Held.ASKED)

    def left(state, tracked, out):
        seen.append(f"let go {tracked.event.event_id}")
        return state, gate_move(tracked, TABLE, HeldOn.LET_GO, Held.NONE)

    def clock_moved(state, tracked, now, out):
        seen.append(f"placed again {tracked.event.event_id} ({state.config.shutdown_grace:g})")
        return state, dataclasses.replace(tracked, start_at=now + 60)

    return Gate(
        NAME,
        TABLE,
        enter,
        handlers={HoldAnswered: answered},
        effects=(AskHold,),
        restarted=restarted,
        left=left,
        clock_moved=clock_moved,
    )


def composed_with(monkeypatch, gate: Gate) -> None:
    """pipeline.GATES with `gate` between the slot's and the drain's, composed as compose
    composes the gates it imports (undone by the caller's `onward.link(pipeline.GATES)`)."""
    gates = (*pipeline.GATES[:2], gate, *pipeline.GATES[2:])
    names = ("_HANDLERS", "TIMERS", "COUPLINGS", "_DUE", "_DUE_BY_PHASE")
    for name, value in zip(names, compose.composed(gates)):
        monkeypatch.setattr(compose, name, value)
    onward.link(gates)


@pytest.fixture
def seen(monkeypatch):
    found: list[str] = []
    composed_with(monkeypatch, holding_gate(found))
    try:
        yield found
    finally:
        onward.link(pipeline.GATES)


def _gated(m: Machine) -> Tracked:
    m.fetched(doc(event()), at=100.1)
    return m.state.events["E1"]


def test_a_gate_declared_elsewhere_holds_an_event_gated_until_its_answer_lets_it_on(seen):
    m = Machine()
    tracked = _gated(m)
    assert (tracked.phase, tracked.gated) == (Phase.GATED, NAME), "held, and by whom"
    assert gate_state(tracked, TABLE) is Held.ASKED
    assert of(m.effects, AskHold) == [AskHold("E1")]
    assert not of(m.effects, SpawnHooks), "its before-hooks wait"
    (waiting,) = logs(m.effects, "event_waiting")
    assert (waiting.fields["reason"], waiting.fields["gate"]) == ("gate", NAME)
    assert f"1 held at a gate ({NAME})" in of(m.effects, Notify)[-1].fields["STATUS"]
    (persist,) = of(m.effects, Persist)
    assert persist.events["E1"].gated == NAME, "kept in the state file"
    m.send(HoldAnswered("E1", "no answer"), at=101)  # its executor failed: it still waits
    assert m.phase() is Phase.GATED
    m.send(HoldAnswered("E1"), at=102)
    assert m.phase() is Phase.RUNNING, "let on: the drain's gate, then the before-hooks"
    assert of(m.effects, SpawnHooks)
    assert m.state.events["E1"].gated == ""
    assert gate_state(m.state.events["E1"], TABLE) is Held.PASSED


def test_the_status_shows_a_gated_event_with_its_gates_name_and_not_as_hooks_started(seen):
    m = Machine()
    _gated(m)
    wall = 1_800_000_000.0
    shown = Observer(wall).document(m.state, wall, HealthFrom.HOOKS_STARTED)
    (row,) = shown["events"]
    assert (row["phase"], row["waiting_for"]) == ("gated", NAME)
    assert shown["health"]["ok"], "its hooks have not started"
    text = status(shown, wall, [])
    assert f"E1: gated ({NAME}), Scheduled" in text
    assert f"when the {NAME} gate lets it on" in text


@pytest.mark.parametrize(
    ("listed", "phase", "what"),
    [
        ((), None, "event_completed"),  # it left the document: forgotten
        ((event(status="Started"),), Phase.MISSED, "event_missed"),
    ],
)
def test_an_event_that_leaves_or_starts_while_gated_is_let_go_by_its_gate(
    seen, listed, phase, what
):
    m = Machine()
    _gated(m)
    m.fetched(doc(*listed, incarnation=3), at=101)
    assert logs(m.effects, what)
    assert "let go E1" in seen
    assert not of(m.effects, SpawnHooks), "never prepared: no cancelled- or after-hooks"
    if phase is None:
        assert "E1" not in m.state.events
    else:
        assert m.phase() is phase
        assert gate_state(m.state.events["E1"], TABLE) is Held.NONE
        assert m.state.events["E1"].gated == ""


def test_a_reload_that_removes_a_gated_events_type_has_its_gate_let_it_go(seen):
    m = Machine()
    _gated(m)
    m.send(Reloaded(config(events={})), at=101)
    assert m.phase() is Phase.UNHANDLED
    assert "let go E1" in seen
    assert gate_state(m.state.events["E1"], TABLE) is Held.NONE


@pytest.mark.parametrize("boot", ["boot-1", "boot-2"], ids=["restart", "new boot"])
def test_a_restart_with_an_event_gated_has_its_gate_ask_again_and_its_answer_lets_it_on(seen, boot):
    before = Machine()
    (persist,) = of(before.fetched(doc(event()), at=100.1), Persist)
    m = Machine(loaded=persist.events, boot=boot)
    assert m.phase() is Phase.GATED
    assert "asked again E1" in seen
    assert of(m.effects, AskHold) == [AskHold("E1")]
    m.fetched(doc(event()), at=101)
    assert m.phase() is Phase.GATED, "still waiting for its answer"
    m.send(HoldAnswered("E1"), at=102)
    assert m.phase() is Phase.RUNNING


def test_a_clock_step_or_a_reload_has_the_gate_holding_an_event_place_its_timers_again(seen):
    """Its deadline may come from the wall clock (NotBefore), and a reload may change its
    settings: the gate is told, as the slot's and the drain's deadlines are placed again."""
    from scheduledeventsd.engine.vocabulary.constants import CLOCK_STEP  # noqa: PLC0415

    m = when_machine()
    first_seen(m, due_in(3 * 86400))
    assert m.phase() is Phase.GATED
    m.send(DocumentFetched(doc(due_in(3 * 86400)), WALL0 + 2 + 2 * CLOCK_STEP), at=MONO0 + 1)
    assert seen[-1] == "placed again E1 (10)", "the wall clock stepped"
    assert m.state.events["E1"].start_at == MONO0 + 61
    m.send(Reloaded(dataclasses.replace(m.state.config, shutdown_grace=20.0)), at=MONO0 + 2)
    assert seen[-1] == "placed again E1 (20)", "a reload: with the new settings"
    assert m.phase() is Phase.GATED


def test_a_slot_whose_lease_ends_while_its_event_is_gated_is_lost_then_not_at_its_let_on(seen):
    """A gate after the slot's holds an event whose slot is granted: the lease's end wakes the
    daemon and loses the slot while it waits (as while draining), so it is never approved
    early. On the old code the lease's timer did not count for a gated event: nothing woke for
    it until its gate let it on."""
    m = when_machine(concurrency=SLOTS, coordination=ETCD)
    first_seen(m, due_in(3 * 86400))
    assert m.phase() is Phase.QUEUED
    m.send(SlotGranted("E1", MONO0 + 1), at=MONO0 + 1)
    assert m.phase() is Phase.GATED, "granted, then held by the toy gate"
    assert m.state.events["E1"].slot is Slot.HELD
    assert m.wake() == pytest.approx(MONO0 + 1 + TTL), "the lease's end wakes it while gated"
    effects = m.tick(MONO0 + 1 + TTL)
    assert logs(effects)[:2] == ["slot_lost", "slot_unavailable"]
    assert m.phase() is Phase.GATED
    m.send(HoldAnswered("E1"), at=MONO0 + 7)
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 8)
    assert not of(m.effects, PostApproval)
    assert m.phase() is Phase.NOT_APPROVED


def _requeued_and_gated(seen: list[str], cluster: Optional[Pacemaker] = None) -> Machine:
    """E1 passed the toy gate (then the drain's, with `cluster`: the node drained), its
    before-hooks started holding its slot, and the daemon restarted mid-run: it is queued
    again (prepared), granted its slot back, and held at the toy gate, after the slot's."""
    rule = EventRule(("drain",), ("undrain",), ("undrain",))
    m = when_machine(concurrency=SLOTS, coordination=ETCD, events={"Reboot": rule}, cluster=cluster)
    first_seen(m, due_in(3 * 86400))
    m.send(SlotGranted("E1", MONO0 + 1), at=MONO0 + 1)
    m.send(HoldAnswered("E1"), at=MONO0 + 2)
    if cluster is not None:
        assert of(m.effects, DrainNode)
        m.send(ClusterMarked("E1", ours=True), at=MONO0 + 3)
        m.send(ClusterDrained("E1"), at=MONO0 + 4)
    assert [s.stage.value for s in of(m.effects, SpawnHooks)] == ["before"]
    again = Machine(m.state.config, now=MONO0 + 10)
    again.send(Boot(durable_events(m.state.events), "", "boot-1", m.state.cluster_mark))
    first_seen(again, due_in(3 * 86400), at=MONO0 + 12)
    assert again.phase() is Phase.QUEUED
    again.send(SlotGranted("E1", MONO0 + 13), at=MONO0 + 13)
    assert again.phase() is Phase.GATED, "its slot taken back, then held by the toy gate"
    assert again.state.events["E1"].prepared
    assert again.state.events["E1"].drain.value == ("" if cluster is None else "drained")
    assert seen.count("asked E1") == 2
    return again


@pytest.mark.parametrize("cluster", [None, PACEMAKER], ids=["", "drained"])
def test_a_requeued_event_gated_after_a_restart_that_leaves_gets_its_cancelled_hooks(seen, cluster):
    """Prepared before the restart (its before-hooks had started): it is owed its cancelled-
    hooks, after the node's restore if it was drained, and its gate lets it go. On the old
    code it was forgotten as never prepared (event_completed, no cancelled-hooks, the node
    left marked), as a requeued event was before `prepared`."""
    m = _requeued_and_gated(seen, cluster)
    first_seen(m, incarnation=3, at=MONO0 + 14)
    assert logs(m.effects, "event_cancelled")
    if cluster is not None:
        assert of(m.effects, RestoreNode) == [RestoreNode("E1", m.state.cluster_mark)]
        assert not of(m.effects, SpawnHooks), "no hook before the node is restored"
        m.send(ClusterRestored("E1"), at=MONO0 + 15)
    assert [s.stage.value for s in of(m.effects, SpawnHooks)] == ["cancelled"]
    assert seen[-1] == "let go E1"
    assert m.phase() is Phase.AFTER
    assert m.state.events["E1"].gated == ""


def test_a_requeued_event_gated_after_a_restart_that_starts_gets_its_after_hooks_once_over(seen):
    """Not `missed`: its hooks had started before the restart; done, its gate lets it go, and
    its after-hooks run once it is over. On the old code it was MISSED (event_missed), and its
    after-hooks never ran."""
    m = _requeued_and_gated(seen)
    started = dataclasses.replace(due_in(3 * 86400), status="Started")
    first_seen(m, started, incarnation=3, at=MONO0 + 14)
    assert m.phase() is Phase.DONE
    assert not logs(m.effects, "event_missed")
    assert seen[-1] == "let go E1"
    assert m.state.events["E1"].gated == ""
    first_seen(m, incarnation=4, at=MONO0 + 15)
    assert [s.stage.value for s in of(m.effects, SpawnHooks)] == ["after"]


def test_a_requeued_event_gated_at_a_new_boot_is_judged_by_the_next_document(seen):
    """A new boot with it gated: REBOOTED, as any prepared event (the gate lets it go, and does
    not ask again); Started in the next document, that boot was its maintenance: after-hooks.
    On the old code it stayed GATED, its gate asked again, and no after-hooks ever ran."""
    m = _requeued_and_gated(seen)
    booted = Machine(
        m.state.config, loaded=durable_events(m.state.events), now=MONO0 + 20, boot="boot-2"
    )
    assert booted.phase() is Phase.REBOOTED
    assert seen[-1] == "let go E1"
    assert not of(booted.effects, AskHold)
    assert booted.state.events["E1"].gated == ""
    started = dataclasses.replace(due_in(3 * 86400), status="Started")
    first_seen(booted, started, incarnation=3, at=MONO0 + 21)
    assert [s.stage.value for s in of(booted.effects, SpawnHooks)] == ["after"]


def test_a_gated_event_is_written_as_waiting_for_the_previous_release(tmp_path):
    """The previous release knows no `gated`: it reads the event as waiting (placed again by
    the next document, its start instant enters the gates it knows); this one reads it back."""
    from scheduledeventsd.host import store  # noqa: PLC0415

    known = {"E1": Tracked(event(), Phase.GATED, gates=((NAME, "asked"),), gated=NAME)}
    written = store._encode(known)
    (entry,) = written["events"]
    assert (entry["phase"], entry["newer_phase"], entry["gated"]) == ("waiting", "gated", NAME)
    assert store._decode(written) == known


# ---- the planner plans a fleet through the gate, from what its effect declares ------------

WALL = dt.datetime(2026, 11, 23, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize(("answers", "early"), [(True, True), (False, False)])
def test_the_planner_plans_a_fleet_through_a_holding_gate_from_its_effects_declared_answer(
    tmp_path, monkeypatch, answers, early
):
    """A gate whose effect declares the answer `plan` gives (GateEffect.planned) is passed as
    soon as its turn comes (approved at 02:30 as without it); one that declares none holds the
    event, which is then never approved early, and is late. On the old code the plan stopped:
    the planner cannot carry out AskHold (and later, the held event was not flagged)."""
    from tests.engine.test_plan import at, files, planned, wave  # noqa: PLC0415

    found: list[str] = []
    composed_with(monkeypatch, holding_gate(found, answers_in_plan=answers))
    try:
        data = planned(files(tmp_path, wave(1)))
    finally:
        onward.link(pipeline.GATES)
    assert found, "the gate was entered"
    (row,) = data["rows"]
    assert row["approved_early"] is early
    gated = [s for s in row["spans"] if s["phase"] == "gated"]
    if early:
        assert row["approved"] == at(28, "02:30:00")
        assert gated == [{"phase": "gated", "from": at(28, "02:00:00"), "to": at(28, "02:00:00")}]
    else:
        assert row["hooks_start"] is None, "held until it went down: never prepared"
        assert row["flags"] == ["late"]  # the old planner read its before-hooks only: none
        assert gated == [{"phase": "gated", "from": at(28, "02:00:00"), "to": at(28, "05:30:00")}]
