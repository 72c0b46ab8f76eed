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
from typing import Callable

import pytest

from scheduledeventsd.config import Concurrency, Etcd
from scheduledeventsd.coordination.daemon_lease import DaemonLease
from scheduledeventsd.coordination.etcd import EtcdClient, EtcdError
from scheduledeventsd.coordination.peers import EtcdCoordinator, event_prefix
from scheduledeventsd.coordination.slots import SlotKeeper
from scheduledeventsd.engine import (
    AcquireSlot,
    Coordinate,
    Message,
    PeersChanged,
    SlotFailed,
    SlotGranted,
)
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


def said(inbox: queue.SimpleQueue, kind: type, event_id: str) -> Message:
    while True:
        message = inbox.get(timeout=20)
        if isinstance(message, kind) and message.event_id == event_id:  # type: ignore[attr-defined]
            return message  # type: ignore[no-any-return]


def swapped_while_written(
    cluster, lease: DaemonLease, path: ProxySet, write: Callable[[], None], written: str
) -> str:
    """`write` starts a writer of the daemon whose etcd path is `path`, its first write
    stalled (cut) with the daemon's lease in hand; meanwhile another holder swaps the lease
    for one of hold_max, held before its revoke until a key under `written` appears (at most
    WINDOW), then the path is restored. The old lease's ID."""
    direct = lease.settings
    with EtcdClient(direct) as reader, EtcdClient(direct) as looker:
        old, _ = lease.get(reader)  # granted: the writer needs no grant, only its write
        swap = RevokeLater(direct, old, lambda: bool(looker.range(written)[1]))
        swapping = threading.Thread(target=lease.hold, args=(swap, 600, "another"))
        try:
            path.cut()
            write()
            wait_for(lambda: path.accepted > 0, 5, "the writer's first write under way")
            swapping.start()
            swap.at_revoke.wait(1.5)  # main: there at once; now: waits for that write
        finally:
            path.restore()
        swapping.join(WINDOW + 10)
        swap.close()
        return old


def on_the_lease(cluster, lease: DaemonLease, old: str, prefix: str) -> list[str]:
    """The keys under `prefix`, asserted on the daemon's lease now (not `old`, revoked)."""
    with EtcdClient(lease.settings) as reader:
        now, _ = lease.get(reader)
        assert now != old, "swapped for one of hold_max"
        assert reader.lease_keys(old) is None, "the old lease revoked"
        found = reader.range(prefix)[1]
        assert all(kv.lease == now for kv in found), "on the daemon's lease as it is now"
        return [kv.key for kv in found]


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
    with ProxySet(cluster.endpoints, host="127.0.0.7") as path:
        slow = Etcd(endpoints=tuple(path.endpoints), prefix=direct.prefix, timeout=direct.timeout)
        keeper = SlotKeeper(slow, Concurrency("web", 1, TTL, hold_max=600), inbox.put, lease)
        try:
            take = lambda: keeper.acquire(AcquireSlot(event("R1"), "vm-a"))  # noqa: E731
            old = swapped_while_written(cluster, lease, path, take, slots)
            said(inbox, SlotGranted, "R1")
            assert on_the_lease(cluster, lease, old, slots) == [f"{slots}0"], (
                "SlotGranted said: the key must be in etcd (main: revoked with the old lease)"
            )
        finally:
            keeper.stop_all()
            lease.close()


def test_a_shared_events_mark_written_while_the_lease_is_swapped_is_not_revoked(cluster):
    """The same with a shared event's ready mark (peers.py): written under the old lease after
    the swap's last read, it went with the revoke on main (the VM said ready, its peers never
    saw it: the event waited for it until NotBefore)."""
    direct = Etcd(endpoints=tuple(cluster.endpoints), prefix=f"/sed-{uuid.uuid4().hex[:8]}")
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    shared = event(resources=("vm-a", "vm-b"))
    marks = event_prefix(direct, shared.event_id)
    with ProxySet(cluster.endpoints, host="127.0.0.7") as path:
        slow = Etcd(endpoints=tuple(path.endpoints), prefix=direct.prefix, timeout=direct.timeout)
        coordinator = EtcdCoordinator(slow, inbox.put, TTL)
        lease = coordinator.lease
        lease.settings = direct  # its keep-alive and the test's reads: not through the cut
        try:
            ready = lambda: coordinator.start(Coordinate(shared, "vm-a", True, 7))  # noqa: E731
            old = swapped_while_written(cluster, lease, path, ready, marks)
            said(inbox, PeersChanged, shared.event_id)
            assert on_the_lease(cluster, lease, old, marks) == [f"{marks}vm-a"], (
                "its ready must stay in etcd (main: revoked with the old lease)"
            )
        finally:
            coordinator.stop_all()


