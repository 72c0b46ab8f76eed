"""The fleet as etcd shows it: who holds each group's slots, who waits and why, which shared
events have how many VMs ready; and an operator's free of a held slot.

Read by `scheduledeventsd fleet` with the daemon's own etcd settings (endpoints, TLS, user): the
daemons decide nothing from this view, it only reads the keys they write. The keys, all under
`coordination.etcd.prefix` (each segment percent-encoded: names are data, not paths):

- `slots/<group>/<n>` = `{"vm", "event", "at"}`: slot n of the group (n < its max), held by
  that VM for that event since `at`; on the daemon's one lease (daemon_lease.py): of `ttl`,
  or, once its event is approved, of `hold_max`, renewed while the daemon lives (slots.py).
  When that lease ends is when the hold ends.
- `daemons/<vm>` = `{"vm", "groups": {group: max}, "ttl", "at"}`: the daemon of that VM is
  alive and wants or holds a slot. On the daemon's lease; deleted when it stops, so a held
  slot whose VM has no such key is held by a VM that is down. On a lease of `hold_max` the key
  outlives a daemon killed in its maintenance: alive only while its lease is renewed (`silent`).
- `waiting/<group>/<vm>` = `{"vm", "event", "why", "since"}`: that VM's event waits for a
  slot of the group (why: every slot is held; who holds them is the group's slots). Written
  once while it waits for that group, on the daemon's lease; deleted when it takes a slot or
  stops. Not shown while its lease is silent.
- `freed/<group>/<vm>` = `{"vm", "event", "key", "by", "at"}`: an operator freed the slot that
  VM held for that event (`fleet free`), under a lease of FREED_TTL. The daemon that held it
  logs `slot_freed_by_operator` when it notices, and never takes a slot for that event again.
- `events/<EventId>/<vm>` = `{"state": "ready"|"failed", ...}`: shared events (peers.py),
  deleted by that VM once the event is over for it: only events in progress are shown.
- `settled/<EventId>`: written by the VM whose write decided a shared event (peers.py); the
  other VMs watch it; deleted by the last VM to forget the event. Not shown.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import socket
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..config import Etcd
from ..retry import Backoff
from .etcd import EtcdClient, EtcdError, KeyValue

FREED_TTL = 24 * 3600  # seconds a freed mark lasts: longer than any event takes to end


def _segment(text: str) -> str:
    return urllib.parse.quote(text, safe="-_.~")


def _root(settings: Etcd) -> str:
    return settings.prefix.rstrip("/")


def daemon_key(settings: Etcd, vm: str) -> str:
    return f"{_root(settings)}/daemons/{_segment(vm)}"


def waiting_key(settings: Etcd, group: str, vm: str) -> str:
    return f"{_root(settings)}/waiting/{_segment(group)}/{_segment(vm)}"


def freed_key(settings: Etcd, group: str, vm: str) -> str:
    return f"{_root(settings)}/freed/{_segment(group)}/{_segment(vm)}"


def stamp() -> str:
    """Now, as every key's `at` says it."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def encode(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True).encode()


def decode(value: Optional[bytes]) -> dict[str, Any]:
    """A key's JSON object; {} for anything else (a value we cannot read is shown as such)."""
    try:
        decoded = json.loads(value or b"")
    except (ValueError, RecursionError):
        return {}
    return decoded if isinstance(decoded, dict) else {}


def _text(fields: dict[str, Any], name: str) -> str:
    value = fields.get(name)
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class Holder:
    vm: str
    event: str
    since: str
    alive: bool  # its daemon's key is there
    ends_in: Optional[int]  # seconds the slot's lease has left (None: no lease, held for good)
    slot: str  # the slot's number


@dataclass(frozen=True)
class Waiter:
    vm: str
    event: str
    why: str
    since: str


@dataclass(frozen=True)
class Group:
    name: str
    max: Optional[int]  # from this VM's configuration, else what the daemons say
    holders: tuple[Holder, ...] = ()
    waiting: tuple[Waiter, ...] = ()


@dataclass(frozen=True)
class SharedEvent:
    event_id: str
    ready: tuple[str, ...]
    failed: tuple[str, ...]


@dataclass(frozen=True)
class View:
    groups: tuple[Group, ...]
    events: tuple[SharedEvent, ...]
    ttl: int  # this VM's concurrency.ttl: a silent holder whose hold ends later is down
    daemons: tuple[str, ...] = field(default=())  # VMs whose daemon is alive

    def down(self) -> list[tuple[str, Holder]]:
        """(group, holder) of each slot held by a VM whose daemon is silent and whose hold
        ends in more than `ttl`: a VM still down (not a daemon killed outside a maintenance,
        whose slot goes within `ttl`)."""
        return [
            (g.name, h)
            for g in self.groups
            for h in g.holders
            if not h.alive and (h.ends_in is None or h.ends_in > self.ttl)
        ]


