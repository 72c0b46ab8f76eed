"""A reviewer's attacks on shared events and the hold lease, with a real 3-member etcd, real
daemons and real hooks (tests/system/test_fleet.py's Fleet)."""

from __future__ import annotations

import signal
import time

import pytest

from tests.conftest import wait_for
from tests.system.test_fleet import Fleet, approvals, etcd_settings, keys
from tests.system.test_hold import TTL, held_config, lease_count, slot_holder, stamps
from tests.system.test_slots import Tier, slot_lease_left
from tests.tcp_proxy import ProxySet

pytestmark = pytest.mark.xdist_group(name="etcd")


@pytest.fixture
def fleet2(tmp_path, sim, hooks):
    f = Fleet(tmp_path, sim, hooks)
    # The hook sleeps what `$OUT/<vm>.sleep` says when it runs (changed between rounds).
    f.hook = hooks.make(
        "prepare",
        's=$(cat "$OUT/$SCHEDULED_EVENT_VM_NAME.sleep" 2>/dev/null || echo 0)\n'
        'sleep "$s"\n'
        'date +%s.%N > "$OUT/$SCHEDULED_EVENT_VM_NAME.done"\n',
    )
    yield f
    f.stop()


def test_a_shared_event_back_under_its_id_waits_for_every_vms_new_ready(cluster, fleet2, sim):
    """An event that left while vm-b's ready was written and came back under the same EventId
    is approved only once vm-b's hooks ran again: vm-b's ready from before it left is not this
    time's (on main it stayed on vm-b's daemon lease and vm-a approved at once, while vm-b's
    before-hooks still ran)."""
    fleet, out = fleet2, fleet2.hooks.out
    (out / "vm-a.sleep").write_text("30")
    for vm in ("vm-a", "vm-b"):
        fleet.start(vm, fleet.config(vm, etcd_settings(cluster, fleet)))
    event_id = sim.add_event("Reboot", ["vm-a", "vm-b"], not_before_in=600)
    marks = f"{fleet.prefix}/events/{event_id}/"
    wait_for(lambda: "vm-b" in str(keys(cluster, marks)), 15, "vm-b's ready")
    sim.remove_event(event_id)
    for vm in ("vm-a", "vm-b"):
        fleet.daemons[vm].wait_log("event_cancelled", timeout=10)
    (out / "vm-a.sleep").write_text("0")
    (out / "vm-b.sleep").write_text("6")
    (out / "vm-b.done").unlink()
    sim.add_event("Reboot", ["vm-a", "vm-b"], event_id=event_id, not_before_in=600)
    wait_for(lambda: approvals(sim, event_id), 20, "the approval")
    done = out / "vm-b.done"
    assert done.exists(), "approved while vm-b's before-hooks still ran"
    assert min(a.at for a in approvals(sim, event_id)) >= float(done.read_text())


@pytest.fixture
def tier(tmp_path, sim, hooks, cluster):
    t = Tier(tmp_path, sim, hooks, cluster)
    yield t
    t.stop()


def test_a_restart_in_the_maintenance_leaves_no_hold_lease_behind(tier, sim):
    """vm-1 approved (its slot on its hold lease), its daemon restarted before the platform
    starts the event: the new daemon takes the slot back on a hold lease of its own. The old
    one, with no key left on it, is revoked then, not left to etcd until hold_max: once vm-1's
    undrain succeeded only its daemon's lease is left. On main the old hold lease stayed (two
    leases for one daemon holding nothing, an hour by default; one more per restart)."""
    sim.scenario.start_after_approval = 600
    cfg1 = held_config(tier, "vm-1")
    one = tier.start("vm-1", cfg1)
    first = sim.add_event("Reboot", ["vm-1"], not_before_in=3600)
    one.wait_log("event_approved", event_id=first, timeout=15)
    wait_for(lambda: slot_lease_left(tier.cluster, tier.prefix) > 3000, 10, "the hold lease")
    assert one.stop() == 0
    again = tier.start("vm-1", cfg1)
    again.wait_log("slot_acquired", event_id=first, taken_back=True, timeout=15)
    sim.remove_event(first)  # over: its after-hooks run, the slot is given back
    again.wait_log("slot_released", event_id=first, timeout=15)
    # the first daemon's own lease expires within TTL; its hold lease must not outlive it
    wait_for(lambda: lease_count(tier) == 1, TTL + 5, "only the live daemon's lease")


