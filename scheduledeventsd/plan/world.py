"""The simulated parts the planner carries effects out with: the cloud's metadata documents,
hook runs of stated durations, the etcd slot keeper's semantics and the peers' keys.

Each answers with the messages the daemon's own executors send (runtime/daemon.py, lanes.py,
coordination/slots.py, peers.py), so the engine cannot tell the plan from a fleet. Instants are
seconds after the plan's start.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional, Protocol

from ..config import Hook, Limit
from ..engine import Message, Outcome, PeersChanged, SlotBusy, SlotGranted
from ..model import SCHEDULED, STARTED, Document, Event
from .fleet import GONE_FOR_GOOD, REBOOTS, Fleet, HookTime

# ---- the cloud: what each VM's metadata document says --------------------------------------


@dataclass
class Posting:
    """One event the cloud posts: naming one VM, or every VM of a shared maintenance."""

    event_id: str
    event_type: str
    vms: tuple[str, ...]
    posted: float
    not_before: float
    impact: float
    duration: Optional[int] = None
    cancelled: Optional[float] = None  # withdrawn then, unless it started before
    started: Optional[float] = None  # approved, or its NotBefore came

    @property
    def reboots(self) -> bool:
        return self.event_type in REBOOTS

    @property
    def gone_for_good(self) -> bool:
        return self.event_type in GONE_FOR_GOOD

    def due(self) -> float:
        """When the cloud starts it unless approved before: its NotBefore, or when it is
        posted if that is later (no notice, or a NotBefore already past: Started at once)."""
        return self.started if self.started is not None else self.not_before

    def ends(self) -> Optional[float]:
        """When it leaves the document: withdrawn, or once the VM is back (never, for a VM
        gone for good)."""
        if self.cancelled is not None and (self.started is None or self.cancelled < self.started):
            return self.cancelled
        if self.started is None or self.gone_for_good:
            return None
        return self.started + self.impact


def postings(fleet: Fleet, start: dt.datetime) -> list[Posting]:
    """Every event of the fleet's maintenance, in the order it is posted (stable ids)."""
    found: list[Posting] = []
    for i, m in enumerate(fleet.maintenance):
        groups = [m.vms] if m.shared else [(vm,) for vm in m.vms]
        for k, vms in enumerate(groups):
            posted = m.posted + (m.spread * k / len(groups) if len(groups) > 1 else 0.0)
            if m.not_before is not None:
                not_before = (m.not_before - start).total_seconds()
            else:
                not_before = posted + (m.notice or 0.0)
            name = f"scheduledeventsd-plan/{i}/{','.join(vms)}"
            event_id = str(uuid.uuid5(uuid.NAMESPACE_URL, name)).upper()
            cancelled = None if m.cancelled is None else posted + m.cancelled
            # No notice (a host failure): it is Started when first listed.
            started = posted if not_before <= posted else None
            found.append(
                Posting(
                    event_id, m.event_type, vms, posted, not_before, m.impact, m.duration,
                    cancelled, started,
                )
            )  # fmt: skip
    found.sort(key=lambda p: (p.posted, p.event_id))
    return found


class Cloud:
    """The metadata service of every VM: a document per VM, its incarnation counted on change."""

    def __init__(self, events: list[Posting], start: dt.datetime) -> None:
        self.events = events
        self.by_id = {p.event_id: p for p in events}
        self.start = start
        self._of: dict[str, list[Posting]] = {}
        for p in events:
            for vm in p.vms:
                self._of.setdefault(vm, []).append(p)
        self._shown: dict[str, tuple[tuple[tuple[str, bool], ...], Document]] = {}
        self._incarnation: dict[str, int] = {}

    def of(self, vm: str) -> list[Posting]:
        return self._of.get(vm, [])

    def approve(self, event_id: str, now: float) -> bool:
        """An approval starts the event now (for every VM it names); True if it did."""
        posting = self.by_id.get(event_id)
        if posting is None or posting.started is not None or posting.posted > now:
            return False
        if posting.cancelled is not None and posting.cancelled <= now:
            return False
        posting.started = now
        return True

    def document(self, vm: str, now: float) -> Document:
        """The VM's document now: the same object while what it lists is the same (a quiet
        poll builds nothing), a new incarnation when that changes."""
        listed = []
        for p in self.of(vm):
            ends = p.ends()
            if p.posted > now or (ends is not None and ends <= now):
                continue
            listed.append((p, p.started is not None and p.started <= now))
        shown = tuple((p.event_id, started) for p, started in listed)
        last = self._shown.get(vm)
        if last is not None and last[0] == shown:
            return last[1]
        events = []
        for p, started in listed:
            not_before = None if started else self.start + dt.timedelta(seconds=p.not_before)
            events.append(
                Event(
                    event_id=p.event_id,
                    event_type=p.event_type,
                    status=STARTED if started else SCHEDULED,
                    resource_type="VirtualMachine",
                    resources=p.vms,
                    not_before=not_before,
                    description="planned maintenance (scheduledeventsd plan)",
                    source="Platform",
                    duration_seconds=p.duration,
                )
            )
        self._incarnation[vm] = self._incarnation.get(vm, 0) + 1
        document = Document(self._incarnation[vm], tuple(events))
        self._shown[vm] = (shown, document)
        return document