def silent(left: int, granted: int, ttl: int) -> bool:
    """Whether the daemon of a lease (`left` and `granted` seconds, EtcdClient.lease_times)
    went silent: gone, or not renewed for more than `ttl` (a live daemon renews every third
    of it, daemon_lease.py). Its keys may stay until `hold_max`; they no longer speak for it."""
    return left < 0 or granted - left > ttl


def read(settings: Etcd, groups: dict[str, int], ttl: int) -> View:
    """The fleet now (EtcdError when etcd cannot be read). `groups`: this VM's groups and
    their max, shown even when nobody holds or waits."""
    root = _root(settings) + "/"
    client = EtcdClient(settings)
    try:
        _, kvs = client.range(root)
        # A slot's or waiting mark's lease: the daemon's (one per daemon), which says when the
        # hold ends and whether it is renewed; one on a `ttl` lease is alive while it exists.
        leases = {kv.lease for kv in kvs if kv.lease and _asked(root, kv)}
        times = {lease: client.lease_times(lease) for lease in sorted(leases)}
    finally:
        client.close()
    return _view(root, kvs, times, groups, ttl)


def _parts(root: str, key: str) -> list[str]:
    return [urllib.parse.unquote(p) for p in key[len(root) :].split("/")]


def _asked(root: str, kv: KeyValue) -> bool:
    """A slot key or a waiting mark: its lease is asked when it ends and whether it is renewed."""
    parts = _parts(root, kv.key)
    slot = len(parts) == 3 and parts[0] == "slots" and parts[2].isdigit()
    return slot or (len(parts) == 3 and parts[0] == "waiting")


def _view(
    root: str,
    kvs: list[KeyValue],
    times: dict[str, tuple[int, int]],
    configured: dict[str, int],
    ttl: int,
) -> View:
    maxes: dict[str, Optional[int]] = dict(configured)
    alive: set[str] = set()
    holders: dict[str, list[Holder]] = {}
    waiting: dict[str, list[Waiter]] = {}
    events: dict[str, dict[str, str]] = {}
    ttls: dict[str, int] = {}  # each VM's daemon's ttl, as it says
    for kv in kvs:
        parts, fields = _parts(root, kv.key), decode(kv.value)
        if parts[0] == "daemons" and len(parts) == 2:
            vm, said_ttl = _text(fields, "vm") or parts[1], fields.get("ttl")
            ttls[vm] = said_ttl if isinstance(said_ttl, int) and said_ttl > 0 else ttl
            if kv.lease not in times or not silent(*times[kv.lease], ttls[vm]):
                alive.add(vm)
            said = fields.get("groups")
            for group, most in said.items() if isinstance(said, dict) else ():
                if isinstance(most, int) and group not in configured:
                    known = maxes.get(group)
                    maxes[group] = most if known is None else min(known, most)
        elif parts[0] == "events" and len(parts) == 3:
            state = _text(fields, "state") or "?"
            events.setdefault(parts[1], {})[_text(fields, "vm") or parts[2]] = state
    for kv in kvs:
        parts, fields = _parts(root, kv.key), decode(kv.value)
        if parts[0] == "slots" and len(parts) == 3 and parts[2].isdigit():
            vm = _text(fields, "vm") or "?"
            left = times[kv.lease][0] if kv.lease in times else None
            held = Holder(
                vm, _text(fields, "event"), _text(fields, "at"), vm in alive, left, parts[2]
            )
            holders.setdefault(parts[1], []).append(held)
            maxes.setdefault(parts[1], None)
        elif parts[0] == "waiting" and len(parts) == 3:
            vm, why = _text(fields, "vm") or parts[2], _text(fields, "why")
            if kv.lease in times and silent(*times[kv.lease], ttls.get(vm, ttl)):
                continue  # its daemon is silent: nobody waits there
            waiter = Waiter(vm, _text(fields, "event"), why, _text(fields, "since"))
            waiting.setdefault(parts[1], []).append(waiter)
            maxes.setdefault(parts[1], None)
    groups = tuple(
        Group(
            name,
            maxes[name],
            tuple(sorted(holders.get(name, []), key=lambda h: int(h.slot))),
            tuple(sorted(waiting.get(name, []), key=lambda w: (w.since, w.vm))),
        )
        for name in sorted(maxes)
    )
    shared = tuple(
        SharedEvent(
            event_id,
            tuple(sorted(vm for vm, s in states.items() if s == "ready")),
            tuple(sorted(vm for vm, s in states.items() if s == "failed")),
        )
        for event_id, states in sorted(events.items())
    )
    return View(groups, shared, ttl, tuple(sorted(alive)))


