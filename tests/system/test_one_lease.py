"""One etcd lease per running daemon (issue 28), at every instant, with a real 3-member etcd,
real daemons and real hooks: before, during (approved, hooks running, held through its
maintenance) and after a maintenance, whatever the number of its events. While a slot is held
through, the daemon's lease itself is one of `hold_max` (its slot, its marks and its alive mark
on it); killed -9 then, its slot stays held until hold_max while `fleet` says its daemon is
silent within `ttl` (from the lease: renewed every third of ttl, or not) and exits 1; killed
outside a maintenance it loses everything within `ttl`."""

from __future__ import annotations

import base64
import json
import signal
import time
import urllib.parse
import uuid

import pytest

from scheduledeventsd.config import Concurrency, Etcd
from scheduledeventsd.coordination import fleet as fleet_keys
from scheduledeventsd.coordination.etcd import EtcdClient, KeyValue
from tests.conftest import cli, wait_for
from tests.system.test_hold import (
    TTL,
    held_config,
    lease_count,
    slot_holder,
    stamps,
    vm2_waits_for_vm1s_approval,
)
from tests.system.test_slots import Tier

pytestmark = pytest.mark.xdist_group(name="etcd")


@pytest.fixture
def tier(tmp_path, sim, hooks, cluster):
    t = Tier(tmp_path, sim, hooks, cluster)
    t.config("vm-x")  # the CLI's VM: of the group, no event
    yield t
    t.stop()


def _post(tier: Tier, path: str, body: dict) -> dict:
    with tier.cluster.session() as session:
        answer = session.post(f"{tier.cluster.endpoints[0]}{path}", json=body, timeout=5)
        return answer.json()


def _owner(tier: Tier, key: str, value: bytes) -> str:
    """The VM a daemon's key speaks for (its name in the key, or in the value)."""
    parts = [urllib.parse.unquote(p) for p in key[len(tier.prefix) + 1 :].split("/")]
    if parts[0] in ("daemons", "waiting"):
        return parts[-1]
    said = json.loads(value)
    return str(said.get("vm", "?"))


def leases_by_vm(tier: Tier) -> dict[str, set[str]]:
    """Each VM's daemon's keys (slots, alive and waiting marks, shared-event marks): the
    leases they are on. Operators' freed marks (a lease of their own) are left out."""
    start = base64.b64encode(tier.prefix.encode()).decode()
    end = base64.b64encode(tier.prefix.encode()[:-1] + bytes([tier.prefix.encode()[-1] + 1]))
    found = _post(tier, "/v3/kv/range", {"key": start, "range_end": end.decode()})
    out: dict[str, set[str]] = {}
    for kv in found.get("kvs", []):
        key = base64.b64decode(kv["key"]).decode()
        if f"{tier.prefix}/freed/" in key:
            continue
        vm = _owner(tier, key, base64.b64decode(kv["value"]))
        out.setdefault(vm, set()).add(kv.get("lease", "0"))
    return out


def all_leases(tier: Tier) -> set[str]:
    return {lease["ID"] for lease in _post(tier, "/v3/lease/leases", {}).get("leases", [])}


def one_lease_each(tier: Tier, vms: tuple[str, ...]) -> dict[str, str]:
    """Asserts each of `vms` has exactly one lease carrying all its keys, and that etcd has no
    other lease (`etcdctl lease list` agrees); the lease of each."""
    by_vm = leases_by_vm(tier)
    assert sorted(by_vm) == sorted(vms), by_vm
    for vm, leases in by_vm.items():
        assert len(leases) == 1, f"{vm}'s keys are on {len(leases)} leases: {leases}"
    mine = {vm: next(iter(leases)) for vm, leases in by_vm.items()}
    assert all_leases(tier) == set(mine.values()), "no other lease in etcd"
    assert lease_count(tier) == len(vms)
    return mine


def granted(tier: Tier, lease: str) -> int:
    return int(_post(tier, "/v3/lease/timetolive", {"ID": lease})["grantedTTL"])


