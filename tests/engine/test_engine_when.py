"""Choosing when, in the pure engine with a fake clock: windows hold an event's before-hooks
until one opens (never past the lead), NotBefore moves, reloads and clock steps place the wait
again, and the fast hooks run when little time is left."""

from __future__ import annotations

import dataclasses
import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from scheduledeventsd import engine
from scheduledeventsd.config import ApprovePolicy, Concurrency, EventRule, HealthFrom, Metadata
from scheduledeventsd.engine import (
    AcquireSlot,
    ApprovalSent,
    CancelFetch,
    DocumentFetched,
    Fetch,
    HooksFinished,
    Outcome,
    Phase,
    PostApproval,
    ReleaseSlot,
    Reloaded,
    SlotBusy,
    SlotGranted,
    SpawnHooks,
    lifecycle,
)
from scheduledeventsd.engine.gates import window as window_gate
from scheduledeventsd.engine.gates.lead import WINDOW_LEAD
from scheduledeventsd.observe.observer import Observer
from scheduledeventsd.windows import Window
from tests.engine.test_engine import Machine, config, doc, event, logs, of

WALL0 = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.timezone.utc).timestamp()  # a Thursday
MONO0 = 100.0
EVENTS = {
    "Reboot": EventRule(("drain",), ("undrain",)),
    "Freeze": EventRule(("checkpoint",)),
    "Redeploy": EventRule(("drain",), window=False),
}


def window(start, end, days=range(7), zone="UTC"):
    return Window(
        frozenset(days), dt.time.fromisoformat(start), dt.time.fromisoformat(end), ZoneInfo(zone)
    )


def due_in(seconds, event_id="E1", event_type="Reboot"):
    when = dt.datetime.fromtimestamp(WALL0 + seconds, dt.timezone.utc)
    return dataclasses.replace(event(event_id, event_type), not_before=when)


def mono(wall_text):
    """The fake monotonic instant of a UTC wall time."""
    wall = dt.datetime.fromisoformat(wall_text).replace(tzinfo=dt.timezone.utc).timestamp()
    return MONO0 + wall - WALL0


def machine(windows=(), events=EVENTS, **overrides):
    cfg = config(events=events, windows=tuple(windows), approve=ApprovePolicy.ALWAYS, **overrides)
    return Machine(cfg, now=MONO0)


def seen(m, *events, incarnation=2, at=None):
    at = m.now if at is None else at
    return m.send(DocumentFetched(doc(*events, incarnation=incarnation), WALL0 + at - MONO0), at=at)


def test_a_reboot_waits_for_the_window_then_its_hooks_start_and_it_is_approved():
    m = machine([window("02:00", "05:00")])
    seen(m, due_in(3 * 86400))
    assert m.phase() is Phase.WAITING
    (waiting,) = logs(m.effects, "event_waiting")
    assert waiting.fields["reason"] == "window"
    assert waiting.fields["hooks_start_at"] == "2026-11-27T02:00:00Z"
    assert waiting.fields["window"] == "mon,tue,wed,thu,fri,sat,sun 02:00-05:00 UTC"
    opens = mono("2026-11-27T02:00")
    assert m.state.events["E1"].start_at == opens
    assert not of(m.tick(opens - 0.01), SpawnHooks)
    (spawn,) = of(m.tick(opens), SpawnHooks)
    assert spawn.hooks == ("drain",)
    m.send(
        HooksFinished(spawn.run, Outcome.SUCCEEDED), at=mono("2026-11-27T06:00")
    )  # window closed
    assert of(m.effects, PostApproval), "the window bounds when preparation starts, not approval"


def test_inside_a_window_the_hooks_start_at_once():
    m = machine([window("11:00", "13:00")])
    seen(m, due_in(3 * 86400))
    assert of(m.effects, SpawnHooks)


def test_no_window_before_not_before_means_as_without_windows():
    m = machine([window("02:00", "05:00", days=[0])])  # Mondays; NotBefore is Saturday
    seen(m, due_in(2 * 86400))
    assert of(m.effects, SpawnHooks)
    assert m.phase() is Phase.RUNNING


def test_a_window_opening_late_never_makes_preparation_later_than_the_lead():
    """A window opening 2 minutes before NotBefore: the hooks start WINDOW_LEAD before it."""
    m = machine([window("13:58", "15:00")])
    seen(m, due_in(2 * 3600))  # NotBefore 14:00
    (waiting,) = logs(m.effects, "event_waiting")
    assert waiting.fields["reason"] == "start_before"
    assert m.state.events["E1"].start_at == MONO0 + 2 * 3600 - WINDOW_LEAD


