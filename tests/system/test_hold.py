"""A slot held through the whole maintenance (issue 28), with a real 3-member etcd, a daemon per
VM, one simulator and real hook processes: `max: 1`, vm-1 approved and its daemon stopped
(its maintenance) for 3x `ttl`; nobody else starts while it is away; back on a new boot, the
event gone, its undrain succeeds and vm-2 starts at once; never back, vm-2 starts at
`hold_max`, not before; its undrain failing keeps the slot until a retry succeeds. And one
etcd lease per live daemon, whatever the number of its events."""

from __future__ import annotations

import subprocess
import time
import uuid

import pytest

from tests.conftest import wait_for
from tests.system.test_lifecycle import boot_wrapper, needs_root
from tests.system.test_slots import Tier, slot_lease_left

pytestmark = pytest.mark.xdist_group(name="etcd")
TTL = 5


@pytest.fixture
def tier(tmp_path, sim, hooks, cluster):
    t = Tier(tmp_path, sim, hooks, cluster)
    yield t
    t.stop()


def stamps(tier: Tier, hook: str, vm: str) -> list[float]:
    path = tier.out / f"{hook}.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [float(at) for who, at in (line.split() for line in lines) if who == vm]


def held_config(tier: Tier, vm: str, hold_max: int = 3600, after_retry: float = 60):
    cfg = tier.config(vm, ttl=TTL)
    cfg["concurrency"].update(hold_max=hold_max, after_retry=after_retry)
    return cfg


def away_after_approval(tier: Tier, sim, tmp_path, cfg1):
    """vm-1 takes the slot and is approved, its daemon stopped as for its reboot (the event
    then Starts and leaves the document while it is down); vm-2's Reboot waits for the slot.
    Returns vm-2's event, the boot id file and the wrapper that fakes vm-1's boot."""
    sim.scenario.start_after_approval = 2.0  # Started, then gone, after vm-1's daemon stopped
    boot, wrapper = boot_wrapper(tmp_path)
    one = tier.factories["vm-1"].start(cfg1, prefix=wrapper)
    two = tier.start("vm-2", held_config(tier, "vm-2"))
    first = sim.add_event("Reboot", ["vm-1"], not_before_in=3600)
    one.wait_log("slot_acquired", event_id=first, timeout=15)
    second = sim.add_event("Reboot", ["vm-2"], not_before_in=3600)
    two.wait_log("event_waiting", event_id=second, reason="slot", timeout=15)
    one.wait_log("event_approved", event_id=first, timeout=15)
    assert one.stop() == 0
    assert one.logs("slot_held", event_id=first), "the stop holds the slot"
    wait_for(lambda: sim.approved(first) and first not in sim.event_ids(), 15, "vm-1's event over")
    return second, boot, wrapper


@needs_root
def test_a_slot_is_held_while_its_vm_is_away_and_handed_on_as_its_undrain_succeeds(
    tier, sim, tmp_path
):
    cfg1 = held_config(tier, "vm-1")
    second, boot, wrapper = away_after_approval(tier, sim, tmp_path, cfg1)
    assert slot_lease_left(tier.cluster, tier.prefix) > 3000, "under hold_max, not ttl"
    stopped = time.time()
    time.sleep(3 * TTL)  # the maintenance, three times the ttl: a daemon's lease would be gone
    assert not stamps(tier, "drain", "vm-2"), "nobody else starts while vm-1 is away"
    boot.write_text(f"{uuid.uuid4()}\n")  # vm-1 comes back on a new boot
    back = tier.factories["vm-1"].start(cfg1, prefix=wrapper)
    back.wait_log("after_hooks_finished", timeout=15)
    wait_for(lambda: stamps(tier, "drain", "vm-2"), 10, "vm-2's before-hooks")
    undrained = stamps(tier, "undrain", "vm-1")[-1]
    started = stamps(tier, "drain", "vm-2")[0]
    assert stopped + 3 * TTL <= undrained < started, "vm-2 only after vm-1's undrain"
    assert started - undrained < 2, f"vm-2 started {started - undrained:.2f} s after it"
    wait_for(lambda: sim.approved(second), 15, "vm-2 approved early, holding the slot")


def test_a_vm_that_never_returns_lets_the_next_one_go_at_hold_max_not_before(tier, sim, tmp_path):
    hold_max = 20
    cfg1 = held_config(tier, "vm-1", hold_max=hold_max)
    sim.scenario.start_after_approval = 2.0
    one = tier.start("vm-1", cfg1)
    two = tier.start("vm-2", held_config(tier, "vm-2"))
    first = sim.add_event("Reboot", ["vm-1"], not_before_in=3600)
    one.wait_log("slot_acquired", event_id=first, timeout=15)
    second = sim.add_event("Reboot", ["vm-2"], not_before_in=3600)
    two.wait_log("event_waiting", event_id=second, reason="slot", timeout=15)
    one.wait_log("event_approved", event_id=first, timeout=15)
    assert one.stop() == 0
    stopped = time.time()
    wait_for(lambda: stamps(tier, "drain", "vm-2"), hold_max + 15, "vm-2's before-hooks")
    started = stamps(tier, "drain", "vm-2")[0]
    assert started >= stopped + hold_max - 1, f"vm-2 started {started - stopped:.1f} s after"
    assert started <= stopped + hold_max + 5, f"vm-2 started {started - stopped:.1f} s after"


