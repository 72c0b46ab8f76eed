"""The approver's lane against the IMDS simulator on loopback: an approval the engine withdrew
(WithdrawApproval) while it waited behind a slow POST is not sent; one asked for again is."""

from __future__ import annotations

import functools
import queue

from scheduledeventsd.engine import ApprovalFailed, ApprovalSent
from scheduledeventsd.providers.imds import ImdsClient
from scheduledeventsd.runtime.lanes import Lane, Withdrawn, approve
from scheduledeventsd.simulators.azure import Fault
from tests.conftest import VM, wait_for


def _submit(lane, withdrawn, event_id):
    lane.submit(
        functools.partial(approve, event_id=event_id, deadline=None, withdrawn=withdrawn),
        lambda detail: ApprovalFailed(event_id, "internal", detail),
    )


def test_a_withdrawn_approval_queued_behind_a_slow_post_is_not_sent(sim):
    """A's POST is slow (IMDS delays it 1 s); B, queued behind it, is withdrawn meanwhile: B is
    answered "withdrawn" and IMDS never sees it, A (on the wire) is sent. Asked for again
    (the mark discarded, as the daemon does for a new PostApproval), B is sent."""
    inbox = queue.SimpleQueue()
    lane = Lane("test-approve", inbox, ImdsClient(sim.url, "2020-07-01", 5.0, 5.0))
    withdrawn = Withdrawn()
    a = sim.add_event("Freeze", [VM], not_before_in=3600)
    b = sim.add_event("Freeze", [VM], not_before_in=3600)
    sim.add_fault(Fault("delay", delay=1.0, method="POST", count=1))
    try:
        _submit(lane, withdrawn, a)
        _submit(lane, withdrawn, b)
        wait_for(lambda: any(r.method == "POST" for r in sim.requests), what="A's POST")
        withdrawn.add(b)
        first, second = inbox.get(timeout=10), inbox.get(timeout=10)
        assert (type(first), first.event_id) == (ApprovalSent, a)
        assert (type(second), second.event_id, second.kind) == (ApprovalFailed, b, "withdrawn")
        assert [x.event_id for x in sim.approvals] == [a], "B was never POSTed"
        withdrawn.discard(b)
        _submit(lane, withdrawn, b)
        again = inbox.get(timeout=10)
        assert (type(again), again.event_id) == (ApprovalSent, b)
        assert sim.approved(b)
    finally:
        lane.stop()