def test_a_window_chooses_within_start_before_not_before_it():
    """start_before 4 h, NotBefore 17:00, a window 15:00-16:00: the hooks start at 15:00, in the
    window and within start_before (the lead, 13:00, used to win over the window)."""
    events = {**EVENTS, "Reboot": EventRule(("drain",), start_before=4 * 3600)}
    m = machine([window("15:00", "16:00")], events=events)
    seen(m, due_in(5 * 3600))  # NotBefore 17:00; lead at 13:00, window at 15:00
    (waiting,) = logs(m.effects, "event_waiting")
    assert waiting.fields["reason"] == "window"
    assert waiting.fields["hooks_start_at"] == "2026-11-26T15:00:00Z"
    assert not of(m.tick(mono("2026-11-26T14:59:59")), SpawnHooks)
    assert of(m.tick(mono("2026-11-26T15:00")), SpawnHooks)


def test_a_window_open_now_does_not_start_hooks_before_start_before_allows():
    """The docs' promise, broken: a window open all day, start_before 60, NotBefore 25 min
    away: the hooks ran at once (SECONDS_LEFT 1346). They start 60 s before NotBefore."""
    events = {**EVENTS, "Reboot": EventRule(("drain",), start_before=60)}
    m = machine([window("00:00", "23:59")], events=events)
    seen(m, due_in(25 * 60))
    assert not of(m.effects, SpawnHooks)
    (waiting,) = logs(m.effects, "event_waiting")
    assert waiting.fields["hooks_start_at"] == "2026-11-26T12:24:00Z"
    assert m.state.events["E1"].start_at == MONO0 + 25 * 60 - 60
    assert not of(m.tick(MONO0 + 25 * 60 - 61), SpawnHooks)
    (spawn,) = of(m.tick(MONO0 + 25 * 60 - 60), SpawnHooks)
    assert spawn.event.event_id == "E1"


def test_with_no_window_within_start_before_the_hooks_start_at_the_lead():
    """start_before 1 h, NotBefore 14:00, the window opens 13:55 (inside start_before but later
    than the 10-minute window lead): preparation is never late because of a window: 13:00."""
    events = {**EVENTS, "Reboot": EventRule(("drain",), start_before=3600)}
    m = machine([window("13:55", "15:00")], events=events)
    seen(m, due_in(2 * 3600))
    (waiting,) = logs(m.effects, "event_waiting")
    assert waiting.fields["reason"] == "start_before"
    assert waiting.fields["hooks_start_at"] == "2026-11-26T13:00:00Z"


def test_freeze_and_types_with_window_false_ignore_windows():
    m = machine([window("02:00", "05:00")])
    seen(
        m,
        due_in(3 * 86400, "F", "Freeze"),
        due_in(3 * 86400, "D", "Redeploy"),
        due_in(3 * 86400, "R", "Reboot"),
    )
    assert {s.event.event_id for s in of(m.effects, SpawnHooks)} == {"F", "D"}
    assert m.phase("R") is Phase.WAITING


def test_a_moving_not_before_places_the_wait_again():
    m = machine([window("02:00", "05:00", days=[4, 5])])  # fri, sat
    seen(m, due_in(3 * 86400))  # NotBefore Sunday 12:00: Friday 02:00
    assert m.state.events["E1"].start_at == mono("2026-11-27T02:00")
    seen(m, due_in(10 * 3600), incarnation=3, at=MONO0 + 1)  # NotBefore tonight 22:00
    assert of(m.effects, SpawnHooks), "no window before the new NotBefore: at once"


def test_a_reload_that_changes_the_windows_places_the_wait_again():
    m = machine([window("02:00", "05:00")])
    seen(m, due_in(3 * 86400))
    new = dataclasses.replace(m.state.config, windows=(window("20:00", "21:00"),))
    m.send(Reloaded(new), at=MONO0 + 5)
    (waiting,) = logs(m.effects, "event_waiting")
    assert waiting.fields["hooks_start_at"] == "2026-11-26T20:00:00Z"
    m.send(Reloaded(dataclasses.replace(new, windows=())), at=MONO0 + 6)
    assert of(m.effects, SpawnHooks), "no windows any more: at once"


def test_a_wall_clock_step_places_the_wait_again():
    m = machine([window("02:00", "05:00")])
    seen(m, due_in(3 * 86400))
    # The wall clock jumps 2 h ahead against the monotonic one (same document).
    m.send(DocumentFetched(doc(due_in(3 * 86400)), WALL0 + 10 + 7200), at=MONO0 + 10)
    assert logs(m.effects, "clock_moved")
    assert m.state.events["E1"].start_at == mono("2026-11-27T02:00") - 7200