# ---- hook runs -------------------------------------------------------------------------------


def hook_run(
    names: tuple[str, ...],
    times: Mapping[str, HookTime],
    hooks: Mapping[str, Hook],
    ran: Optional[dict[str, int]] = None,
) -> tuple[float, Outcome, str]:
    """A run's length and outcome: each hook in order for its stated time (none stated: at
    once); the first that fails, or outlasts its commands' timeouts, ends the run FAILED.
    `ran` counts the VM's runs of each hook so far (a list in FLEET.yaml: one entry per run)."""
    elapsed = 0.0
    ran = {} if ran is None else ran
    for name in names:
        hook = hooks.get(name)
        if hook is None:  # the daemon says the same (runtime/daemon.py _spawn)
            return elapsed, Outcome.FAILED, f"hook(s) {name} not defined under hooks"
        stated = times.get(name, HookTime(0.0)).nth(ran.get(name, 0))
        ran[name] = ran.get(name, 0) + 1
        limit = sum(command.timeout for command in hook.commands)
        if stated.seconds > limit:
            return elapsed + limit, Outcome.FAILED, f"{name}: timed out after {limit:g}s"
        elapsed += stated.seconds
        if stated.fails:
            return elapsed, Outcome.FAILED, f"{name}: failed (as FLEET.yaml says)"
    return elapsed, Outcome.SUCCEEDED, ""


# ---- slots: the etcd keeper's semantics, behind one small interface ----------------------------

Answer = tuple[str, Message]  # the VM told, and what


class Slots(Protocol):
    """Concurrency slots as the engine's AcquireSlot and ReleaseSlot meet them. One VM holds
    at most one slot of each of its groups, shared by its events (coordination/slots.py)."""

    def acquire(
        self, limits: tuple[Limit, ...], vm: str, event_id: str, now: float
    ) -> list[Answer]:
        """Ask for a slot in every group of `limits` (or take back the ones this VM holds,
        after its restart)."""

    def release(self, vm: str, event_id: str, now: float) -> list[Answer]:
        """Give them back or stop asking; the VMs granted the freed slots are told."""

    def stopped(self, vm: str, now: float, hold: float) -> None:
        """The VM's daemon stopped: slots it held stay held `hold` s (0: freed), it asks no
        more."""

    def next_expiry(self) -> Optional[float]:
        """When a handed-over slot frees itself, if any is."""

    def expire(self, now: float) -> list[Answer]:
        """Free what has expired by `now`."""

    def held(self) -> list[tuple[str, str, float, Optional[float]]]:
        """(group, vm, from, to) of every hold so far (to None: held still); group: the VM's
        first."""


@dataclass
class _Hold:
    group: str
    vm: str
    since: float
    to: Optional[float] = None


