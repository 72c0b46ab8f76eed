"""An operator's levers on a real 3-member etcd: `scheduledeventsd fleet` shows who holds a
group's slots and who waits (text and JSON), exits 1 while a VM whose daemon stopped for its
maintenance still holds its slot, `fleet free VM` lets the next VM go (logged by the CLI and by
the freed VM's daemon, which never takes the slot back for that event), a free of nothing or
without etcd exits 2 and touches nothing, and /metrics shows each group's held slots and max."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest
import requests

from scheduledeventsd.coordination import fleet as fleet_keys
from scheduledeventsd.coordination.etcd import KeyValue
from tests.conftest import cli, wait_for
from tests.etcd_cluster import free_ports
from tests.system.test_fleet import keys
from tests.system.test_slots import Tier, long_drain

pytestmark = pytest.mark.xdist_group(name="etcd")


@pytest.fixture
def tier(tmp_path, sim, hooks, cluster):
    """Daemons of group `web` (test_slots.Tier), and vm-x's configuration for the CLI."""
    t = Tier(tmp_path, sim, hooks, cluster)
    t.config("vm-x")
    yield t
    t.stop()


def fleet(tier, *args: str):
    """`scheduledeventsd fleet ARGS` with vm-x's configuration (a VM of the group, no event)."""
    path = tier.factories["vm-x"].write_config(tier.config("vm-x"), "fleet.yaml")
    return cli("fleet", "--config", str(path), *args, timeout=60)


def holding(tier, hooks, vm: str, seconds: float, **extra):
    """vm's daemon with a drain of `seconds`: it holds the slot that long."""
    daemon = tier.start(vm, long_drain(tier, hooks, tier.config(vm, **extra), seconds))
    event_id = tier.sim.add_event("Reboot", [vm], not_before_in=3600)
    daemon.wait_log("slot_acquired", event_id=event_id, timeout=15)
    return daemon, event_id


def test_fleet_shows_the_holder_alive_and_the_waiter_with_why_in_text_and_json(tier, sim, hooks):
    _, first = holding(tier, hooks, "vm-1", 15)
    two = tier.start("vm-2", tier.config("vm-2"))
    second = sim.add_event("Reboot", ["vm-2"], not_before_in=3600)
    two.wait_log("event_waiting", event_id=second, reason="slot")

    shown = fleet(tier)
    assert shown.returncode == 0, shown.stderr
    assert "group web: 1 of 1 slot(s) held" in shown.stdout
    held = next(line for line in shown.stdout.splitlines() if "held    slot 0" in line)
    assert "vm-1" in held
    assert first in held
    assert "daemon alive" in held
    waiting = next(line for line in shown.stdout.splitlines() if "waiting vm-2" in line)
    assert second in waiting
    assert "every slot of web is held" in waiting

    as_json = fleet(tier, "--json")
    assert as_json.returncode == 0, as_json.stderr
    (group,) = json.loads(as_json.stdout)["groups"]
    assert (group["group"], group["max"], group["held"]) == ("web", 1, 1)
    (holder,) = group["holders"]
    assert (holder["vm"], holder["event"], holder["alive"]) == ("vm-1", first, True)
    assert 0 < holder["ends_in"] <= 30, "the daemon's own lease: ttl"
    (waiter,) = group["waiting"]
    assert (waiter["vm"], waiter["event"]) == ("vm-2", second)
    assert json.loads(as_json.stdout)["down"] == []


