"""Review 6: SharedForgotten (coordination/peers.py `_forget`) is what a put-back's undo waits
for (engine/postponed): it must mean this VM's `ready` is gone from etcd. A put-back stops the
event's worker (StopCoordinating, withdraw) and asks the delete (ForgetShared) in one step; the
worker, stopped, may still be writing its mark. Real 3-member etcd."""

from __future__ import annotations

import dataclasses
import queue
import time

from scheduledeventsd.config import Etcd
from scheduledeventsd.coordination.etcd import EtcdClient
from scheduledeventsd.coordination.peers import EtcdCoordinator, event_prefix
from scheduledeventsd.engine import Coordinate, SharedForgotten
from tests.engine.test_engine import event
from tests.tcp_proxy import ProxySet

TRIES = 60


def test_shared_forgotten_is_sent_only_once_no_ready_of_this_vm_stands(cluster):
    """The daemon's order for a put-back: Coordinate (its worker writes ready), then in one
    step StopCoordinating (withdraw) and ForgetShared. Once SharedForgotten is sent, this VM's
    mark must be gone and stay gone: the node is undone on it, and another VM whose ready
    completes the set would be approved on a ready of a VM no longer prepared. Before the fix,
    in a quarter of the tries (15 of 60 on this machine), the stopped worker's put landed after
    the delete: the ready was read back after SharedForgotten, until the withdraw deleted it
    (and for the daemon's lifetime if that delete failed: the lease is the daemon's). Now the
    delete waits for the stopped worker's thread, which never starts a write once stopped."""
    settings = Etcd(endpoints=tuple(cluster.endpoints), prefix="/review6", timeout=2)
    inbox: queue.Queue[object] = queue.Queue()
    coordinator = EtcdCoordinator(settings, inbox.put, ttl=30)
    reader = EtcdClient(settings)
    stale = []
    try:
        for i in range(TRIES):
            event_id = f"E{i}"
            shared = dataclasses.replace(event(event_id, "Reboot", "Scheduled", ("vm-a", "vm-b")))
            coordinator.start(Coordinate(shared, "vm-a", True, 1))
            coordinator.stop(event_id, withdraw=True)
            coordinator.forget(event_id, "vm-a")
            deadline = time.monotonic() + 10
            while True:
                message = inbox.get(timeout=max(0.0, deadline - time.monotonic()))
                if message == SharedForgotten(event_id):
                    break
            until = time.monotonic() + 0.2
            while time.monotonic() < until:
                if reader.range(event_prefix(settings, event_id))[1]:
                    stale.append(event_id)
                    break
    finally:
        reader.close()
        coordinator.stop_all()
    assert not stale, f"a ready of this VM in etcd after SharedForgotten: {stale}"


def test_a_worker_stopped_before_its_first_write_never_writes_its_mark(cluster):
    """A worker told to stop (StopCoordinating, withdraw) while it is still getting the
    daemon's lease (etcd slow to answer: the path is cut, then restored) never writes its
    ready: etcd's history of the key holds no put at all. Before the fix the stopped worker
    wrote it once the grant was answered (its closed client opens a new connection), and the
    withdraw deleted it after: a put a ForgetShared's delete could come before."""
    with ProxySet(cluster.endpoints, host="127.0.0.2") as path:
        settings = Etcd(endpoints=tuple(path.endpoints), prefix="/review6b", timeout=5)
        direct = Etcd(endpoints=tuple(cluster.endpoints), prefix="/review6b", timeout=5)
        inbox: queue.Queue[object] = queue.Queue()
        coordinator = EtcdCoordinator(settings, inbox.put, ttl=30)
        reader = EtcdClient(direct)
        try:
            revision = reader.range(event_prefix(direct, "E"))[0]
            shared = event("E", "Reboot", "Scheduled", ("vm-a", "vm-b"))
            path.cut()
            coordinator.start(Coordinate(shared, "vm-a", True, 1))
            deadline = time.monotonic() + 5
            while path.accepted == 0:  # the worker asks for the lease: held
                assert time.monotonic() < deadline, "the worker never asked etcd"
                time.sleep(0.02)
            time.sleep(0.2)
            coordinator.stop("E", withdraw=True)
            path.restore()
            time.sleep(3)  # the grant answered, the worker ended, a withdraw done
            puts = [
                kv
                for changes in reader.watch(event_prefix(direct, "E"), revision + 1, 1.0)
                for kv in changes
                if kv.value is not None
            ]
        finally:
            reader.close()
            coordinator.stop_all()
    assert puts == [], f"a stopped worker wrote its mark: {puts}"
    assert inbox.empty(), "a stopped worker reports nothing"