def test_the_fast_hooks_run_when_less_than_fast_below_is_left():
    events = {**EVENTS, "Reboot": EventRule(("drain",), fast=("checkpoint",), fast_below=300)}
    m = machine(events=events)
    seen(m, due_in(200), due_in(400, "E2"))
    spawned = {s.event.event_id: s.hooks for s in of(m.effects, SpawnHooks)}
    assert spawned == {"E1": ("checkpoint",), "E2": ("drain",)}
    (rule,) = logs(m.effects, "event_rule")
    assert rule.fields["rule"] == "fast"
    assert rule.fields["seconds_left"] == 200


def test_the_fast_path_is_decided_when_the_hooks_start_not_when_first_seen():
    events = {
        **EVENTS,
        "Reboot": EventRule(("drain",), fast=("checkpoint",), fast_below=1200, start_before=900),
    }
    m = machine(events=events)
    seen(m, due_in(3600))
    assert m.phase() is Phase.WAITING
    (spawn,) = of(m.tick(MONO0 + 3600 - 900), SpawnHooks)
    assert spawn.hooks == ("checkpoint",), "900 s left at the lead, under fast_below"


def test_fast_hooks_that_succeed_approve_and_the_after_hooks_still_run():
    events = {**EVENTS, "Reboot": EventRule(("drain",), ("undrain",), fast=("checkpoint",))}
    m = machine(events=events)
    seen(m, due_in(60))
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 1)
    assert of(m.effects, PostApproval)
    m.send(ApprovalSent("E1"))
    seen(m, incarnation=3, at=MONO0 + 2)  # it left after our approval: over
    assert [s.hooks for s in of(m.effects, SpawnHooks)] == [("undrain",)]


# ---- concurrency slots ---------------------------------------------------------------------

SLOTS = Concurrency("web", 1)


def slotted(**overrides):
    return machine(concurrency=SLOTS, **overrides)


def test_with_concurrency_the_hooks_wait_for_a_slot_and_start_when_it_is_granted():
    m = slotted()
    seen(m, due_in(3 * 86400))
    assert m.phase() is Phase.QUEUED
    (ask,) = of(m.effects, AcquireSlot)
    assert ask.event.event_id == "E1"
    assert not of(m.effects, SpawnHooks)
    (waiting,) = logs(m.effects, "event_waiting")
    assert waiting.fields["reason"] == "slot"
    m.send(SlotBusy("E1", ("vm-b",)), at=MONO0 + 1)
    assert logs(m.effects, "event_waiting")[0].fields["holders"] == ["vm-b"]
    m.send(SlotGranted("E1"), at=MONO0 + 2)
    assert logs(m.effects, "slot_acquired")
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 3)
    assert of(m.effects, PostApproval), "holding its slot, it is approved early"


def test_the_slot_is_held_until_the_after_hooks_end_then_given_back():
    m = slotted()
    seen(m, due_in(3 * 86400))
    m.send(SlotGranted("E1"), at=MONO0 + 1)
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=MONO0 + 2)
    m.send(ApprovalSent("E1"))
    seen(m, incarnation=3, at=MONO0 + 3)  # over: the after-hooks run, holding the slot
    (after,) = of(m.effects, SpawnHooks)
    assert not of(m.effects, ReleaseSlot)
    m.send(HooksFinished(after.run, Outcome.SUCCEEDED), at=MONO0 + 4)
    assert of(m.effects, ReleaseSlot) == [ReleaseSlot("E1")]
    assert logs(m.effects, "slot_released")


def test_no_slot_by_the_deadline_prepares_anyway_and_never_approves_early():
    m = slotted()
    seen(m, due_in(3600))
    deadline = MONO0 + 3600 - WINDOW_LEAD
    assert m.state.events["E1"].start_at == deadline
    assert not of(m.tick(deadline - 0.01), SpawnHooks)
    m.tick(deadline)
    assert logs(m.effects, "slot_unavailable")
    assert of(m.effects, ReleaseSlot) == [ReleaseSlot("E1")], "it stops asking"
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=deadline + 1)
    assert not of(m.effects, PostApproval)
    assert m.phase() is Phase.NOT_APPROVED
    (refused,) = logs(m.effects, "event_not_approved")
    assert refused.fields["cause"] == "slot_unavailable"
    m.send(SlotGranted("E1"), at=deadline + 2)  # too late: given back at once
    assert of(m.effects, ReleaseSlot) == [ReleaseSlot("E1")]