def test_a_holder_is_shown_since_it_took_the_slot_and_its_status_names_it_a_holder(
    tier, sim, hooks
):
    """vm-2 waits while vm-1 drains for 6 s, then takes the slot: `fleet` shows it holding
    since then, and vm-2's `status` names it as the holder. On the old code the slot key's
    `at` was stamped when vm-2's worker began to wait (`since` was the waiting mark's own
    instant, seconds before it held anything), and `status` said "last seen holders vm-1",
    the holder when it was refused, while vm-2 held the slot."""
    holding(tier, hooks, "vm-1", 6)
    cfg = long_drain(tier, hooks, tier.config("vm-2"), 10)
    two = tier.start("vm-2", cfg)
    second = sim.add_event("Reboot", ["vm-2"], not_before_in=3600)
    two.wait_log("event_waiting", event_id=second, reason="slot")
    (group,) = json.loads(fleet(tier, "--json").stdout)["groups"]
    (waiter,) = group["waiting"]
    two.wait_log("slot_acquired", event_id=second, timeout=30)
    (group,) = json.loads(fleet(tier, "--json").stdout)["groups"]
    (holder,) = group["holders"]
    assert (holder["vm"], holder["event"]) == ("vm-2", second)
    waited = _instant(holder["since"]) - _instant(waiter["since"])
    assert waited > 2, (waiter["since"], holder["since"])  # vm-1 drained 6 s meanwhile
    path = tier.factories["vm-2"].write_config(cfg, "status.yaml")
    shown = wait_for(
        lambda: (
            (s := cli("status", "--config", str(path))).stdout.count(f"held for {second}") and s
        ),
        10,
        "vm-2's status written since it took the slot",
    )
    (line,) = [x for x in shown.stdout.splitlines() if x.startswith("concurrency:")]
    assert line.endswith(f"held for {second}; last seen holders vm-2"), line


