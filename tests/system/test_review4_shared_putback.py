"""Review of the put-back of a shared event waiting for its peers (merge 0549f7d), against
three real daemons and a real 3-member etcd: histories where a VM is approved before every VM
named said `ready` for its current preparation. Each defect was a strict xfail until fixed."""

from __future__ import annotations

import signal
import time

import pytest

from scheduledeventsd.simulators.azure import rfc1123
from tests.conftest import DaemonFactory, wait_for
from tests.system.test_fleet import VMS, approvals, etcd_settings
from tests.system.test_shared_keys import of_event
from tests.system.test_shared_postponed import (  # noqa: F401 - fixtures
    DAY,
    LEAD,
    fleet,
    late_sim,
    undone,
)
from tests.tcp_proxy import ProxySet

pytestmark = pytest.mark.xdist_group(name="etcd")


def start_each(f, sleeps, coordination, undo_sleeps=(0, 0, 0)):
    """As test_shared_postponed.start_with_a_lead, a VM's `coordination` as given (else the
    fleet's): `prepare` before, `undo` (sleeping as given, then noting it ran) when cancelled,
    start_before LEAD; their configs, by VM."""
    undo = f.hooks.make(
        "undo",
        'sleep "$1"\necho "$SCHEDULED_EVENT_VM_NAME $SCHEDULED_EVENT_STAGE" >> "$OUT/undone"',
    )
    configs = {}
    for vm, sleep, undo_sleep in zip(VMS, sleeps, undo_sleeps):
        cfg = f.config(vm, coordination.get(vm, f.coordination), sleep)
        cfg["hooks"]["undo"] = [{"command": [undo, str(undo_sleep)]}]
        cfg["events"]["Reboot"] = {
            "before": ["prepare"],
            "cancelled": ["undo"],
            "start_before": LEAD,
        }
        f.start(vm, cfg)
        configs[vm] = cfg
    return configs


def test_a_vm_cut_off_from_etcd_when_it_sees_the_move_is_not_counted_ready_while_restored(
    tmp_path,
    cluster,
    fleet,  # noqa: F811 - the fixture
    sim,
    late_sim,  # noqa: F811 - the fixture
):
    """vm-a (its etcd through a proxy) and vm-b wait for vm-c's 4 s hook. vm-a's etcd is cut
    (connections refused), then vm-a's document moves NotBefore 3 days later (vm-b's and
    vm-c's not yet: their own simulator). vm-a puts the event back: its withdraw and its
    ForgetShared cannot reach etcd, and its `ready` from before the move stays there (until
    its lease expires: ttl, 30 s), so when vm-c's hook ends, vm-c's ready completes the set:
    vm-b and vm-c approve the event (for every VM, vm-a too). The promise: nobody approved
    while a VM named is not prepared; so vm-a's node is not restored (its cancelled-hook, the
    undrain, does not run) before etcd confirmed its ready deleted; etcd back, it is. Before:
    vm-a's undrain ran at once, and the others were approved on its ready while restored."""
    fleet.factories["vm-b"] = DaemonFactory(tmp_path / "vm-b", late_sim)
    fleet.factories["vm-c"] = DaemonFactory(tmp_path / "vm-c", late_sim)
    with ProxySet(cluster.endpoints, host="127.0.0.2") as path:
        proxied = {"etcd": {**etcd_settings(cluster, fleet)["etcd"], "endpoints": path.endpoints}}
        start_each(fleet, (0.1, 0.3, 4.0), {"vm-a": proxied})
        event_id = sim.add_event("Reboot", list(VMS), not_before_in=15)
        late_sim.add_event("Reboot", list(VMS), event_id=event_id, not_before_in=15)
        wait_for(lambda: len(of_event(cluster, fleet, event_id)) == 2, 10, "vm-a's, vm-b's ready")
        path.cut(reset=True)
        sim.update_event(event_id, NotBefore=rfc1123(time.time() + 3 * DAY))  # vm-a's only
        note = fleet.daemons["vm-a"].wait_log("event_cancelled", timeout=10)
        assert note["phase"] == "coordinating"
        assert note["waits_for"] == "etcd"
        keys = of_event(cluster, fleet, event_id)
        assert any(k.endswith("/vm-a") for k in keys), "its ready from before still there"
        fleet.daemons["vm-c"].wait_log("hook_finished", timeout=15, hook="prepare")
        fleet.daemons["vm-c"].polls_seen(late_sim, count=8)
        assert approvals(late_sim, event_id), "approved on vm-a's ready from before"
        assert undone(fleet) == [], "vm-a's node not restored while its ready counts"
        path.restore()
        unmarked = fleet.daemons["vm-a"].wait_log("event_unmarked", timeout=40)
        assert "etcd confirmed" in unmarked["reason"]
        wait_for(lambda: undone(fleet) == ["vm-a cancelled"], 10, "vm-a's cancelled-hook")
        assert not any(k.endswith("/vm-a") for k in of_event(cluster, fleet, event_id))
        fleet.stop()


def test_a_vm_killed_during_the_put_back_prepares_again_at_the_new_lead(
    cluster,
    fleet,  # noqa: F811 - the fixture
    sim,
):
    """NotBefore moves 3 days later while vm-a and vm-b wait for vm-c's hook: all three put
    the event back. vm-a's daemon is killed (-9), then started again, while its 6 s
    cancelled-hook runs. When NotBefore comes near again, vm-b and vm-c prepare again and write
    `ready`; vm-a must too (before-hooks at its lead, `ready`), and the event is approved. On
    main vm-a's event was cut off (after_hooks_interrupted, OVER) and OVER listed stays OVER:
    vm-a never prepares, the others wait drained until NotBefore, nobody approves, and the
    maintenance comes with vm-a's node neither prepared nor (its undo cut off) restored. A
    SIGTERM lets a 6 s hook end (shutdown_grace): that restart passes."""
    configs = start_each(fleet, (0.1, 0.3, 4.0), {}, undo_sleeps=(6, 0, 0))
    event_id = sim.add_event("Reboot", list(VMS), not_before_in=LEAD - 5)
    wait_for(lambda: len(of_event(cluster, fleet, event_id)) == 2, 10, "vm-a's, vm-b's ready")
    sim.update_event(event_id, NotBefore=rfc1123(time.time() + 3 * DAY))
    fleet.daemons["vm-a"].wait_log("hook_started", timeout=10, hook="undo")
    fleet.daemons["vm-a"].signal(signal.SIGKILL)
    fleet.daemons["vm-a"].stop()
    fleet.start("vm-a", configs["vm-a"])
    wait_for(lambda: {"vm-b cancelled", "vm-c cancelled"} <= set(undone(fleet)), 15, "undone")
    wait_for(lambda: not of_event(cluster, fleet, event_id), 40, "the readies taken back")
    fleet.daemons["vm-a"].polls_seen(sim, count=4)
    near = time.time() + LEAD + 8
    sim.update_event(event_id, NotBefore=rfc1123(near))
    deadline = time.time() + 30
    while len(fleet.runs()) < 6 and not approvals(sim, event_id) and time.time() < deadline:
        time.sleep(0.2)
    assert sorted(fleet.runs()) == sorted(VMS * 2), "vm-a prepared again at its new lead"
    wait_for(lambda: approvals(sim, event_id), 20, "the approval at the new lead")
