"""A prepared event whose NotBefore moves later by more than its lead (Google Cloud moves its
upcoming window) is not left prepared, its node drained, for the whole delay
(engine/postponed.py): its cancelled-hooks run (after the node's restore), then it is judged
anew and waits for its new lead, where it is prepared again. A move within the lead, or of an
event nothing would hold back, changes nothing. Fake clock."""

from __future__ import annotations

import dataclasses
import datetime as dt

from scheduledeventsd.config import EventRule
from scheduledeventsd.config.provider import Provider
from scheduledeventsd.engine import (
    ClusterRestored,
    DocumentFetched,
    DrainNode,
    HooksFinished,
    Outcome,
    Phase,
    RestoreNode,
    SpawnHooks,
)
from scheduledeventsd.providers.gcp import UPCOMING_ID
from tests.engine.test_engine import Machine, config, doc, logs, of
from tests.engine.test_engine_cluster import MARK, drained, due_in, machine

HOUR = 3600.0
LEAD = HOUR
REDEPLOY = EventRule(("drain",), cancelled=("undrain",), start_before=LEAD)
EVENTS = {"Redeploy": REDEPLOY}
WALL0 = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.timezone.utc).timestamp()
MONO0 = 100.0


def window_at(seconds):
    """Google Cloud's upcoming window, `seconds` after WALL0 (its fixed EventId)."""
    event = due_in(seconds, UPCOMING_ID, "Redeploy")
    return dataclasses.replace(event, provider="gcp")


def gcp():
    return Machine(config(events=EVENTS, provider=Provider.GCP), now=MONO0)


def seen(m, *events, incarnation, at):
    return m.send(DocumentFetched(doc(*events, incarnation=incarnation), WALL0 + at - MONO0), at=at)


def prepared(m, first):
    """Seen within its lead: the drain hook ran, and it proceeds at NotBefore (no approval)."""
    (before,) = of(seen(m, first, incarnation=2, at=MONO0), SpawnHooks)
    assert before.hooks == ("drain",)
    m.send(HooksFinished(before.run, Outcome.SUCCEEDED), at=MONO0 + 1)
    assert m.phase(UPCOMING_ID) is Phase.NOT_APPROVED


def test_a_window_moved_days_later_runs_the_cancelled_hooks_then_waits_for_its_new_lead():
    """Before: the window moved 3 days later, and nothing happened: the node stayed drained
    (its drain hook's work) for 3 days until the maintenance."""
    m = gcp()
    prepared(m, window_at(30 * 60))
    moved = window_at(3 * 86400)
    (undrain,) = of(seen(m, moved, incarnation=3, at=MONO0 + 60), SpawnHooks)
    assert (undrain.stage.value, undrain.hooks) == ("cancelled", ("undrain",))
    assert undrain.event.not_before == moved.not_before
    (cancelled,) = logs(m.effects, "event_cancelled")
    assert cancelled.fields["stage"] == "cancelled"
    assert cancelled.fields["hooks_start_at"] == "2026-11-29T11:00:00Z", "its new lead"
    assert "moved 257400 s later" in cancelled.fields["reason"]
    m.send(HooksFinished(undrain.run, Outcome.SUCCEEDED), at=MONO0 + 61)
    assert UPCOMING_ID not in m.state.events, "forgotten: judged anew at the next poll"
    seen(m, moved, incarnation=3, at=MONO0 + 62)  # the same answer again
    assert logs(m.effects, "event_detected")
    assert not of(m.effects, SpawnHooks), "not prepared again before its new lead"
    assert m.phase(UPCOMING_ID) is Phase.WAITING
    lead_at = MONO0 + 3 * 86400 - LEAD
    assert m.state.events[UPCOMING_ID].start_at == lead_at
    (again,) = of(m.tick(lead_at), SpawnHooks)
    assert (again.stage.value, again.hooks) == ("before", ("drain",))


def test_a_window_moved_later_within_the_lead_keeps_the_event_prepared():
    """Moved by less than its lead: no churn (undrain, drain again); it stays prepared."""
    m = gcp()
    prepared(m, window_at(30 * 60))
    seen(m, window_at(30 * 60 + LEAD - 60), incarnation=3, at=MONO0 + 60)
    assert not of(m.effects, SpawnHooks)
    assert not logs(m.effects, "event_cancelled")
    assert m.phase(UPCOMING_ID) is Phase.NOT_APPROVED


def test_without_a_lead_or_a_window_a_moved_event_stays_prepared():
    """No start_before and no windows: its hooks run when it is first seen, however far away
    NotBefore is, so a move changes nothing (it would be prepared again at once)."""
    m = Machine(
        config(
            events={"Redeploy": EventRule(("drain",), cancelled=("undrain",))},
            provider=Provider.GCP,
        ),
        now=MONO0,
    )
    prepared(m, window_at(30 * 60))
    seen(m, window_at(3 * 86400), incarnation=3, at=MONO0 + 60)
    assert not of(m.effects, SpawnHooks)
    assert m.phase(UPCOMING_ID) is Phase.NOT_APPROVED


def test_a_failed_preparation_moved_days_later_is_prepared_again_at_its_new_lead():
    """Its drain hook failed: it proceeds at NotBefore unprepared. Moved days later, it gets its
    cancelled-hooks and a second chance at its new lead."""
    m = gcp()
    (before,) = of(seen(m, window_at(30 * 60), incarnation=2, at=MONO0), SpawnHooks)
    m.send(HooksFinished(before.run, Outcome.FAILED), at=MONO0 + 1)
    assert m.phase(UPCOMING_ID) is Phase.HOOKS_FAILED
    (undrain,) = of(seen(m, window_at(2 * 86400), incarnation=3, at=MONO0 + 60), SpawnHooks)
    assert undrain.stage.value == "cancelled"


def test_a_pacemaker_node_is_restored_before_the_cancelled_hooks_and_drained_again_later():
    """With `cluster.pacemaker`: the node's restore first (not standby for 3 days), its
    cancelled-hooks on the answer, then the drain again at the new lead."""
    rule = EventRule(("drain",), cancelled=("undrain",), start_before=LEAD)
    m = machine(events={"Reboot": rule}, config={"provider": Provider.GCP})
    first, moved = due_in(30 * 60), due_in(3 * 86400)
    m.send(DocumentFetched(doc(first), WALL0), at=MONO0)
    assert of(m.effects, DrainNode)
    (before,) = of(drained(m, "E1"), SpawnHooks)
    m.send(HooksFinished(before.run, Outcome.SUCCEEDED), at=MONO0 + 1)
    assert m.phase() is Phase.NOT_APPROVED
    m.send(DocumentFetched(doc(moved, incarnation=3), WALL0 + 60), at=MONO0 + 60)
    assert of(m.effects, RestoreNode) == [RestoreNode("E1", MARK)]
    assert not of(m.effects, SpawnHooks), "no hook before the node is restored"
    (undrain,) = of(m.send(ClusterRestored("E1"), at=MONO0 + 61), SpawnHooks)
    assert undrain.stage.value == "cancelled"
    m.send(HooksFinished(undrain.run, Outcome.SUCCEEDED), at=MONO0 + 62)
    m.send(DocumentFetched(doc(moved, incarnation=3), WALL0 + 63), at=MONO0 + 63)
    assert m.phase() is Phase.WAITING
    assert not of(m.effects, DrainNode)
    m.tick(MONO0 + 3 * 86400 - LEAD)
    assert of(m.effects, DrainNode), "drained again at its new lead"