def _instant(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_a_holder_stopped_for_its_maintenance_is_named_and_freeing_it_lets_the_next_go(
    tier, sim, hooks
):
    """vm-1 holds the slot, is approved, and its daemon stops (the reboot it approved): its
    slot stays under the hand-over lease, its daemon silent: `fleet` exits 1 naming it. `fleet
    free vm-1` frees it (slot_freed_by_operator), vm-2 takes it; vm-1's daemon started again
    says slot_freed_by_operator and does not take a slot back for that event."""
    sim.scenario.started_for = None  # its event stays (Started) while the VM is "down"
    cfg = tier.config("vm-1", ttl=6)
    one = tier.start("vm-1", cfg)
    first = sim.add_event("Reboot", ["vm-1"], not_before_in=3600)
    one.wait_log("event_approved", event_id=first, timeout=15)
    assert one.stop() == 0
    two = tier.start("vm-2", tier.config("vm-2", ttl=6))
    second = sim.add_event("Reboot", ["vm-2"], not_before_in=3600)
    two.wait_log("event_waiting", event_id=second, reason="slot")

    shown = fleet(tier)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    down = next(line for line in shown.stdout.splitlines() if line.startswith("DOWN"))
    assert "vm-1" in down
    assert "fleet free vm-1" in down
    held = next(line for line in shown.stdout.splitlines() if "held    slot 0" in line)
    assert "daemon SILENT" in held

    freed = fleet(tier, "free", "vm-1")
    assert freed.returncode == 0, freed.stderr
    assert freed.stdout.startswith("slot_freed_by_operator vm=vm-1 group=web slot=0")
    assert first in freed.stdout
    two.wait_log("slot_acquired", event_id=second, timeout=10)
    assert fleet(tier).returncode == 0, "nobody down any more"

    again = tier.start("vm-1", cfg)
    said = again.wait_log("slot_freed_by_operator", event_id=first, timeout=15)
    assert said["group"] == "web"
    assert "@" in said["by"]
    again.polls_seen(sim)
    assert not again.logs("slot_acquired"), "never taken back for that event"
    (slot,) = [v for k, v in keys(tier.cluster, f"{tier.prefix}/slots/").items()]
    assert slot["vm"] == "vm-2"


def test_a_slot_freed_under_a_live_daemon_is_noticed_and_logged_there(tier, sim, hooks):
    """The freed VM's daemon (draining, alive) notices within a renewal (ttl/3), logs
    slot_freed_by_operator, is not approved early, and the waiting VM takes the slot."""
    one, first = holding(tier, hooks, "vm-1", 20, ttl=6)
    two = tier.start("vm-2", tier.config("vm-2", ttl=6))
    second = sim.add_event("Reboot", ["vm-2"], not_before_in=3600)
    two.wait_log("event_waiting", event_id=second, reason="slot")
    freed = fleet(tier, "free", "vm-1", "--group", "web")
    assert freed.returncode == 0, freed.stderr
    said = one.wait_log("slot_freed_by_operator", event_id=first, timeout=10)
    assert said["level"] == "warning"
    two.wait_log("slot_acquired", event_id=second, timeout=10)
    refused = one.wait_log("event_not_approved", event_id=first, timeout=30)
    assert refused["cause"] == "slot_unavailable"
    assert not [a for a in sim.approvals if a.event_id == first]


def test_freeing_a_vm_that_holds_nothing_exits_2_and_touches_nothing(tier, sim, hooks):
    holding(tier, hooks, "vm-1", 10)
    before = keys(tier.cluster, tier.prefix)
    for args in (("free", "vm-2"), ("free", "vm-1", "--group", "db")):
        refused = fleet(tier, *args)
        assert refused.returncode == 2, refused.stdout
        assert "holds no slot" in refused.stderr
        assert "nothing freed" in refused.stderr
        assert "Traceback" not in refused.stderr
    after = keys(tier.cluster, tier.prefix)
    assert {k: v for k, v in after.items() if "/daemons/" not in k} == {
        k: v for k, v in before.items() if "/daemons/" not in k
    }


def test_etcd_unreachable_exits_2_with_one_line_and_no_traceback(tier):
    tier.cluster.kill()
    for args in ((), ("--json",), ("free", "vm-1")):
        started = time.monotonic()
        answer = fleet(tier, *args)
        assert answer.returncode == 2, (args, answer.stdout, answer.stderr)
        lines = answer.stderr.strip().splitlines()
        assert len(lines) == 1, answer.stderr
        assert lines[0].startswith("error: etcd at "), answer.stderr
        assert "unreachable" in lines[0]
        assert answer.stdout == ""
        assert time.monotonic() - started < 30


def test_metrics_show_the_groups_held_slots_and_max_from_each_vm(tier, sim, hooks):
    """vm-2 holds nothing; its /metrics says web has 1 slot of 1 held (vm-1's), then 0."""
    (port,) = free_ports(1)
    one, first = holding(tier, hooks, "vm-1", 3)
    two = tier.start("vm-2", tier.config("vm-2", http={"listen": f"127.0.0.1:{port}"}))
    two.wait_log("http_listening")

    def sample(name: str) -> float:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        line = next((x for x in text.splitlines() if x.startswith(f'{name}{{group="web"}}')), "")
        return float(line.split()[-1]) if line else -1.0

    assert sample("scheduledeventsd_group_slots_max") == 1.0
    wait_for(lambda: sample("scheduledeventsd_group_slots_held") == 1.0, 10, "1 held")
    one.wait_log("slot_released", event_id=first, timeout=30)
    wait_for(lambda: sample("scheduledeventsd_group_slots_held") == 0.0, 10, "0 held")


def test_only_a_silent_holder_whose_hold_outlives_ttl_counts_as_down():
    """A daemon killed outside a maintenance leaves its slot under its own lease (within
    `ttl`): not a VM still down. One stopped for its maintenance leaves it under its lease of
    hold_max (longer): down. A live daemon's never. (The keys as etcd returns them; no etcd.)"""
    root = "/p/"

    def slot(n: int, vm: str, lease: str) -> KeyValue:
        return KeyValue(f"{root}slots/web/{n}", fleet_keys.encode({"vm": vm, "event": "E"}), lease)

    kvs = [
        slot(0, "killed", "1"),
        slot(1, "stopped", "2"),
        slot(2, "alive", "3"),
        KeyValue(f"{root}daemons/alive", fleet_keys.encode({"vm": "alive"}), "3"),
    ]
    times = {"1": (25, 30), "2": (800, 3600), "3": (29, 30)}  # (left, granted)
    view = fleet_keys._view(root, kvs, times, {"web": 3}, ttl=30)
    assert [(group, h.vm) for group, h in view.down()] == [("web", "stopped")]
    (web,) = view.groups
    assert [(h.vm, h.alive) for h in web.holders] == [
        ("killed", False),
        ("stopped", False),
        ("alive", True),
    ]
