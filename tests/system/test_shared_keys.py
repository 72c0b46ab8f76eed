"""A shared event leaves no key in etcd once it is over (issue 28): three real daemons, a real
3-member etcd, one simulator. Each daemon deletes its own mark when it forgets the event, the
last one the settled key too; a daemon stopped for the maintenance does it once back. Before,
the marks lived on each daemon's one lease as long as the daemon, and `fleet` listed every
past shared event for ever."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time

import pytest

from tests.conftest import cli, wait_for
from tests.system.test_fleet import VMS, Fleet, approvals, etcd_settings, keys
from tests.tcp_proxy import ProxySet

pytestmark = pytest.mark.xdist_group(name="etcd")


@pytest.fixture
def fleet(tmp_path, sim, hooks, cluster):
    """test_fleet's three daemons (one each for vm-a, vm-b, vm-c), with etcd's settings; the
    simulator keeps a Started event listed until the test removes it."""
    sim.scenario = dataclasses.replace(sim.scenario, started_for=None)
    f = Fleet(tmp_path, sim, hooks)
    f.coordination = etcd_settings(cluster, f)
    yield f
    f.stop()


def of_event(cluster, fleet, event_id):
    """Every key under the fleet's prefix that names the event (marks, settled)."""
    return sorted(k for k in keys(cluster, fleet.prefix) if event_id in k)


def a_shared_reboot_started(fleet, sim):
    """Every daemon started, a Reboot naming the three VMs approved and Started for each."""
    fleet.start_all(fleet.coordination)
    event_id = sim.add_event("Reboot", list(VMS), not_before_in=600)
    wait_for(lambda: approvals(sim, event_id), 20, "the approval")
    for vm in VMS:
        fleet.daemons[vm].wait_log("event_status_changed", timeout=10)  # Started
    return event_id


def only_vm_cs_mark_and_settled_left(cluster, fleet, event_id):
    """Waits for vm-a's and vm-b's marks to go: vm-c's mark and settled are all that is left."""
    left = wait_for(
        lambda: (found := of_event(cluster, fleet, event_id)) and len(found) == 2 and found,
        10,
        "the two others' marks to go",
    )
    assert left == sorted(
        [f"{fleet.prefix}/events/{event_id}/vm-c", f"{fleet.prefix}/settled/{event_id}"]
    )


def shared_events(fleet, vm="vm-a"):
    """`scheduledeventsd fleet --json`'s shared events, with that VM's configuration."""
    path = fleet.factories[vm].write_config(fleet.config(vm, fleet.coordination), "fleet.yaml")
    answer = cli("fleet", "--config", str(path), "--json", timeout=60)
    assert answer.returncode == 0, answer.stderr
    return json.loads(answer.stdout)["shared_events"]


def test_a_shared_reboot_over_for_three_vms_leaves_no_key_and_fleet_lists_no_past_event(
    cluster, fleet, sim
):
    """Marks and settled are there while the event is decided (the slower VMs read them), and
    none is left once it is over for every VM; `fleet --json` lists no shared event then."""
    event_id = a_shared_reboot_started(fleet, sim)
    assert len(of_event(cluster, fleet, event_id)) == 4, "three marks and settled, decided"
    assert [e["event_id"] for e in shared_events(fleet)] == [event_id]
    sim.remove_event(event_id)  # over
    for vm in VMS:
        fleet.daemons[vm].wait_log("event_completed", timeout=10)
    wait_for(lambda: not of_event(cluster, fleet, event_id), 10, "the event's keys to go")
    assert shared_events(fleet) == []
    for vm in VMS:
        assert fleet.daemons[vm].proc.poll() is None, "deleted by live daemons, not their leases"