def test_one_lease_per_daemon_before_during_and_after_a_maintenance_whatever_its_events(
    tier, sim, hooks
):
    """vm-a and vm-b (`max: 2`) each hold a slot for a Reboot (hooks running), mark two shared
    Freezes ready, are approved (held through: the lease becomes one of hold_max) and then
    their Reboots end (given back: one of ttl again). At every step each daemon has one lease
    carrying all its keys, and etcd no other. On main the approval added a hold lease per
    daemon: four leases, the slot on one, the marks on the other."""
    drain = hooks.make("drain-6", "exec sleep 6")
    daemons, reboots = {}, {}
    for vm in ("vm-a", "vm-b"):
        cfg = held_config(tier, vm)
        cfg["concurrency"]["max"] = 2
        cfg["approve"] = "all"
        cfg["hooks"]["drain"] = [{"command": [drain], "timeout": 60}]
        cfg["events"]["Freeze"] = []
        daemons[vm] = tier.start(vm, cfg)
    sim.scenario.start_after_approval = 600  # approved events stay until removed
    for vm in ("vm-a", "vm-b"):
        reboots[vm] = sim.add_event("Reboot", [vm], not_before_in=3600)
    shared = [sim.add_event("Freeze", ["vm-a", "vm-b"], not_before_in=900) for _ in range(2)]
    for vm, daemon in daemons.items():
        daemon.wait_log("hook_started", event_id=reboots[vm], timeout=15)
    for event_id in shared:
        for daemon in daemons.values():
            daemon.wait_log("event_approved", event_id=event_id, timeout=15)
    running = one_lease_each(tier, ("vm-a", "vm-b"))  # hooks running, shared marks written
    assert {granted(tier, lease) for lease in running.values()} == {TTL}

    for vm, daemon in daemons.items():
        daemon.wait_log("slot_held_through", event_id=reboots[vm], timeout=20)
    held = one_lease_each(tier, ("vm-a", "vm-b"))
    assert {granted(tier, lease) for lease in held.values()} == {3600}, "of hold_max"
    assert not set(held.values()) & set(running.values()), "the old ones revoked"
    time.sleep(TTL)  # renewed meanwhile: still one each
    one_lease_each(tier, ("vm-a", "vm-b"))

    for vm, daemon in daemons.items():
        sim.remove_event(reboots[vm])
        daemon.wait_log("slot_released", event_id=reboots[vm], timeout=20)
    wait_for(
        lambda: {granted(tier, lease) for lease in leases_by_vm_ids(tier)} == {TTL},
        10,
        "back to ttl",
    )
    after = one_lease_each(tier, ("vm-a", "vm-b"))
    assert {granted(tier, lease) for lease in after.values()} == {TTL}


def leases_by_vm_ids(tier: Tier) -> set[str]:
    return {lease for leases in leases_by_vm(tier).values() for lease in leases}


def fleet(tier: Tier, *args: str):
    path = tier.factories["vm-x"].write_config(tier.config("vm-x", ttl=TTL), "fleet.yaml")
    return cli("fleet", "--config", str(path), *args, timeout=60)


def holder_of(shown) -> dict:
    (group,) = json.loads(shown.stdout)["groups"]
    (holder,) = group["holders"]
    return holder