def test_an_event_too_close_to_not_before_starts_at_once_without_a_slot():
    m = slotted()
    seen(m, due_in(300))
    assert of(m.effects, SpawnHooks)
    assert not of(m.effects, AcquireSlot)
    assert logs(m.effects, "slot_unavailable")


def test_a_queued_event_that_leaves_or_starts_gives_its_place_back():
    m = slotted()
    seen(m, due_in(3 * 86400), due_in(3 * 86400, "E2"))
    seen(m, dataclasses.replace(due_in(3 * 86400, "E2"), status="Started"), incarnation=3)
    assert m.phase("E2") is Phase.MISSED
    assert set(of(m.effects, ReleaseSlot)) == {ReleaseSlot("E1"), ReleaseSlot("E2")}


def test_a_queued_event_whose_resources_drop_this_vm_stops_asking_for_a_slot():
    """Forgotten as not ours (judged anew: not_ours) while its slot was asked for: the slot
    is given back (the old before/after diff saw the same EventId again, not_ours, and the
    keeper went on asking for a slot for an event of another VM)."""
    m = slotted()
    seen(m, due_in(3 * 86400))
    assert m.phase() is Phase.QUEUED
    other = dataclasses.replace(due_in(3 * 86400), resources=("vm-b",))
    seen(m, other, incarnation=3, at=MONO0 + 1)
    assert m.phase() is Phase.NOT_OURS
    assert of(m.effects, ReleaseSlot) == [ReleaseSlot("E1")]


def test_types_that_do_not_obey_windows_take_no_slot():
    m = slotted()
    seen(m, due_in(3 * 86400, "F", "Freeze"))
    assert of(m.effects, SpawnHooks)
    assert not of(m.effects, AcquireSlot)


def test_a_restart_asks_again_for_a_held_slot_and_a_lost_one_is_queued_for_anew():
    """Its before-hooks were cut off by the stop: a slot that went to another VM meanwhile
    is asked for anew, and they wait in the queue for it (review of issue 26: before, the
    slot was given up and the hooks ran at once beside the VM that held it)."""
    m = slotted()
    seen(m, due_in(3 * 86400))
    m.send(SlotGranted("E1"), at=MONO0 + 1)
    held = m.state.events["E1"]
    assert held.slot.value == "held"
    again = Machine(m.state.config, loaded={"E1": held}, now=MONO0 + 10)
    (ask,) = of(again.effects, AcquireSlot)
    assert ask.event.event_id == "E1"
    again.send(SlotBusy("E1", ("vm-b",)), at=MONO0 + 11)
    assert again.state.events["E1"].slot.value == "asked"
    assert not of(again.effects, ReleaseSlot)
    seen(again, due_in(3 * 86400), at=MONO0 + 12)
    assert again.phase() is Phase.QUEUED
    assert not of(again.effects, SpawnHooks)


def _requeued(**overrides):
    """E1's before-hooks started holding its slot, then the daemon restarted: it is queued
    again, taking its slot back before they run again."""
    events = {**EVENTS, "Reboot": EventRule(("drain",), ("undrain",), ("undrain",))}
    m = slotted(events=events, **overrides)
    seen(m, due_in(3 * 86400))
    m.send(SlotGranted("E1"), at=MONO0 + 1)
    assert [s.stage.value for s in of(m.effects, SpawnHooks)] == ["before"]
    again = Machine(m.state.config, loaded=engine.durable_events(m.state.events), now=MONO0 + 10)
    seen(again, due_in(3 * 86400), at=MONO0 + 12)
    assert again.phase() is Phase.QUEUED
    return again


def test_a_requeued_event_that_leaves_gets_its_cancelled_hooks():
    """Its before-hooks had started: it is owed its cancelled-hooks (before, it was forgotten
    as never prepared: no undrain ran)."""
    m = _requeued()
    seen(m, incarnation=3, at=MONO0 + 13)
    assert [s.stage.value for s in of(m.effects, SpawnHooks)] == ["cancelled"]
    assert logs(m.effects, "event_cancelled")


def test_a_requeued_event_that_starts_gets_its_after_hooks_once_over():
    """Not `missed` (its hooks had started before the restart): done, after-hooks once over."""
    m = _requeued()
    started = dataclasses.replace(due_in(3 * 86400), status="Started")
    seen(m, started, incarnation=3, at=MONO0 + 13)
    assert m.phase() is Phase.DONE
    assert not logs(m.effects, "event_missed")
    seen(m, incarnation=4, at=MONO0 + 14)
    assert [s.stage.value for s in of(m.effects, SpawnHooks)] == ["after"]


