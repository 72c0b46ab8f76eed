"""A shared event whose NotBefore moves days later while the VMs wait for each other (three real
daemons, a real 3-member etcd, one simulator): the waiting VMs stop waiting, take their `ready`
back and run their cancelled-hooks (the node is not kept drained for days); the VM whose
before-hook was still running does the same once it ends, without ever writing `ready`; nobody
is approved. At the new lead they all prepare again and coordinate again for the same EventId:
approved only once every VM's hook ran again (engine/postponed.py)."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from scheduledeventsd.simulators.azure import rfc1123
from tests.conftest import wait_for
from tests.system.test_fleet import VMS, Fleet, approvals, etcd_settings
from tests.system.test_shared_keys import of_event

pytestmark = pytest.mark.xdist_group(name="etcd")

LEAD = 20  # start_before, in seconds
DAY = 86400


@pytest.fixture
def fleet(tmp_path, sim, hooks, cluster):
    f = Fleet(tmp_path, sim, hooks)
    f.coordination = etcd_settings(cluster, f)
    yield f
    f.stop()


def start_with_a_lead(fleet, sleeps):
    """Each VM: `prepare` (sleeping as given) before, `undo` when cancelled, start_before LEAD."""
    undo = fleet.hooks.make(
        "undo", 'echo "$SCHEDULED_EVENT_VM_NAME $SCHEDULED_EVENT_STAGE" >> "$OUT/undone"'
    )
    for vm, sleep in zip(VMS, sleeps):
        cfg = fleet.config(vm, fleet.coordination, sleep)
        cfg["hooks"]["undo"] = [{"command": [undo]}]
        cfg["events"]["Reboot"] = {
            "before": ["prepare"],
            "cancelled": ["undo"],
            "start_before": LEAD,
        }
        fleet.start(vm, cfg)


def undone(fleet):
    path = fleet.hooks.out / "undone"
    return sorted(path.read_text().splitlines()) if path.exists() else []


def test_vms_waiting_for_a_peer_when_notbefore_moves_days_later_undo_and_coordinate_again(
    cluster, fleet, sim
):
    """vm-c's before-hook takes 4 s; vm-a and vm-b wait for it (their ready in etcd) when the
    NotBefore moves 3 days later. Every VM logs event_cancelled (phase coordinating), runs its
    cancelled-hook; the event's keys go; nobody is approved; each waits for its new lead. When
    NotBefore comes near again, all three prepare again and are approved only after vm-c's hook
    ran again. Before: vm-a and vm-b kept waiting, drained, and vm-c's ready approved the event
    for all three as soon as its hook ended (a maintenance 3 days away)."""
    start_with_a_lead(fleet, (0.1, 0.3, 4.0))
    event_id = sim.add_event("Reboot", list(VMS), not_before_in=LEAD - 5)  # within the lead
    prefix = f"{fleet.prefix}/events/{event_id}/"
    wait_for(lambda: len(of_event(cluster, fleet, event_id)) == 2, 10, "vm-a's, vm-b's ready")
    assert sorted(of_event(cluster, fleet, event_id)) == [prefix + "vm-a", prefix + "vm-b"]
    moved = time.time() + 3 * DAY
    sim.update_event(event_id, NotBefore=rfc1123(moved))
    fleet.daemons["vm-c"].wait_log("hook_finished", timeout=15, hook="prepare")
    fleet.daemons["vm-a"].polls_seen(sim, count=4)
    assert not approvals(sim, event_id), "vm-c's ready approved a maintenance 3 days away"
    cancelled = {vm: fleet.daemons[vm].wait_log("event_cancelled", timeout=10) for vm in VMS}
    for vm, note in cancelled.items():
        assert note["phase"] == "coordinating", vm
        assert note["moved_s"] > 3 * DAY - 2 * LEAD, vm
        assert abs(wall_of(note["hooks_start_at"]) - (int(moved) - LEAD)) <= 1, "its new lead"
    wait_for(lambda: len(undone(fleet)) == 3, 10, "the three cancelled-hooks")
    assert undone(fleet) == [f"{vm} cancelled" for vm in VMS]
    wait_for(lambda: not of_event(cluster, fleet, event_id), 10, "the readies to be taken back")
    for vm in VMS:  # judged anew: each waits for its new lead
        fleet.daemons[vm].wait_log("event_waiting", timeout=10, event_id=event_id)
    fleet.daemons["vm-a"].polls_seen(sim, count=8)
    assert not approvals(sim, event_id), "approved while every VM had undone its preparation"
    assert sorted(fleet.runs()) == list(VMS), "prepared once each, not again before the lead"
    assert not fleet.daemons["vm-c"].logs("peers_waiting"), "vm-c never wrote its ready"

    # Time passes: the new NotBefore is near. Its lead comes 8 s from now.
    near = time.time() + LEAD + 8
    sim.update_event(event_id, NotBefore=rfc1123(near))
    wait_for(lambda: approvals(sim, event_id), 30, "the approval at the new lead")
    assert sorted(fleet.runs()) == sorted(VMS * 2), "each VM prepared again"
    again = {vm: fleet.done_at(vm) for vm in VMS}
    assert min(again.values()) >= near - LEAD - 1, "not before the new lead"
    first = min(a.at for a in approvals(sim, event_id))
    assert first >= max(again.values()), "approved before every VM's hook ran again"
    for vm in VMS:
        fleet.daemons[vm].wait_log("event_status_changed", timeout=10)  # Started for each


def wall_of(iso):
    """A logged instant (`hooks_start_at`) as a wall time."""
    return (
        dt.datetime.strptime(iso, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp()
    )
