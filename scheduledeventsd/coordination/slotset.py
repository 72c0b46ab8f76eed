"""Which slot keys a VM takes: one in every group its `concurrency` names, or none.

Planned from one read of the groups' keys; slots.py puts the planned keys in one etcd
transaction that holds only while every key is as read, so a VM never holds a slot in some
groups and waits for the others (two VMs could then wait on each other for ever).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from ..config import Limit
from .etcd import KeyValue


def holder(value: Optional[bytes]) -> str:
    """The VM a slot key names ("" for a value this daemon did not write)."""
    try:
        decoded = json.loads(value or b"")
    except (ValueError, RecursionError):
        return ""
    vm = decoded.get("vm") if isinstance(decoded, dict) else None
    return vm if isinstance(vm, str) else ""


@dataclass(frozen=True)
class Plan:
    """`take`: a key per group and what it holds now (None: absent), to put together; empty
    when a group has no slot for this VM. `stale`: this VM's keys to delete (beyond a group's
    max, a second key of a group, or, with a group full, the ones it would have taken back:
    never a partial hold). `full`: the groups without a slot for it; `holders`: who holds them."""

    take: tuple[tuple[str, Optional[bytes]], ...]
    stale: tuple[KeyValue, ...]
    full: tuple[str, ...] = ()
    holders: tuple[str, ...] = ()


def root(prefixes: Mapping[str, str]) -> str:
    """The one prefix under which every group's keys are (read and watched at once): the
    group's own with one group, else their common start (`<prefix>/slots/`)."""
    found = list(prefixes.values())
    common = found[0]
    for prefix in found[1:]:
        while not prefix.startswith(common):
            common = common[: common.rstrip("/").rfind("/") + 1]
    return common


def index(key: str, prefix: str, most: int) -> Optional[int]:
    """n of a slot key `<prefix><n>` of the group, n < `most`; None for any other key."""
    n = key[len(prefix) :] if key.startswith(prefix) else ""
    return int(n) if n.isdigit() and int(n) < most else None


def plan(
    kvs: list[KeyValue],
    vm: str,
    limits: tuple[Limit, ...],
    prefixes: Mapping[str, str],
    *,
    held_only: bool = False,
) -> Plan:
    """Per group: the slot this VM holds already (taken back, e.g. after a restart), else the
    lowest free one; none free in a group: nothing is taken. `held_only` (its VM is in the
    maintenance it holds them for): only the slots it holds are taken back, if it holds any;
    a group it holds none of (a reload added it) is for its next event, never a reason to
    give up the ones it holds."""
    take: list[tuple[str, Optional[bytes]]] = []
    stale: list[KeyValue] = []
    full: list[str] = []
    holders: set[str] = set()
    kept = held_only and any(
        holder(kv.value) == vm and index(kv.key, prefixes[limit.group], limit.max) is not None
        for limit in limits
        for kv in kvs
        if kv.key.startswith(prefixes[limit.group]) and kv.value is not None
    )
    for limit in limits:
        prefix = prefixes[limit.group]
        keys = [kv for kv in kvs if kv.key.startswith(prefix) and kv.value is not None]
        mine = [kv for kv in keys if holder(kv.value) == vm]
        counting = [kv for kv in mine if index(kv.key, prefix, limit.max) is not None]
        stale += [kv for kv in mine if kv is not (counting[0] if counting else None)]
        if counting:
            take.append((counting[0].key, counting[0].value))
            continue
        if kept:
            continue
        used = {index(kv.key, prefix, limit.max) for kv in keys}
        free = next((n for n in range(limit.max) if n not in used), None)
        if free is not None:
            take.append((f"{prefix}{free}", None))
            continue
        full.append(limit.group)
        held = [kv for kv in keys if index(kv.key, prefix, limit.max) is not None]
        holders |= {holder(kv.value) or "?" for kv in held}
    if full:
        stale += [KeyValue(key, value) for key, value in take if value is not None]
        return Plan((), tuple(stale), tuple(full), tuple(sorted(holders)))
    return Plan(tuple(take), tuple(stale))


def in_line(value: Optional[bytes], group: str) -> str:
    """The VM of a waiting mark (fleet.py) of a VM that waits for `group` alone, else ""."""
    try:
        mark = json.loads(value or b"")
    except (ValueError, RecursionError):
        return ""
    if not isinstance(mark, dict) or mark.get("groups") != [group]:
        return ""
    vm = mark.get("vm")
    return vm if isinstance(vm, str) else ""


def turn(kvs: list[KeyValue], ahead: set[str], prefix: str, most: int) -> bool:
    """A VM in a group's line (one group: its keys' `prefix` and `most` slots) tries for a free slot
    when fewer VMs are ahead of it than slots are free: those take them, and the others wait
    for the next change instead of sending a transaction each per release that only one wins."""
    used = {index(kv.key, prefix, most) for kv in kvs if kv.value is not None}
    return len(ahead) < most - len(used - {None})