def test_a_terminated_vm_frees_its_slot_as_it_goes(tier, sim):
    """A Terminate (taking slots with `window: true`) approved: vm-1 does not come back, so its
    stop gives the slot back at once and vm-2 starts within seconds, not at hold_max."""
    cfg1 = held_config(tier, "vm-1")
    cfg1["events"] = {"Terminate": {"before": ["drain"], "window": True}}
    sim.scenario.start_after_approval = 600
    one = tier.start("vm-1", cfg1)
    two = tier.start("vm-2", held_config(tier, "vm-2"))
    first = sim.add_event("Terminate", ["vm-1"], not_before_in=3600)
    one.wait_log("slot_acquired", event_id=first, timeout=15)
    second = sim.add_event("Reboot", ["vm-2"], not_before_in=3600)
    two.wait_log("event_waiting", event_id=second, reason="slot", timeout=15)
    one.wait_log("event_approved", event_id=first, timeout=15)
    assert one.stop() == 0
    stopped = time.time()
    assert one.logs("slot_released", event_id=first)
    wait_for(lambda: stamps(tier, "drain", "vm-2"), 10, "vm-2's before-hooks")
    assert stamps(tier, "drain", "vm-2")[0] - stopped < 3


@needs_root
def test_an_undrain_that_fails_keeps_the_slot_held_until_a_retry_succeeds(
    tier, sim, hooks, tmp_path
):
    healthy = tmp_path / "healthy"
    undrain = hooks.make(
        "undrain-flaky",
        'echo "$SCHEDULED_EVENT_VM_NAME $(date +%s.%N)" >> "$OUT/tries.log"\n'
        f"test -e {healthy} || exit 1\n"
        'echo "$SCHEDULED_EVENT_VM_NAME $(date +%s.%N)" >> "$OUT/undrain.log"',
    )
    cfg1 = held_config(tier, "vm-1", after_retry=2)
    cfg1["hooks"]["undrain"] = [{"command": [undrain]}]
    _, boot, wrapper = away_after_approval(tier, sim, tmp_path, cfg1)
    boot.write_text(f"{uuid.uuid4()}\n")
    back = tier.factories["vm-1"].start(cfg1, prefix=wrapper)
    failed = back.wait_log("after_hooks_failed", timeout=15)
    assert failed["retry_in_s"] == 2
    wait_for(lambda: len(stamps(tier, "tries", "vm-1")) >= 3, 15, "two retries")
    time.sleep(TTL)
    assert not stamps(tier, "drain", "vm-2"), "held while vm-1 is not healthy"
    assert not back.logs("slot_released")
    healthy.write_text("")
    wait_for(lambda: stamps(tier, "drain", "vm-2"), 10, "vm-2's before-hooks")
    assert stamps(tier, "drain", "vm-2")[0] > stamps(tier, "undrain", "vm-1")[0]
    assert back.logs("slot_released")


def lease_count(tier: Tier) -> int:
    listed = subprocess.run(
        ["etcdctl", "--endpoints", ",".join(tier.cluster.endpoints), "lease", "list"],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    ).stdout
    return int(listed.splitlines()[0].split()[1])


def test_one_lease_per_live_daemon_whatever_the_number_of_its_events(tier, sim, hooks):
    """Two daemons, each holding a slot (a long drain) and marking two shared events ready:
    two leases in etcd, not one per slot and per mark (was six)."""
    slow = hooks.make("slow", "exec sleep 60")
    daemons = {}
    for vm in ("vm-a", "vm-b"):
        cfg = tier.config(vm, most=2, ttl=TTL, shutdown_grace=1)
        cfg["approve"] = "all"
        cfg["hooks"]["drain"] = [{"command": [slow], "timeout": 120}]
        cfg["events"]["Freeze"] = []
        daemons[vm] = tier.start(vm, cfg)
    sim.scenario.start_after_approval = 600
    for vm in ("vm-a", "vm-b"):
        event_id = sim.add_event("Reboot", [vm], not_before_in=3600)
        daemons[vm].wait_log("slot_acquired", event_id=event_id, timeout=15)
    shared = [sim.add_event("Freeze", ["vm-a", "vm-b"], not_before_in=900) for _ in range(2)]
    for event_id in shared:
        for daemon in daemons.values():
            daemon.wait_log("event_approved", event_id=event_id, timeout=15)
    assert lease_count(tier) == 2
