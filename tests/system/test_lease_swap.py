"""The daemon's one lease swapped (daemon_lease.py `hold`, `unhold`) while other threads of the
daemon write under it, against a real 3-member etcd (reviewed, issue 28). A key put under the
old lease after the swap's last read of it went with the old lease's revoke: a slot the worker
said it held (SlotGranted) was gone from etcd, free for the next VM while this one went into
its maintenance. Each test holds the swap just before its revoke (a client of the test's that
waits there) and lets a writer that had the old lease in hand write meanwhile."""

from __future__ import annotations

import queue
import threading
import time
import uuid

import pytest

from scheduledeventsd.config import Concurrency, Etcd
from scheduledeventsd.coordination.daemon_lease import DaemonLease
from scheduledeventsd.coordination.etcd import EtcdClient
from scheduledeventsd.coordination.slots import SlotKeeper
from scheduledeventsd.engine import AcquireSlot, SlotGranted
from tests.conftest import wait_for
from tests.engine.test_engine import event
from tests.tcp_proxy import ProxySet

pytestmark = pytest.mark.xdist_group(name="etcd")
TTL = 6
WINDOW = 3.0  # s the swap waits before its revoke for the writer's key to appear


class RevokeLater(EtcdClient):
    """The swap's client: before revoking `old`, waits (at most WINDOW) for `appears()`."""

    def __init__(self, settings: Etcd, old: str, appears) -> None:
        super().__init__(settings)
        self.old, self.appears = old, appears
        self.at_revoke = threading.Event()
        self.appeared = False

    def revoke(self, lease: str) -> None:
        if lease == self.old:
            self.at_revoke.set()
            until = time.monotonic() + WINDOW
            while time.monotonic() < until and not self.appeared:
                self.appeared = self.appears()
                time.sleep(0.05)
        super().revoke(lease)


def granted(inbox: queue.SimpleQueue, event_id: str) -> SlotGranted:
    while True:
        message = inbox.get(timeout=20)
        if isinstance(message, SlotGranted) and message.event_id == event_id:
            return message


def test_a_slot_taken_while_the_daemons_lease_is_swapped_is_on_the_new_lease_not_revoked(cluster):
    """vm-a's worker has the daemon's lease in hand (its first write stalled on the network)
    when another holder swaps the lease for one of hold_max; the worker then takes the free
    slot. Its key must be in etcd, on the daemon's lease, once it says SlotGranted. On main
    the take went under the old lease after the swap's last read of it, and the revoke
    deleted it: SlotGranted said, no key in etcd (the next VM free to take the slot)."""
    direct = Etcd(endpoints=tuple(cluster.endpoints), prefix=f"/sed-{uuid.uuid4().hex[:8]}")
    slots = f"{direct.prefix}/slots/web/"
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    lease = DaemonLease(direct, TTL)
    reader = EtcdClient(direct)
    old, _ = lease.get(reader)  # the daemon's lease, granted: the worker needs no grant
    with ProxySet(cluster.endpoints, host="127.0.0.7") as path:
        slow = Etcd(endpoints=tuple(path.endpoints), prefix=direct.prefix, timeout=direct.timeout)
        keeper = SlotKeeper(slow, Concurrency("web", 1, TTL, hold_max=600), inbox.put, lease)
        looker = EtcdClient(direct)  # the swap's thread's own
        swap = RevokeLater(direct, old, lambda: bool(looker.range(slots)[1]))
        swapping = threading.Thread(target=lease.hold, args=(swap, 600, "another"))
        try:
            path.cut()  # the worker's writes hang until restored, its lease in hand
            keeper.acquire(AcquireSlot(event("R1"), "vm-a"))
            wait_for(lambda: path.accepted > 0, 5, "the worker's first write under way")
            swapping.start()
            swap.at_revoke.wait(1.5)  # main: there at once; now: waits for that write
            path.restore()
            granted(inbox, "R1")
            swapping.join(WINDOW + 10)
            now, _ = lease.get(reader)
            assert now != old, "swapped for one of hold_max"
            held = reader.range(slots)[1]
            assert [kv.key for kv in held] == [f"{slots}0"], (
                "SlotGranted said: the key must be in etcd (main: revoked with the old lease)"
            )
            assert held[0].lease == now, "on the daemon's lease as it is now"
            assert reader.lease_keys(old) is None, "the old lease revoked"
        finally:
            path.restore()
            keeper.stop_all()
            lease.close()
            swap.close()
            looker.close()
            reader.close()
