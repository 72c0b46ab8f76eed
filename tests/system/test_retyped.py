"""An EventId served again with another EventType, end to end (the real daemon, the IMDS
simulator, real hook processes): the change is logged, the old type's hooks are stopped and
undone, and the event is approved only on the hooks of its new type."""

from __future__ import annotations

import os

import pytest

from tests.conftest import VM, wait_for


def config(daemons, hooks):
    """Freeze: a checkpoint that runs until stopped (its cancelled-hook thaws); Reboot: drain."""
    checkpoint = hooks.make(
        "checkpoint",
        'echo checkpoint >> "$OUT/order"\necho $$ > "$OUT/checkpoint.pid"\nexec sleep 300',
    )
    return daemons.config(
        hooks={
            "checkpoint": [{"command": [checkpoint]}],
            "thaw": [{"command": [hooks.recorder("thaw")]}],
            "drain": [{"command": [hooks.recorder("drain")]}],
        },
        events={
            "Freeze": {"before": ["checkpoint"], "cancelled": ["thaw"]},
            "Reboot": {"before": ["drain"]},
        },
    )


def test_a_freeze_become_reboot_stops_the_freeze_hooks_and_is_approved_on_the_drain(
    daemons, sim, hooks
):
    """The reviewer's repro. Before: checkpoint (the Freeze's hook) finished and the event was
    approved as a Reboot; drain never ran, and nothing said the type had changed."""
    daemon = daemons.start(config(daemons, hooks))
    event_id = sim.add_event("Freeze", [VM], not_before_in=3 * 3600)
    wait_for((hooks.out / "checkpoint.pid").exists, what="the checkpoint hook to start")
    checkpoint_pid = int((hooks.out / "checkpoint.pid").read_text())
    sim.update_event(event_id, EventType="Reboot")
    changed = daemon.wait_log("event_type_changed", event_id=event_id)
    assert (changed["level"], changed["event_type"], changed["previous_type"]) == (
        "warning",
        "Reboot",
        "Freeze",
    )
    daemon.wait_log("hook_cancelled", event_id=event_id)
    thawed = daemon.wait_log("after_hooks_finished", event_id=event_id, stage="cancelled")
    assert thawed["event_type"] == "Freeze", "the Freeze's cancelled-hooks, for the Freeze"
    approved = daemon.wait_log("event_approved", event_id=event_id)
    assert approved["event_type"] == "Reboot"
    with pytest.raises(ProcessLookupError):
        os.kill(checkpoint_pid, 0)
    assert hooks.order() == ["checkpoint", "thaw", "drain"], "approved on the drain alone"
    assert [a.event_id for a in sim.approvals] == [event_id]
    assert len(daemon.logs("event_type_changed")) == 1, "said once"


def test_an_unhandled_type_become_reboot_is_drained_and_approved(daemons, sim, hooks):
    """Before: served first as Hibernate (no rule), it stayed `unhandled` for ever as a Reboot:
    no drain, no approval, and the status still showed Hibernate."""
    daemon = daemons.start(config(daemons, hooks))
    event_id = sim.add_event("Hibernate", [VM], not_before_in=3 * 3600)
    daemon.wait_log("event_unhandled", event_id=event_id)
    sim.update_event(event_id, EventType="Reboot")
    daemon.wait_log("event_type_changed", event_id=event_id, previous_type="Hibernate")
    approved = daemon.wait_log("event_approved", event_id=event_id)
    assert approved["event_type"] == "Reboot"
    assert hooks.order() == ["drain"]