def test_a_requeued_event_granted_its_slot_outside_its_window_goes_on():
    """Its preparation started in its window: the slot taken back later is not given back to
    wait for the next window (the node it drained, its hooks cut off, would wait days)."""
    m = _requeued(windows=(window("11:00", "12:00:05"),))  # open at first sight, closed at 13 s
    m.send(SlotBusy("E1", ("vm-b",)), at=MONO0 + 13)  # another VM's now: asked for anew
    m.send(SlotGranted("E1"), at=MONO0 + 14)
    assert [s.stage.value for s in of(m.effects, SpawnHooks)] == ["before"]
    assert not of(m.effects, ReleaseSlot)


def test_slot_busy_for_a_queued_event_after_a_restart_is_recorded_not_an_internal_error():
    """Issue 26 #14: after a restart a QUEUED event waits for the next document to place its
    deadline (start_at=inf); a SlotBusy then raised OverflowError (internal_error) and the
    status never showed the holders."""
    m = slotted()
    seen(m, due_in(3 * 86400))
    assert m.phase() is Phase.QUEUED
    again = Machine(m.state.config, loaded={"E1": m.state.events["E1"]}, now=MONO0 + 10)
    assert again.state.events["E1"].start_at == float("inf")
    again.send(SlotBusy("E1", ("vm-b",)), at=MONO0 + 11)
    (waiting,) = logs(again.effects, "event_waiting")
    assert waiting.fields["holders"] == ["vm-b"]
    assert waiting.fields["hooks_start_at"] is None, "placed by the next document"
    status = Observer(WALL0).document(again.state, WALL0 + 11, HealthFrom.DETECTED)
    assert status["concurrency"]["last_seen_holders"] == ["vm-b"]
    seen(again, due_in(3 * 86400), at=MONO0 + 12)  # the next document places the deadline
    assert again.state.events["E1"].start_at == MONO0 + 3 * 86400 - WINDOW_LEAD


def test_a_wall_clock_step_places_the_slot_deadline_again():
    """Issue 26 #15: the wall clock 1 h behind at first sight, then corrected: the slot deadline
    stayed an hour late (only windowed waits were placed again), so the hooks did not start
    even at NotBefore. Every timer taken from the wall clock follows the step."""
    m = slotted()
    behind = 3600.0
    m.send(DocumentFetched(doc(due_in(2 * 3600)), WALL0 - behind), at=MONO0)
    assert m.phase() is Phase.QUEUED
    assert m.state.events["E1"].start_at == MONO0 + 2 * 3600 + behind - WINDOW_LEAD
    m.send(DocumentFetched(doc(due_in(2 * 3600)), WALL0 + 10), at=MONO0 + 10)  # corrected
    assert logs(m.effects, "clock_moved")
    deadline = MONO0 + 2 * 3600 - WINDOW_LEAD
    assert m.state.events["E1"].start_at == deadline
    assert not of(m.tick(deadline - 0.01), SpawnHooks)
    assert of(m.tick(deadline), SpawnHooks), "no slot by the deadline: hooks start anyway"
    assert logs(m.effects, "slot_unavailable")


def test_a_slot_granted_after_the_window_closed_is_given_back_until_the_next_window():
    """Issue 28, windows and slots together: the window 02:00-05:00 opens, the Reboot asks for
    the slot and waits; the slot comes at 05:30, after the window closed. Before, its
    before-hooks started then (`_slot_granted` prepared whenever the slot came); now the slot
    is given back and the event waits for the next window, where it asks again and starts."""
    m = slotted(windows=(window("02:00", "05:00"),))
    seen(m, due_in(3 * 86400))  # Thursday 12:00; NotBefore Sunday 12:00
    opens = mono("2026-11-27T02:00")
    assert m.state.events["E1"].start_at == opens
    m.tick(opens)
    assert m.phase() is Phase.QUEUED
    assert of(m.effects, AcquireSlot)
    m.send(SlotBusy("E1", ("vm-b",)), at=opens + 60)
    effects = m.send(SlotGranted("E1"), at=mono("2026-11-27T05:30"))
    assert not of(effects, SpawnHooks), "no before-hooks outside the window"
    assert of(effects, ReleaseSlot) == [ReleaseSlot("E1")], "the slot given back at once"
    assert not logs(effects, "slot_acquired")
    (waiting,) = logs(effects, "event_waiting")
    assert waiting.fields["reason"] == "window"
    assert waiting.fields["hooks_start_at"] == "2026-11-28T02:00:00Z"
    assert m.phase() is Phase.WAITING
    assert m.state.events["E1"].slot.value == ""
    following = mono("2026-11-28T02:00")
    assert m.wake() == following
    assert not of(m.tick(following - 0.01), AcquireSlot)
    assert of(m.tick(following), AcquireSlot), "asked for again when the next window opens"
    assert m.phase() is Phase.QUEUED
    m.send(SlotGranted("E1"), at=following + 5)
    assert logs(m.effects, "slot_acquired")
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=following + 10)
    assert of(m.effects, PostApproval), "holding its slot, prepared in the window: early"


