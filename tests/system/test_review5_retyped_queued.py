"""Review of fix/retyped (8686c51), end to end (the real daemon, the IMDS simulator, real hook
processes): an approval decided on the old type's hooks but still queued on the approval lane
(behind another event's slow POST) when the type change is seen goes out after it, and IMDS
approves the EventId, now the new type's, whose hooks never ran. Fixed: the engine withdraws
it (WithdrawApproval) and the lane does not send it."""

from __future__ import annotations

import time

from scheduledeventsd.simulators.azure import Fault
from tests.conftest import VM, wait_for


def test_an_approval_queued_when_the_type_changes_is_not_sent_for_the_new_type(daemons, sim, hooks):
    cfg = daemons.config(
        metadata={"timeout": 8, "first_call_timeout": 10},
        hooks={
            "quick": [{"command": [hooks.recorder("quick")]}],
            "checkpoint": [{"command": [hooks.recorder("checkpoint")]}],
            "drain": [{"command": [hooks.make("drain", "exec sleep 300")]}],
        },
        events={"Preempt": ["quick"], "Freeze": ["checkpoint"], "Reboot": ["drain"]},
    )
    daemon = daemons.start(cfg)
    sim.add_fault(Fault("delay", delay=5.0, method="POST", count=1))  # IMDS slow, once
    other = sim.add_event("Preempt", [VM], not_before_in=3600)
    wait_for(lambda: any(r.method == "POST" for r in sim.requests), what="the first POST")
    event_id = sim.add_event("Freeze", [VM], not_before_in=3 * 3600)
    wait_for(lambda: "checkpoint" in hooks.order(), what="checkpoint to run")
    time.sleep(0.3)  # its success decided: approving, queued behind the slow POST
    sim.update_event(event_id, EventType="Reboot")
    daemon.wait_log("event_type_changed", event_id=event_id, timeout=3)
    changed_at = time.monotonic()
    wait_for(lambda: sim.approved(other), timeout=10, what="the slow POST answered")
    time.sleep(1.0)
    after = [a for a in sim.approvals if a.event_id == event_id and a.monotonic > changed_at]
    assert not after, "POSTed after the change was seen: a Reboot approved on checkpoint"