class AnswerLost(EtcdClient):
    """A swap's client whose move is applied by etcd and its answer lost (a leader change, a
    partition just after the request): EtcdError, as the daemon's client says then."""

    def move_keys(self, keys, old: str, new: str) -> bool:  # type: ignore[no-untyped-def]
        super().move_keys(keys, old, new)
        raise EtcdError("timeout", "no whole answer within the timeout")


def leases(reader: EtcdClient, prefix: str) -> set[str]:
    return {kv.lease for kv in reader.range(prefix)[1]}


def swap_unanswered(
    lease: DaemonLease, reader: EtcdClient, lossy: AnswerLost, key: str, value: bytes
) -> str:
    """`key` put under the daemon's lease, then a swap for one of hold_max whose move etcd
    applies and whose answer is lost (EtcdError): the lease `key` was put under."""
    old, _ = lease.get(reader)
    reader.put(key, value, old)
    with pytest.raises(EtcdError):
        lease.hold(lossy, 600, "vm-a")
    return old


def test_a_swap_whose_move_was_applied_but_not_answered_keeps_the_keys_and_ends_on_one_lease(
    cluster,
):
    """The daemon's lease swapped for one of hold_max (its VM approved), etcd applied the move
    of its keys but the answer never came: on main the swap revoked the new lease, and the
    slot key with it (gone while its VM went into its maintenance). The keys stay, and the
    next swap (tried again every third of ttl) ends on one lease with every key."""
    direct = Etcd(endpoints=tuple(cluster.endpoints), prefix=f"/sed-{uuid.uuid4().hex[:8]}")
    slot = f"{direct.prefix}/slots/web/0"
    lease = DaemonLease(direct, TTL)
    with EtcdClient(direct) as reader, AnswerLost(direct) as lossy:
        try:
            old = swap_unanswered(lease, reader, lossy, slot, b'{"vm": "vm-a"}')
            assert reader.range(slot)[1], "the slot key is still in etcd (main: revoked)"
            now, moved = lease.hold(reader, 600, "vm-a")
            assert slot in moved
            assert leases(reader, direct.prefix) == {now}
            assert reader.lease_keys(old) is None, "the old lease revoked"
            assert reader.time_to_live(now) > 500
        finally:
            lease.close()


def test_a_swap_back_whose_move_was_applied_but_not_answered_keeps_the_keys_on_one_lease(
    cluster,
):
    """The same on the swap back to `ttl` (the slot given back, a shared event's mark left):
    on main the mark went with the revoked new lease. It stays; the keep-alive thread swaps
    back again at its next renewal and the daemon ends on one lease of `ttl` with it."""
    direct = Etcd(endpoints=tuple(cluster.endpoints), prefix=f"/sed-{uuid.uuid4().hex[:8]}")
    mark = f"{direct.prefix}/events/E1/vm-a"
    lease = DaemonLease(direct, TTL)
    with EtcdClient(direct) as reader, AnswerLost(direct) as lossy:
        try:
            held, _ = lease.hold(reader, 600, "vm-a")
            reader.put(mark, b'{"state": "ready"}', held)
            lease.unhold("vm-a", lossy)  # the error is the keep-alive thread's to try again
            assert reader.range(mark)[1], "the mark is still in etcd (main: revoked)"
            wait_for(lambda: lease.get(reader)[0] != held, 2 * TTL, "swapped back")
            back, _ = lease.get(reader)
            time.sleep(TTL + 1)  # longer than the lost swap's lease would live unrenewed
            assert reader.range(mark)[1], "the mark is still in etcd"
            assert leases(reader, direct.prefix) == {back}
            assert reader.lease_keys(held) is None, "the hold lease revoked"
            assert 0 < reader.time_to_live(back) <= TTL
        finally:
            lease.close()


def test_a_stray_of_a_swap_unanswered_is_not_revoked_as_a_previous_processs_lease(cluster):
    """A slot given back with its keys on a swap's stray lease (its move applied, unanswered)
    names that lease to `revoke_empty`, meant for a previous process's: its marks (a shared
    event's ready) went with it. The stray is the daemon's own: kept for the next swap."""
    direct = Etcd(endpoints=tuple(cluster.endpoints), prefix=f"/sed-{uuid.uuid4().hex[:8]}")
    mark = f"{direct.prefix}/events/E1/vm-a"
    lease = DaemonLease(direct, TTL)
    with EtcdClient(direct) as reader, AnswerLost(direct) as lossy:
        try:
            swap_unanswered(lease, reader, lossy, mark, b'{"state": "ready"}')
            (stray,) = leases(reader, direct.prefix)
            lease.revoke_empty(reader, {stray})
            assert reader.range(mark)[1], "the mark is still in etcd (was: revoked)"
            now, moved = lease.hold(reader, 600, "vm-a")
            assert moved == {mark}
            assert leases(reader, direct.prefix) == {now}
        finally:
            lease.close()