def test_a_daemon_killed_in_its_maintenance_keeps_its_slot_to_hold_max_and_is_silent_within_ttl(
    tier, sim
):
    """vm-1 approved (held through: its one lease is of hold_max, its alive mark on it), vm-2
    waiting; vm-1's daemon killed -9. Its alive mark stays (on that lease), yet `fleet` says
    its daemon is silent within ttl (+ a little) and exits 1 naming it: the lease is no longer
    renewed. vm-2 waits past 3x ttl and starts at hold_max, not before. On main the slot was on
    a second lease (two for vm-1's daemon)."""
    hold_max = 25
    sim.scenario.start_after_approval = 600
    one = tier.start("vm-1", held_config(tier, "vm-1", hold_max=hold_max))
    first, _ = vm2_waits_for_vm1s_approval(tier, sim, one)
    one.wait_log("slot_held_through", event_id=first, timeout=20)
    wait_for(lambda: "vm-2" in keys_under(tier, "waiting/web/"), 10, "vm-2's waiting mark")
    leases = one_lease_each(tier, ("vm-1", "vm-2"))
    assert granted(tier, leases["vm-1"]) == hold_max
    alive = fleet(tier, "--json")
    assert alive.returncode == 0, alive.stdout + alive.stderr
    assert holder_of(alive)["alive"] is True

    one.proc.send_signal(signal.SIGKILL)
    one.proc.wait(10)
    killed = time.monotonic()
    settings = Etcd(endpoints=tuple(tier.cluster.endpoints), prefix=tier.prefix)
    read = lambda: fleet_keys.read(settings, {"web": 1}, TTL)  # noqa: E731 - what `fleet` reads
    wait_for(lambda: not read().groups[0].holders[0].alive, TTL + 10, "vm-1 silent")
    silent_after = time.monotonic() - killed
    assert silent_after <= TTL + 2, f"said silent {silent_after:.1f} s after the kill"
    shown = fleet(tier, "--json")
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert holder_of(shown)["vm"] == "vm-1"
    assert holder_of(shown)["alive"] is False
    assert [d["vm"] for d in json.loads(shown.stdout)["down"]] == ["vm-1"]
    daemons = keys_under(tier, "daemons/")
    assert "vm-1" in daemons, "its alive mark is still there (on the hold lease)"

    time.sleep(max(0.0, 3 * TTL - (time.monotonic() - killed)))
    assert slot_holder(tier) == ["vm-1"], "held while vm-1 is away"
    assert not stamps(tier, "drain", "vm-2"), "nobody else starts while vm-1 is away"
    wait_for(lambda: stamps(tier, "drain", "vm-2"), hold_max + 15, "vm-2's before-hooks")
    waited = time.monotonic() - killed
    assert waited >= hold_max - TTL / 3 - 1, f"vm-2 went {waited:.1f} s after the kill"


def keys_under(tier: Tier, below: str) -> list[str]:
    from tests.system.test_fleet import keys  # noqa: PLC0415 - etcdctl's view

    found = keys(tier.cluster, f"{tier.prefix}/{below}")
    return [k.rsplit("/", 1)[1] for k in found]


def test_a_daemon_killed_outside_a_maintenance_loses_its_slot_within_ttl_after_one_held(
    tier, sim, hooks
):
    """vm-1's first Reboot is held through and given back (its lease swapped to hold_max and
    back to ttl); for its second, its daemon is killed -9 while the drain runs (not approved,
    not in a maintenance): the slot goes within ttl with its one lease, and vm-2 takes it. A
    guard of the swap back (main had no swap to undo: it passes there too)."""
    sim.scenario.start_after_approval = 600
    cfg1 = held_config(tier, "vm-1")
    one = tier.start("vm-1", cfg1)
    first = sim.add_event("Reboot", ["vm-1"], not_before_in=3600)
    one.wait_log("slot_held_through", event_id=first, timeout=20)
    sim.remove_event(first)
    one.wait_log("slot_released", event_id=first, timeout=20)
    slow = hooks.make("drain-60", "exec sleep 60")
    cfg1["hooks"]["drain"] = [{"command": [slow], "timeout": 120}]
    tier.factories["vm-1"].write_config(cfg1)
    one.signal(signal.SIGHUP)
    one.wait_log("config_reloaded")
    again = sim.add_event("Reboot", ["vm-1"], not_before_in=3600)
    one.wait_log("hook_started", event_id=again, timeout=15)
    (lease,) = one_lease_each(tier, ("vm-1",)).values()
    assert granted(tier, lease) == TTL
    two = tier.start("vm-2", held_config(tier, "vm-2"))
    second = sim.add_event("Reboot", ["vm-2"], not_before_in=3600)
    two.wait_log("event_waiting", event_id=second, reason="slot", timeout=15)
    one.proc.send_signal(signal.SIGKILL)
    one.proc.wait(10)
    killed = time.monotonic()
    two.wait_log("slot_acquired", event_id=second, timeout=TTL + 10)
    assert time.monotonic() - killed <= TTL + 3


