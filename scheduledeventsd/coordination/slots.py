"""Concurrency slots in etcd: at most `max` VMs of a group in early maintenance at once; with
several groups (a tier and a zone), a slot in each, taken in one transaction or none
(slotset.py), held, handed over and given back together.

The keys (read by `scheduledeventsd fleet`, freed by `fleet free`; keep this list true):

- `<prefix>/slots/<group>/<n>`, n < max (group URL-quoted): one slot, held by the VM whose
  value it is. Value: JSON `{"vm": name, "event": EventId of the first event that took it,
  "at": when it was taken, UTC ISO 8601}`; taken by a transaction that creates it only if
  absent, given back by one that deletes it only while it holds that exact value.
- While its daemon runs, the key hangs on the daemon's one lease (daemon_lease.py: every key
  the daemon writes, its shared-event marks `<prefix>/events/<EventId>/<vm>` included, TTL
  `concurrency.ttl`, renewed every third of it): a daemon killed loses it within `ttl`.
- Once its VM is in its maintenance (HoldSlot `alive`, gates/through.py) the daemon's lease
  itself is swapped for one of `hold_max` (daemon_lease.py `hold`: all its keys moved in one
  transaction), renewed while it lives (SlotMoved says so, or that the move failed); a
  stopping daemon swaps it the same way and renews it once more: held until the VM is back
  (taken back there, the old lease revoked once no slot is on it) and its after-hooks
  succeeded, or hold_max; given back, the lease is swapped back to `ttl`. A Terminate or
  Preempt deletes it as the VM goes. Across a reload it stays on the daemon's lease; the new
  keeper takes back only the VM's keys (an added group is for its next event).
- Freeing a held slot by hand is deleting its key: the VM's daemon, if alive, hears it only
  through its engine's next SlotBusy (it does not watch its own key).

The engine decides when to ask, give back and hold (AcquireSlot, ReleaseSlot, HoldSlot); one
worker thread per VM carries it out (its events share one slot, given back after the last) and
tells them SlotGranted, SlotKept (when etcd's acknowledged keep-alive was sent: lost `ttl`
after), SlotBusy (holders, on change; lease expired) or SlotFailed (asked again, backoff).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import threading
import time
import urllib.parse
from collections.abc import Iterable
from typing import Callable, Optional

from ..config import Concurrency, Etcd
from ..engine import AcquireSlot, Message, SlotBusy, SlotFailed, SlotFreed, SlotGranted, SlotKept
from ..engine import SlotMoved as Moved
from ..retry import Backoff
from . import slotset
from .daemon_lease import DaemonLease
from .etcd import Changes, EtcdClient, EtcdError, KeyValue
from .fleet import daemon_key, encode, freed_mark, stamp
from .slot_line import Line
from .slotset import holder

# Seconds a waiter waits for those ahead in line to take a free slot (one may be dead: `ttl`)
PATIENCE = 1.0


def group_prefix(settings: Etcd, group: str) -> str:
    return f"{settings.prefix.rstrip('/')}/slots/{urllib.parse.quote(group, safe='-_.~')}/"


__all__ = ["SlotKeeper", "group_prefix", "holder"]


class SlotKeeper:
    """The slot workers of this VM: one per VM name, shared by every event of that VM that
    asks for a slot. Slots bound how many VMs are down at once, not events: a second event of
    a VM (a Redeploy during a Reboot's drain) holds the slot the first one holds, and the VM
    gives it back only once the last of them is released."""

    def __init__(
        self,
        settings: Etcd,
        concurrency: Concurrency,
        send: Callable[[Message], None],
        lease: Optional[DaemonLease] = None,
    ) -> None:
        """`lease`: the daemon's one lease (the coordinator's); one of its own without it."""
        self.settings = settings
        self.concurrency = concurrency
        self._send = send
        self._own_lease = lease is None
        self.lease = lease if lease is not None else DaemonLease(settings, concurrency.ttl)
        if self.lease.ttl != concurrency.ttl:
            self.lease.retune(concurrency.ttl)
        self._lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}  # by VM name
        self._vm_of: dict[str, str] = {}  # EventId -> the VM name its worker holds for
        self._giving_back: list[threading.Thread] = []  # releases, waited for by `stop_all`

    def acquire(self, effect: AcquireSlot) -> None:
        event_id, vm = effect.event.event_id, effect.vm_name
        with self._lock:
            if event_id in self._vm_of:
                return
            worker = self._workers.get(vm)
            if worker is not None and effect.hold:
                worker.keep(effect.hold)
            fresh = worker is None
            if worker is None:
                worker = _Worker(self.settings, self.concurrency, effect, self._send, self.lease)
                self._workers[vm] = worker
            self._vm_of[event_id] = vm
            worker.join(event_id)
        if fresh:
            worker.start()

    def release(self, event_id: str) -> None:
        with self._lock:
            vm = self._vm_of.pop(event_id, None)
            worker = self._workers.get(vm) if vm is not None else None
            if worker is None or not worker.leave(event_id):
                return  # unknown, or another event of the VM still needs the slot
            del self._workers[vm]  # type: ignore[arg-type]
            self._giving_back = [t for t in self._giving_back if t.is_alive()]
            self._giving_back.append(worker.release())

    def keep(self, event_id: str, seconds: int) -> None:
        """The event's VM is in its maintenance (HoldSlot `alive`): the daemon's lease becomes
        one of `seconds`, its slot on it (on the worker's thread: never holds up the loop)."""
        with self._lock:
            vm = self._vm_of.get(event_id)
            worker = self._workers.get(vm) if vm is not None else None
        if worker is not None:
            worker.keep(seconds)

    def hold(self, event_id: str, seconds: int) -> tuple[tuple[str, ...], str]:
        """The daemon stops while this event holds the VM's slot (HoldSlot): the daemon's lease
        becomes one of `seconds` with the slot key on it (if not yet), renewed one last time;
        the VM's worker ends. The slot's keys, and why that failed ("": held)."""
        with self._lock:
            vm = self._vm_of.get(event_id)
            worker = self._workers.pop(vm, None) if vm is not None else None
            if worker is None:
                return (), ""
            self._vm_of = {e: v for e, v in self._vm_of.items() if v != vm}
        return worker.stop(hold=seconds)

    def stop_all(self) -> None:
        """The daemon's stop (after HoldSlot) or a reload: slots given back are (a Terminate's
        went within `ttl`: the daemon exited first); a slot held stays on the daemon's lease (the
        new keeper takes it back; a lease closed by the reload is revoked once it has)."""
        with self._lock:
            workers, self._workers, self._vm_of = list(self._workers.values()), {}, {}
            releasing, self._giving_back = self._giving_back, []
        until = time.monotonic() + 2 * self.settings.timeout + self.concurrency.ttl / 3
        for thread in releasing:  # each bounded as `_give_back` is: together, at most that
            thread.join(timeout=max(0.0, until - time.monotonic()))
        for worker in workers:
            worker.stop(hold=self.concurrency.ttl, handover=True)
        if self._own_lease:
            self.lease.close()


class _Worker:
    def __init__(
        self,
        settings: Etcd,
        concurrency: Concurrency,
        effect: AcquireSlot,
        send: Callable[[Message], None],
        lease: DaemonLease,
    ) -> None:
        self.settings = settings
        self._shared = lease
        self.concurrency = concurrency
        self.renew = concurrency.ttl / 3
        self.event_id = effect.event.event_id  # the first event: names the thread and the key
        self.vm = effect.vm_name
        self.prefixes = {g: group_prefix(settings, g) for g in concurrency.groups}
        self.root = slotset.root(self.prefixes)  # read and watched: every group's keys
        self.value = self._stamped()  # stamped again as it takes its slot (`_take`)
        self._send = send
        self._client = EtcdClient(settings)
        self._stopped = threading.Event()
        self._ended = threading.Event()  # stopped, released, or the lease expired while held
        self._lease: Optional[str] = None
        self._keys: tuple[str, ...] = ()  # the slot keys, one per group, once held
        self._line = Line(settings, concurrency, self.vm, self.event_id, self.prefixes)
        self._announced: Optional[bytes] = None  # the daemon's mark written (fleet.py)
        # Monotonic: when the last grant or keep-alive of the lease that etcd acknowledged was
        # sent (the lease lives `ttl` from at least then); the engine counts the slot lost
        # `ttl` after it, whatever this thread is doing.
        self._confirmed = 0.0
        self._events: set[str] = set()  # the events of this VM that hold or want the slot
        self._held = False  # SlotGranted was said: events joining now are granted at once
        self._expired = False  # the lease expired while held: taken anew (`_hold`)
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._run, name=f"slot-{self.event_id[:8]}", daemon=True
        )
        self._keep = effect.hold  # held through its maintenance: on the hold lease of that
        self._token = f"{self.vm} {id(self)}"  # this worker, among the hold lease's holders
        self._on_hold = self._said = self._failing = False  # on the hold lease; said; failing
        self._lapsed = False  # on the hold lease as etcd went away: kept there, or lost then
        self._wake = threading.Event()  # `_hold` looks again now (moved, released, stopped)
        self._unwatch = lease.watch(self)

    def _stamped(self) -> bytes:
        """Its slot keys' value, `at` now: when it took the slot, as `fleet` shows it (stamped
        when it began to wait, `fleet` said a VM held the slot since before it took it)."""
        at = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return json.dumps(
            {"vm": self.vm, "event": self.event_id, "at": at}, sort_keys=True
        ).encode()

    def start(self) -> None:
        self._thread.start()

    def join(self, event_id: str) -> None:
        """Another event of this VM needs the slot: it shares it (granted now if held)."""
        with self._lock:
            self._events.add(event_id)
            if self._held:
                self._send(SlotGranted(event_id, self._confirmed))

    def leave(self, event_id: str) -> bool:
        """True when no event needs the slot any more (the caller gives it back)."""
        with self._lock:
            self._events.discard(event_id)
            return not self._events

    def _tell(
        self, kind: Callable[..., Message], *fields: object, held: Optional[bool] = None
    ) -> None:
        """Send every event of this VM the same news, `kind(event_id, *fields)` (and note
        whether the slot is held, under the same lock as `join`)."""
        with self._lock:
            if held is not None:
                self._held = held
            for event_id in sorted(self._events):
                self._send(kind(event_id, *fields))

    def keep(self, seconds: int) -> None:
        """Held through its maintenance from now on: its keys move to the hold lease (`_hold`
        does it, and tries again every third of `ttl` while etcd cannot be asked)."""
        self._keep = seconds
        self._wake.set()

    def release(self) -> threading.Thread:
        """Give the slot back now (a thread of its own: never holds up the daemon's loop)."""
        self._stopped.set()
        self._ended.set()
        self._wake.set()
        self._unwatch()
        self._client.close()
        thread = threading.Thread(target=self._give_back, name="slot-release", daemon=True)
        thread.start()
        return thread

    def stop(self, hold: int = 0, handover: bool = False) -> tuple[tuple[str, ...], str]:
        """End this worker; with `hold`, the daemon's lease becomes one of `hold` s with a slot
        held on it (moved while ours; renewed once more if it was already); `handover` (a
        reload): the keys stay on the daemon's lease as they are. Its keys, and why it failed."""
        self._stopped.set()
        self._ended.set()
        self._wake.set()
        self._unwatch()
        self._client.close()
        self._thread.join(timeout=self.settings.timeout)
        keys, error = self._keys, ""
        try:
            with EtcdClient(self.settings) as client:
                if hold and keys and self._on_hold and not handover:
                    self._renew_hold(client)
                elif hold and keys and not self._on_hold and not handover:
                    _, moved = self._shared.hold(client, hold, self._token)
                    if not set(keys) <= moved and not self._put_held(client, keys):
                        error = "the slot is not this VM's any more (freed or lost meanwhile)"
        except EtcdError as e:
            error = f"{e.kind}: {e.detail}"[:300]
        if handover:  # on the daemon's lease still: the new keeper's worker takes them back
            self._shared.unhold(self._token)
        try:
            with EtcdClient(self.settings) as client:
                self._unmark(client)
        except EtcdError:
            pass  # the marks go with the daemon's lease
        return keys, error

    def _put_held(self, client: EtcdClient, keys: tuple[str, ...]) -> bool:
        """Its keys put under the daemon's lease (the hold lease now) while they are its."""
        with self._shared.using(client) as lease:
            self._lease = lease
            return client.put_all([(k, self.value) for k in keys], self.value, lease)

    def _renew_hold(self, client: EtcdClient) -> None:
        """Its keys are on the hold lease already: `hold_max` counted from now, or, etcd not
        answering, from its last renewal (a third of `ttl` ago at most): held either way."""
        with contextlib.suppress(EtcdError):
            self._shared.renew_hold(client)

    def _unmark(self, client: EtcdClient) -> None:
        """Its daemon stops: no longer alive for `fleet`, its events no longer waiting."""
        if self._announced is not None:
            client.delete(daemon_key(self.settings, self.vm), self._announced)
        self._line.leave(client)

    def _give_back(self) -> None:
        """Delete the VM's key: the one it holds or, given back before it was taken back after
        a restart (after-hooks quicker than etcd), the one its hold lease still keeps: a key
        left there would hold the next VM up for hold_max. Only while it holds our value.
        Tried again until etcd answers: on the daemon's one lease, renewed, a key left would
        hold the group up for as long as the daemon lives (or the lease, closed, is gone). Then
        only the keys it wrote itself: any other of its VM's could be the VM's next event's,
        taken meanwhile (its previous process's, if left, goes at the end of that one's lease)."""
        self._thread.join(timeout=self.settings.timeout + self.renew)
        backoff = Backoff(first=1.0, cap=self.renew)
        failures = 0
        while True:
            try:
                with EtcdClient(self.settings) as client:
                    self._return(client, looked=failures > 0)
            except EtcdError:
                failures += 1
                if self._shared.wait_closed(backoff.delay(failures)):
                    return  # the daemon stops: its keys go with its lease (a hold's at its end)
            else:
                return

    def _return(self, client: EtcdClient, looked: bool) -> None:
        self._line.leave(client)  # released while it waited (its event cancelled)
        if self._keys:
            client.delete_all(self._keys, self.value)
        else:  # the lease it was on (its daemon's before the restart) revoked too
            ours, was = tuple(self.prefixes.values()), set()
            for kv in client.range(self.root)[1]:
                mine = kv.key.startswith(ours) and kv.value and holder(kv.value) == self.vm
                mine = mine and (not looked or kv.value == self.value)
                if mine and client.delete(kv.key, kv.value or b""):
                    was.add(kv.lease)
            self._shared.revoke_empty(client, was)
        if self._keep or self._on_hold:
            self._shared.unhold(self._token, client)  # back to ttl once nobody holds

    def _run(self) -> None:
        backoff = Backoff(first=1.0, cap=self.renew)
        failures = 0
        while not self._stopped.is_set():
            try:
                self._work()
            except EtcdError as e:
                if self._stopped.is_set():
                    return
                if self._lease is not None and "lease not found" in e.detail:
                    self._shared.lost(self._lease)  # expired meanwhile: granted anew
                if self._keep and self._keys and not self._on_hold:
                    self._move_failed(e)  # its keys were still to move: lost within ttl
                elif not failures:
                    self._tell(SlotFailed, e.kind, e.detail)
                failures += 1
                self._lapsed = self._lapsed or bool(self._on_hold and self._keys)
                self._keys = ()
                self._lease = None
                with self._lock:
                    self._held = False
                self._client.close()
                self._client = EtcdClient(self.settings)
                if self._stopped.wait(backoff.delay(failures)):
                    return
            except Exception as e:  # noqa: BLE001 - must end in a message, never silently
                self._tell(SlotFailed, "internal", repr(e))
                return
            else:
                return

    def _get_lease(self) -> str:
        """The daemon's lease (granted now if it has none) and when etcd last confirmed it."""
        lease, self._confirmed = self._shared.get(self._client)
        return lease

    def kept(self, confirmed: float) -> None:
        """The daemon's lease was renewed: a held slot is confirmed until `ttl` after."""
        with self._lock:
            held = self._held
        if held and not self._ended.is_set():
            self._confirmed = confirmed
            self._tell(SlotKept, confirmed)

    def expired(self) -> None:
        """etcd says the daemon's lease is gone, and a held slot with it; one on the hold lease
        (a partition in its maintenance, shorter than hold_max) is not: nothing is said, its
        marks are written again under the new lease and it is taken again (SlotGranted)."""
        with self._lock:
            held = self._held
        if held and not self._ended.is_set():
            if not self._on_hold:
                self._keys = ()
                self._tell(SlotBusy, ("(lease expired)",), (), True, held=False)
            with self._lock:
                self._expired = True
            self._ended.set()
            self._wake.set()

    def _work(self) -> None:
        if self._keep:  # taken back held through (a restart): of hold_max from the start
            self._shared.hold(self._client, self._keep, self._token)
        self._lease = self._get_lease()
        self._announce()
        if self._freed():
            return
        while not self._stopped.is_set():
            if not self._wait_and_take():
                return
            self._lapsed = self._on_hold  # nothing said: the hold lease may still keep it
            self._lease = self._get_lease()  # its lease expired: taken anew under a new one
            self._announce()  # alive for `fleet` again (its mark went with the lease)

    def _wait_and_take(self) -> bool:
        """Read the groups' keys once, then follow them on one watch (its events, not a read
        after each: a release wakes every waiter, and each reading again was a request per
        waiter per release) until the slots are taken; read again after `renew` without a
        change. True when its lease expired while held (taken anew, `_hold`)."""
        holders: Optional[tuple[str, ...]] = None
        again = False
        while not self._stopped.is_set():
            revision, kvs = self._client.range(self.root)
            seen = {kv.key: kv for kv in kvs}
            if again:
                self._line.recount(self._client, kvs)
            changes = self._client.watch(self.root, revision + 1, self.renew)
            try:
                while not self._stopped.is_set():
                    taking = self._take(list(seen.values()), anyway=again)
                    again = True
                    if taking is None:
                        self._line.leave(self._client)
                        sharing = self._holders(seen.values())
                        self._tell(SlotGranted, self._confirmed, sharing, held=True)
                        self._lapsed = False
                        return self._hold()
                    if taking.full and (self._lapsed or taking.holders != holders):
                        holders, lost = taking.holders, self._lapsed  # lost: its hold lease too
                        self._lapsed, self._on_hold = False, self._on_hold and not lost
                        self._keys, held = ((), False) if lost else (self._keys, None)
                        self._tell(SlotBusy, holders, taking.full, lost, held=held)
                        with self._shared.using(self._client) as lease:
                            self._line.mark(self._client, taking.full[0], lease)
                    patience = threading.Timer(PATIENCE, self._client.interrupt)
                    if self._line.waited:
                        patience.start()
                    try:
                        if not self._changed(changes, seen):
                            break  # nothing for `renew`, or PATIENCE: read again, try anyway
                    finally:
                        patience.cancel()
                    again = False
                    self._lease = self._get_lease()  # the same, unless it expired meanwhile
            finally:
                changes.close()
        return False

    def _announce(self) -> None:
        """Its daemon is alive (fleet.py's `daemons/<vm>`), on the daemon's lease."""
        groups = {limit.group: limit.max for limit in self.concurrency.limits}
        said = {"vm": self.vm, "groups": groups, "ttl": self.concurrency.ttl, "at": stamp()}
        self._announced = encode(said)
        with self._shared.using(self._client) as self._lease:
            self._client.put(daemon_key(self.settings, self.vm), self._announced, self._lease)

    def _freed(self) -> bool:
        """An operator freed the slot one of these events held (`fleet free`): told, never
        taken again for it (after a restart it would be taken back silently)."""
        for group in self.prefixes:
            mark = freed_mark(self._client, self.settings, group, self.vm)
            with self._lock:
                ours = mark.get("event") in self._events
            if ours:
                self._tell(SlotFreed, str(mark.get("by", "")), str(mark.get("at", "")), held=False)
                return True
        return False

    def _still_ours(self) -> bool:
        """Every slot key still holds this VM's value; else an operator freed one (told)."""
        values = {kv.key: kv.value for kv in self._client.range(self.root)[1]}
        gone = [k for k in self._keys if values.get(k) != self.value]
        if not gone:
            return True
        group = next((g for g, p in self.prefixes.items() if gone[0].startswith(p)), "")
        mark = freed_mark(self._client, self.settings, group, self.vm)
        if not mark and self._lease is not None and self._client.keep_alive(self._lease) == 0:
            self._shared.lost(self._lease)  # its lease expired (a partition): `expired`, not freed
            return False
        self._keys = ()
        self._tell(SlotFreed, str(mark.get("by", "")), str(mark.get("at", "")), held=False)
        self._ended.set()
        return False

    def _take(self, kvs: list[KeyValue], anyway: bool = False) -> Optional[slotset.Plan]:
        """Take a slot in every group at once: the one this VM holds (after a restart: put
        under the new lease), else a free one. None when they are ours; else the plan that
        found a group full, or was beaten by another VM (its change is then watched). A key
        of this VM at or beyond `max` (a reload or restart lowered it) is no slot any more:
        it is deleted, never taken back; so are the VM's keys while another group is full.
        A free slot is tried for on its turn in line (slot_line.py), or `anyway`."""
        assert self._lease is not None  # noqa: S101 - granted before
        keep = self._keep
        limits = self.concurrency.limits
        taking = slotset.plan(kvs, self.vm, limits, self.prefixes, held_only=bool(keep))
        for kv in taking.stale:
            self._client.delete(kv.key, kv.value or b"")
        line = self._line
        line.waited = bool(taking.take) and not anyway and not line.turn(kvs, taking)
        if line.waited:
            return taking
        if keep and taking.take:  # the daemon's lease is of hold_max from now on
            self._shared.hold(self._client, keep, self._token)
        took = False
        if taking.take:  # under the lease as it is now: never one a swap is revoking
            self.value = self._stamped()  # before: an answer lost after the put wrote it
            with self._shared.using(self._client) as lease:
                took = self._client.put_all(taking.take, self.value, lease)
        if took:
            self._keys = tuple(key for key, _ in taking.take)
            self._on_hold, self._said = bool(keep), False
            if keep:  # its daemon's lease before a restart or reload: revoked once slot-free
                was = {kv.lease for kv in kvs if (kv.key, kv.value) in taking.take}
                self._shared.revoke_empty(self._client, was - {lease, self._lease or ""})
            self._lease = lease
            return None
        return taking

    def _holders(self, kvs: Iterable[KeyValue]) -> tuple[str, ...]:
        """Who holds its groups' slots as it took its own: itself and the others in `kvs`
        (`status` showed the holders of the last refusal while this VM held the slot)."""
        ours = tuple(self.prefixes.values())
        found = {holder(kv.value) or "?" for kv in kvs if kv.key.startswith(ours)}
        return tuple(sorted(found | {self.vm}))

    def _changed(self, changes: Changes, seen: dict[str, KeyValue]) -> bool:
        """Wait for a change to the keys of this VM's groups on `changes` (the watch), applied
        to `seen`; False after `renew` without one (the keys are read again then), also while
        only other groups' keys change under the same root."""
        until = time.monotonic() + self.renew
        ours = tuple(self.prefixes.values())
        for batch in changes:  # closed on leaving
            for kv in batch:
                if kv.value is None:
                    seen.pop(kv.key, None)
                else:
                    seen[kv.key] = kv
                    self._line.took(kv.value)
            if any(kv.key.startswith(ours) for kv in batch):
                return True
            if time.monotonic() >= until:
                return False
        return False

    def _move_to_hold(self) -> None:
        """Held through its maintenance (`keep`): the keys move to the hold lease in one
        transaction while ours; etcd failing, tried again next round; not ours: `_still_ours`."""
        if not self._keep or not self._keys:
            return
        try:
            if not self._on_hold:
                lease, moved = self._shared.hold(self._client, self._keep, self._token)
                self._lease = lease  # the daemon's lease, swapped for one of hold_max
                on = set(self._keys) <= moved or self._put_held(self._client, self._keys)
                self._on_hold = on
        except EtcdError as e:
            self._client.close()
            if not self._ended.is_set():  # else closed on purpose: the worker ends
                self._client = EtcdClient(self.settings)
                self._move_failed(e)
            return
        if self._on_hold and not self._said:
            self._said, self._failing = True, False
            self._tell(Moved, self._keys, self._keep)

    def _move_failed(self, e: EtcdError) -> None:
        """Said once a series (etcd's error): on the daemon's lease, lost within ttl if it dies."""
        if not self._failing:
            self._failing = True
            self._tell(Moved, self._keys, self._keep, f"{e.kind}: {e.detail}"[:300])

    def _hold(self) -> bool:
        """Held until released or stopped; the daemon's lease keeps it (`kept`: SlotKept),
        its expiry loses it (`expired`); read every third of `ttl` (an operator's `fleet free`).
        True when its lease expired (a partition): the slot is asked for again, not left free
        while its VM may still be in its maintenance (the engine gives it back if not needed)."""
        while not self._ended.is_set():
            self._move_to_hold()
            woken = self._wake.wait(self.renew)  # `keep`: moved at once, read at the round
            self._wake.clear()
            if self._ended.is_set() or not self._keys:
                break
            if not woken and not self._still_ours():
                break
        with self._lock:
            again, self._expired = self._expired and not self._stopped.is_set(), False
            if again:
                self._ended.clear()
        return again