class EtcdSlots:
    """The keeper's semantics (coordination/slotset.py): per group the slot key this VM holds
    (taken back after a restart), else the lowest free one; any group full and nothing is
    taken (its own keys it would have taken back deleted: never a partial hold), and it is
    told who holds the full groups' slots (SlotBusy, again when that changes). A waiting VM
    tries again whenever a key of one of its groups changes; the freed slots go to the VMs
    that asked first (etcd lets the watchers race: the plan picks this order, the instants
    are the same). Held until the engine gives them back, through a restart (held for
    `concurrency.hold_max`, as HoldSlot; a VM that does not come back frees them as it goes)."""

    def __init__(self) -> None:
        self._keys: dict[str, dict[int, str]] = {}  # group -> slot n -> the VM holding it
        self._limits: dict[str, tuple[Limit, ...]] = {}  # vm -> its groups' limits
        self._holding: dict[str, set[str]] = {}  # vm -> its events sharing its slots
        self._handed: dict[str, float] = {}  # vm -> when its hand-over ends
        self._asking: dict[str, set[str]] = {}  # vm -> its events, in the order they asked
        self._told: dict[str, tuple[str, ...]] = {}  # vm asking -> the holders it was told
        self._waiting: dict[str, dict[str, int]] = {}  # group -> its VMs asking -> when (order)
        self._asked = 0
        self._holds: list[_Hold] = []

    def acquire(
        self, limits: tuple[Limit, ...], vm: str, event_id: str, now: float
    ) -> list[Answer]:
        self._limits[vm] = limits
        if vm in self._holding:
            self._holding[vm].add(event_id)
            return [(vm, SlotGranted(event_id, now))]
        if vm in self._asking:  # it shares the wait; told when the holders change
            self._asking[vm].add(event_id)
            return []
        self._asking[vm] = {event_id}
        self._asked += 1
        for limit in limits:
            self._waiting.setdefault(limit.group, {})[vm] = self._asked
        answers: list[Answer] = []
        dirty = self._try(vm, now, answers)
        answers += self._changed(dirty, now)
        return answers

    def release(self, vm: str, event_id: str, now: float) -> list[Answer]:
        if vm in self._asking:
            self._asking[vm].discard(event_id)
            if not self._asking[vm]:
                self._stop_asking(vm)
        events = self._holding.get(vm)
        if events is None:
            return []
        events.discard(event_id)
        if events:
            return []
        del self._holding[vm]
        return self._changed(self._free(vm, now), now)

    def stopped(self, vm: str, now: float, hold: float) -> None:
        if vm in self._asking:
            self._stop_asking(vm)
        if self._holding.pop(vm, None) is not None:
            self._handed[vm] = now + hold

    def next_expiry(self) -> Optional[float]:
        return min(self._handed.values()) if self._handed else None

    def expire(self, now: float) -> list[Answer]:
        dirty: set[str] = set()
        for vm, until in list(self._handed.items()):
            if until <= now:
                del self._handed[vm]
                dirty |= self._free(vm, until)
        return self._changed(dirty, now)

    def held(self) -> list[tuple[str, str, float, Optional[float]]]:
        return [(h.group, h.vm, h.since, h.to) for h in self._holds]

    def _try(self, vm: str, now: float, answers: list[Answer]) -> set[str]:
        """One read and one transaction of the keeper for an asking VM: the groups whose keys
        it changed."""
        limits = self._limits[vm]
        if vm not in self._handed and self._still_full(vm, limits, answers):
            return set()
        take: list[tuple[str, int]] = []
        stale: list[tuple[str, int]] = []
        full: list[str] = []
        holders: set[str] = set()
        for limit in limits:
            keys = self._keys.get(limit.group, {})
            mine = sorted(n for n, holder in keys.items() if holder == vm)
            counting = [n for n in mine if n < limit.max]
            stale += [(limit.group, n) for n in mine if n != (counting[0] if counting else None)]
            if counting:
                take.append((limit.group, counting[0]))
                continue
            free = next((n for n in range(limit.max) if n not in keys), None)
            if free is not None:
                take.append((limit.group, free))
                continue
            full.append(limit.group)
            holders |= {holder for n, holder in keys.items() if n < limit.max}
        if full:  # nothing taken; the keys it would have taken back are deleted too
            stale += [(group, n) for group, n in take if n in self._keys.get(group, {})]
        for group, n in stale:
            del self._keys[group][n]
        dirty = {group for group, _ in stale}
        back = vm in self._handed
        if full or not take:
            if back and not any(vm in k.values() for k in self._keys.values()):
                del self._handed[vm]  # its hold is gone with its keys
                self._ended(vm, now)
            told = tuple(sorted(holders))
            if full and self._told.get(vm) != told:
                self._told[vm] = told
                asking = sorted(self._asking[vm])
                answers.extend((vm, SlotBusy(e, told, tuple(full))) for e in asking)
            return dirty
        for group, n in take:
            self._keys.setdefault(group, {})[n] = vm
        dirty |= {group for group, _ in take}
        events = self._asking[vm]
        self._stop_asking(vm)
        self._holding[vm] = events
        if self._handed.pop(vm, None) is None:  # taken back: the same hold goes on
            self._holds.append(_Hold(limits[0].group, vm, now))
        answers.extend((vm, SlotGranted(e, now)) for e in sorted(events))
        return dirty

    def _still_full(self, vm: str, limits: tuple[Limit, ...], answers: list[Answer]) -> bool:
        """`_try` for an asking VM that holds no key (not handed over), when a group is full:
        nothing to take or delete, only who holds the full groups to tell. The quick path for
        the many VMs that try again at each hand-over."""
        full = []
        for limit in limits:
            keys = self._keys.get(limit.group)
            if keys is not None and sum(n < limit.max for n in keys) >= limit.max:
                full.append(limit)
        if not full:
            return False
        holders = {h for limit in full for n, h in self._keys[limit.group].items() if n < limit.max}
        told = tuple(sorted(holders))
        if self._told.get(vm) != told:
            self._told[vm] = told
            groups = tuple(limit.group for limit in full)
            answers.extend((vm, SlotBusy(e, told, groups)) for e in sorted(self._asking[vm]))
        return True

    def _changed(self, dirty: set[str], now: float) -> list[Answer]:
        """The VMs waiting on a group whose keys changed try again, in the order they asked,
        until no try changes a key."""
        answers: list[Answer] = []
        while dirty:
            order = {vm: k for group in dirty for vm, k in self._waiting.get(group, {}).items()}
            again: set[str] = set()
            for vm in sorted(order, key=order.__getitem__):
                if vm in self._asking:
                    again |= self._try(vm, now, answers)
            dirty = again
        return answers

    def _stop_asking(self, vm: str) -> None:
        del self._asking[vm]
        self._told.pop(vm, None)
        for limit in self._limits[vm]:
            self._waiting.get(limit.group, {}).pop(vm, None)

    def _free(self, vm: str, now: float) -> set[str]:
        """Delete the VM's keys: the groups whose keys changed."""
        dirty: set[str] = set()
        for limit in self._limits[vm]:
            keys = self._keys.get(limit.group, {})
            for n in [n for n, holder in keys.items() if holder == vm]:
                del keys[n]
                dirty.add(limit.group)
        self._ended(vm, now)
        return dirty

    def _ended(self, vm: str, now: float) -> None:
        for hold in reversed(self._holds):
            if hold.vm == vm and hold.to is None:
                hold.to = now
                return


