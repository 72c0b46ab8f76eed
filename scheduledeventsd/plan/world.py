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
from dataclasses import dataclass, field
from typing import Optional, Protocol

from ..config import Hook
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
    at most one slot of its group, shared by its events (coordination/slots.py)."""

    def acquire(self, group: str, most: int, vm: str, event_id: str, now: float) -> list[Answer]:
        """Ask for a slot (or take back the one this VM holds, after its restart)."""

    def release(self, vm: str, event_id: str, now: float) -> list[Answer]:
        """Give it back or stop asking; the VMs granted the freed slot are told."""

    def stopped(self, vm: str, now: float, hold: float) -> None:
        """The VM's daemon stopped: a slot it held stays held `hold` s (0: freed), it asks no
        more."""

    def next_expiry(self) -> Optional[float]:
        """When a handed-over slot frees itself, if any is."""

    def expire(self, now: float) -> list[Answer]:
        """Free what has expired by `now`."""

    def held(self) -> list[tuple[str, str, float, Optional[float]]]:
        """(group, vm, from, to) of every hold so far (to None: held still)."""


@dataclass
class _Group:
    most: int
    holders: dict[str, set[str]] = field(default_factory=dict)  # vm -> its events
    handed: dict[str, float] = field(default_factory=dict)  # vm -> when its hand-over ends
    waiting: dict[str, set[str]] = field(default_factory=dict)  # in the order they asked

    def taken(self) -> tuple[str, ...]:
        return tuple(sorted((*self.holders, *self.handed)))


@dataclass
class _Hold:
    group: str
    vm: str
    since: float
    to: Optional[float] = None


class EtcdSlots:
    """Today's keeper: a free slot is granted at once; when none is, the VM waits and is told
    who holds them (SlotBusy, again on change); a slot freed goes to the VM that asked first
    (etcd lets the watchers race: the plan picks this order, the instants are the same). Held
    until the engine gives it back, through a restart (held for `concurrency.hold_max`, as
    coordination/slots.py's HoldSlot; a VM that does not come back frees it as it goes)."""

    def __init__(self) -> None:
        self._groups: dict[str, _Group] = {}
        self._group_of: dict[str, str] = {}  # vm -> its group
        self._holds: list[_Hold] = []

    def acquire(self, group: str, most: int, vm: str, event_id: str, now: float) -> list[Answer]:
        g = self._groups.setdefault(group, _Group(most))
        self._group_of[vm] = group
        if vm in g.handed:  # taken back under the restarted daemon's lease
            del g.handed[vm]
            g.holders[vm] = {event_id}
            return [(vm, SlotGranted(event_id, now))]
        if vm in g.holders:
            g.holders[vm].add(event_id)
            return [(vm, SlotGranted(event_id, now))]
        if vm in g.waiting:
            g.waiting[vm].add(event_id)
            return []
        if len(g.holders) + len(g.handed) < most:
            g.holders[vm] = {event_id}
            self._holds.append(_Hold(group, vm, now))
            return [(vm, SlotGranted(event_id, now))]
        g.waiting[vm] = {event_id}
        return [(vm, SlotBusy(event_id, g.taken()))]

    def release(self, vm: str, event_id: str, now: float) -> list[Answer]:
        g = self._groups.get(self._group_of.get(vm, ""))
        if g is None:
            return []
        if vm in g.waiting:
            g.waiting[vm].discard(event_id)
            if not g.waiting[vm]:
                del g.waiting[vm]
        if vm not in g.holders:
            return []
        g.holders[vm].discard(event_id)
        if g.holders[vm]:
            return []
        del g.holders[vm]
        self._ended(vm, now)
        return self._hand_on(g, self._group_of[vm], now)

    def stopped(self, vm: str, now: float, hold: float) -> None:
        g = self._groups.get(self._group_of.get(vm, ""))
        if g is None:
            return
        g.waiting.pop(vm, None)
        if g.holders.pop(vm, None) is not None:
            g.handed[vm] = now + hold

    def next_expiry(self) -> Optional[float]:
        ends = [t for g in self._groups.values() for t in g.handed.values()]
        return min(ends) if ends else None

    def expire(self, now: float) -> list[Answer]:
        answers: list[Answer] = []
        for name, g in self._groups.items():
            for vm, until in list(g.handed.items()):
                if until <= now:
                    del g.handed[vm]
                    self._ended(vm, until)
                    answers.extend(self._hand_on(g, name, now))
        return answers

    def held(self) -> list[tuple[str, str, float, Optional[float]]]:
        return [(h.group, h.vm, h.since, h.to) for h in self._holds]

    def _ended(self, vm: str, now: float) -> None:
        for hold in reversed(self._holds):
            if hold.vm == vm and hold.to is None:
                hold.to = now
                return

    def _hand_on(self, g: _Group, group: str, now: float) -> list[Answer]:
        answers: list[Answer] = []
        while g.waiting and len(g.holders) + len(g.handed) < g.most:
            vm = next(iter(g.waiting))
            events = g.waiting.pop(vm)
            g.holders[vm] = events
            self._holds.append(_Hold(group, vm, now))
            answers.extend((vm, SlotGranted(e, now)) for e in sorted(events))
        taken = g.taken()
        for vm, events in g.waiting.items():
            answers.extend((vm, SlotBusy(e, taken)) for e in sorted(events))
        return answers


# ---- peers: the keys of a shared event in etcd -----------------------------------------------


class Peers:
    """prefix/events/ID/vm = ready or failed; a VM that wrote ready watches the event's keys
    and is told them on every change (coordination/peers.py)."""

    def __init__(self) -> None:
        self._states: dict[str, dict[str, str]] = {}
        self._watching: dict[str, set[str]] = {}

    def write(self, event_id: str, vm: str, ready: bool) -> list[Answer]:
        states = self._states.setdefault(event_id, {})
        states[vm.casefold()] = "ready" if ready else "failed"
        watchers = self._watching.setdefault(event_id, set())
        if ready:
            watchers.add(vm)
        shown = dict(sorted(states.items()))
        answers: list[Answer] = [(w, PeersChanged(event_id, shown)) for w in sorted(watchers)]
        if not ready:  # a failed write reports the keys once, and ends
            answers.append((vm, PeersChanged(event_id, shown)))
        return answers

    def stop(self, vm: str, event_ids: tuple[str, ...]) -> None:
        for event_id in event_ids:
            self._watching.get(event_id, set()).discard(vm)

    def stopped(self, vm: str) -> None:
        for watchers in self._watching.values():
            watchers.discard(vm)
