"""What a VM waiting for a slot costs etcd, against a real 3-member cluster: a release used to
wake every waiter, each reading the group again, trying its transaction and rewriting its
waiting mark, so a waiter's requests grew with the hand-overs before its turn (O(N²) a wave).
The waiter is counted alone: it speaks to one member, the others to another, and each
member's /metrics counts the gRPC calls its own JSON gateway made."""

from __future__ import annotations

import json
import queue
import re
import time
import uuid
from collections import Counter

import pytest
import requests

from scheduledeventsd.config import Concurrency, Etcd
from scheduledeventsd.coordination.etcd import EtcdClient
from scheduledeventsd.coordination.slots import PATIENCE, SlotKeeper
from scheduledeventsd.engine import AcquireSlot, Message, SlotBusy, SlotGranted
from tests.conftest import wait_for
from tests.engine.test_engine import event
from tests.etcd_cluster import Cluster
from tests.system.test_fleet import keys

pytestmark = pytest.mark.xdist_group(name="etcd")
_STARTED = re.compile(r'^grpc_server_started_total\{[^}]*grpc_method="(\w+)"[^}]*\} ([0-9.e+]+)$')


def calls(endpoint: str) -> Counter[str]:
    """gRPC calls this member has started, per method (its gateway's, for our clients)."""
    counted: Counter[str] = Counter()
    with requests.Session() as session:
        session.trust_env = False
        for line in session.get(f"{endpoint}/metrics", timeout=5).text.splitlines():
            m = _STARTED.match(line)
            if m:
                counted[m.group(1)] += int(float(m.group(2)))
    return counted


def granted(*inboxes: queue.SimpleQueue[Message]) -> str:
    """The next event granted a slot, whichever keeper tells it."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for inbox in inboxes:
            try:
                message = inbox.get(timeout=0.02)
            except queue.Empty:
                continue
            if isinstance(message, SlotGranted):
                return message.event_id
    raise AssertionError("no slot granted within 20 s")


def test_a_waiter_sends_nothing_while_the_five_ahead_of_it_take_and_give_back_the_slot(
    cluster: Cluster,
):
    """max 1: vm-1..vm-5 wait in line behind vm-0, then vm-w. While the five ahead of it
    take and give back the slot in turn, vm-w reads nothing again, opens no new watch and
    tries no transaction: it follows the group on its one watch, and tries once, on its turn
    (on main every waiter tried at every release, a range and a transaction at least, and
    whoever won took the slot: vm-w took it first)."""
    prefix = f"/sed-{uuid.uuid4().hex[:8]}"
    concurrency = Concurrency("web", 1, 30)
    others, theirs = Etcd(endpoints=(cluster.endpoints[0],), prefix=prefix), queue.SimpleQueue()
    mine, inbox = Etcd(endpoints=(cluster.endpoints[2],), prefix=prefix), queue.SimpleQueue()
    keeper = SlotKeeper(others, concurrency, theirs.put)
    waiter = SlotKeeper(mine, concurrency, inbox.put)
    line = f"{prefix}/waiting/web/"
    try:
        keeper.acquire(AcquireSlot(event("E0"), "vm-0"))
        assert granted(theirs) == "E0"
        for n in range(1, 6):
            keeper.acquire(AcquireSlot(event(f"E{n}"), f"vm-{n}"))
            wait_for(lambda n=n: len(keys(cluster, line)) == n, 10, f"vm-{n} in line")
        waiter.acquire(AcquireSlot(event("W"), "vm-w"))
        assert isinstance(inbox.get(timeout=20), SlotBusy)
        wait_for(lambda: len(keys(cluster, line)) == 6, 10, "vm-w in line, last")
        time.sleep(0.5)
        before = calls(cluster.endpoints[2])
        holder, order = "E0", []
        for _ in range(5):
            if holder == "W":
                break
            keeper.release(holder)
            holder = granted(theirs, inbox)
            order.append(holder)
            time.sleep(0.3)  # vm-w hears of each hand-over
        during = calls(cluster.endpoints[2]) - before
        sent = {k: v for k, v in during.items() if not k.startswith("Lease")}
        assert sent == {}, f"vm-w's requests during the hand-overs ahead of it: {sent}"
        assert order == ["E1", "E2", "E3", "E4", "E5"], "who waited first takes first"
        keeper.release(holder)
        assert granted(inbox) == "W"
    finally:
        waiter.stop_all()
        keeper.stop_all()


def test_a_dead_waiter_ahead_in_line_holds_the_next_up_a_second_not_its_ttl(cluster: Cluster):
    """vm-dead's waiting mark is first in line, its daemon gone (the mark lasts until its
    lease ends: here, never). vm-w waits behind it; when vm-0 gives the slot back, vm-w takes
    it within PATIENCE (and a little), not when the dead one's lease would have ended."""
    prefix = f"/sed-{uuid.uuid4().hex[:8]}"
    settings = Etcd(endpoints=tuple(cluster.endpoints), prefix=prefix)
    inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
    keeper = SlotKeeper(settings, Concurrency("web", 1, 30), inbox.put)
    dead = {"vm": "vm-dead", "event": "D", "since": "", "why": "", "groups": ["web"]}
    try:
        keeper.acquire(AcquireSlot(event("E0"), "vm-0"))
        assert granted(inbox) == "E0"
        client = EtcdClient(settings)
        client.put(f"{prefix}/waiting/web/vm-dead", json.dumps(dead).encode())
        client.close()
        keeper.acquire(AcquireSlot(event("W"), "vm-w"))
        wait_for(lambda: len(keys(cluster, f"{prefix}/waiting/web/")) == 2, 10, "vm-w in line")
        time.sleep(0.3)
        released = time.monotonic()
        keeper.release("E0")
        assert granted(inbox) == "W"
        took = time.monotonic() - released
        assert 0.8 * PATIENCE <= took < PATIENCE + 2, f"vm-w took the slot after {took:.2f} s"
    finally:
        keeper.stop_all()