def test_a_partition_longer_than_hold_max_says_the_slot_held_through_the_maintenance_is_lost(
    tier, sim, cluster
):
    """vm-1 approved (its slot on its hold lease), then cut off from etcd for longer than
    hold_max while its daemon lives: the hold ends and vm-2 takes the slot (hold_max bounds
    the hold). Healed, vm-1 says `slot_lost` (asked for again, held again once free). On
    main it said `slot_unavailable`, "its slot was lost while the daemon was down: not
    approved early": its daemon never was down, its event was approved, and nothing said
    the slot was lost."""
    hold_max = 12
    sim.scenario.start_after_approval = 600
    with ProxySet(tier.cluster.endpoints, host="127.0.0.2") as path:
        cfg1 = held_config(tier, "vm-1", hold_max=hold_max)
        cfg1["coordination"]["etcd"]["endpoints"] = path.endpoints
        one = tier.start("vm-1", cfg1)
        tier.start("vm-2", held_config(tier, "vm-2"))
        first = sim.add_event("Reboot", ["vm-1"], not_before_in=3600)
        one.wait_log("event_approved", event_id=first, timeout=20)
        wait_for(lambda: slot_lease_left(cluster, tier.prefix) > TTL, 10, "the hold lease")
        path.cut()
        sim.add_event("Reboot", ["vm-2"], not_before_in=3600)
        wait_for(lambda: stamps(tier, "drain", "vm-2"), hold_max + 15, "vm-2 at hold_max")
        path.restore()
        lost = one.wait_log("slot_lost", event_id=first, timeout=20)
        assert lost["level"] == "warning"
        assert not [
            r for r in one.logs("slot_unavailable", event_id=first) if "down" in r["reason"]
        ], "its daemon was never down"
        tier.stop()


def test_a_hold_max_shorter_than_a_third_of_ttl_is_renewed_in_time_while_the_daemon_lives(
    tier, sim, cluster
):
    """`hold_max: 5` with the default `ttl: 30` (both accepted; check-config only warns): the
    hold lease was renewed with the daemon's lease, every third of ttl (10 s), so it expired
    between two renewals, 5 s after the approval, while vm-1's daemon lived: the slot key
    went and vm-2 drained while vm-1 was in its maintenance. Renewed every third of the
    shorter of the two, it stays vm-1's."""
    sim.scenario.start_after_approval = 600
    cfg1 = tier.config("vm-1", ttl=30)
    cfg1["concurrency"]["hold_max"] = 5
    one = tier.start("vm-1", cfg1)
    first = sim.add_event("Reboot", ["vm-1"], not_before_in=3600)
    one.wait_log("event_approved", event_id=first, timeout=15)
    tier.start("vm-2", held_config(tier, "vm-2"))
    sim.add_event("Reboot", ["vm-2"], not_before_in=3600)
    time.sleep(12)
    assert slot_holder(tier) == ["vm-1"], "held while its daemon lives"
    assert not stamps(tier, "drain", "vm-2"), "vm-2 waits: vm-1 is in its maintenance"


def test_a_reload_removing_concurrency_in_the_maintenance_gives_the_slot_back(tier, sim):
    """vm-1 approved (its slot on its hold lease), then reloaded without `concurrency`: the
    engine says `slot_released`, and the key must go. The reload's keeper handed it over on
    the hold lease for a new keeper that never came (none without concurrency), and the daemon
    kept renewing that lease: the group's slot stayed vm-1's while its daemon lived, past
    hold_max, after `slot_released` was logged."""
    hold_max = 8
    sim.scenario.start_after_approval = 600
    cfg1 = held_config(tier, "vm-1", hold_max=hold_max)
    one = tier.start("vm-1", cfg1)
    first = sim.add_event("Reboot", ["vm-1"], not_before_in=3600)
    one.wait_log("event_approved", event_id=first, timeout=15)
    wait_for(lambda: slot_lease_left(tier.cluster, tier.prefix) > TTL, 10, "the hold lease")
    del cfg1["concurrency"]
    tier.factories["vm-1"].write_config(cfg1)
    one.signal(signal.SIGHUP)
    one.wait_log("config_reloaded")
    one.wait_log("slot_released", event_id=first, timeout=10)
    wait_for(lambda: slot_holder(tier) == [], hold_max + 4, "the slot given back")
