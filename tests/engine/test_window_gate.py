"""The window gate's own table (issue 27), in the pure engine with a fake clock: an event held back
by its lead time or a maintenance window says why in `Tracked.window`, which changes only as
`window.TABLE` declares; every row is taken by some history here, the slice is held exactly while
the phase is `waiting`, and a move the table does not declare is refused as a phase move is."""

from __future__ import annotations

import dataclasses

import pytest

from scheduledeventsd import engine
from scheduledeventsd.config import Concurrency, EventRule
from scheduledeventsd.engine import (
    DocumentFetched,
    Hold,
    IllegalTransitionError,
    Phase,
    Reloaded,
    SlotGranted,
    SpawnHooks,
    Tracked,
)
from scheduledeventsd.engine.gates import window
from scheduledeventsd.engine.gates.lead import WINDOW_LEAD
from scheduledeventsd.engine.gates.window import WindowOn
from tests.engine.test_engine import Machine, doc, logs, of
from tests.engine.test_engine_when import EVENTS, MONO0, WALL0, due_in, machine, mono
from tests.engine.test_engine_when import window as daily

HELD = frozenset({Hold.LEAD, Hold.WINDOW, Hold.UNPLACED})
LEAD = {**EVENTS, "Reboot": EventRule(("drain",), start_before=3600)}


class Gate(Machine):
    """A Machine that checks after every step: an event is `waiting` exactly while the window
    gate holds it back."""

    def send(self, message, at=None):
        effects = super().send(message, at)
        for event_id, t in self.state.events.items():
            assert (t.phase is Phase.WAITING) == (t.window in HELD), (event_id, t.phase, t.window)
        return effects


def gate(windows=(), events=EVENTS, loaded=None):
    m = machine(windows, events=events)
    m.__class__ = Gate
    if loaded is not None:
        m.send(engine.Boot(loaded, "", "boot-1"))
    return m


def seen(m, *events, incarnation=2, at=None, wall_step=0.0):
    at = m.now if at is None else at
    wall = WALL0 + at - MONO0 + wall_step
    return m.send(DocumentFetched(doc(*events, incarnation=incarnation), wall), at=at)


@pytest.fixture
def taken(monkeypatch):
    """Every (from, on, to) the window gate's moves take in a test."""
    moves: set[tuple[Hold, WindowOn, Hold]] = set()
    real = window.move

    def move(tracked, on, target):
        moved = real(tracked, on, target)
        moves.add((tracked.window, on, target))
        return moved

    monkeypatch.setattr(window, "move", move)
    return moves


def test_a_lead_time_holds_the_event_until_its_instant_then_the_gate_opens(taken):
    m = gate(events=LEAD)
    seen(m, due_in(3 * 3600))
    assert (m.phase(), m.state.events["E1"].window) == (Phase.WAITING, Hold.LEAD)
    assert logs(m.effects, "event_waiting")[0].fields["reason"] == "start_before"
    (spawn,) = of(m.tick(MONO0 + 2 * 3600), SpawnHooks)
    assert spawn.hooks == ("drain",)
    assert (m.phase(), m.state.events["E1"].window) == (Phase.RUNNING, Hold.OPEN)
    assert taken >= {
        (Hold.NONE, WindowOn.HELD, Hold.LEAD),
        (Hold.LEAD, WindowOn.OPENED, Hold.OPEN),
    }


def test_a_window_holds_the_event_and_placing_it_again_may_change_why(taken):
    """A document lists it again (still the window); a reload removing the windows leaves only
    start_before (the lead); a wall clock step places the lead again."""
    two_days = {**EVENTS, "Reboot": EventRule(("drain",), start_before=2 * 86400)}
    m = gate([daily("02:00", "05:00")], events=two_days)
    seen(m, due_in(3 * 86400))  # NotBefore Sunday 12:00: from Friday 12:00, Saturday 02:00
    assert m.state.events["E1"].window is Hold.WINDOW
    seen(m, due_in(3 * 86400), incarnation=3, at=MONO0 + 1)
    assert m.state.events["E1"].window is Hold.WINDOW
    m.send(Reloaded(dataclasses.replace(m.state.config, windows=())), at=MONO0 + 2)
    assert m.state.events["E1"].window is Hold.LEAD
    assert m.state.events["E1"].start_at == MONO0 + 86400
    seen(m, due_in(3 * 86400), incarnation=3, at=MONO0 + 3, wall_step=600)
    assert logs(m.effects, "clock_moved")
    assert m.state.events["E1"].window is Hold.LEAD
    assert m.state.events["E1"].start_at == MONO0 + 86400 - 600
    m.send(Reloaded(dataclasses.replace(m.state.config, windows=(daily("02:00", "05:00"),))))
    assert m.state.events["E1"].window is Hold.WINDOW
    assert m.state.events["E1"].start_at == mono("2026-11-28T02:00") - 600
    assert of(m.tick(mono("2026-11-28T02:00") - 600), SpawnHooks)
    assert m.state.events["E1"].window is Hold.OPEN
    assert taken >= {
        (Hold.WINDOW, WindowOn.OPENED, Hold.OPEN),
        (Hold.NONE, WindowOn.HELD, Hold.WINDOW),
        (Hold.WINDOW, WindowOn.PLACED, Hold.WINDOW),
        (Hold.WINDOW, WindowOn.PLACED, Hold.LEAD),
        (Hold.LEAD, WindowOn.PLACED, Hold.LEAD),
        (Hold.LEAD, WindowOn.PLACED, Hold.WINDOW),
    }


