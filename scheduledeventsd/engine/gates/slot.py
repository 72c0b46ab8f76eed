"""The slot gate's table and what it keeps: a concurrency slot of the group (etcd) held from before
the before-hooks until the event is over. Its entry, the grant and the deadline: queued."""

from __future__ import annotations

import enum
from typing import Optional

from ...config import Config, EventRule
from ...model import Event
from ...records import Level, Record, What
from ..frozen import replace
from ..lifecycle import Phase, Slot
from ..machine import Table, row
from ..notes import _iso_wall, _note
from ..state import SlotLease, State, Tracked, _with, ours
from ..vocabulary.constants import SLOT_GRACE
from ..vocabulary.effects import AcquireSlot, Effect, ReleaseSlot
from ..vocabulary.messages import SlotBusy, SlotFailed, SlotKept
from .lead import lead
from .through import seconds


class SlotOn(str, enum.Enum):
    """What happens to an event's slot: the triggers of its table."""

    ASK = "its before-hooks are due"
    TOO_LATE = "too close to NotBefore to wait"
    GRANTED = "etcd granted it"
    OUT_OF_WINDOW = "granted after its window closed"
    DEADLINE = "its deadline came first"
    BUSY = "it went to another VM while the daemon was down"
    TAKEN = "it went to another VM before its hooks ran again"
    GIVEN_UP = "its lead passed while it waited to be taken back"
    LOST = "etcd did not confirm it within its ttl"
    EXPIRED = "its lease expired (a partition) after its approval"
    FREED = "an operator freed it (fleet free)"
    OVER = "its event is over or forgotten"
    DROPPED = "a reload removed concurrency"
    OVER_AT_BOOT = "the state file has its event over"
    STOPPED = "the daemon stops (for the maintenance it approved, most likely)"
    GOES = "the daemon stops and its VM does not come back (Terminate, Preempt)"
    AFTER_FAILED = "its after- or cancelled-hooks failed or were cut off"


_ = Slot
TABLE = Table(
    "slot",
    "an event's concurrency slot (concurrency, etcd; with several groups a slot in each, taken "
    "and given back together): held from before its before-hooks until it is over; missing, "
    "it is never approved early",
    (
        row([_.NONE], SlotOn.ASK, _.ASKED, "AcquireSlot: the event waits in queued"),
        row([_.NONE], SlotOn.TOO_LATE, _.MISSING, "slot_unavailable: prepared now"),
        row([_.ASKED, _.HELD], SlotOn.GRANTED, _.HELD, "slot_acquired (taken_back)"),
        row(
            [_.ASKED],
            SlotOn.OUT_OF_WINDOW,
            _.NONE,
            "ReleaseSlot: it waits for the next window, or the lead, and asks again then",
        ),
        row([_.NONE, _.ASKED, _.HELD], SlotOn.DEADLINE, _.MISSING, "slot_unavailable: prepared"),
        row([_.HELD], SlotOn.BUSY, _.MISSING, "ReleaseSlot, slot_unavailable"),
        row([_.HELD], SlotOn.TAKEN, _.ASKED, "asked for anew: its hooks wait in the queue"),
        row([_.ASKED], SlotOn.GIVEN_UP, _.NONE, "ReleaseSlot: prepared without it"),
        row([_.HELD], SlotOn.LOST, _.MISSING, "slot_lost: ReleaseSlot, slot_unavailable"),
        row([_.HELD], SlotOn.EXPIRED, _.ASKED, "slot_lost: asked for anew, held again till over"),
        row([_.ASKED, _.HELD], SlotOn.FREED, _.MISSING, "slot_freed_by_operator: ReleaseSlot"),
        row([_.ASKED, _.HELD], SlotOn.OVER, _.NONE, "ReleaseSlot (slot_released if it was held)"),
        row([_.HELD], SlotOn.DROPPED, _.NONE, "ReleaseSlot, slot_released"),
        row([_.ASKED, _.HELD], SlotOn.OVER_AT_BOOT, _.NONE, "nothing to give back"),
        row([_.HELD], SlotOn.STOPPED, _.HELD, "HoldSlot: held for hold_max (slot_held)"),
        row([_.HELD], SlotOn.GOES, _.NONE, "ReleaseSlot: free as its VM goes (slot_released)"),
        row([_.HELD], SlotOn.AFTER_FAILED, _.HELD, "kept: they run again every after_retry"),
    ),
)
del _


def move(tracked: Tracked, on: SlotOn, target: Slot) -> Tracked:
    """The one place an event's slot changes: only as `TABLE` declares."""
    TABLE.check(tracked.slot, on, target)
    return replace(tracked, slot=target)


