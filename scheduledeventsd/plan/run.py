"""The plan's loop: every VM runs the daemon's own engine (`engine.step`, the same tables, no
second model) on a simulated clock; its effects are carried out by the simulated parts
(world.py) as runtime/daemon.py carries them out, and their answers come back as the messages
the daemon's executors send.

A heap holds (time, VM, what is due): a message, the engine's wake-up (WakeAt), the poll it
ordered (Fetch), a document that changes, an event that starts, a VM back from its reboot. A
poll whose document did not change and that did nothing but order the next (a quiet answer) is
not replayed one by one: the VM's polls stay "quiet" until anything else is due for it, then the
last ones are delivered (the last `RATE_WINDOW` of them at their own instants, so the engine's
rate budget is what it would be), and the rest in one late answer. A held slot's keep-alives are
delivered the same way, the latest before any step of its engine (each at its instant while two
events share the slot), so its lease never ends in the plan and the VM is not woken for the
lease's end (`_beyond_lease`). A week's notice at 1 s polls costs a handful of steps, not
604 800. The slot's news told to a VM that waits for a slot while nothing else happens to it
(SlotBusy, each time the slot changes hands) is stepped only for the last of a run of them,
once a probe showed they only tell it who holds the slots (`_defer`).
"""

from __future__ import annotations

import datetime as dt
import gc
import heapq
import math
from typing import Any, Optional

from .. import engine
from ..engine import (
    Boot,
    DocumentFetched,
    Effect,
    Faulted,
    Fetch,
    Message,
    Notify,
    Persisted,
    Record,
    SlotBusy,
    SlotGranted,
    SlotKept,
    Stage,
    State,
    WakeAt,
)
from ..engine.vocabulary.constants import IMDS_RATE, RATE_WINDOW
from . import observe
from .executors import executor_of
from .fleet import Fleet
from .timeline import Seen
from .vm import BACK, CANCEL, DOC, EXPIRE, FETCH, KEEP, MSG, START, TICK, Guard, Vm
from .world import Answer, Cloud, EtcdSlots, Peers, Posting, Slots, postings


class PlanError(Exception):
    """The planner met what it cannot simulate faithfully (a defect in the planner)."""


_QUIET = (Fetch, WakeAt)  # all a quiet answer does
_HARMLESS = (WakeAt, Record, Notify)  # a step that did only this started nothing
_SPECULATED = (SlotBusy, SlotKept, Persisted)  # messages stepped before the polls caught up
_ANY_BOOT = (DOC, CANCEL)  # the cloud's doing: due whichever daemon runs then
# What a slot's news (SlotBusy) changes when it only tells who holds the slots (`_defer`).
_HOLDERS_ONLY = frozenset({"slot_holders", "status_sent"})
SLACK = 2 * 86400.0  # the plan ends this long after the last NotBefore at the latest


