"""A VM's place in the line of one group's waiters (slots.py): its waiting mark
`waiting/<group>/<vm>` (fleet.py: why it waits, for `fleet`), and the VMs whose marks were
there before its own. A free slot is its to try for once they have taken theirs or left the
line (their marks gone); with several groups, everyone tries (no line)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Optional

from ..config import Concurrency, Etcd
from . import slotset
from .etcd import EtcdClient, KeyValue
from .fleet import encode, silent, stamp, waiting_key
from .slotset import holder


class Line:
    """The worker's thread only (not thread-safe)."""

    def __init__(
        self,
        settings: Etcd,
        concurrency: Concurrency,
        vm: str,
        event_id: str,
        prefixes: dict[str, str],
    ) -> None:
        self.settings = settings
        self.concurrency = concurrency
        self.vm = vm
        self.event_id = event_id
        self.prefixes = prefixes
        self.waiting: Optional[tuple[str, bytes]] = None  # the waiting mark (fleet.py)
        # The VMs whose marks were in its group's line before its own (one group only: with
        # several, everyone tries); None: not in line. Those seen taking a slot leave it.
        self.ahead: Optional[set[str]] = None
        self.marked: Optional[str] = None  # the lease its waiting mark was written under
        self.waited = False  # room, but not its turn: it waits PATIENCE, then tries anyway

    def leave(self, client: EtcdClient) -> None:
        """Its events no longer wait: out of line (else the others behind it wait PATIENCE at
        each release for it) and out of `fleet`'s waiting list."""
        if self.waiting is not None:  # forgotten once deleted (else tried again)
            client.delete(*self.waiting)
        self.waiting, self.ahead = None, None

    def mark(self, client: EtcdClient, group: str, lease: str) -> None:
        """Its events wait for a slot of `group`: why, for `fleet`. Written once while it
        waits for that group (who holds it changes at every hand-over; `fleet` shows them)."""
        key = waiting_key(self.settings, group, self.vm)
        if self.waiting is not None and self.waiting[0] == key and self.marked == lease:
            return
        since = json.loads(self.waiting[1])["since"] if self.waiting else stamp()
        if self.waiting is not None:
            client.delete(*self.waiting)
        mark = {
            "vm": self.vm,
            "event": self.event_id,
            "since": since,
            "why": f"every slot of {group} is held",
            "groups": sorted(self.prefixes),
        }
        self.waiting = (key, encode(mark))
        if len(self.concurrency.limits) > 1:
            client.put(*self.waiting, lease)
        else:
            line = waiting_key(self.settings, group, "")
            _, marks = client.put_and_range(*self.waiting, lease, line)
            ahead = (slotset.in_line(kv.value, group) for kv in marks if kv.key != key)
            self.ahead = {vm for vm in ahead if vm}
        self.marked = lease

    def recount(self, client: EtcdClient, slots: Iterable[KeyValue]) -> None:
        """Those ahead whose marks are gone (a daemon died: its lease ended) leave its line; so
        do those whose mark is on a lease that also holds a slot (`slots`: the groups' keys)
        and is silent: a daemon killed in its maintenance, whose lease of `hold_max` keeps its
        marks long after it (the only leases longer than `ttl`; asked only for those)."""
        if self.ahead and self.waiting is not None:
            line = self.waiting[0].rsplit("/", 1)[0] + "/"
            marks = client.range(line)[1]
            held = {kv.lease for kv in slots if kv.lease}
            times = {lease: client.lease_times(lease) for lease in {m.lease for m in marks} & held}
            ttl = self.concurrency.ttl
            here = {holder(m.value) for m in marks if not silent(*times.get(m.lease, (0, 0)), ttl)}
            self.ahead &= here

    def turn(self, kvs: list[KeyValue], taking: slotset.Plan) -> bool:
        """Its turn to try for a free slot (slotset.turn), or not in line."""
        if self.ahead is None or all(value is not None for _, value in taking.take):
            return True
        self.ahead -= {holder(kv.value) for kv in kvs}  # those holding a slot left the line
        (limit,) = self.concurrency.limits
        return slotset.turn(kvs, self.ahead, self.prefixes[limit.group], limit.max)

    def took(self, value: Optional[bytes]) -> None:
        """A slot key was written: the VM it names took its slot, and left the line."""
        if self.ahead:
            self.ahead.discard(holder(value))
