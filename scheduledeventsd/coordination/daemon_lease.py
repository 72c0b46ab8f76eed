"""This daemon's one etcd lease: every key it writes (its slots, its shared-event marks, its
alive and waiting marks for `fleet`) hangs on it, and one thread keeps it alive, every third of
`ttl`. Per event and VM that is one grant for the daemon's life, not one per slot and mark, and
one keep-alive stream for all of them.

Its TTL is `ttl` (a daemon killed loses everything within ttl), except while a slot of its VM
is held through a maintenance (approved, slots.py): then the lease itself is replaced by one of
`concurrency.hold_max` (`hold`: granted, every key moved onto it in one transaction while each
is still on the old one, the old one revoked), so a daemon that goes down then (a clean stop
for its maintenance, the VM pulled away, a crash) leaves its slot held until `hold_max` after
the last renewal, or until it is back and takes it again. Once no slot is held through any more
(`unhold`) it is swapped back to a `ttl` one the same way. One lease per running daemon at every
instant, two only inside a swap (or after a swap whose move etcd did not answer: its new lease,
renewed, until the next swap moves its keys), whatever the number of its events. Kept alive
every third of `ttl` whatever its TTL: a lease that lost more than `ttl` of what it was granted
belongs to a silent daemon (fleet.py `silent`): how `fleet` and the waiters' line tell a daemon
killed in its maintenance from a live one, though its keys stay.

The slot workers hear from it (`watch`): `kept(confirmed)` after each keep-alive etcd
acknowledged (when it was sent, on the monotonic clock: the engine counts a slot lost `ttl`
after that) and `expired()` when etcd says the lease is gone (its keys with it); the next `get`
grants a new one.

Every key is written `using` the lease: never while a swap is under way (a key put under the
old lease after the swap's last read of it was revoked with it: a slot the daemon then thought
it held, gone from etcd, taken by the next VM), and under the lease it is at that instant.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Callable, Optional, Protocol

from ..config import Etcd
from ..retry import Backoff
from .etcd import EtcdClient, EtcdError

SWAP_TRIES = 5  # transactions a swap tries while other threads rewrite the keys it moves


class Listener(Protocol):
    def kept(self, confirmed: float) -> None: ...

    def expired(self) -> None: ...


class DaemonLease:
    """Thread-safe: slot workers and shared-event workers `get` it from their own threads."""

    def __init__(self, settings: Etcd, ttl: int) -> None:
        self.settings = settings
        self.ttl = ttl
        self._lock = threading.Lock()
        self._granting = threading.Lock()  # one grant or swap at a time, outside `_lock`
        self._idle = threading.Condition(self._lock)  # writes under way and swaps wait on it
        self._writing = 0  # writes `using` the lease under way: a swap waits for them
        self._swapping = False  # a swap under way: writes wait for it
        # Leases a swap granted and did not adopt, its move unanswered (applied, perhaps, its
        # answer lost): renewed, and their keys moved by the next swap, then revoked.
        self._strays: list[str] = []
        self._client = EtcdClient(settings)  # the keep-alive thread's own
        self._id: Optional[str] = None
        self._confirmed = 0.0  # monotonic: when the last acknowledged grant or keep-alive was sent
        self._granted = ttl  # the ttl the current lease was granted with
        self._listeners: list[Listener] = []
        self._stopped = threading.Event()
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._holding = 0  # the lease's hold_max while a slot is held through on it; 0: `ttl`
        self._holders: set[str] = set()  # who holds a slot through on it (a VM's slot worker)
        self._back = (
            False  # nobody holds any more: swapped back to `ttl` (tried again if etcd failed)
        )
        self._drop_slots = False  # ... leaving the slot keys behind (`drop_unheld`)

    def retune(self, ttl: int) -> None:
        """A reload changed `concurrency.ttl`: renewed every third of the new one, new grants
        (and swaps back) under it."""
        with self._lock:
            self.ttl = ttl
        self._wake.set()

    def get(self, client: EtcdClient) -> tuple[str, float]:
        """The lease's ID and when etcd last confirmed it, granted through `client` (the
        caller's thread's) if there is none; raises EtcdError."""
        with self._granting:
            with self._lock:
                if self._id is not None:
                    return self._id, self._confirmed
                ttl = self._holding or self.ttl
            sent = time.monotonic()
            lease = client.grant(ttl)
            self._adopt(lease, sent, ttl)
            return lease, sent

    @contextlib.contextmanager
    def using(self, client: EtcdClient) -> Iterator[str]:
        """The lease to write a key under (`get`), not swapped until the write is done: a
        write waits for a swap under way, and a swap for the writes. Never `get`, `hold` or
        `unhold` inside (the swap waits for this write). Raises EtcdError."""
        while True:
            lease, _ = self.get(client)
            with self._idle:
                while self._swapping:
                    self._idle.wait()
                if self._id == lease:  # else swapped (or lost) meanwhile: the new one
                    self._writing += 1
                    break
        try:
            yield lease
        finally:
            with self._idle:
                self._writing -= 1
                self._idle.notify_all()

    def hold(self, client: EtcdClient, seconds: int, holder: str) -> tuple[str, frozenset[str]]:
        """The lease, swapped for one of `seconds` (every key moved onto it) unless it is held
        already, and the keys that swap moved (none if there was none); raises EtcdError."""
        with self._granting:
            with self._lock:
                if self._id is not None and self._holding:
                    self._holders.add(holder)
                    self._back = self._drop_slots = False  # held again: nothing to drop
                    return self._id, frozenset()
            lease, moved = self._swap(client, seconds)
            with self._lock:
                self._holding = seconds
                self._holders.add(holder)
                self._back = self._drop_slots = False
            return lease, moved

    def unhold(self, holder: str, client: Optional[EtcdClient] = None) -> None:
        """`holder` holds nothing through a maintenance any more: once nobody does, the lease
        is swapped back through `client` to a `ttl` one (with every key left on it; failing,
        the keep-alive thread tries again). Without `client` (a reload hands the keys over to
        a new worker) left as it is."""
        with self._lock:
            self._holders.discard(holder)
            if self._holders or client is None or not self._holding:
                return
            self._back = True
        with contextlib.suppress(EtcdError):
            self._swap_back(client)

    def drop_unheld(self) -> None:
        """A reload removed `concurrency` while a slot was held through: its keeper handed it
        over to a keeper that will never come, and the engine gave it back. Swapped back to a
        `ttl` lease without the slot keys (revoked with the old one) on the keep-alive thread,
        if nobody holds it."""
        with self._lock:
            if self._holders or not self._holding:
                return
            self._back = self._drop_slots = True
        self._wake.set()

    def revoke_empty(self, client: EtcdClient, leases: set[str]) -> None:
        """Leases a slot was taken back from (this daemon's before a restart or a reload),
        revoked once no slot key is left on them: not left to etcd until hold_max. What else
        they carry (the alive mark, shared-event marks) was the gone process's: the new one
        writes again what it still means. Never its own lease, nor a stray of its own (its
        marks on it, if a swap's unanswered move was applied: moved by the next swap)."""
        with self._lock:
            own = {self._id, *self._strays}
        for old in sorted(lease for lease in leases if lease and lease not in own):
            with contextlib.suppress(EtcdError):
                left = client.lease_keys(old)
                if left is not None and not any(self._is_slot(key) for key in left):
                    client.revoke(old)

    def renew_hold(self, client: EtcdClient) -> None:
        """One last renewal, as the daemon stops: the hold counts `hold_max` from now, not from
        the thread's last renewal (up to a third of `ttl` earlier). Raises EtcdError."""
        with self._lock:
            lease = self._id if self._holding else None
        if lease is not None:
            client.keep_alive(lease)

    def lost(self, lease: str) -> None:
        """A caller found `lease` gone (etcd refused a put under it): granted anew next time."""
        with self._lock:
            if self._id != lease:
                return
            self._id = None
            listeners = list(self._listeners)
        for listener in listeners:
            listener.expired()

    def watch(self, listener: Listener) -> Callable[[], None]:
        """Hear of keep-alives and expiry; returns what stops that."""
        with self._lock:
            self._listeners.append(listener)

        def unwatch() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unwatch

    def wait_closed(self, seconds: float) -> bool:
        """Wait `seconds`, or less if the lease is closed meanwhile: whether it is."""
        return self._stopped.wait(seconds)

    def close(self) -> None:
        """Stop renewing (never revoked: its keys expire within its TTL, as for a daemon killed)."""
        self._stopped.set()
        self._wake.set()
        self._client.close()

    def retire(self) -> None:
        """A reload replaced this lease (`coordination` changed; `close` first): revoked once
        no slot key is on it (the new keeper took them back under its own lease), checked
        every third of `ttl` on a thread of its own until it expires (its keys, if never taken
        back, with it)."""
        with self._lock:
            lease, seconds, self._id = self._id, self._granted, None
        if lease is not None:
            threading.Thread(
                target=self._retire, args=(lease, seconds), name="etcd-retire", daemon=True
            ).start()

    def _retire(self, lease: str, seconds: int) -> None:
        until = time.monotonic() + seconds
        every = self._every()
        client = EtcdClient(self.settings)
        try:
            while time.monotonic() < until:
                time.sleep(every)  # the new keeper takes the keys back meanwhile
                try:
                    left = client.lease_keys(lease)
                    if left is None:
                        return
                    if not any(self._is_slot(key) for key in left):
                        client.revoke(lease)
                        return
                except EtcdError:
                    client.close()
                    client = EtcdClient(self.settings)
        finally:
            client.close()

    def _is_slot(self, key: str) -> bool:
        return key.startswith(f"{self.settings.prefix.rstrip('/')}/slots/")

    def _adopt(self, lease: str, sent: float, ttl: int) -> None:
        """`lease` is the daemon's from now on (kept alive by the thread, started if need be)."""
        with self._lock:
            self._id, self._confirmed, self._granted = lease, sent, ttl
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(target=self._run, name="etcd-lease", daemon=True)
                self._thread.start()
        self._wake.set()

    def _swap(
        self, client: EtcdClient, seconds: int, drop_slots: bool = False
    ) -> tuple[str, frozenset[str]]:
        """With `_granting` held: a new lease of `seconds`, every key of the current one moved
        onto it (`drop_slots`: but the slot keys), the old one revoked. Its ID, the keys moved.
        No write `using` the lease meanwhile (after the last read, it would go with the old)."""
        with self._idle:
            self._swapping = True
            while self._writing:
                self._idle.wait()
        try:
            return self._swap_alone(client, seconds, drop_slots)
        finally:
            with self._idle:
                self._swapping = False
                self._idle.notify_all()

    def _swap_alone(
        self, client: EtcdClient, seconds: int, drop_slots: bool
    ) -> tuple[str, frozenset[str]]:
        """A move etcd did not answer may have been applied (a leader change, a partition
        just after the request): the new lease, never revoked then (its keys would go with
        it), is a stray until a swap moves its keys and revokes it."""
        with self._lock:
            old, strays = self._id, list(self._strays)
        sent = time.monotonic()
        new = client.grant(seconds)
        moved: set[str] = set()
        try:
            for source in (lease for lease in (old, *strays) if lease is not None):
                moved |= self._move(client, source, new, drop_slots)
        except EtcdError:
            with self._lock:
                self._strays.append(new)
            raise
        self._adopt(new, sent, seconds)
        with self._lock:
            self._strays = [lease for lease in self._strays if lease not in strays]
        for source in (lease for lease in (old, *strays) if lease is not None):
            with contextlib.suppress(EtcdError):  # empty; else gone at its end, never renewed
                client.revoke(source)
        return new, frozenset(moved)

    def _move(self, client: EtcdClient, old: str, new: str, drop_slots: bool) -> frozenset[str]:
        """The keys on `old`, moved onto `new` in one transaction while each is still on `old`;
        read again after it (another thread may have put one under `old` meanwhile: a shared
        event's mark) and moved too. Raises EtcdError."""
        moved: set[str] = set()
        for _ in range(SWAP_TRIES):
            left = client.lease_keys(old)
            keys = [k for k in left or () if not (drop_slots and self._is_slot(k))]
            if not keys:
                return frozenset(moved)
            if client.move_keys(keys, old, new):
                moved.update(keys)
        raise EtcdError("busy", f"the keys of lease {old} kept changing while moved to {new}")

    def _swap_back(self, client: EtcdClient) -> None:
        """Nobody holds a slot through any more: back to a `ttl` lease (if still so)."""
        with self._granting:
            with self._lock:
                if not self._back or self._holders or not self._holding or self._id is None:
                    self._back = self._drop_slots = False
                    return
                drop, ttl = self._drop_slots, self.ttl
            self._swap(client, ttl, drop)
            with self._lock:
                self._holding, self._back, self._drop_slots = 0, False, False

    def _renew_strays(self, strays: list[str]) -> None:
        """Keys a failed swap may have left on its new lease live until a swap moves them."""
        for stray in strays:
            with contextlib.suppress(EtcdError):
                if self._client.keep_alive(stray) == 0:
                    with self._lock:
                        self._strays = [lease for lease in self._strays if lease != stray]

    def _every(self) -> float:
        """A third of `ttl` (a hold_max shorter than `ttl`, accepted with a warning: of that):
        a live daemon's lease never lost more than that of its TTL."""
        with self._lock:
            return min(self.ttl, self._granted) / 3

    def _run(self) -> None:
        backoff = Backoff(first=1.0, cap=self._every())
        failures = 0
        while not self._stopped.is_set():
            with self._lock:
                lease, confirmed, back = self._id, self._confirmed, self._back
            if lease is None:
                wait = 3600.0  # until `get` grants one
            elif failures:  # asked again with backoff (the engine counts the slot lost at ttl)
                wait = backoff.delay(failures)
            else:
                wait = confirmed + self._every() - time.monotonic()
            if self._wake.wait(max(0.0, wait)):
                self._wake.clear()
                continue
            if lease is None or self._stopped.is_set():
                continue
            sent = time.monotonic()
            try:
                left = self._client.keep_alive(lease)
            except EtcdError:
                if self._stopped.is_set():
                    return
                failures += 1
                self._client.close()
                self._client = EtcdClient(self.settings)
                continue
            failures = 0
            if left == 0:
                self.lost(lease)
                continue
            with self._lock:
                if self._id == lease:
                    self._confirmed = sent
                listeners = list(self._listeners)
                strays = list(self._strays)
            self._renew_strays(strays)
            for listener in listeners:
                listener.kept(sent)
            if back:  # an `unhold` or `drop_unheld` etcd refused: tried at each renewal
                with contextlib.suppress(EtcdError):
                    self._swap_back(self._client)