def test_a_slot_granted_after_the_last_window_that_opens_too_late_waits_for_the_lead():
    """The next window opens after the lead (too late to prepare in): the slot granted after
    the window closed is given back and the hooks wait for the lead, as the window gate says
    for any event; a slot granted inside a window is kept (its hooks start at once)."""
    m = slotted(windows=(window("02:00", "05:00", days=[4, 6]),))  # fri, sun
    seen(m, due_in(3 * 86400 - 35700))  # NotBefore Sunday 02:05: Sunday's window too late
    opens = mono("2026-11-27T02:00")
    m.tick(opens)
    assert m.phase() is Phase.QUEUED
    m.send(SlotGranted("E1"), at=mono("2026-11-27T06:00"))
    assert m.phase() is Phase.WAITING
    (waiting,) = logs(m.effects, "event_waiting")
    assert waiting.fields["reason"] == "start_before"
    lead = mono("2026-11-29T02:05") - WINDOW_LEAD
    assert m.state.events["E1"].start_at == lead
    assert of(m.tick(lead), AcquireSlot)
    m.send(SlotGranted("E1"), at=lead + 1)
    assert of(m.effects, SpawnHooks), "at the lead the slot is kept whatever the window"


def test_a_slot_granted_inside_the_window_starts_the_hooks_at_once():
    m = slotted(windows=(window("02:00", "05:00"),))
    seen(m, due_in(3 * 86400))
    opens = mono("2026-11-27T02:00")
    m.tick(opens)
    m.send(SlotGranted("E1"), at=mono("2026-11-27T04:59"))
    assert of(m.effects, SpawnHooks)
    assert not of(m.effects, ReleaseSlot)


# ---- faster than 1 Hz ----------------------------------------------------------------------


def test_at_4_hz_polls_and_approvals_stay_within_imds_rate_limit():
    """IMDS refuses a sixth request in a second (429), approvals included: at 4 Hz an approval
    waits at most for the oldest poll of the second to leave the window, and no request is
    refused (as the server counts, with up to 15 ms of latency jitter)."""
    m = Machine(
        config(metadata=Metadata(poll_interval=0.25), approve=ApprovePolicy.ALWAYS), now=MONO0
    )
    sent: list[tuple[float, str]] = []
    approved_at = hooks_done = None
    ordered = None  # the poll lane: a new order replaces one whose instant has not come
    t = MONO0
    pending = list(m.effects)
    while t < MONO0 + 6:
        while pending:
            effect = pending.pop(0)
            if isinstance(effect, Fetch):
                ordered = effect.at
            elif isinstance(effect, CancelFetch):
                ordered = None
            elif isinstance(effect, SpawnHooks):
                hooks_done = m.now + 0.005
                pending += m.send(HooksFinished(effect.run, Outcome.SUCCEEDED), at=hooks_done)
            elif isinstance(effect, PostApproval):
                sent.append((m.now, "approval"))
                approved_at = approved_at or m.now
                pending += m.send(ApprovalSent(effect.event.event_id), at=m.now)
        if ordered is not None and ordered <= t + 0.01:
            at, ordered = max(ordered, m.now), None
            sent.append((at, "poll"))
            events = (due_in(3600),) if at >= MONO0 + 2 else ()
            answer = DocumentFetched(
                doc(*events, incarnation=2 if events else 1), WALL0 + at - MONO0
            )
            pending += m.send(answer, at=at)
            t = at
        else:
            t = max(t + 0.01, m.now)
            pending += m.tick(round(t, 3))
    # IMDS counts arrivals: with 1 to 15 ms of latency (the margin is 20 ms), never more than 5
    # in a trailing second.
    arrivals = sorted(at + (0.001 if i % 2 else 0.015) for i, (at, _) in enumerate(sent))
    busiest = max(sum(1 for u in arrivals if a - 1.0 < u <= a) for a in arrivals)
    assert busiest <= 5
    assert approved_at is not None
    assert approved_at - (MONO0 + 2) < 0.3, "the approval went out with the next poll's answer"
    assert approved_at - hooks_done <= 0.25, "an approval waits at most one poll's place"
    assert sum(1 for _, kind in sent if kind == "poll") >= 3.5 * 5, "nearly 4 polls a second"