def _slot_busy(state: State, msg: SlotBusy, now: float, out: list[Effect]) -> State:
    tracked = state.events.get(msg.event_id)
    if tracked is None:
        return state
    state = replace(state, slot_holders=msg.holders)
    if tracked.phase is Phase.QUEUED:
        out.append(_slot_waiting(tracked.event, tracked.start_at, msg.holders, state, msg.full))
        if tracked.slot is Slot.HELD:  # not taken back (another VM's now): asked for anew
            state = _without_lease(state, msg.event_id)
            tracked = move(tracked, SlotOn.TAKEN, Slot.ASKED)
            state = _with(state, msg.event_id, tracked)
        return _no_grace(state, tracked, now)
    if tracked.slot is Slot.HELD and tracked.phase in (Phase.INTERRUPTED, Phase.REBOOTED):
        # Its slot went to another VM while the daemon was down, before its before-hooks ran
        # again: asked for anew, they wait in the queue (`_prepare`).
        state = _without_lease(state, msg.event_id)
        return _with(state, msg.event_id, move(tracked, SlotOn.TAKEN, Slot.ASKED))
    if tracked.slot is Slot.HELD:  # after a restart its slot had gone to another VM
        out.append(
            _note(
                Level.WARNING,
                What.SLOT_UNAVAILABLE,
                tracked.event,
                holders=list(msg.holders),
                reason="its slot was lost while the daemon was down: not approved early",
            )
        )
        out.append(ReleaseSlot(msg.event_id))
        return _with(state, msg.event_id, move(tracked, SlotOn.BUSY, Slot.MISSING))
    return state


def _slot_confirmed(state: State, event_id: str, confirmed: float) -> State:
    """The slot is ours for `ttl` from when etcd's acknowledged request was sent."""
    concurrency = state.config.concurrency
    ttl = concurrency.ttl if concurrency is not None else 0
    lease = state.slot_leases.get(event_id)
    until = confirmed + ttl
    if lease is not None and lease.confirmed and lease.until >= until:
        return state
    return replace(state, slot_leases={**state.slot_leases, event_id: SlotLease(until)})


def _slot_unconfirmed(state: State, tracked: Tracked, now: float) -> State:
    """A held slot asked for again (a restart, a reload): no early approval until etcd says
    it is still ours, and lost if that takes longer than `ttl`."""
    concurrency = state.config.concurrency
    ttl = concurrency.ttl if concurrency is not None else 0
    lease = SlotLease(now + ttl, confirmed=False)
    return replace(state, slot_leases={**state.slot_leases, tracked.event.event_id: lease})


def _without_lease(state: State, event_id: str) -> State:
    return replace(state, slot_leases={k: v for k, v in state.slot_leases.items() if k != event_id})


def _slot_awaited(state: State, tracked: Tracked) -> bool:
    """A slot asked for and not granted, or held before a restart and not confirmed by etcd
    since (being taken back)."""
    held = state.slot_leases.get(tracked.event.event_id)
    taking_back = tracked.slot is Slot.HELD and held is not None and not held.confirmed
    return taking_back or tracked.slot is Slot.ASKED


def _slot_kept(state: State, msg: SlotKept, now: float, out: list[Effect]) -> State:
    tracked = state.events.get(msg.event_id)
    held = state.slot_leases.get(msg.event_id)
    if tracked is None or tracked.slot is not Slot.HELD or held is None or not held.confirmed:
        return state  # lost meanwhile, or not taken back yet (SlotGranted says so first)
    return _slot_confirmed(state, msg.event_id, msg.confirmed)


def _slot_failed(state: State, msg: SlotFailed, now: float, out: list[Effect]) -> State:
    tracked = state.events.get(msg.event_id)
    if tracked is None or tracked.slot not in (Slot.ASKED, Slot.HELD):
        return state
    out.append(
        _note(
            Level.WARNING,
            What.SLOT_FAILED,
            tracked.event,
            kind=msg.kind,
            error=msg.detail[:300],
            reason="etcd could not be asked for a slot; asked again; without one by the "
            "deadline its hooks start and it is not approved early",
        )
    )
    return _no_grace(state, tracked, now) if tracked.phase is Phase.QUEUED else state


def _no_grace(state: State, tracked: Tracked, now: float) -> State:
    """Past its lead, a queued event waits only for etcd's answer (SLOT_GRACE): an answer
    that gives no slot (every one taken, etcd unreachable) starts its hooks now, without one."""
    rule = state.config.events.get(tracked.event.event_type, EventRule())
    lead_at = _slot_deadline(tracked.event, rule, state)
    if lead_at is None or lead_at > now or tracked.start_at <= now:
        return state
    return _with(state, tracked.event.event_id, replace(tracked, start_at=now))


def _needs_slot(state: State, tracked: Tracked) -> bool:
    """Concurrency slots bound early maintenance: the types that obey windows (planned
    maintenance), once per event (not again once held, given up or missed)."""
    concurrency = state.config.concurrency
    rule = state.config.events.get(tracked.event.event_type)
    if concurrency is None or rule is None or not rule.obeys_windows(tracked.event.event_type):
        return False
    return tracked.slot is Slot.NONE