def test_after_a_restart_the_wait_is_unplaced_until_a_document_places_it(taken):
    """The state file does not keep the slice (`durable_events` drops it): the restart leaves
    the event unplaced (no instant, no wake-up for it), the next document places it."""
    m = gate(events=LEAD)
    seen(m, due_in(3 * 3600))
    kept = engine.durable_events(m.state.events)
    assert kept["E1"].window is Hold.NONE, "not in the state file"
    again = gate(events=LEAD, loaded=kept)
    assert again.state.events["E1"].window is Hold.UNPLACED
    assert again.wake() == again.now + 3600.0, "nothing to wake for until a document"
    seen(again, due_in(3 * 3600), at=again.now + 5)
    assert again.state.events["E1"].window is Hold.LEAD
    assert not of(again.effects, SpawnHooks)
    assert (Hold.NONE, WindowOn.RESTARTED, Hold.UNPLACED) in taken
    assert (Hold.UNPLACED, WindowOn.PLACED, Hold.LEAD) in taken
    windowed = gate([daily("02:00", "05:00")])
    seen(windowed, due_in(3 * 86400))
    again = gate([daily("02:00", "05:00")], loaded=engine.durable_events(windowed.state.events))
    seen(again, due_in(3 * 86400), at=again.now + 5)
    assert again.state.events["E1"].window is Hold.WINDOW
    assert (Hold.UNPLACED, WindowOn.PLACED, Hold.WINDOW) in taken


def test_a_restart_past_its_instant_opens_the_gate_at_the_first_document(taken):
    loaded = {"E1": Tracked(due_in(1800), Phase.WAITING, boot_id="boot-1")}
    m = gate(events=LEAD, loaded=loaded)
    (spawn,) = of(seen(m, due_in(1800), at=MONO0 + 1), SpawnHooks)
    assert spawn.event.event_id == "E1"
    assert m.state.events["E1"].window is Hold.OPEN
    assert (Hold.UNPLACED, WindowOn.OPENED, Hold.OPEN) in taken


def test_an_event_that_starts_or_loses_its_rule_while_held_leaves_the_gate(taken):
    m = gate(events=LEAD)
    seen(m, due_in(3 * 3600), due_in(3 * 3600, "E2", "Freeze"))
    assert m.state.events["E2"].window is Hold.NONE, "Freeze has no start_before: at once"
    started = dataclasses.replace(due_in(3 * 3600), status="Started")
    seen(m, started, incarnation=3, at=MONO0 + 1)
    assert (m.phase(), m.state.events["E1"].window) == (Phase.MISSED, Hold.NONE)
    m = gate([daily("02:00", "05:00")])
    seen(m, due_in(3 * 86400))
    m.send(Reloaded(dataclasses.replace(m.state.config, events={})), at=MONO0 + 1)
    assert (m.phase(), m.state.events["E1"].window) == (Phase.UNHANDLED, Hold.NONE)
    m = gate(events=LEAD, loaded={"E1": Tracked(due_in(1800), Phase.WAITING, boot_id="b")})
    seen(m, dataclasses.replace(due_in(1800), status="Started"), at=MONO0 + 1)
    assert (m.phase(), m.state.events["E1"].window) == (Phase.MISSED, Hold.NONE)
    assert (Hold.LEAD, WindowOn.DROPPED, Hold.NONE) in taken
    assert (Hold.WINDOW, WindowOn.DROPPED, Hold.NONE) in taken
    assert (Hold.UNPLACED, WindowOn.DROPPED, Hold.NONE) in taken