def test_a_slot_held_again_after_a_reload_dropped_one_is_moved_by_the_next_swap_back(cluster):
    """A reload removed `concurrency` while a slot was held through (`drop_unheld`: swapped back
    without the slot keys), then another put it back and a slot was held through again before
    that swap back ran. The drop stayed asked for: the swap back after that slot's release
    dropped every slot key on the lease, another VM's event's too (its worker still saying it
    held it). Held again, the drop is forgotten."""
    direct = Etcd(endpoints=tuple(cluster.endpoints), prefix=f"/sed-{uuid.uuid4().hex[:8]}")
    slot = f"{direct.prefix}/slots/web/0"
    lease = DaemonLease(direct, TTL)
    with EtcdClient(direct) as reader:
        try:
            lease.hold(reader, 600, "old keeper")
            lease.unhold("old keeper")  # handed over by the reload, to a keeper never coming
            lease.drop_unheld()  # the keep-alive thread's to do, at its next renewal
            held, _ = lease.hold(reader, 600, "new keeper")  # before it did
            reader.put(slot, b'{"vm": "vm-a"}', held)
            lease.unhold("new keeper", reader)
            back, _ = lease.get(reader)
            assert back != held, "swapped back"
            assert reader.range(slot)[1], "the slot key moved, not dropped (was: revoked)"
            assert leases(reader, direct.prefix) == {back}
        finally:
            lease.close()


def test_a_slot_given_back_while_etcd_was_out_of_reach_is_deleted_once_it_answers(cluster):
    """vm-a's event released while its daemon was cut from etcd for less than `ttl`: the
    delete failed and was never tried again, and the key stayed on the daemon's one lease,
    renewed for as long as the daemon lives (before the one lease it went with the worker's
    own within ttl): every other VM of the group waited for good. It is deleted once etcd
    answers."""
    ttl = 9  # renewed every 3 s: cut for 3.5 s, it is never lost
    direct = Etcd(endpoints=tuple(cluster.endpoints), prefix=f"/sed-{uuid.uuid4().hex[:8]}")
    slots = f"{direct.prefix}/slots/web/"
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    with ProxySet(cluster.endpoints, host="127.0.0.7") as path, EtcdClient(direct) as reader:
        daemon = Etcd(endpoints=tuple(path.endpoints), prefix=direct.prefix, timeout=1.0)
        keeper = SlotKeeper(daemon, Concurrency("web", 1, ttl), inbox.put)
        try:
            keeper.acquire(AcquireSlot(event("R1"), "vm-a"))
            said(inbox, SlotGranted, "R1")
            path.cut(reset=True)
            keeper.release("R1")  # its delete refused by every member
            time.sleep(3.5)
            path.restore()
            wait_for(lambda: not reader.range(slots)[1], 3 * ttl, "the slot given back")
        finally:
            path.restore()
            keeper.stop_all()


def test_a_slot_whose_worker_lost_track_of_it_given_back_in_a_partition_is_deleted_after(
    cluster,
):
    """The same when the worker had lost track of its key first (its read every third of
    `ttl` failed: SlotFailed, the key no longer counted as its own) and the event was released
    before etcd answered again: the key it wrote is looked for again and deleted once etcd
    answers (here only the worker's path to etcd is cut: the daemon's lease is renewed)."""
    ttl = 6
    direct = Etcd(endpoints=tuple(cluster.endpoints), prefix=f"/sed-{uuid.uuid4().hex[:8]}")
    slots = f"{direct.prefix}/slots/web/"
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    lease = DaemonLease(direct, ttl)
    with ProxySet(cluster.endpoints, host="127.0.0.7") as path, EtcdClient(direct) as reader:
        worker = Etcd(endpoints=tuple(path.endpoints), prefix=direct.prefix, timeout=1.0)
        keeper = SlotKeeper(worker, Concurrency("web", 1, ttl), inbox.put, lease)
        try:
            keeper.acquire(AcquireSlot(event("R1"), "vm-a"))
            said(inbox, SlotGranted, "R1")
            path.cut(reset=True)
            said(inbox, SlotFailed, "R1")  # its read failed: its keys forgotten
            keeper.release("R1")  # its delete refused by every member
            time.sleep(2)
            path.restore()
            wait_for(lambda: not reader.range(slots)[1], 3 * ttl, "the slot given back")
        finally:
            path.restore()
            keeper.stop_all()
            lease.close()