def _slot_deadline(event: Event, rule: EventRule, state: State) -> Optional[float]:
    """The monotonic instant its hooks start without a slot: its lead before NotBefore (a slot
    asked for at the lead or later gets SLOT_GRACE from then). None: no NotBefore, or no clock
    yet (no time to wait)."""
    if event.not_before is None or state.wall_offset is None:
        return None
    return event.not_before.timestamp() - lead(rule) - state.wall_offset


def _queued_until(tracked: Tracked, state: State, now: float) -> float:
    """A queued event's slot deadline placed again (a document, a clock step, a reload): its
    lead before NotBefore as the wall clock now says, but never less than SLOT_GRACE after the
    slot was asked (`start_at` keeps that instant, so a document does not push it on; inf after
    a restart: the grace counts from now). Now, with no NotBefore or clock."""
    rule = state.config.events.get(tracked.event.event_type, EventRule())
    deadline = _slot_deadline(tracked.event, rule, state)
    if deadline is None:
        return now
    return max(deadline, min(tracked.start_at, now + SLOT_GRACE))


def _slot_waiting(
    event: Event,
    deadline: float,
    holders: tuple[str, ...],
    state: State,
    full: tuple[str, ...] = (),
) -> Record:
    """`deadline` is inf after a restart until the next document places it: no instant then
    (fromtimestamp(inf) raised OverflowError: internal_error, holders never recorded). With
    several groups, `full` names those without a slot for this VM (it holds one in each or none)."""
    wall = deadline + (state.wall_offset or 0.0)
    return _note(
        Level.INFO,
        What.EVENT_WAITING,
        event,
        reason="slot",
        **_groups(state),
        holders=list(holders),
        **({"full": list(full)} if full else {}),
        hooks_start_at=_iso_wall(wall),
    )


def _groups(state: State) -> dict[str, object]:
    """The records' `group` (the first, or only, group); with several, `groups` too."""
    concurrency = state.config.concurrency
    if concurrency is None:
        return {"group": None}
    if not concurrency.more:
        return {"group": concurrency.group}
    return {"group": concurrency.group, "groups": list(concurrency.groups)}


# Phases in which an event's slot is given back: it is over, or it never will be prepared.
_SLOT_ENDS = frozenset({Phase.OVER, Phase.GONE, Phase.MISSED, Phase.UNHANDLED})


def _release_when_over(state: State, out: list[Effect]) -> State:
    """A coupling (compose.COUPLINGS): a slot asked for or held is given back once its event is
    over, will never be prepared, or is forgotten. Read from the state alone: an event forgotten
    in this step waits in `state.forgotten` for it."""
    forgotten = state.forgotten
    if forgotten:
        state = replace(state, forgotten=())
        for gone in forgotten:
            current = state.events.get(gone.event.event_id)
            if current is None or current.slot not in (Slot.ASKED, Slot.HELD):
                state = _give_back(state, gone, out)
    for event_id, t in ours(state.events):
        if t.slot in (Slot.ASKED, Slot.HELD) and t.phase in _SLOT_ENDS:
            state = _give_back(state, t, out)
            state = _with(state, event_id, move(t, SlotOn.OVER, Slot.NONE))
    return state


def _give_back(state: State, t: Tracked, out: list[Effect]) -> State:
    event_id = t.event.event_id
    out.append(ReleaseSlot(event_id))
    if t.slot is Slot.HELD:
        # The VM's events share its one slot (slots.SlotKeeper): it stays the VM's while
        # another of them holds it.
        kept = sorted(k for k, o in state.events.items() if k != event_id and o.slot is Slot.HELD)
        out.append(_note(Level.INFO, What.SLOT_RELEASED, t.event, kept_for=kept))
    return state


def _slots_reloaded(state: State, old: Config, now: float, out: list[Effect]) -> State:
    """A reload that changes `concurrency` or etcd gives the daemon a new slot keeper (the old
    one hands its held slots over): every slot asked for or held is asked for again through
    it, held ones taken back under a renewed lease (the hold lease in a maintenance), and
    unconfirmed till then (the new keeper may find it is no slot any more). Without `concurrency`
    any more, held slots are given back (the keeper is gone), and no slot is needed."""
    new = state.config
    if (new.coordination, new.concurrency) == (old.coordination, old.concurrency):
        return state  # the daemon keeps its keeper (the same test as its _use_config)
    etcd = new.coordination.etcd if new.coordination is not None else None
    for event_id, t in state.events.items():
        if t.slot not in (Slot.ASKED, Slot.HELD) or t.phase in _SLOT_ENDS:
            continue
        if new.concurrency is not None and etcd is not None:
            out.append(AcquireSlot(t.event, t.vm_name or state.vm_name or "", seconds(state, t)))
            if t.slot is Slot.HELD:
                state = _slot_unconfirmed(state, t, now)
        elif t.slot is Slot.HELD:
            out.append(ReleaseSlot(event_id))
            out.append(_note(Level.INFO, What.SLOT_RELEASED, t.event))
            state = _with(state, event_id, move(t, SlotOn.DROPPED, Slot.NONE))
    return state