def test_at_4_hz_an_approval_takes_the_place_of_the_poll_ordered_for_later():
    """The polls alone fill IMDS' 5 requests a second at 4 Hz: the approval that is due goes
    at once, the poll ordered for later is cancelled, and the next is ordered after it."""
    m = Machine(
        config(metadata=Metadata(poll_interval=0.25), approve=ApprovePolicy.ALWAYS), now=MONO0
    )
    (fetch,) = of(m.effects, Fetch)
    for k in range(8):  # two seconds of polls: the rate limit's window is full of them
        events = (due_in(3600),) if k == 7 else ()
        answer = DocumentFetched(doc(*events, incarnation=2 if events else 1), WALL0 + k / 4)
        m.send(answer, at=fetch.at + 0.004)
        (fetch,) = of(m.effects, Fetch)
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=m.now + 0.05)
    kinds = [type(e) for e in m.effects if isinstance(e, (CancelFetch, PostApproval, Fetch))]
    assert kinds == [CancelFetch, PostApproval, Fetch], "cancelled, approved, then ordered again"
    (again,) = of(m.effects, Fetch)
    assert again.at > fetch.at, "the poll moved behind the approval"
    window = [t for t in m.state.sent if t > again.at - engine.RATE_WINDOW]
    assert len(window) <= engine.IMDS_RATE


def test_a_queued_event_whose_status_becomes_unknown_keeps_the_loop_polling():
    """Issue 26 #16: `before: []`, queued for a slot, then EventStatus Completed with NotBefore
    cleared. Its deadline became now and the move queued -> done was undeclared: the document
    was refused whole and its poll stayed "in flight", so no poll was ordered again (a Preempt
    posted later was never seen). Now it is decided (done, its slot given back) and the next
    poll is ordered; a Preempt in the next document is detected."""
    m = slotted(events={**EVENTS, "Reboot": EventRule((), ("undrain",)), "Preempt": EventRule(())})
    seen(m, due_in(3 * 86400))
    assert m.phase() is Phase.QUEUED
    done = dataclasses.replace(due_in(3 * 86400), status="Completed", not_before=None)
    seen(m, done, incarnation=3, at=MONO0 + 1)
    assert not logs(m.effects, "transition_refused")
    assert m.phase() is Phase.DONE
    assert ReleaseSlot("E1") in of(m.effects, ReleaseSlot)
    (fetch,) = of(m.effects, Fetch)
    assert fetch.at <= MONO0 + 2, "the next poll is ordered on time"
    preempt = dataclasses.replace(due_in(30, "E2", "Preempt"))
    seen(m, done, preempt, incarnation=4, at=fetch.at)
    assert logs(m.effects, "event_detected")[0].fields["event_id"] == "E2"
    assert of(m.effects, Fetch)


def test_a_refused_document_still_orders_the_next_poll():
    """Whatever transition a document breaks, the loop never stops polling: the refused
    message releases its poll as a faulted one does (issue 26 #16's wedge)."""
    m = slotted(events={**EVENTS, "Reboot": EventRule((), ("undrain",))})
    m.state = dataclasses.replace(m.state, strict=False)
    seen(m, due_in(3 * 86400))
    broken = dict(lifecycle.TABLE)
    del lifecycle.TABLE[(Phase.QUEUED, engine.On.LISTED)]  # type: ignore[attr-defined]
    try:
        seen(m, due_in(3 * 86400 + 60), incarnation=3, at=MONO0 + 1)
    finally:
        lifecycle.TABLE.clear()  # type: ignore[attr-defined]
        lifecycle.TABLE.update(broken)  # type: ignore[attr-defined]
    assert logs(m.effects, "transition_refused")
    (fetch,) = of(m.effects, Fetch)
    assert MONO0 + 1 < fetch.at <= MONO0 + 1 + engine.POLL_BACKOFF_CAP
    assert m.state.poll.in_flight_since == fetch.at
    (wake,) = of(m.effects, engine.WakeAt)
    assert wake.at >= MONO0 + 1 + engine.POLL_BACKOFF_CAP, "never a busy loop on a due timer"