def test_a_slot_granted_after_the_window_closed_holds_the_event_again(taken):
    """Issue 28 (windows and slots): a queued event granted its slot after its window closed
    gives it back and is held again, for the next window or its lead; whether it passed the
    gate (open) or was queued at first sight inside a window (never held)."""
    cases = [
        # (windows, NotBefore in, seen at, granted at, held by, from)
        ([daily("02:00", "05:00")], 3 * 86400, None, "2026-11-27T05:30", Hold.WINDOW, Hold.OPEN),
        (
            [daily("02:00", "05:00", days=[4, 6])],
            3 * 86400 - 35700,  # NotBefore Sunday 02:05: Sunday's window opens too late
            None,
            "2026-11-27T06:00",
            Hold.LEAD,
            Hold.OPEN,
        ),
        ([daily("11:00", "13:00")], 3 * 86400, MONO0, "2026-11-26T13:30", Hold.WINDOW, Hold.NONE),
        (
            [daily("11:00", "13:00", days=[3]), daily("02:00", "05:00", days=[6])],
            3 * 86400 - 35700,
            MONO0,
            "2026-11-26T13:30",
            Hold.LEAD,
            Hold.NONE,
        ),
    ]
    for windows, notice, at, granted, held, passed in cases:
        m = machine(windows, concurrency=Concurrency("web", 1))
        m.__class__ = Gate
        seen(m, due_in(notice), at=at)
        if at is None:
            m.tick(mono("2026-11-27T02:00"))
        assert (m.phase(), m.state.events["E1"].window) == (Phase.QUEUED, passed)
        m.send(SlotGranted("E1"), at=mono(granted))
        assert (m.phase(), m.state.events["E1"].window) == (Phase.WAITING, held)
        assert (passed, WindowOn.CLOSED, held) in taken


HISTORIES = (
    test_a_lead_time_holds_the_event_until_its_instant_then_the_gate_opens,
    test_a_window_holds_the_event_and_placing_it_again_may_change_why,
    test_after_a_restart_the_wait_is_unplaced_until_a_document_places_it,
    test_a_restart_past_its_instant_opens_the_gate_at_the_first_document,
    test_an_event_that_starts_or_loses_its_rule_while_held_leaves_the_gate,
    test_a_slot_granted_after_the_window_closed_holds_the_event_again,
)


def test_every_row_of_the_window_table_is_taken_by_the_histories_above(taken):
    """Played together, the histories above take every move the table declares, and only
    those (a row no history takes is a row nothing holds in place)."""
    for history in HISTORIES:
        history(taken)
    declared = {(s, r.on, r.target) for r in window.TABLE.rows for s in r.sources}
    assert taken == declared


def test_a_move_the_window_table_does_not_declare_raises():
    tracked = Tracked(due_in(600), Phase.WAITING, window=Hold.OPEN)
    with pytest.raises(IllegalTransitionError, match="window open: nothing is declared"):
        window.move(tracked, WindowOn.PLACED, Hold.LEAD)
    with pytest.raises(IllegalTransitionError, match="only to"):
        window.move(Tracked(due_in(600), Phase.NEW), WindowOn.HELD, Hold.OPEN)


def test_an_undeclared_window_move_is_refused_whole_and_its_timer_is_not_retried_at_once():
    """Outside tests (not strict) the step that breaks the table is refused, as for a phase
    move: transition_refused, the event left as it was, no busy loop on its due timer."""
    m = gate(events=LEAD)
    seen(m, due_in(3 * 3600))
    m.state = dataclasses.replace(m.state, strict=False)
    moves = window.TABLE.moves
    removed = moves.pop((Hold.LEAD, WindowOn.OPENED))  # type: ignore[attr-defined]
    try:
        m.tick(MONO0 + 2 * 3600)
    finally:
        moves[(Hold.LEAD, WindowOn.OPENED)] = removed  # type: ignore[index]
    (refused,) = logs(m.effects, "transition_refused")
    assert "window lead: nothing is declared" in refused.fields["error"]
    assert not of(m.effects, SpawnHooks)
    assert (m.phase(), m.state.events["E1"].window) == (Phase.WAITING, Hold.LEAD)
    (wake,) = of(m.effects, engine.WakeAt)
    assert wake.at >= m.now + engine.POLL_BACKOFF_CAP, "never a busy loop on the due timer"


def test_a_window_opening_too_late_holds_by_the_lead():
    """The lead wins over a window opening after it: held as `lead`, not `window`."""
    m = gate([daily("13:58", "15:00")])
    seen(m, due_in(2 * 3600))
    assert m.state.events["E1"].window is Hold.LEAD
    assert m.state.events["E1"].start_at == MONO0 + 2 * 3600 - WINDOW_LEAD