@dataclass(frozen=True)
class Freed:
    group: str
    slot: str
    event: str


def free(settings: Etcd, vm: str, group: Optional[str] = None) -> list[Freed]:
    """Free every slot `vm` holds (in `group` only, when given): a freed mark first (so its
    daemon knows why, and does not take one again for that event), then the slot key deleted
    only while it still names that VM. [] when it holds none; EtcdError when etcd cannot be
    asked. Nothing else is touched."""
    root = _root(settings) + "/"
    prefix = root + "slots/" + (f"{_segment(group)}/" if group is not None else "")
    client = EtcdClient(settings)
    freed = []
    try:
        for kv in client.range(prefix)[1]:
            parts, fields = _parts(root, kv.key), decode(kv.value)
            if len(parts) != 3 or not parts[2].isdigit() or _text(fields, "vm") != vm:
                continue
            assert kv.value is not None  # noqa: S101 - a range gives values
            mark = {
                "vm": vm,
                "event": _text(fields, "event"),
                "key": kv.key,
                "by": _operator(),
                "at": stamp(),
            }
            lease = client.grant(FREED_TTL)
            client.put(freed_key(settings, parts[1], vm), encode(mark), lease)
            if client.delete(kv.key, kv.value):
                freed.append(Freed(parts[1], parts[2], mark["event"]))
    finally:
        client.close()
    return freed


def freed_mark(client: EtcdClient, settings: Etcd, group: str, vm: str) -> dict[str, Any]:
    """The operator's mark on this VM's slot of the group ({} when none)."""
    key = freed_key(settings, group, vm)
    found = [kv for kv in client.range(key)[1] if kv.key == key]
    return decode(found[0].value) if found else {}


def _operator() -> str:
    """Who freed it, for both logs: the user and the machine the command ran on."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()}"


WATCH_CHECK = 30.0  # a silent watch is checked with a linearizable read (as peers.py does)


class SlotCounter:
    """How many slots of each group are held, as each VM sees it (for the metrics): a watch of
    `slots/<group>/` per group, `counted(group, held)` on every change. A thread of its own,
    never in the daemon's way; etcd unreachable: the last count stays, asked again with backoff."""

    def __init__(
        self, settings: Etcd, groups: dict[str, int], counted: Callable[[str, int], None]
    ) -> None:
        self.settings = settings
        self.groups = dict(groups)
        self._counted = counted
        self._stopped = threading.Event()
        self._clients: list[EtcdClient] = []
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(g,), name="slot-count", daemon=True)
            for g in self.groups
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()

    def _run(self, group: str) -> None:
        failures = 0
        while not self._stopped.is_set():
            client = EtcdClient(self.settings)
            with self._lock:
                self._clients.append(client)
            if self._stopped.is_set():
                client.close()
                return
            try:
                self._watch(client, group)
            except EtcdError:
                failures += 1
            except Exception:  # noqa: BLE001 - a metric is never worth the daemon
                failures += 1
            finally:
                client.close()
            if self._stopped.wait(Backoff(first=1.0, cap=30.0).delay(failures)):
                return

    def _watch(self, client: EtcdClient, group: str) -> None:
        prefix = f"{_root(self.settings)}/slots/{_segment(group)}/"
        most = self.groups[group]
        while not self._stopped.is_set():
            revision, kvs = client.range(prefix)
            held = {kv.key for kv in kvs if _counts(kv.key[len(prefix) :], most)}
            self._counted(group, len(held))
            for changes in client.watch(prefix, revision + 1, WATCH_CHECK):
                for kv in changes:
                    if not _counts(kv.key[len(prefix) :], most):
                        continue
                    if kv.value is None:
                        held.discard(kv.key)
                    else:
                        held.add(kv.key)
                self._counted(group, len(held))


def _counts(n: str, most: int) -> bool:
    """A slot's number below the group's max (a key beyond it is no slot: max was lowered)."""
    return n.isdigit() and int(n) < most


__all__ = ["EtcdError", "Freed", "Group", "Holder", "SlotCounter", "View", "Waiter", "free", "read"]