def test_a_silent_daemons_keys_no_longer_speak_for_it():
    """fleet's view (pure): a daemon's alive mark and waiting mark on a lease that lost more
    than ttl of its TTL are those of a silent daemon (killed in its maintenance, its lease of
    hold_max); on a lease renewed within a third of ttl, of a live one."""
    root = "/p/"
    value = lambda **f: json.dumps(f).encode()  # noqa: E731
    kvs = [
        KeyValue("/p/daemons/vm-1", value(vm="vm-1", ttl=30), "11"),
        KeyValue("/p/slots/web/0", value(vm="vm-1", event="e1"), "11"),
        KeyValue("/p/daemons/vm-2", value(vm="vm-2", ttl=30), "22"),
        KeyValue("/p/waiting/db/vm-2", value(vm="vm-2", event="e2"), "22"),
        KeyValue("/p/slots/db/0", value(vm="vm-2", event="e3"), "22"),
        KeyValue("/p/daemons/vm-3", value(vm="vm-3", ttl=30), "33"),
        KeyValue("/p/waiting/web/vm-3", value(vm="vm-3", event="e4"), "33"),
    ]
    times = {"11": (3590, 3600), "22": (3560, 3600), "33": (28, 30)}
    view = fleet_keys._view(root, kvs, times, {"web": 1}, 30)
    assert view.daemons == ("vm-1", "vm-3")
    web = next(g for g in view.groups if g.name == "web")
    assert [(h.vm, h.alive) for h in web.holders] == [("vm-1", True)]
    assert [w.vm for w in web.waiting] == ["vm-3"]
    db = next(g for g in view.groups if g.name == "db")
    assert [(h.vm, h.alive) for h in db.holders] == [("vm-2", False)]
    assert db.waiting == (), "a silent daemon's waiting mark is not shown"
    assert [(g, h.vm) for g, h in view.down()] == [("db", "vm-2")]
    assert fleet_keys.silent(-1, 30, 30)
    assert not fleet_keys.silent(20, 30, 30)


def test_the_line_passes_a_waiting_mark_on_a_silent_lease_that_holds_a_slot(cluster):
    """The waiters' line against real etcd (slot_line.Line): a daemon killed in its
    maintenance leaves its waiting mark on its lease of hold_max (here another VM of that
    daemon waits while one holds a slot), so the mark outlives it. Once that lease is silent
    (not renewed for more than ttl) the waiter behind it recounts it out of its line; a live
    waiter's mark, renewed, stays ahead. (On main the recount kept every mark still there:
    whoever was behind a dead daemon's mark waited PATIENCE at each release until hold_max.)"""
    from scheduledeventsd.coordination.slot_line import Line  # noqa: PLC0415 - not on main
    from scheduledeventsd.coordination.slots import group_prefix  # noqa: PLC0415

    ttl = 2
    settings = Etcd(endpoints=tuple(cluster.endpoints), prefix=f"/sed-{uuid.uuid4().hex[:8]}")
    client = EtcdClient(settings)
    try:
        dead, live, mine = client.grant(60), client.grant(ttl * 3), client.grant(ttl * 3)
        slot = group_prefix(settings, "web") + "0"
        client.put(slot, fleet_keys.encode({"vm": "vm-dead-a", "event": "E1"}), dead)
        for vm, lease in (("vm-dead-b", dead), ("vm-live", live)):
            mark = {"vm": vm, "event": f"E-{vm}", "since": "", "why": "", "groups": ["web"]}
            client.put(fleet_keys.waiting_key(settings, "web", vm), fleet_keys.encode(mark), lease)
        line = Line(settings, Concurrency("web", 1, ttl), "vm-me", "E-me", {"web": slot[:-1]})
        line.mark(client, "web", mine)
        assert line.ahead == {"vm-dead-b", "vm-live"}
        line.recount(client, client.range(slot)[1])
        assert line.ahead == {"vm-dead-b", "vm-live"}, "not silent yet"
        time.sleep(ttl + 1.5)  # the dead lease not renewed meanwhile; the others are
        client.keep_alive(live)
        client.keep_alive(mine)
        line.recount(client, client.range(slot)[1])
        assert line.ahead == {"vm-live"}
    finally:
        client.close()
