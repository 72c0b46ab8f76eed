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

from scheduledeventsd.simulators.azure import Scenario, Simulator, rfc1123
from tests.conftest import VM, DaemonFactory, wait_for
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


def start_with_a_lead(fleet, sleeps, undo_sleeps=(0, 0, 0)):
    """Each VM: `prepare` (sleeping as given) before, `undo` (sleeping as given, then noting
    it ran) when cancelled, start_before LEAD."""
    undo = fleet.hooks.make(
        "undo",
        'sleep "$1"\necho "$SCHEDULED_EVENT_VM_NAME $SCHEDULED_EVENT_STAGE" >> "$OUT/undone"',
    )
    for vm, sleep, undo_sleep in zip(VMS, sleeps, undo_sleeps):
        cfg = fleet.config(vm, fleet.coordination, sleep)
        cfg["hooks"]["undo"] = [{"command": [undo, str(undo_sleep)]}]
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


@pytest.fixture
def late_sim():
    """A second simulator, for vm-c: the same event, its document changed later than vm-a's
    and vm-b's (as the conftest's `sim`)."""
    simulator = Simulator(
        Scenario(vm_name=VM, start_after_approval=0.5, started_for=1.0), rate_limit=False
    )
    simulator.start()
    yield simulator
    simulator.stop()


def test_a_vm_that_sees_the_move_later_is_not_approved_on_the_others_readies_from_before(
    tmp_path, cluster, fleet, sim, late_sim
):
    """vm-a and vm-b wait for vm-c's 4 s hook when their document moves NotBefore 3 days later;
    vm-c's document moves only later (it sees the move after its hook ended). Their cancelled-
    hooks take 6 s, yet their readies are taken back at once: vm-c writes its ready and waits
    for vm-a and vm-b, and nobody is approved. Once vm-c sees the move it takes its ready back
    and runs its cancelled-hook too; at the new lead all three are approved, after vm-c's hook
    ran again. Before: vm-a and vm-b kept waiting, and vm-c's ready approved all three. (With
    only the delete once the cancelled-hooks end, vm-c's ready completed the set meanwhile.)"""
    fleet.factories["vm-c"] = DaemonFactory(tmp_path / "vm-c", late_sim)
    start_with_a_lead(fleet, (0.1, 0.3, 4.0), undo_sleeps=(6, 6, 0))
    event_id = sim.add_event("Reboot", list(VMS), not_before_in=LEAD - 5)
    late_sim.add_event("Reboot", list(VMS), event_id=event_id, not_before_in=LEAD - 5)
    prefix = f"{fleet.prefix}/events/{event_id}/"
    wait_for(lambda: len(of_event(cluster, fleet, event_id)) == 2, 10, "vm-a's, vm-b's ready")
    moved = time.time() + 3 * DAY
    sim.update_event(event_id, NotBefore=rfc1123(moved))  # vm-a's and vm-b's document only
    for vm in VMS[:2]:
        assert fleet.daemons[vm].wait_log("event_cancelled", timeout=10)["phase"] == "coordinating"
    waiting = fleet.daemons["vm-c"].wait_log("peers_waiting", timeout=15)
    assert (waiting["ready"], waiting["waiting_for"]) == ("vm-c", "vm-a vm-b")
    assert of_event(cluster, fleet, event_id) == [prefix + "vm-c"]
    assert not undone(fleet), "their cancelled-hooks still run"
    fleet.daemons["vm-c"].polls_seen(late_sim, count=4)
    assert not approvals(sim, event_id), "approved on readies taken back"
    assert not approvals(late_sim, event_id), "approved on readies taken back"

    late_sim.update_event(event_id, NotBefore=rfc1123(moved))  # vm-c sees the move now
    note = fleet.daemons["vm-c"].wait_log("event_cancelled", timeout=10)
    assert note["phase"] == "coordinating"
    wait_for(lambda: len(undone(fleet)) == 3, 15, "the three cancelled-hooks")
    wait_for(lambda: not of_event(cluster, fleet, event_id), 10, "vm-c's ready taken back")
    near = time.time() + LEAD + 8
    for simulator in (sim, late_sim):
        simulator.update_event(event_id, NotBefore=rfc1123(near))
    wait_for(lambda: approvals(sim, event_id) and approvals(late_sim, event_id), 30, "approval")
    again = {vm: fleet.done_at(vm) for vm in VMS}
    assert min(again.values()) >= near - LEAD - 1, "not before the new lead"
    first = min(a.at for a in [*approvals(sim, event_id), *approvals(late_sim, event_id)])
    assert first >= max(again.values()), "approved before every VM's hook ran again"