# ---- peers: the keys of a shared event in etcd -----------------------------------------------


class Peers:
    """prefix/events/ID/vm = ready or failed; a VM is told the event's keys by its own write,
    and, once it wrote ready, again when a write decides the event: the last ready or a
    failed (the settled key it watches, coordination/peers.py)."""

    def __init__(self) -> None:
        self._states: dict[str, dict[str, str]] = {}
        self._watching: dict[str, set[str]] = {}

    def write(self, event_id: str, vm: str, ready: bool, named: tuple[str, ...]) -> list[Answer]:
        states = self._states.setdefault(event_id, {})
        states[vm.casefold()] = "ready" if ready else "failed"
        watchers = self._watching.setdefault(event_id, set())
        if ready:
            watchers.add(vm)
        shown = dict(sorted(states.items()))
        decided = not ready or all(states.get(n.casefold()) == "ready" for n in named)
        told = sorted(watchers) if decided else [vm]
        answers: list[Answer] = [(w, PeersChanged(event_id, shown)) for w in told]
        if not ready:  # a failed write reports the keys once, and ends
            answers.append((vm, PeersChanged(event_id, shown)))
        return answers

    def stop(self, vm: str, event_ids: tuple[str, ...]) -> None:
        for event_id in event_ids:
            self._watching.get(event_id, set()).discard(vm)

    def forget(self, vm: str, event_id: str) -> None:
        """Its mark deleted (ForgetShared); the event's keys with the last one."""
        states = self._states.get(event_id, {})
        states.pop(vm.casefold(), None)
        if not states:
            self._states.pop(event_id, None)
            self._watching.pop(event_id, None)

    def stopped(self, vm: str) -> None:
        for watchers in self._watching.values():
            watchers.discard(vm)
