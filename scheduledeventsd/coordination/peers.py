"""Shared events through etcd: write this VM's state, learn the other VMs', report what they say.

The engine decides (approve once every VM named is ready, never when one failed); this module
carries out its Coordinate effects. Each shared event gets a worker thread with its own etcd
connection: it writes `<prefix>/events/<EventId>/<vm name>` under the daemon's one lease
(daemon_lease.py, also its slots': a mark lives as long as its daemon, gone within `ttl` of its
stop; one lost with it is written again) and reads the event's keys in the same transaction,
and sends them to the inbox as PeersChanged. A write that decides the event (the last ready, or
a `failed`) also puts `<prefix>/settled/<EventId>`; the other VMs watch only that key (and
their own mark), and read the event's keys when it changes: each VM is woken once per event,
not by every other VM's ready (at 100 VMs that fan-out was most of the approval's latency).
A watch silent for WATCH_CHECK reads them again, which also covers a VM that completed the set
and died before it settled. Until told to stop (a `failed` write reports the keys once, and
ends). Any failure ends the worker with one CoordinationFailed; the engine's backoff decides
when to try again.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import urllib.parse
from typing import Callable, Optional

from ..config import Etcd
from ..engine import Coordinate, CoordinationFailed, Message, PeersChanged
from .daemon_lease import DaemonLease
from .etcd import EtcdClient, EtcdError, KeyValue

# A watch that stays silent this long is checked with a linearizable read: a member cut off
# from the quorum keeps a stream open but delivers nothing.
WATCH_CHECK = 30.0


def event_prefix(settings: Etcd, event_id: str) -> str:
    return f"{settings.prefix.rstrip('/')}/events/{_segment(event_id)}/"


def settled_key(settings: Etcd, event_id: str) -> str:
    """Written by the VM whose write decided a shared event (the last ready, or a `failed`):
    the one key the other VMs watch, then read the event's keys and judge for themselves."""
    return f"{settings.prefix.rstrip('/')}/settled/{_segment(event_id)}"


def _segment(text: str) -> str:
    """A key segment: IMDS' EventId and the VM name are data, never a path of their own."""
    return urllib.parse.quote(text, safe="-_.~")


def record(effect: Coordinate) -> bytes:
    """The value a VM writes: its state, with what an operator reading the keys wants."""
    return json.dumps(
        {
            "state": "ready" if effect.ready else "failed",
            "vm": effect.vm_name,
            "event_type": effect.event.event_type,
            "incarnation": effect.incarnation,
            "at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
        sort_keys=True,
    ).encode()


def state_of(value: Optional[bytes]) -> str:
    """`ready`, `failed`, or `` for anything else (a value we cannot read is not a ready)."""
    if value is None:
        return ""
    try:
        decoded = json.loads(value)
    except (ValueError, RecursionError):
        return ""
    state = decoded.get("state") if isinstance(decoded, dict) else None
    return state if state in ("ready", "failed") else ""


class EtcdCoordinator:
    """The workers of the shared events in progress, by EventId."""

    def __init__(self, settings: Etcd, send: Callable[[Message], None], ttl: int = 30) -> None:
        """`ttl`: of the daemon's one lease (`concurrency.ttl`), which it owns."""
        self.settings = settings
        self._send = send
        self.lease = DaemonLease(settings, ttl)
        self._lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}

    def start(self, effect: Coordinate) -> None:
        event_id = effect.event.event_id
        worker = _Worker(self.settings, effect, self._send, self.lease)
        with self._lock:
            previous = self._workers.pop(event_id, None)
            if effect.ready:
                self._workers[event_id] = worker
        if previous is not None:
            previous.stop()
        worker.start()

    def stop(self, *event_ids: str) -> None:
        with self._lock:
            workers = [self._workers.pop(e) for e in event_ids if e in self._workers]
        for worker in workers:
            worker.stop()

    def stop_all(self) -> None:
        """The daemon stops (or a reload replaces this): the workers end, and the lease is no
        longer renewed (never revoked: the keys on it expire within its ttl)."""
        with self._lock:
            ids = list(self._workers)
        self.stop(*ids)
        self.lease.close()