def test_a_daemon_stopped_for_the_maintenance_deletes_its_mark_once_back_well_before_ttl(
    cluster, fleet, sim
):
    """vm-c's daemon stops once approved and is back after the event is gone: the other two
    forgot it, vm-c's mark (on its old lease, `ttl` 30 s) and settled are still there; the
    restarted daemon forgets the event from its state file and deletes both, within seconds."""
    event_id = a_shared_reboot_started(fleet, sim)
    fleet.daemons["vm-c"].stop()
    sim.remove_event(event_id)  # over
    for vm in VMS[:2]:
        fleet.daemons[vm].wait_log("event_completed", timeout=10)
    only_vm_cs_mark_and_settled_left(cluster, fleet, event_id)
    back = time.monotonic()
    fleet.start("vm-c", fleet.config("vm-c", fleet.coordination))
    wait_for(lambda: not of_event(cluster, fleet, event_id), 10, "vm-c's mark and settled")
    assert time.monotonic() - back < 15, "not the old lease's ttl (30 s) ending"


def test_an_event_back_under_its_eventid_waits_for_every_vms_new_ready(cluster, fleet, sim):
    """The same EventId again once the first is over (Google Cloud's are fixed), vm-c's daemon
    stopped meanwhile: vm-a and vm-b are ready, vm-c never is, so nobody approves. Before, the
    first event's ready of vm-c (on its daemon's lease, 30 s) approved it as soon as vm-a's
    hooks ended."""
    event_id = a_shared_reboot_started(fleet, sim)
    sim.remove_event(event_id)
    for vm in VMS:
        fleet.daemons[vm].wait_log("event_completed", timeout=10)
    fleet.daemons["vm-c"].polls_seen(sim)  # forgotten: its after-hooks (none) have run
    fleet.daemons["vm-c"].stop()
    first, runs = len(approvals(sim, event_id)), len(fleet.runs())
    waited = len(fleet.daemons["vm-b"].logs("peers_waiting"))
    sim.add_event("Reboot", list(VMS), event_id=event_id, not_before_in=600)
    wait_for(lambda: len(fleet.runs()) == runs + 2, 10, "vm-a's and vm-b's hooks again")
    fleet.daemons["vm-a"].polls_seen(sim, count=8)
    assert len(approvals(sim, event_id)) == first, "not approved on a ready from before"
    again = fleet.daemons["vm-b"].logs("peers_waiting")[waited:]  # vm-b wrote after vm-a
    assert [w["waiting_for"] for w in again] == ["vm-c"]


def test_a_delete_etcd_did_not_answer_is_tried_again_once_it_is_back(cluster, fleet, sim):
    """vm-c is cut off from etcd (connections reset) when it forgets the event: its delete
    fails. Once etcd answers again its mark and settled go, within seconds. Before: the delete
    was tried once, and the keys stayed as long as vm-c's daemon (`fleet` listed the past event,
    and vm-c's ready from before would count for the EventId back while its hooks ran again)."""
    with ProxySet(cluster.endpoints, host="127.0.0.2") as path:
        fleet.start_all(fleet.coordination)
        cfg = fleet.config("vm-c", {"etcd": {**fleet.coordination["etcd"]}}, 1.5)
        cfg["coordination"]["etcd"]["endpoints"] = path.endpoints
        fleet.daemons["vm-c"].stop()
        fleet.start("vm-c", cfg)
        event_id = sim.add_event("Reboot", list(VMS), not_before_in=600)
        wait_for(lambda: approvals(sim, event_id), 20, "the approval")
        for vm in VMS:
            fleet.daemons[vm].wait_log("event_status_changed", timeout=10)  # Started
        path.cut(reset=True)
        sim.remove_event(event_id)  # over
        for vm in VMS:
            fleet.daemons[vm].wait_log("event_completed", timeout=10)
        only_vm_cs_mark_and_settled_left(cluster, fleet, event_id)
        fleet.daemons["vm-c"].polls_seen(sim, count=8)  # its delete tried, and failed
        assert len(of_event(cluster, fleet, event_id)) == 2
        path.restore()
        wait_for(lambda: not of_event(cluster, fleet, event_id), 15, "vm-c's mark and settled")
        assert fleet.daemons["vm-c"].proc.poll() is None, "deleted by vm-c, not its lease"


