"""This daemon's one etcd lease: every key it writes (its slots, its shared-event marks) hangs on
it, and one thread keeps it alive, every third of its ttl. A daemon killed loses all of them
within `ttl`. Per event and VM that is one grant for the daemon's life, not one per slot and
mark, and one keep-alive stream for all of them.

Its hold lease, of `concurrency.hold_max`, is the second and last: granted when its VM's slot is
held through a maintenance (approved, slots.py), renewed by the same thread at the same instants
(every third of the shorter of the two) while the daemon lives, revoked once no slot is on it.
A daemon that goes down (a clean stop for its maintenance, the VM pulled away, a crash) leaves
that slot held until `hold_max` after the last renewal, or until it is back and takes it again
(the old one, left with no key, revoked then: slots.py): at most two leases per daemon,
whatever the number of its events. A reload that changes `coordination` makes a new one;
the old hold lease is revoked once the new keeper has taken its keys back (`retire`).

The slot workers hear from it (`watch`): `kept(confirmed)` after each keep-alive etcd
acknowledged (when it was sent, on the monotonic clock: the engine counts a slot lost `ttl`
after that) and `expired()` when etcd says the lease is gone (its keys with it); the next `get`
grants a new one.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Optional, Protocol

from ..config import Etcd
from ..retry import Backoff
from .etcd import EtcdClient, EtcdError


class Listener(Protocol):
    def kept(self, confirmed: float) -> None: ...

    def expired(self) -> None: ...


class DaemonLease:
    """Thread-safe: slot workers and shared-event workers `get` it from their own threads."""

    def __init__(self, settings: Etcd, ttl: int) -> None:
        self.settings = settings
        self.ttl = ttl
        self._lock = threading.Lock()
        self._granting = threading.Lock()  # one grant at a time, outside `_lock`
        self._client = EtcdClient(settings)  # the keep-alive thread's own
        self._id: Optional[str] = None
        self._confirmed = 0.0  # monotonic: when the last acknowledged grant or keep-alive was sent
        self._granted = ttl  # the ttl the current lease was granted with
        self._listeners: list[Listener] = []
        self._stopped = threading.Event()
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._hold: Optional[str] = None  # the hold lease's ID, while a slot is on it
        self._hold_ttl = 0  # the ttl it was granted with (renewed every third of it too)
        self._holders: set[str] = set()  # who put keys on it (a VM's slot worker each)

    def retune(self, ttl: int) -> None:
        """A reload changed `concurrency.ttl`: renewed every third of the shorter of the two
        (the lease granted keeps its own ttl), new grants under the new one."""
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
                ttl = self.ttl
            sent = time.monotonic()
            lease = client.grant(ttl)
            with self._lock:
                self._id, self._confirmed, self._granted = lease, sent, ttl
                if self._thread is None and not self._stopped.is_set():
                    self._thread = threading.Thread(
                        target=self._run, name="etcd-lease", daemon=True
                    )
                    self._thread.start()
            self._wake.set()
            return lease, sent

    def hold(self, client: EtcdClient, seconds: int, holder: str) -> str:
        """The hold lease's ID (granted through `client` for `seconds` if there is none), kept
        alive from now on with the daemon's lease; raises EtcdError."""
        with self._granting:
            with self._lock:
                if self._hold is not None:
                    self._holders.add(holder)
                    return self._hold
            lease = client.grant(seconds)
            with self._lock:
                self._hold, self._hold_ttl = lease, seconds
                self._holders.add(holder)
            self._wake.set()  # a hold_max shorter than ttl: renewed at its own pace from now
            return lease

    def unhold(self, holder: str, client: Optional[EtcdClient] = None) -> None:
        """`holder` keeps nothing on the hold lease any more: revoked through `client` once
        nobody does (its keys, if any were left, go with it: they were given back). Without
        `client` (a reload hands the keys over to a new worker) never revoked. Raises
        EtcdError."""
        with self._lock:
            self._holders.discard(holder)
            if self._holders or client is None:
                return
            lease, self._hold = self._hold, None
        if lease is not None:
            client.revoke(lease)

    def drop_unheld(self) -> None:
        """A reload removed `concurrency` while a slot was on the hold lease: its keeper handed
        it over to a keeper that will never come, and the engine gave it back. Revoked (its
        keys go) on a thread of its own if nobody holds it; it was renewed for good."""
        with self._lock:
            if self._holders or self._hold is None:
                return
            lease, self._hold = self._hold, None

        def revoke() -> None:
            client = EtcdClient(self.settings)
            try:
                client.revoke(lease)
            except EtcdError:
                pass  # renewed no more: gone at hold_max
            finally:
                client.close()

        threading.Thread(target=revoke, name="etcd-unhold", daemon=True).start()

    @staticmethod
    def revoke_empty(client: EtcdClient, leases: set[str]) -> None:
        """Leases a slot was taken back from (the hold lease of this daemon before a restart or
        a reload), revoked if no key is left on them: not left to etcd until hold_max. Only
        empty ones: a dead daemon's lease may still carry its shared-event marks."""
        for old in sorted(lease for lease in leases if lease):
            with contextlib.suppress(EtcdError):
                if client.lease_keys(old) == []:
                    client.revoke(old)

    def renew_hold(self, client: EtcdClient) -> None:
        """One last renewal, as the daemon stops: the hold counts `hold_max` from now, not from
        the thread's last renewal (up to a third of `ttl` earlier). Raises EtcdError."""
        with self._lock:
            lease = self._hold
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

    def close(self) -> None:
        """Stop renewing (never revoked: its keys expire within ttl, as for a daemon killed)."""
        self._stopped.set()
        self._wake.set()
        self._client.close()

    def retire(self) -> None:
        """A reload replaced this lease (`coordination` changed; `close` first): its hold
        lease, if any, is revoked once no key is on it (the new keeper took them back under
        its own) or left to expire (gone); checked every third of `ttl` on a thread of its
        own, until `hold_max` has passed (its keys, if never taken back, expire then)."""
        with self._lock:
            lease, seconds, self._hold = self._hold, self._hold_ttl, None
        if lease is not None:
            threading.Thread(
                target=self._retire, args=(lease, seconds), name="etcd-hold-retire", daemon=True
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
                    if left == []:
                        client.revoke(lease)
                    if not left:
                        return
                except EtcdError:
                    client.close()
                    client = EtcdClient(self.settings)
        finally:
            client.close()

    def _every(self) -> float:
        """A third of the shortest lease it renews: a hold_max shorter than `ttl` (accepted,
        with a warning) expired between two renewals while the daemon lived."""
        with self._lock:
            hold = self._hold_ttl if self._hold is not None else self.ttl
            return min(self.ttl, self._granted, hold) / 3

    def _run(self) -> None:
        backoff = Backoff(first=1.0, cap=self._every())
        failures = 0
        while not self._stopped.is_set():
            with self._lock:
                lease, confirmed = self._id, self._confirmed
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
            self._renew_hold()
            if left == 0:
                self.lost(lease)
                continue
            with self._lock:
                if self._id == lease:
                    self._confirmed = sent
                listeners = list(self._listeners)
            for listener in listeners:
                listener.kept(sent)

    def _renew_hold(self) -> None:
        """The hold lease, renewed with the daemon's (a failure is tried again at the next
        renewal: it lives `hold_max`, far longer than a third of `ttl`)."""
        with self._lock:
            hold = self._hold
        if hold is None:
            return
        try:
            if self._client.keep_alive(hold) == 0:
                with self._lock:
                    if self._hold == hold:  # expired (a partition longer than hold_max)
                        self._hold = None
        except EtcdError:
            pass
