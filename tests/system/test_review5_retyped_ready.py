"""Review of fix/retyped (8686c51), with real etcd: a shared event's `ready` written for one
EventType must not count for the same EventId listed with another. The VM that sees the change
first deletes only its own mark; another VM that has not seen it yet (its poll later, its IMDS
failing) keeps its `ready` of the old type, and the coordinator reports it as ready. Each defect
was an xfail(strict) test, now fixed."""

from __future__ import annotations

import dataclasses

from tests.system.test_fleet import _shared_event_coordinators


def test_a_ready_written_for_the_old_type_does_not_count_for_the_new_one(cluster):
    from scheduledeventsd.engine import Coordinate, PeersChanged  # noqa: PLC0415

    _, shared, coordinators, inboxes = _shared_event_coordinators(cluster, "vm-a", "vm-b")
    shared = dataclasses.replace(shared, resources=("vm-a", "vm-b"))
    freeze = dataclasses.replace(shared, event_type="Freeze")
    reboot = dataclasses.replace(shared, event_type="Reboot")
    try:
        coordinators["vm-b"].start(Coordinate(freeze, "vm-b", True, 7))  # not seen the change
        assert inboxes["vm-b"].get(timeout=20).states == {"vm-b": "ready"}
        coordinators["vm-a"].start(Coordinate(reboot, "vm-a", True, 8))  # drain ran for it
        heard = inboxes["vm-a"].get(timeout=20)
        assert isinstance(heard, PeersChanged), heard
        assert heard.states.get("vm-b") != "ready", (
            "vm-b prepared for a Freeze (checkpoint), not for the Reboot: vm-a must wait"
        )
    finally:
        for coordinator in coordinators.values():
            coordinator.stop_all()
