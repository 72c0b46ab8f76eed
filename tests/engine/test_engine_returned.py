"""An event that left the document and came back under the same EventId while its after-hooks
or its node's restore were pending is a new maintenance (engine/returned.py): once that stage
has ended (never cut short), it is judged as first seen, so it is drained, prepared and approved
again; back Started, it is missed, not silently over. Fake clock."""

from __future__ import annotations

import dataclasses

import pytest

from scheduledeventsd.config import EventRule
from scheduledeventsd.engine import (
    ApprovalSent,
    ClusterRestored,
    Drain,
    DrainNode,
    HooksFinished,
    Outcome,
    Phase,
    PostApproval,
    RestoreNode,
    SpawnHooks,
    Tracked,
)
from scheduledeventsd.engine.lifecycle import Stage
from scheduledeventsd.providers.gcp import UPCOMING_ID
from tests.engine.test_engine import Machine, config, doc, event, logs, of
from tests.engine.test_engine_cluster import EVENTS, MARK, drained, due_in, machine, seen

AFTER_HOOKS = {"Reboot": EventRule(("checkpoint",), ("resume",))}
GCP_EVENTS = {**EVENTS, "Redeploy": EventRule(("drain",), ("undrain",), ("undrain",))}


def gcp_like(seconds, status="Scheduled"):
    """Google Cloud's upcoming window: one fixed EventId, whatever maintenance it announces."""
    return dataclasses.replace(
        due_in(seconds, UPCOMING_ID, "Redeploy", status=status), provider="gcp"
    )


def approved(m):
    return [p.event.event_id for p in of(m.effects, PostApproval)]


def approved_and_left(m, first, event_id):
    """Drained, its before-hooks succeeded, approved; then it left: its node's restore asked."""
    seen(m, first)
    (before,) = of(drained(m, event_id), SpawnHooks)
    m.send(HooksFinished(before.run, Outcome.SUCCEEDED))
    assert of(m.effects, PostApproval)
    m.send(ApprovalSent(event_id))
    seen(m, incarnation=3, at=m.now + 1)
    assert of(m.effects, RestoreNode) == [RestoreNode(event_id, MARK)]
    assert m.state.events[event_id].drain is Drain.RESTORING


@pytest.mark.parametrize(
    ("first", "again"),
    [
        (due_in(600), due_in(7200)),
        (gcp_like(600), gcp_like(7200)),  # (c) a fixed id: every notice is "the same" event
    ],
    ids=["azure", "gcp-fixed-id"],
)
def test_back_scheduled_while_restoring_is_drained_prepared_and_approved_again(first, again):
    """(a), (c) Before: the restore and the after-hooks ran, then it stayed `over` while listed
    (next wake-up an hour later): the new maintenance got no drain, no hooks, no approval."""
    event_id = first.event_id
    m = machine(events=GCP_EVENTS)
    approved_and_left(m, first, event_id)
    seen(m, again, incarnation=4, at=m.now + 1)  # back, a new NotBefore
    assert not of(m.effects, DrainNode), "not while its node is being restored"
    assert not of(m.effects, SpawnHooks), "its after-hooks wait for the restore"
    (after,) = of(m.send(ClusterRestored(event_id)), SpawnHooks)
    assert after.stage.value == "after", "its stage is never cut short"
    m.send(HooksFinished(after.run, Outcome.SUCCEEDED), at=m.now + 1)
    assert not of(m.effects, DrainNode), "its after-hooks ran to the end first"
    seen(m, again, incarnation=4, at=m.now + 1)  # the next poll: judged as first seen
    assert logs(m.effects, "event_detected")
    assert of(m.effects, DrainNode), "the new maintenance drains the node again"
    assert not of(m.effects, SpawnHooks), "no hook before the cluster agrees"
    (before,) = of(drained(m, event_id), SpawnHooks)
    assert (before.stage.value, before.event.not_before) == ("before", again.not_before)
    m.send(HooksFinished(before.run, Outcome.SUCCEEDED))
    assert approved(m) == [event_id]


def test_back_scheduled_while_after_hooks_run_is_prepared_and_approved_again():
    """(b) Without a drain: it came back while its after-hooks ran. Before: over while
    listed, its new before-hooks never ran."""
    m = Machine(config(events=AFTER_HOOKS))
    m.fetched(doc(event()))
    (before,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(before.run, Outcome.SUCCEEDED), at=101)
    m.send(ApprovalSent("E1"))
    m.fetched(doc(incarnation=3), at=102)  # over: its after-hooks run
    (after,) = of(m.effects, SpawnHooks)
    assert after.stage.value == "after"
    m.fetched(doc(event(), incarnation=4), at=103)  # back while they run
    assert not of(m.effects, SpawnHooks)
    assert m.phase() is Phase.AFTER
    m.send(HooksFinished(after.run, Outcome.SUCCEEDED), at=104)
    assert "E1" not in m.state.events, "forgotten: the next document's E1 is news"
    m.fetched(doc(event(), incarnation=4), at=105)
    (again,) = of(m.effects, SpawnHooks)
    assert (again.stage.value, again.hooks) == ("before", ("checkpoint",))
    m.send(HooksFinished(again.run, Outcome.SUCCEEDED), at=106)
    assert approved(m) == ["E1"]


def test_back_started_after_it_left_is_missed_not_silently_over():
    """(d) It came back already Started while its after-hooks ran: no chance to prepare, said
    as event_missed once they end. Before: `over`, and nothing said."""
    m = Machine(config(events=AFTER_HOOKS))
    m.fetched(doc(event()))
    m.send(HooksFinished(1, Outcome.SUCCEEDED), at=101)
    m.send(ApprovalSent("E1"))
    m.fetched(doc(incarnation=3), at=102)
    (after,) = of(m.effects, SpawnHooks)
    m.fetched(doc(event(status="Started"), incarnation=4), at=103)
    m.send(HooksFinished(after.run, Outcome.SUCCEEDED), at=104)
    m.fetched(doc(event(status="Started"), incarnation=4), at=105)
    (missed,) = logs(m.effects, "event_missed")
    assert missed.fields["event_id"] == "E1"
    assert m.phase() is Phase.MISSED
    assert not of(m.effects, SpawnHooks)


def test_over_after_a_restart_and_listed_again_is_judged_at_once():
    """Its after-hooks cut off by a restart (over), it had left and is listed again: the
    state file says it left, so the first document judges it as first seen."""
    gone = event()
    loaded = {"E1": Tracked(gone, Phase.OVER, prepared=True, stage=Stage.AFTER, left=True)}
    m = Machine(loaded=loaded)
    m.fetched(doc(event(), incarnation=5))
    (before,) = of(m.effects, SpawnHooks)
    assert before.stage.value == "before"