def test_a_timer_that_raises_again_after_a_fault_still_leaves_a_poll_ordered():
    """The daemon drops a step that raises and feeds Faulted; if the Faulted step's own timers
    raised too, it dropped that as well: the poll stayed in flight, the wake-up in the past, and
    the loop spun without polling. Now the poll is ordered, and the next wake-up waits the poll
    backoff's cap; the watchdog is still pinged."""
    cfg = config(events=EVENTS, approve=ApprovePolicy.ALWAYS)
    m = Machine(cfg, now=MONO0, watchdog_usec=10_000_000)
    seen(m, due_in(3 * 86400))
    m.state = dataclasses.replace(m.state, strict=False)
    broken = window_gate._start_waiting

    def start_waiting(state, now, out):
        raise RuntimeError("a timer that raises")

    window_gate._start_waiting = start_waiting
    at = MONO0 + 6  # the watchdog (every 5 s) is due
    try:
        answer = DocumentFetched(doc(due_in(3 * 86400), incarnation=3), WALL0 + at - MONO0)
        with pytest.raises(RuntimeError):
            engine.step(m.state, answer, at)  # the daemon logs it, then:
        m.send(engine.Faulted("step DocumentFetched", "RuntimeError", answer), at=at)
    finally:
        window_gate._start_waiting = broken
    (fetch,) = of(m.effects, Fetch)
    assert fetch.at <= at + engine.POLL_BACKOFF_CAP
    (wake,) = of(m.effects, engine.WakeAt)
    assert wake.at >= at + engine.POLL_BACKOFF_CAP, "no busy loop"
    assert {"WATCHDOG": "1"} in [n.fields for n in of(m.effects, engine.Notify)]


# ---- a slot asked for at the lead ----------------------------------------------------------

LEAD_900 = {**EVENTS, "Reboot": EventRule(("drain",), ("undrain",), start_before=900)}


def at_the_lead():
    """start_before 900 and concurrency, NotBefore 1 h away: the event waits for its lead."""
    m = slotted(events=LEAD_900)
    seen(m, due_in(3600))
    assert m.phase() is Phase.WAITING
    lead_at = MONO0 + 3600 - 900
    m.tick(lead_at)
    return m, lead_at


def test_with_start_before_the_slot_is_asked_for_at_the_lead_and_a_grant_approves_early():
    """The slot deadline is the lead itself, so the old engine never asked (deadline > now was
    false when the lead came): slot_unavailable at once, never approved early. Now the slot is
    asked for at the lead, the hooks wait for etcd's answer, and a grant lets it be approved."""
    m, lead_at = at_the_lead()
    (ask,) = of(m.effects, AcquireSlot)
    assert ask.event.event_id == "E1"
    assert m.phase() is Phase.QUEUED
    assert not logs(m.effects, "slot_unavailable")
    assert not of(m.effects, SpawnHooks), "the hooks wait for etcd's answer"
    m.send(SlotGranted("E1"), at=lead_at + 0.05)
    (spawn,) = of(m.effects, SpawnHooks)
    assert spawn.hooks == ("drain",)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=lead_at + 1)
    assert of(m.effects, PostApproval), "holding its slot, it is approved early"


def test_a_slot_asked_for_at_the_lead_waits_only_the_grace_and_documents_do_not_extend_it():
    m, lead_at = at_the_lead()
    assert m.state.events["E1"].start_at == lead_at + engine.SLOT_GRACE
    for second in range(1, int(engine.SLOT_GRACE)):  # polls go on meanwhile
        seen(m, due_in(3600), incarnation=2, at=lead_at + second)
        assert not of(m.effects, SpawnHooks)
    assert m.state.events["E1"].start_at == lead_at + engine.SLOT_GRACE
    m.tick(lead_at + engine.SLOT_GRACE)
    assert logs(m.effects, "slot_unavailable")
    (spawn,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(spawn.run, Outcome.SUCCEEDED), at=lead_at + 10)
    assert not of(m.effects, PostApproval)
    assert m.phase() is Phase.NOT_APPROVED


def test_every_slot_taken_at_the_lead_starts_the_hooks_at_once_without_one():
    m, lead_at = at_the_lead()
    m.send(SlotBusy("E1", ("vm-b",)), at=lead_at + 0.05)
    assert logs(m.effects, "slot_unavailable")
    assert of(m.effects, SpawnHooks), "no wait for the rest of the grace"
    assert of(m.effects, ReleaseSlot) == [ReleaseSlot("E1")]


def test_a_slot_asked_for_long_before_the_lead_keeps_the_lead_as_deadline():
    """Without start_before the slot is asked for at first sight; SlotBusy then changes
    nothing: the deadline stays the lead (the grace is only for a slot asked at the lead)."""
    m = slotted()
    seen(m, due_in(3600))
    m.send(SlotBusy("E1", ("vm-b",)), at=MONO0 + 1)
    assert m.state.events["E1"].start_at == MONO0 + 3600 - WINDOW_LEAD
    assert not of(m.effects, SpawnHooks)