def test_an_event_back_while_a_vms_daemon_is_down_is_not_approved_on_its_ready_from_before(
    cluster, fleet, sim
):
    """vm-c's daemon stops for the maintenance, before it forgot the event: its ready stays on
    its lease (`ttl` 30 s). The event comes back under its EventId within that: vm-a and vm-b
    are ready again, vm-c is not (its daemon is down), so nobody may approve: vm-c's ready is
    older than the settled key, theirs newer. Once vm-c is ready again (its write completes the
    set), the event is approved. Before: they approved at once, on vm-c's ready
    from the first event."""
    event_id = a_shared_reboot_started(fleet, sim)
    fleet.daemons["vm-c"].stop()
    sim.remove_event(event_id)
    for vm in VMS[:2]:
        fleet.daemons[vm].wait_log("event_completed", timeout=10)
    wait_for(lambda: len(of_event(cluster, fleet, event_id)) == 2, 10, "vm-c's mark, settled")
    first = len(approvals(sim, event_id))
    sim.add_event("Reboot", list(VMS), event_id=event_id, not_before_in=600)
    fleet.daemons["vm-a"].polls_seen(sim, count=12)
    assert len(approvals(sim, event_id)) == first, "approved on vm-c's ready from before"
    # vm-c back without its state file (it knows nothing of the first event, so it prepares):
    # its new ready replaces the old one and completes the set while the settled key of the
    # first event is still there; approved then, after its before-hook.
    (fleet.hooks.out / "vm-c.done").unlink()
    shutil.rmtree(fleet.factories["vm-c"].state_dir)
    fleet.start("vm-c", fleet.config("vm-c", fleet.coordination, 1.5))
    wait_for(lambda: len(approvals(sim, event_id)) > first, 30, "the approval of the event back")
    done = fleet.hooks.out / "vm-c.done"
    assert done.exists(), "approved before vm-c's before-hook ran again"
    assert min(a.at for a in approvals(sim, event_id)[first:]) >= float(done.read_text())


def test_an_event_back_while_a_vms_after_hooks_run_waits_for_its_new_ready(
    cluster, fleet, sim, hooks
):
    """vm-c's after-hook (undrain) takes 8 s; the event, over, comes back under its EventId
    meanwhile: vm-c deletes its ready from before at once, so vm-a's and vm-b's new readies do
    not approve it; it is approved once vm-c's before-hook ran again. Before: vm-c's old ready
    stayed until its after-hook ended, and the event back was approved on it at once."""
    slow = hooks.make("undrain", 'date +%s.%N > "$OUT/undrain.started"\nsleep 8')
    for vm, sleep in zip(VMS, (0.1, 0.3, 1.5)):
        cfg = fleet.config(vm, fleet.coordination, sleep)
        if vm == "vm-c":
            cfg["hooks"]["undrain"] = [{"command": [slow]}]
            cfg["events"]["Reboot"] = {"before": ["prepare"], "after": ["undrain"]}
        fleet.start(vm, cfg)
    event_id = sim.add_event("Reboot", list(VMS), not_before_in=600)
    wait_for(lambda: approvals(sim, event_id), 20, "the approval")
    for vm in VMS:
        fleet.daemons[vm].wait_log("event_status_changed", timeout=10)  # Started
    sim.remove_event(event_id)
    for vm in VMS[:2]:
        fleet.daemons[vm].wait_log("event_completed", timeout=10)
    wait_for((hooks.out / "undrain.started").exists, 10, "vm-c's after-hook")
    first = len(approvals(sim, event_id))
    (hooks.out / "vm-c.done").unlink()
    sim.add_event("Reboot", list(VMS), event_id=event_id, not_before_in=600)
    wait_for(lambda: len(approvals(sim, event_id)) > first, 30, "the approval of the event back")
    done = hooks.out / "vm-c.done"
    assert done.exists(), "approved before vm-c's before-hook ran again"
    assert min(a.at for a in approvals(sim, event_id)[first:]) >= float(done.read_text())