class _Worker:
    def __init__(
        self,
        settings: Etcd,
        effect: Coordinate,
        send: Callable[[Message], None],
        lease: DaemonLease,
    ) -> None:
        self.settings = settings
        self._lease = lease
        self.effect = effect
        self._send = send
        self._client = EtcdClient(settings)
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._settling = False
        self._thread = threading.Thread(
            target=self._run, name=f"etcd-{effect.event.event_id[:8]}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """From any thread; a worker writing the settled key closes its client after it."""
        with self._lock:
            self._stopped.set()
            settling = self._settling
        if not settling:
            self._client.close()

    def _run(self) -> None:
        event = self.effect.event
        try:
            self._work()
        except EtcdError as e:
            if not self._stopped.is_set():
                self._send(CoordinationFailed(event.event_id, e.kind, e.detail))
        except Exception as e:  # noqa: BLE001 - must end in a message, never silently
            if not self._stopped.is_set():
                self._send(CoordinationFailed(event.event_id, "internal", repr(e)))
        finally:
            self._client.close()

    def _work(self) -> None:
        effect = self.effect
        prefix = event_prefix(self.settings, effect.event.event_id)
        own = prefix + _segment(effect.vm_name.casefold())
        settled = settled_key(self.settings, effect.event.event_id)
        revision = self._write_and_report(own, prefix, settled)
        if not effect.ready:
            return
        while not self._stopped.is_set():
            # Only the settled key (and our own mark, gone if the lease expired): a VM is woken
            # once when the event is decided, not by every other VM's ready (N² at 100 VMs).
            for changes in self._client.watch_keys((own, settled), revision + 1, WATCH_CHECK):
                if own in {kv.key for kv in changes if kv.value is None}:
                    self._write_and_report(own, prefix, settled)  # the lease expired: again
                else:
                    self._report(_states(self._client.range(prefix)[1], prefix))
                if self._stopped.is_set():  # (not closed while it settled)
                    return
            if self._stopped.is_set():
                return
            # Silent for WATCH_CHECK: read again (needs a quorum; it also covers a VM that
            # completed the set and died before it settled), watch again.
            revision, kvs = self._client.range(prefix)
            self._report(_states(kvs, prefix))

    def _write_and_report(self, own: str, prefix: str, settled: str) -> int:
        """Write this VM's mark and report what the write's answer shows; the revision. The
        VM whose write decides the event knows it from that answer, not from a read or watch
        event after it: it tells the engine first, then wakes the others (the settled key)."""
        revision, kvs = self._write(own, prefix)
        states = _states(kvs, prefix)
        if not self._decides(states):
            self._report(states)
            return revision
        with self._lock:
            self._settling = True
        self._report(states)
        self._settle(settled)
        return revision

    def _decides(self, states: dict[str, str]) -> bool:
        """Whether this VM's write decided the event: its own `failed`, or the last ready."""
        if not self.effect.ready:
            return True
        said = {name.casefold(): state for name, state in states.items()}
        return all(said.get(n.casefold()) == "ready" for n in self.effect.event.resources)

    def _settle(self, key: str) -> None:
        """Write the settled key, which the other VMs watch, even if told to stop meanwhile
        (the engine stops the watch as soon as it heard the set is complete)."""
        try:
            lease, _ = self._lease.get(self._client)
            try:
                self._client.put(key, record(self.effect), lease)
            except EtcdError as e:
                if "lease not found" not in e.detail:
                    raise
                self._lease.lost(lease)
                self._client.put(key, record(self.effect), self._lease.get(self._client)[0])
        finally:
            with self._lock:
                self._settling = False

    def _write(self, key: str, prefix: str) -> tuple[int, list[KeyValue]]:
        """Under the daemon's one lease, whatever the number of events and restarts of this
        worker; a lease found expired is granted anew and the key written again, once. One
        transaction that also reads `prefix`: its revision and keys just after the write."""
        lease, _ = self._lease.get(self._client)
        value = record(self.effect)
        try:
            return self._client.put_and_range(key, value, lease, prefix)
        except EtcdError as e:
            if "lease not found" not in e.detail:
                raise
            self._lease.lost(lease)
            return self._client.put_and_range(key, value, self._lease.get(self._client)[0], prefix)

    def _report(self, states: dict[str, str]) -> None:
        if not self._stopped.is_set():
            self._send(PeersChanged(self.effect.event.event_id, dict(states)))


def _states(kvs: list[KeyValue], prefix: str) -> dict[str, str]:
    return {_name(kv.key, prefix): state_of(kv.value) for kv in kvs}


def _name(key: str, prefix: str) -> str:
    return urllib.parse.unquote(key[len(prefix) :])
