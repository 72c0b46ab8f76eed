"""Several limits at once (issue 28) through a real 3-member etcd: a VM holds a slot in every
group its `concurrency` list names (a tier and a zone) or in none, all taken in one
transaction; four daemons in two tiers and two zones never exceed a limit, and none waits
while every one of its limits has room."""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid

import pytest

from scheduledeventsd.config import Concurrency, Etcd, Limit
from scheduledeventsd.coordination.etcd import EtcdClient
from scheduledeventsd.coordination.slots import SlotKeeper
from scheduledeventsd.engine import AcquireSlot, Message, SlotBusy, SlotGranted
from tests.conftest import wait_for
from tests.engine.test_engine import event
from tests.system.test_fleet import keys
from tests.system.test_slots import Tier, iso_seconds

pytestmark = pytest.mark.xdist_group(name="etcd")
WEB_ZONE = Concurrency("web", 1, 6, more=(Limit("zone-a", 2),))


def settings(cluster) -> Etcd:
    return Etcd(endpoints=tuple(cluster.endpoints), prefix=f"/sed-{uuid.uuid4().hex[:8]}")


class Inbox:
    """What the keepers tell the engine, kept until read: `answer` finds an event's next
    SlotGranted or SlotBusy, whatever came for other events meanwhile."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.put = self.queue.put
        self.unread: list[Message] = []

    def answer(self, event_id: str = "R1") -> Message:
        until = time.monotonic() + 20
        while True:
            for message in self.unread:
                if isinstance(message, (SlotGranted, SlotBusy)) and message.event_id == event_id:
                    self.unread.remove(message)
                    return message
            self.unread.append(self.queue.get(timeout=max(0.01, until - time.monotonic())))


def test_the_keeper_takes_a_slot_in_every_group_or_in_none(cluster):
    """web (max 1) is held by vm-x; vm-a asks for web and zone-a: it is told web is full, by
    whom, and holds no zone-a key meanwhile (a partial hold would keep a zone slot from
    others while it waits). web freed, it takes both at once, under one lease, and gives
    both back together."""
    etcd = settings(cluster)
    slots = f"{etcd.prefix}/slots/"
    seed = EtcdClient(etcd)
    lease = seed.grant(60)
    assert seed.create(f"{slots}web/0", json.dumps({"vm": "vm-x"}).encode(), lease)
    inbox = Inbox()
    keeper = SlotKeeper(etcd, WEB_ZONE, inbox.put)
    try:
        keeper.acquire(AcquireSlot(event("R1"), "vm-a"))
        busy = inbox.answer()
        assert isinstance(busy, SlotBusy), busy
        assert (busy.holders, busy.full) == (("vm-x",), ("web",))
        time.sleep(1)
        assert not [k for k, v in keys(cluster, slots).items() if v["vm"] == "vm-a"]
        seed.revoke(lease)
        assert isinstance(inbox.answer(), SlotGranted)
        held = keys(cluster, slots)
        assert sorted(held) == [f"{slots}web/0", f"{slots}zone-a/0"]
        assert {v["vm"] for v in held.values()} == {"vm-a"}
        keeper.release("R1")
        wait_for(lambda: not keys(cluster, slots), 10, "both slots given back")
    finally:
        keeper.stop_all()
        seed.close()


def test_a_vm_back_from_a_restart_takes_back_every_group_or_gives_its_leftover_keys_up(cluster):
    """Take-back after a restart covers every group: vm-a's keys left under a hand-over lease
    in web and zone-a are put under the new keeper's lease together. When one of them went
    meanwhile and its group is full, the one left is deleted (no partial hold) and vm-a waits."""
    etcd = settings(cluster)
    slots = f"{etcd.prefix}/slots/"
    seed = EtcdClient(etcd)
    left = json.dumps({"vm": "vm-a", "event": "R1"}).encode()
    lease = seed.grant(600)
    assert seed.create(f"{slots}web/0", left, lease)
    assert seed.create(f"{slots}zone-a/1", left, lease)
    inbox = Inbox()
    keeper = SlotKeeper(etcd, WEB_ZONE, inbox.put)
    try:
        keeper.acquire(AcquireSlot(event("R1"), "vm-a"))
        assert isinstance(inbox.answer(), SlotGranted)
        held = keys(cluster, slots)
        assert sorted(held) == [f"{slots}web/0", f"{slots}zone-a/1"], "its own keys, taken back"
        assert all(v["vm"] == "vm-a" for v in held.values())
        assert all(v.get("at") for v in held.values()), "rewritten by the new keeper"
    finally:
        keeper.stop_all()
    wait_for(lambda: not keys(cluster, slots), 15, "gone with the keeper's lease")
    other = seed.grant(600)
    assert seed.create(f"{slots}web/0", json.dumps({"vm": "vm-x"}).encode(), other)
    assert seed.create(f"{slots}zone-a/1", left, lease)
    keeper = SlotKeeper(etcd, WEB_ZONE, inbox.put)
    try:
        keeper.acquire(AcquireSlot(event("R1"), "vm-a"))
        busy = inbox.answer()
        assert isinstance(busy, SlotBusy), busy
        assert busy.full == ("web",)
        assert sorted(keys(cluster, slots)) == [f"{slots}web/0"], "its zone key given up"
    finally:
        keeper.stop_all()
        seed.revoke(lease)
        seed.revoke(other)
        seed.close()


def test_two_vms_asking_for_two_groups_in_opposite_order_never_wait_on_each_other(cluster):
    """The lock-ordering trap: vm-a names [g1, g2], vm-b [g2, g1], both max 1, asking at the
    same instant, 20 times. Taken one group at a time, each could hold one and wait for the
    other for ever; taken all at once, one holds both and the other is told busy, then
    granted once the first gives both back."""
    etcd = settings(cluster)
    slots = f"{etcd.prefix}/slots/"
    a_limits = Concurrency("g1", 1, 6, more=(Limit("g2", 1),))
    b_limits = Concurrency("g2", 1, 6, more=(Limit("g1", 1),))
    for round_ in range(20):
        inbox = Inbox()
        keepers = {"vm-a": SlotKeeper(etcd, a_limits, inbox.put)}
        keepers["vm-b"] = SlotKeeper(etcd, b_limits, inbox.put)
        ids = {"vm-a": f"A{round_}", "vm-b": f"B{round_}"}
        try:
            go = threading.Barrier(2)
            threads = [
                threading.Thread(target=ask, args=(go, keeper, ids[vm], vm))
                for vm, keeper in keepers.items()
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            first = [inbox.answer(ids[vm]) for vm in keepers]
            granted = [m.event_id for m in first if isinstance(m, SlotGranted)]
            assert len(granted) == 1, first
            holders = {v["vm"] for v in keys(cluster, slots).values()}
            assert len(holders) == 1, "one VM holds both groups"
            winner = next(vm for vm, i in ids.items() if i == granted[0])
            loser = "vm-b" if winner == "vm-a" else "vm-a"
            keepers[winner].release(ids[winner])
            assert isinstance(inbox.answer(ids[loser]), SlotGranted)
            keepers[loser].release(ids[loser])
            wait_for(lambda: not keys(cluster, slots), 10, "both given back")
        finally:
            for keeper in keepers.values():
                keeper.stop_all()


def ask(go: threading.Barrier, keeper: SlotKeeper, event_id: str, vm: str) -> None:
    """Ask for a slot once the other thread is ready too (the same instant, near enough)."""
    go.wait()
    keeper.acquire(AcquireSlot(event(event_id), vm))


# ---- four daemons, two tiers, two zones ---------------------------------------------------------


@pytest.fixture
def tier(tmp_path, sim, hooks, cluster):
    t = Tier(tmp_path, sim, hooks, cluster)
    yield t
    t.stop()


# zone-a holds three VMs, zone-b one: with web 1, db 2 and zone 2 both kinds of limit bind.
PLACES = {
    "vm-1": ("web", "zone-a"),
    "vm-2": ("web", "zone-b"),
    "vm-3": ("db", "zone-a"),
    "vm-4": ("db", "zone-a"),
}
MAXES = {"web": 1, "db": 2, "zone-a": 2, "zone-b": 2}
HAND_OVER = 3.0  # s: a freed slot reaches a waiting VM's drain within this (watch, txn, hook)


def test_two_tiers_in_two_zones_never_exceed_a_limit_and_none_waits_while_all_have_room(tier, sim):
    """Issue 28's proof: each VM's config lists its tier group and its zone group; a Reboot for
    each of the four at once. From the instants the hooks record (drain start, undrain end)
    and when each daemon started waiting: at no instant are more VMs of a group between
    drain and undrain than its max, and no VM waits while every group it names has room
    (beyond the hand-over of a freed slot)."""
    for vm, groups in PLACES.items():
        cfg = tier.config(vm, ttl=10)
        cfg["concurrency"] = [{"group": g, "max": MAXES[g]} for g in groups]
        tier.start(vm, cfg)
    events = {vm: sim.add_event("Reboot", [vm], not_before_in=3600) for vm in PLACES}
    wait_for(lambda: len(tier.spans()) == 4, 120, "four drains and undrains")
    spans = tier.spans()
    asked = {}
    for vm in PLACES:
        first = tier.daemons[vm].wait_log("event_waiting", event_id=events[vm], reason="slot")
        asked[vm] = iso_seconds(first["timestamp"])
    edges = sorted({t for span in spans.values() for t in span} | set(asked.values()))
    room = dict.fromkeys(PLACES, 0.0)  # how long each has waited with room, in one stretch
    waited_for_full = set()
    for start, end in zip(edges, edges[1:]):
        middle = (start + end) / 2
        inside = [vm for vm, (s, e) in spans.items() if s <= middle < e]
        for group, most in MAXES.items():
            held = [vm for vm in inside if group in PLACES[vm]]
            assert len(held) <= most, f"{group} exceeded at {middle}: {held} ({spans})"
        for vm, groups in PLACES.items():
            if not asked[vm] <= middle < spans[vm][0]:
                room[vm] = 0.0
                continue
            full = [g for g in groups if sum(g in PLACES[o] for o in inside) >= MAXES[g]]
            if full:
                room[vm] = 0.0
                waited_for_full.add(vm)
                continue
            room[vm] += end - start
            assert room[vm] <= HAND_OVER, f"{vm} waited {room[vm]:.1f} s with room ({spans})"
    assert waited_for_full, "some VM waited for a full group"
    reasons = [
        r["full"]
        for vm in PLACES
        for r in tier.daemons[vm].logs("event_waiting", reason="slot")
        if r.get("full")
    ]
    assert reasons, "the records say which group is full"


def test_a_vm_in_its_maintenance_takes_back_what_it_holds_though_an_added_group_is_full(cluster):
    """Issue 28 #3, where the rule lives (the keeper, real etcd): vm-a holds web/0 (left by its
    keeper before a reload that added zone-a) and is in its maintenance (AcquireSlot `hold`);
    zone-a is full (vm-x). Was: the take-back found zone-a full and deleted web/0 (never a
    partial hold), so the next VM of web went while vm-a was down. Now web/0 is taken back,
    on the daemon's hold lease; zone-a is for vm-a's next event."""
    etcd = settings(cluster)
    slots = f"{etcd.prefix}/slots/"
    seed = EtcdClient(etcd)
    lease = seed.grant(600)
    assert seed.create(f"{slots}web/0", json.dumps({"vm": "vm-a", "event": "R1"}).encode(), lease)
    assert seed.create(f"{slots}zone-a/0", json.dumps({"vm": "vm-x"}).encode(), lease)
    inbox = Inbox()
    keeper = SlotKeeper(etcd, Concurrency("web", 1, 6, more=(Limit("zone-a", 1),)), inbox.put)
    try:
        keeper.acquire(AcquireSlot(event("R1"), "vm-a", hold=120))
        granted = inbox.answer()
        assert isinstance(granted, SlotGranted), granted
        held = {k: v["vm"] for k, v in keys(cluster, slots).items()}
        assert held == {f"{slots}web/0": "vm-a", f"{slots}zone-a/0": "vm-x"}
        (web,) = seed.range(f"{slots}web/")[1]
        assert web.lease != lease, "put by the keeper"
        assert seed.time_to_live(web.lease) > 100, "on the hold lease, not the daemon's of 6 s"
    finally:
        keeper.stop_all()
        seed.revoke(lease)
        seed.close()
