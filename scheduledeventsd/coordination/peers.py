"""Shared events through etcd: write this VM's state, learn the other VMs', report what they say.

The engine decides (approve once every VM named is ready, never when one failed); this module
carries out its Coordinate effects. Each shared event gets a worker thread with its own etcd
connection: it writes `<prefix>/events/<EventId>/<vm name>` under the daemon's one lease
(daemon_lease.py, also its slots': a mark is gone within `ttl` of its daemon's stop if not
deleted before, below; one lost with it is written again) and reads the event's keys in the same
transaction, and sends them to the inbox as PeersChanged. A write that decides the event (the
last ready, or a `failed`) also puts `<prefix>/settled/<EventId>`; the other VMs watch only that
key (and their own mark), and read the event's keys when it changes: each VM is woken once per
event, not by every other VM's ready (at 100 VMs that fan-out was most of the approval's
latency). A watch silent for WATCH_CHECK reads them again, which also covers a VM that completed
the set and died before it settled. Until told to stop (a `failed` write reports the keys once,
and ends). Any failure ends the worker with one CoordinationFailed; the engine's backoff decides
when to try again. Told to stop before its event was decided (it left the document, or started),
the worker takes its ready back (deleted while it holds what it wrote): an event back under the
same EventId is not approved on a ready from before while that VM's hooks run again.
Once the engine has forgotten the event (ForgetShared: its stage has run and it left, or it is
judged anew), this VM's mark is deleted, and the settled key with it by the last VM to forget
(no other mark left): the daemon's lease lives as long as the daemon, so nothing else would;
once etcd answered, the engine is told (SharedForgotten: a put-back's undo waits for it), and
only once no worker stopped for the EventId can still write its mark after the delete (the
delete waits for their threads; a stopped worker never starts a write). A
VM still waiting keeps its own mark, so the settled key stays for it; a restarted daemon forgets
what it knew before (its state file) the same way. A VM down for the maintenance forgets only
once back: its ready from before is older than the settled key, and every read takes that key
with the marks, so it does not count for the EventId back (`round_states`).
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import urllib.parse
from typing import Callable, Optional, TypeVar

from ..config import Etcd
from ..engine import Coordinate, CoordinationFailed, Message, PeersChanged, SharedForgotten
from .daemon_lease import DaemonLease
from .etcd import EtcdClient, EtcdError, KeyValue

T = TypeVar("T")

# A watch that stays silent this long is checked with a linearizable read: a member cut off
# from the quorum keeps a stream open but delivers nothing.
WATCH_CHECK = 30.0
# A ForgetShared delete that etcd did not answer is tried again, doubling from the first to the
# last: a mark left behind stays as long as the daemon (its lease), and a ready from before
# would count for an event back under its EventId while this VM's hooks run again.
FORGET_RETRY = (1.0, 30.0)


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


def state_of(value: Optional[bytes], event_type: str = "") -> str:
    """`ready`, `failed`, or `` for anything else (a value we cannot read is not a ready; nor
    one written for another EventType of the EventId: that VM prepared for another event)."""
    if value is None:
        return ""
    try:
        decoded = json.loads(value)
    except (ValueError, RecursionError):
        return ""
    if not isinstance(decoded, dict):
        return ""
    written_for = decoded.get("event_type")
    if event_type and isinstance(written_for, str) and written_for != event_type:
        return ""
    state = decoded.get("state")
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
        self._forgetting: dict[str, threading.Thread] = {}  # ForgetShared's deletes under way
        self._forget_ends: dict[str, threading.Event] = {}  # set: a delete not tried again
        # Workers stopped (perhaps still writing their mark): a ForgetShared waits for them.
        self._stopped_workers: dict[str, list[_Worker]] = {}

    def start(self, effect: Coordinate) -> None:
        event_id = effect.event.event_id
        with self._lock:
            forgetting = self._forgetting.get(event_id)
            if event_id in self._forget_ends:  # its write replaces the mark: tried no more
                self._forget_ends[event_id].set()
        worker = _Worker(self.settings, effect, self._send, self.lease, forgetting)
        with self._lock:
            previous = self._workers.pop(event_id, None)
            if effect.ready:
                self._workers[event_id] = worker
            if previous is not None:
                self._stopping(event_id, previous)
        if previous is not None:
            previous.stop()
        worker.start()

    def stop(self, *event_ids: str, withdraw: bool = False) -> None:
        """`withdraw` (StopCoordinating): a ready not decided yet is taken back."""
        with self._lock:
            workers = [self._workers.pop(e) for e in event_ids if e in self._workers]
            for worker in workers:
                self._stopping(worker.effect.event.event_id, worker)
        for worker in workers:
            worker.stop(withdraw)

    def _stopping(self, event_id: str, worker: _Worker) -> None:
        """Under the lock: `worker` is being stopped; kept (with the others of its EventId
        still running) until its thread ended, for a ForgetShared to wait for."""
        kept = {e: [w for w in ws if not w.ended()] for e, ws in self._stopped_workers.items()}
        self._stopped_workers = {e: ws for e, ws in kept.items() if ws}
        self._stopped_workers.setdefault(event_id, []).append(worker)

    def forget(self, event_id: str, vm_name: str) -> None:
        """ForgetShared, on a thread of its own: this VM's mark deleted, and the settled key
        with it if no other VM's mark is left, tried again while etcd does not answer. Not while
        a worker for the EventId runs (a new event under it, whose mark that is); a Coordinate
        after this waits for it, and this for the workers of the EventId just stopped."""
        with self._lock:
            if event_id in self._workers:
                return
            stopped = list(self._stopped_workers.get(event_id, ()))
            if event_id in self._forget_ends:  # one still trying: this one takes over
                self._forget_ends[event_id].set()
            end = threading.Event()
            thread = threading.Thread(
                target=self._forget,
                args=(event_id, vm_name, end, stopped),
                name="etcd-forget",
                daemon=True,
            )
            self._forgetting[event_id] = thread
            self._forget_ends[event_id] = end
            thread.start()  # under the lock: stop_all never joins one not started

    def _forget(
        self, event_id: str, vm_name: str, end: threading.Event, stopped: list[_Worker]
    ) -> None:
        """Tried again (FORGET_RETRY) while etcd does not answer, until this daemon stops or
        a new worker for the EventId writes its mark anew. Not before the `stopped` workers'
        threads ended (a write of theirs in flight would land after the delete). Deleted:
        SharedForgotten (a put-back's undo waits for it: engine/postponed), unless a later one
        took over."""
        prefix = event_prefix(self.settings, event_id)
        own = prefix + _segment(vm_name.casefold())
        wait = FORGET_RETRY[0]
        try:
            while not (
                all(worker.join() for worker in stopped)
                and self._deleted(own, prefix, settled_key(self.settings, event_id))
            ):
                if end.wait(wait):
                    return  # the daemon stops (its lease takes the mark) or it is written anew
                wait = min(wait * 2, FORGET_RETRY[1])
            if not end.is_set():
                self._send(SharedForgotten(event_id))
        finally:
            with self._lock:
                if self._forgetting.get(event_id) is threading.current_thread():
                    del self._forgetting[event_id]
                    del self._forget_ends[event_id]

    def _deleted(self, own: str, prefix: str, settled: str) -> bool:
        """One try of ForgetShared's transaction; False when etcd did not answer."""
        client = EtcdClient(self.settings)
        try:
            client.delete_last(own, prefix, settled)
        except EtcdError:
            return False
        finally:
            client.close()
        return True

    def stop_all(self) -> None:
        """The daemon stops (or a reload replaces this): the workers end, the deletes under way
        are waited for (bounded), and the lease is no longer renewed (never revoked: the keys
        on it expire within its ttl)."""
        with self._lock:
            ids = list(self._workers)
            forgetting = list(self._forgetting.values())
            for end in self._forget_ends.values():
                end.set()  # the attempt under way ends; none after it
        self.stop(*ids)
        for thread in forgetting:
            thread.join(timeout=self.settings.timeout + 1)
        self.lease.close()


class _Worker:
    def __init__(
        self,
        settings: Etcd,
        effect: Coordinate,
        send: Callable[[Message], None],
        lease: DaemonLease,
        after: Optional[threading.Thread] = None,
    ) -> None:
        self.settings = settings
        self._lease = lease
        self._after = after  # the delete of this EventId's mark a ForgetShared started
        self.effect = effect
        self._type = effect.event.event_type  # a mark written for another type is not counted
        self._send = send
        self._client = EtcdClient(settings)
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._settling = False
        self._writing = False  # a write of its mark in flight: not cut short by `stop`
        self._written: Optional[bytes] = None  # the last mark written (or being written)
        self._decided = False  # a report that decides the event was sent to the engine
        self._thread = threading.Thread(
            target=self._run, name=f"etcd-{effect.event.event_id[:8]}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def ended(self) -> bool:
        """Whether it can write no more: its thread ended, or it is stopped before it started
        (it never starts a write once stopped)."""
        return not self._thread.is_alive() and (
            self._thread.ident is not None or self._stopped.is_set()
        )

    def join(self) -> bool:
        """Stopped: wait (bounded) for its thread to end; whether it did (`ended`)."""
        if self._thread.ident is not None:
            self._thread.join(timeout=self.settings.timeout + 1)
        return self.ended()

    def stop(self, withdraw: bool = False) -> None:
        """From any thread; a worker writing its mark or the settled key closes its client
        after it (no write is cut short: etcd may apply it unanswered, after a delete).
        `withdraw`: its ready, if the event was not decided, is deleted (a thread of its own)."""
        with self._lock:
            self._stopped.set()
            settling = self._settling or self._writing
        if not settling:
            self._client.close()
        if withdraw and self.effect.ready:
            threading.Thread(target=self._withdraw, name="etcd-withdraw", daemon=True).start()

    def _withdraw(self) -> None:
        """Delete this VM's ready once the worker ended, unless a report deciding the event
        was sent (the other VMs may still need to read it), and only while it holds what this
        worker wrote (a newer worker's write stays)."""
        if self._thread.ident is not None:
            self._thread.join(timeout=self.settings.timeout + 1)
        value = self._written
        if self._decided or value is None:
            return
        prefix = event_prefix(self.settings, self.effect.event.event_id)
        client = EtcdClient(self.settings)
        try:
            client.delete(prefix + _segment(self.effect.vm_name.casefold()), value)
        except EtcdError:
            pass  # it goes with the daemon's lease
        finally:
            client.close()

    def _run(self) -> None:
        event = self.effect.event
        if self._after is not None:
            self._after.join(timeout=self.settings.timeout + 1)
        try:
            self._work()
        except _StoppedError:
            pass
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
                if self._stopped.is_set():  # (its ready may be being taken back)
                    return
                if own in {kv.key for kv in changes if kv.value is None}:
                    self._write_and_report(own, prefix, settled)  # the lease expired: again
                else:
                    kvs = self._client.range_with(prefix, settled)[1]
                    self._report(round_states(kvs, prefix, own, settled, self._type))
                if self._stopped.is_set():  # (not closed while it settled)
                    return
            if self._stopped.is_set():
                return
            # Silent for WATCH_CHECK: read again (needs a quorum; it also covers a VM that
            # completed the set and died before it settled), watch again.
            revision, kvs = self._client.range_with(prefix, settled)
            self._report(round_states(kvs, prefix, own, settled, self._type))

    def _write_and_report(self, own: str, prefix: str, settled: str) -> int:
        """Write this VM's mark and report what the write's answer shows; the revision. The
        VM whose write decides the event knows it from that answer, not from a read or watch
        event after it: it tells the engine first, then wakes the others (the settled key)."""
        revision, kvs = self._write(own, prefix, settled)
        states = round_states(kvs, prefix, own, settled, self._type)
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
            self._under_lease(lambda lease: self._client.put(key, record(self.effect), lease))
        finally:
            with self._lock:
                self._settling = False

    def _write(self, key: str, prefix: str, settled: str) -> tuple[int, list[KeyValue]]:
        """Under the daemon's one lease, whatever the number of events and restarts of this
        worker; a lease found expired is granted anew and the key written again, once. One
        transaction that also reads `prefix` and `settled`: its revision and keys just after
        the write."""
        value = record(self.effect)

        def put(lease: str) -> tuple[int, list[KeyValue]]:
            with self._lock:  # stopped before: no write (a ForgetShared may be deleting it)
                if self._stopped.is_set():
                    raise _StoppedError()
                self._writing = True
                self._written = value
            try:
                return self._client.put_and_range(key, value, lease, prefix, settled)
            finally:
                with self._lock:
                    self._writing = False

        return self._under_lease(put)

    def _under_lease(self, write: Callable[[str], T]) -> T:
        """`write` under the daemon's lease (`using`: never one a swap is revoking); a lease
        found expired is granted anew and the key written again, once."""
        with self._lease.using(self._client) as lease:
            try:
                return write(lease)
            except EtcdError as e:
                if "lease not found" not in e.detail:
                    raise
        self._lease.lost(lease)
        with self._lease.using(self._client) as lease:
            return write(lease)

    def _report(self, states: dict[str, str]) -> None:
        if not self._stopped.is_set():
            self._send(PeersChanged(self.effect.event.event_id, dict(states)))
            said = {name.casefold(): state for name, state in states.items()}
            named = [said.get(n.casefold()) for n in self.effect.event.resources]
            if "failed" in named or all(s == "ready" for s in named):
                self._decided = True


class _StoppedError(Exception):
    """The worker was told to stop before it wrote its mark: it ends without a word."""


def round_states(
    kvs: list[KeyValue], prefix: str, own: str, settled: str, event_type: str = ""
) -> dict[str, str]:
    """The VMs' states in this round of the event, from one read of `prefix` and `settled`;
    a mark written for another `event_type` (the EventId listed with another type since: a VM
    that has not seen it yet) is no state at all.

    A `ready` written before the settled key was last written (its mod_revision below the
    settled key's), read by a VM whose own mark was written after it, is from a round already
    decided: a VM whose daemon went down for that maintenance before it forgot the event still
    has it, and it must not count for the EventId back. A VM that reads the round it is in
    (its mark older than settled) counts every mark; a `failed` counts always (the safe way).
    Revisions are etcd's own, kept through a compaction for the keys still there."""
    floor = next((kv.revision for kv in kvs if kv.key == settled), 0)
    mine = next((kv.revision for kv in kvs if kv.key == own), 0)
    states: dict[str, str] = {}
    for kv in kvs:
        if not kv.key.startswith(prefix):
            continue
        state = state_of(kv.value, event_type)
        if state == "ready" and mine > floor > kv.revision:
            continue  # a ready from before: not this round's
        states[_name(kv.key, prefix)] = state
    return states


def _name(key: str, prefix: str) -> str:
    return urllib.parse.unquote(key[len(prefix) :])