class Plan:
    """One wave over the fleet, from `start`: `run()`, then read `seen`, `steps`, `until`.
    `skip_quiet=False` replays every poll and keep-alive one by one (tests: the same plan)."""

    def __init__(
        self,
        fleet: Fleet,
        start: dt.datetime,
        slots: Optional[Slots] = None,
        *,
        skip_quiet: bool = True,
    ) -> None:
        self.fleet = fleet
        self.skip_quiet = skip_quiet
        self.start = start.astimezone(dt.timezone.utc)
        self.wall0 = self.start.timestamp()
        self.cloud = Cloud(postings(fleet, self.start), self.start)
        self.slots: Slots = slots if slots is not None else EtcdSlots()
        self.peers = Peers()
        self.vms: list[Vm] = []
        for s in fleet.sets:
            for name in s.names:
                config = s.config_for(name)
                group = config.concurrency.group if config.concurrency else ""
                self.vms.append(Vm(len(self.vms), name, s, config, engine.initial(config), group))
        self.by_name = {vm.name: vm for vm in self.vms}
        self.seen: dict[tuple[str, str], Seen] = {}
        for p in self.cloud.events:
            for name in p.vms:
                vm = self.by_name[name]
                groups = vm.config.concurrency.groups if vm.config.concurrency else ()
                self.seen[(name, p.event_id)] = Seen(
                    name, vm.group, p.event_id, p.event_type, p.posted, p.not_before, groups
                )
        self._open = len(self.seen)
        self._heap: list[tuple[float, int, int, int, int, Any]] = []
        self._seq = 0
        self.steps = 0
        self.faults = 0
        self.until = 0.0  # the last instant simulated
        last = max((p.due() + p.impact for p in self.cloud.events), default=0.0)
        self.horizon = last + SLACK

    # ---- the loop ---------------------------------------------------------------------------

    def run(self) -> Plan:
        """The whole wave. Without the cyclic garbage collector meanwhile: what the loop makes
        (frozen states, messages, heap entries) holds no cycles, and at 10 000 VMs collecting
        walked every live state again and again (about a fifth of the plan's CPU at 2 000)."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if enabled:
                gc.enable()

    def _run(self) -> Plan:
        for vm in self.vms:
            self._feed(vm, Boot({}, "", f"plan-boot-{vm.boots}"), 0.0)
        for p in self.cloud.events:
            for name in p.vms:
                self.push(p.posted, self.by_name[name], DOC, None)
                if p.cancelled is not None:
                    self.push(p.cancelled, self.by_name[name], CANCEL, p)
            self.push(p.due(), None, START, p)
        while self._heap and self._open:
            t, _, index, gen, kind, payload = heapq.heappop(self._heap)
            if t > self.horizon:
                break
            self.until = max(self.until, t)
            due = self.vms[index] if index >= 0 else None
            if due is not None and gen != due.gen and kind not in _ANY_BOOT:
                continue  # for a daemon that has died since
            if due is not None and due.deferred is not None and kind != MSG:
                self._flush(due)  # before anything else happens to it
            self._due(due, kind, payload, t)
        for vm in self.vms:
            if vm.deferred is not None:
                self._flush(vm)
        return self

    def _due(self, vm: Optional[Vm], kind: int, payload: Any, t: float) -> None:  # noqa: ANN401
        if kind == START:
            self._start(payload, t)
        elif kind == EXPIRE:
            self.answer(self.slots.expire(t), t)
        elif vm is None:
            raise PlanError(f"nothing due for no VM: {kind}")
        elif kind == BACK:
            self._back(vm, payload, t)
        elif kind == CANCEL:
            self._cancel(vm, payload, t)
        elif vm.alive:
            self._due_alive(vm, kind, payload, t)

    def _due_alive(self, vm: Vm, kind: int, payload: Any, t: float) -> None:  # noqa: ANN401
        if kind == MSG:
            message, guard = payload
            if not self._wanted(vm, guard):
                return
            if type(message) is SlotBusy and self._defer(vm, message, t):
                return
            if vm.deferred is not None:
                self._flush(vm)
            speculated = self.skip_quiet and vm.quiet and isinstance(message, _SPECULATED)
            if speculated and self._speculate(vm, message, t):
                return
            self._catch_up(vm, t)
            self._feed(vm, message, t)
        elif kind == TICK:
            if payload == vm.wake_token:
                self._tick(vm, t)
        elif kind == FETCH:
            if payload == vm.fetch_token and not vm.quiet:
                self._catch_up(vm, t)
                self._poll(vm, t)
        elif kind == KEEP:
            self._keep_alive(vm, payload, t)
        elif kind == DOC and vm.quiet:
            self._catch_up(vm, t)
            self._unquiet(vm)

    def push(self, t: float, vm: Optional[Vm], kind: int, payload: Any) -> None:  # noqa: ANN401
        self._seq += 1
        index, gen = (vm.index, vm.gen) if vm is not None else (-1, 0)
        heapq.heappush(self._heap, (t, self._seq, index, gen, kind, payload))

    def send(self, vm: Vm, message: Message, t: float, guard: Guard = None) -> None:
        self.push(t, vm, MSG, (message, guard))

    def _wanted(self, vm: Vm, guard: Guard) -> bool:
        if guard is None:
            return True
        what, key, token = guard
        if what == "run":
            run = vm.runs.get(int(key))
            return run is not None and run.token == token
        return vm.drains.get(key) == token

    # ---- one step of one VM's engine ---------------------------------------------------------

    def _step(self, vm: Vm, message: Message, t: float) -> tuple[Effect, ...]:
        """`engine.step`, as the daemon's `_feed` calls it: a step that raises is a defect,
        reported to the engine as Faulted (counted in the summary), never the end of the run."""
        try:
            vm.state, effects = engine.step(vm.state, message, t)
        except Exception as e:  # noqa: BLE001 - the daemon survives it: so does the plan
            self.faults += 1
            if isinstance(message, Faulted):
                return ()
            fault = Faulted(f"step {type(message).__name__}", repr(e)[:500], message)
            return self._step(vm, fault, t)
        self.steps += 1
        self._observe(vm, message, effects, t)
        return effects

    def _feed(self, vm: Vm, message: Message, t: float) -> None:
        effects = self._step(vm, message, t)
        self._carry(vm, effects, t)
        if vm.quiet and not all(isinstance(e, _QUIET) for e in effects):
            self._unquiet(vm)

    def _carry(self, vm: Vm, effects: tuple[Effect, ...], t: float) -> None:
        for effect in effects:
            executor = executor_of(effect)
            if executor is None:
                raise PlanError(
                    f"the planner cannot carry out {type(effect).__name__}: give it an "
                    "executor in plan/executors.py EXECUTORS, as runtime/daemon.py has one"
                )
            executor(self, vm, effect, t)
            if not vm.alive:
                return

    def _tick(self, vm: Vm, t: float) -> None:
        """A Tick only when a timer is due. Asked first without the quiet polls caught up: they
        can only delay a timer (the rate budget), so nothing due then is nothing due at all
        (the engine's hourly wake-up); asked again once a keep-alive has come."""
        wake = engine.next_wakeup(vm.state, t)
        if wake <= t and vm.quiet:  # a slot's lease: a keep-alive, before anything else
            self._keep_up(vm, t, speculate=True)
            wake = engine.next_wakeup(vm.state, t)
        if wake <= t:
            self._catch_up(vm, t)
            wake = engine.next_wakeup(vm.state, t)
        if wake > t:  # nothing is due, or what was (a slot's lease) a keep-alive put off
            self.wake(vm, self._beyond_lease(vm, wake, t))
            return
        self._feed(vm, engine.Tick(), t)

    def wake(self, vm: Vm, at: float) -> None:
        if at != vm.wake_at:
            vm.wake_at = at
            vm.wake_token += 1
            self.push(at, vm, TICK, vm.wake_token)

    # ---- polls, and what is taken as quiet ---------------------------------------------------

    def _poll(self, vm: Vm, t: float) -> None:
        document = self.cloud.document(vm.name, t)
        changed = document.incarnation != vm.shown
        vm.shown = document.incarnation
        vm.fetch_at = None
        effects = self._step(vm, DocumentFetched(document, self.wall0 + t), t)
        if self.skip_quiet and not changed and all(isinstance(e, _QUIET) for e in effects):
            vm.quiet = True
        self._carry(vm, effects, t)

    def _unquiet(self, vm: Vm) -> None:
        """The ordered poll goes into the heap: what comes next may not be quiet."""
        vm.quiet = False
        if vm.fetch_at is not None:
            vm.fetch_token += 1
            self.push(vm.fetch_at, vm, FETCH, vm.fetch_token)

    def _catch_up(self, vm: Vm, t: float) -> None:
        """The quiet polls ordered before `t`, then the latest keep-alive of a held slot.

        The polls of the last RATE_WINDOW and an interval are answered at their own instants,
        so the engine's rate budget (the requests it counts in that window) is what it would
        be; the ones before in one answer, late (half an interval before the first of those
        ticks: the engine orders that tick next, skipping the rest, as for any late answer).
        Only those of the last RATE_WINDOW where the polls alone can never fill the budget
        (`_few_polls`): a poll the budget does not hold back is ordered at its tick either way,
        and the requests before that window are never counted again."""
        interval = vm.config.metadata.poll_interval
        keep = RATE_WINDOW if _few_polls(interval) else RATE_WINDOW + interval
        while vm.quiet and vm.fetch_at is not None and vm.fetch_at < t:
            at = vm.fetch_at
            first = math.ceil((t - keep - at) / interval)  # the first tick answered on time
            when = at + (first - 0.5) * interval if first >= 2 else at
            document = self.cloud.document(vm.name, when)
            if document.incarnation != vm.shown:
                raise PlanError(f"{vm.name}: its document changed at {when} while quiet")
            self._renew(vm, when)  # the lease as the keeper had renewed it by then
            vm.fetch_at = None
            effects = self._step(vm, DocumentFetched(document, self.wall0 + when), when)
            if not all(isinstance(e, _QUIET) for e in effects):
                raise PlanError(f"{vm.name}: a poll taken as quiet was not at {when}")
            self._carry(vm, effects, when)
        self._renew(vm, t)

    def _renewal(self, vm: Vm, t: float) -> Optional[float]:
        """The slot keeper's latest renewal by `t`, if its engine has not been told of it."""
        concurrency = vm.config.concurrency
        if vm.kept_from is None or concurrency is None or not self.skip_quiet:
            return None
        renew = concurrency.ttl / 3
        last = vm.kept_from + math.floor((t - vm.kept_from) / renew + 1e-9) * renew
        return last if last > vm.kept_to else None

    def _renew(self, vm: Vm, t: float) -> None:
        """The latest renewal, told to each event holding the slot (the quiet polls before `t`
        caught up)."""
        last = self._renewal(vm, t)
        if last is not None:
            vm.kept_to = last
            for event_id in sorted(vm.slot_events):
                self._carry(vm, self._step(vm, SlotKept(event_id, last), t), t)

    def _keep_up(self, vm: Vm, t: float, *, speculate: bool) -> None:
        """The slot keeper's latest renewal before `t`, told to each event holding the slot."""
        last = self._renewal(vm, t)
        if last is None:
            return
        vm.kept_to = last
        for event_id in sorted(vm.slot_events):
            kept = SlotKept(event_id, last)
            if not (speculate and self._speculate(vm, kept, t)):
                self._catch_up(vm, t)
                self._carry(vm, self._step(vm, kept, t), t)

    def _beyond_lease(self, vm: Vm, wake: float, t: float) -> float:
        """When the VM's engine is next due, its slot's lease aside: the keeper renews it every
        ttl/3 and the engine is told the latest renewal before each of its steps, so the lease
        never ends while the slot is held and its end is no reason to wake the VM. Asked of the
        engine (a step whose state is dropped) with the lease as if renewed beyond the plan."""
        if not (self.skip_quiet and vm.slot_events and vm.kept_from is not None):
            return wake
        state, found = vm.state, wake
        for event_id in sorted(vm.slot_events):
            try:
                state, effects = engine.step(state, SlotKept(event_id, self.horizon), t)
            except Exception:  # noqa: BLE001 - woken for the lease's end, as before
                return wake
            self.steps += 1
            if not all(isinstance(e, _HARMLESS) for e in effects):
                return wake
            found = max([wake, *(e.at for e in effects if isinstance(e, WakeAt))])
        return found

    def _speculate(self, vm: Vm, message: Message, t: float) -> bool:
        """A message that may not need the quiet polls caught up first (a slot's news, a
        write's end): stepped without them, kept if all it did was record and wake. Sound:
        the polls can only delay what is due (the rate budget; none is in flight then), so a
        step that started nothing without them starts nothing with them; and what it changed
        (a lease, the holders) is not what a quiet poll reads or writes, so the polls still
        owed are answered later as they would have been before it."""
        self._keep_up(vm, t, speculate=True)  # its lease first, as for every step
        try:
            state, effects = engine.step(vm.state, message, t)
        except Exception:  # noqa: BLE001 - taken again the daemon's way, caught up
            return False
        if not all(isinstance(e, _HARMLESS) for e in effects):
            return False
        vm.state = state
        self.steps += 1
        self._observe(vm, message, effects, t)
        self._carry(vm, effects, t)
        return True

    def _defer(self, vm: Vm, message: SlotBusy, t: float) -> bool:
        """A slot's news to a quiet VM waiting for a slot, kept to be stepped later (`_flush`)
        if it comes before the VM's next wake-up and only tells who holds the slots: then
        the news it replaces would have done nothing but that either. A probe decides it
        once for the VM's state: the news stepped at the last instant before that wake-up,
        its state dropped. Sound: no timer is due before the wake-up, and what else the news
        does depends on the instant only through the slot's deadline (`_no_grace`: the
        VM's lead), which, passed by then, changes its deadline (or is due) in the probe."""
        if not self.skip_quiet or not vm.quiet or vm.kept_from is not None:
            return False
        if vm.deferred is not None and vm.deferred[1].event_id != message.event_id:
            return False  # news for another of its events: each is stepped (observe reads each)
        probed = (
            vm.busy_probe is vm.state and vm.busy_event == message.event_id and t <= vm.busy_until
        )
        if not probed and (vm.deferred is not None or not self._probe(vm, message, t)):
            return False
        vm.deferred = (t, message)
        return True

    def _probe(self, vm: Vm, message: SlotBusy, t: float) -> bool:
        until = math.nextafter(vm.wake_at, -math.inf)
        if not t <= until < math.inf:
            return False
        try:
            state, effects = engine.step(vm.state, message, until)
        except Exception:  # noqa: BLE001 - taken the usual way
            return False
        self.steps += 1
        if not all(isinstance(e, _HARMLESS) for e in effects) or not _holders_only(vm.state, state):
            return False
        vm.busy_probe, vm.busy_event, vm.busy_until = vm.state, message.event_id, until
        return True

    def _flush(self, vm: Vm) -> None:
        """The last slot's news kept back, stepped at its own instant."""
        if vm.deferred is None:
            return
        (t, message), vm.deferred = vm.deferred, None
        vm.busy_probe = None  # its state is not kept alive for a probe that no longer holds
        if not self._speculate(vm, message, t):
            raise PlanError(f"{vm.name}: a slot's news taken as harmless was not at {t}")

    def _keep_alive(self, vm: Vm, since: float, t: float) -> None:
        """Each keep-alive at its instant, as the keeper renews: always with `skip_quiet=False`,
        else while two or more events share the slot. The engine checks every event's lease
        whenever it is told of one: the latest renewal told late, to one event after the
        other, would find the others' leases expired (the slot lost)."""
        concurrency = vm.config.concurrency
        if vm.kept_from != since or concurrency is None:
            vm.keeping = None
            return  # given back (or lost with the daemon) since
        renew = concurrency.ttl / 3
        following = since + (round((t - since) / renew) + 1) * renew
        if self.skip_quiet:
            if len(vm.slot_events) < 2:
                vm.keeping = None  # one event: its latest renewal is told when due (_keep_up)
                return
            self._keep_up(vm, t, speculate=vm.quiet)
            self.push(following, vm, KEEP, since)
            return
        vm.kept_to = t
        for event_id in sorted(vm.slot_events):
            self._feed(vm, SlotKept(event_id, t), t)
        self.push(following, vm, KEEP, since)

    # ---- the cloud: an event starts, a VM goes down and comes back ---------------------------

    def _start(self, posting: Posting, t: float) -> None:
        if posting.started is None and posting.cancelled is not None and posting.cancelled <= t:
            return  # withdrawn before it started
        if posting.started is None:
            posting.started = t
        if posting.started != t:
            return  # approved before its NotBefore
        for name in posting.vms:
            vm = self.by_name[name]
            seen = self.seen[(name, posting.event_id)]
            if vm.deferred is not None:
                self._flush(vm)
            if vm.gone:  # a Preempt or Terminate took it before: it never happens
                seen.never_back = True
                self._open -= 1
                continue
            seen.down = t
            if posting.reboots or posting.gone_for_good:
                self._down(vm, posting, t)
                if posting.reboots:  # it leaves the document then, also if the VM was down
                    self.push(t + posting.impact, vm, DOC, None)  # already (back earlier)
            else:  # paused: Started, then gone once it is over
                seen.back = t + posting.impact
                vm.waiting_after.add(posting.event_id)
                self.push(t, vm, DOC, None)
                self.push(t + posting.impact, vm, DOC, None)

    def _cancel(self, vm: Vm, posting: Posting, t: float) -> None:
        """Withdrawn before it started: it leaves the document; the engine's cancelled-hooks
        (if it prepared) end it."""
        if posting.started is not None and posting.started <= t:
            return
        self.seen[(vm.name, posting.event_id)].cancelled = t
        vm.waiting_after.add(posting.event_id)
        if vm.alive and vm.quiet:
            self._catch_up(vm, t)
            self._unquiet(vm)

    def _down(self, vm: Vm, posting: Posting, t: float) -> None:
        seen = self.seen[(vm.name, posting.event_id)]
        if any(
            r.event_id == posting.event_id and r.stage is Stage.BEFORE for r in vm.runs.values()
        ):
            seen.cut_off = True
        if not vm.alive:  # down already, for another event: this one happens meanwhile
            return
        vm.alive = False
        vm.gen += 1
        vm.runs.clear()
        vm.drains.clear()
        vm.fetch_at, vm.quiet, vm.kept_from, vm.wake_at = None, False, None, math.inf
        vm.slot_events.clear()
        concurrency = vm.config.concurrency  # the engine's HoldSlot (gates/hold.py)
        hold = 0 if posting.gone_for_good or concurrency is None else concurrency.hold_max
        self.slots.stopped(vm.name, t, hold)
        self.peers.stopped(vm.name)
        expiry = self.slots.next_expiry()
        if expiry is not None:
            self.push(expiry, None, EXPIRE, None)
        if posting.gone_for_good:
            vm.gone = True
            seen.never_back = True
            self._open -= 1
        else:
            self.push(t + posting.impact, vm, BACK, posting)

    def _back(self, vm: Vm, posting: Posting, t: float) -> None:
        """A new boot: the daemon starts from its state file."""
        vm.alive = True
        vm.boots += 1
        vm.state = engine.initial(vm.config)
        vm.shown = -1
        for other in self.cloud.of(vm.name):  # this one, and any that started meanwhile
            seen = self.seen[(vm.name, other.event_id)]
            if seen.down is not None and seen.back is None:
                seen.back = t
                vm.waiting_after.add(other.event_id)
        self._feed(vm, Boot(vm.persisted, "", f"plan-boot-{vm.boots}", vm.mark), t)

    # ---- what the engine did, as the report reads it -----------------------------------------

    def _observe(self, vm: Vm, message: Message, effects: tuple[Effect, ...], t: float) -> None:
        if type(message) is not DocumentFetched:  # a poll's answer says nothing observe reads
            observe.message(self.seen, vm, message, t)
        for effect in effects:
            if type(effect) not in _QUIET:
                observe.effect(self.seen, vm, effect, t)
        if vm.waiting_after:
            self._open -= observe.done(self.seen, vm, t)
        if isinstance(message, SlotGranted):  # its lease is kept alive from now on
            vm.slot_events.add(message.event_id)
            if vm.kept_from is None and vm.config.concurrency is not None:
                since = t if message.confirmed is None else message.confirmed
                vm.kept_from = vm.kept_to = since
                if not self.skip_quiet:
                    self.push(since + vm.config.concurrency.ttl / 3, vm, KEEP, since)
            kept, concurrency = vm.kept_from, vm.config.concurrency
            shared = len(vm.slot_events) > 1 and vm.keeping != kept
            if self.skip_quiet and shared and kept is not None and concurrency is not None:
                vm.keeping = kept  # two events share the slot: each renewal at its instant
                renew = concurrency.ttl / 3
                self.push(kept + (math.floor((t - kept) / renew) + 1) * renew, vm, KEEP, kept)

    def answer(self, answers: list[Answer], t: float) -> None:
        for name, message in answers:
            vm = self.by_name.get(name)
            if vm is not None and vm.alive:
                self.send(vm, message, t)

    def rows(self) -> list[Seen]:
        """Every VM's events, in the fleet's order, each with its slot's hold."""
        holds: dict[str, list[tuple[float, Optional[float]]]] = {}
        for _, name, since, to in self.slots.held():
            holds.setdefault(name, []).append((since, to))
        found = []
        order = {vm.name: vm.index for vm in self.vms}
        for seen in sorted(self.seen.values(), key=lambda s: (order[s.vm], s.posted)):
            for since, to in holds.get(seen.vm, []):
                if seen.slot_from is not None and since <= seen.slot_from:
                    seen.slot_to = to
            found.append(seen)
        return found


def _holders_only(old: State, new: State) -> bool:
    """`new` differs from `old` in who holds the slots (and the status that shows it) only."""
    before = vars(old)
    for name, value in vars(new).items():
        if name not in _HOLDERS_ONLY and value is not before[name] and value != before[name]:
            return False
    return True


def _few_polls(interval: float) -> bool:
    """The polls of any RATE_WINDOW and the one ordered next stay under IMDS' budget, whatever
    the window holds of the ticks before it: the rate limit then holds no poll back, so the
    ticks before the last RATE_WINDOW need not be answered one by one (`Plan._catch_up`).
    True for 1 s polls (two of five), false at 4 Hz."""
    return math.ceil(RATE_WINDOW / interval) + 1 < IMDS_RATE
