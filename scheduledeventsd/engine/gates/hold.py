"""The hold: a concurrency slot held through the whole maintenance, until its VM is back and its
after-hooks (or cancelled-hooks) succeeded. A daemon that stops holding a slot leaves it held for
`hold_max` (HoldSlot), unless its VM does not come back (Terminate, Preempt): then it is free as
it goes; after-hooks that fail (or are cut off) while it is held keep it held, and run again
every `after_retry` until they succeed (or an operator frees the slot)."""

from __future__ import annotations

from typing import Optional

from ...config import NOT_BACK
from ...records import Level, What
from .. import runs
from ..frozen import replace
from ..lifecycle import Drain, On, Phase, Slot
from ..notes import _note
from ..state import State, Tracked, _move, _with, ours
from ..vocabulary.constants import Outcome
from ..vocabulary.effects import Effect, HoldSlot, ReleaseSlot
from ..vocabulary.messages import SlotBusy
from . import slot, through

# Phases past the before-hooks of an event whose VM then goes for good: the stop is its end.
_GOES = frozenset({Phase.APPROVED, Phase.NOT_APPROVED, Phase.HOOKS_FAILED, Phase.DONE})


def _stopped(state: State, out: list[Effect]) -> State:
    """On the daemon's exit: every held slot is left held for `hold_max` (its VM is going down
    for its maintenance, or the daemon restarts: it takes the slot back when it is back); a
    slot of a VM that does not come back is given back now."""
    concurrency = state.config.concurrency
    if concurrency is None:
        return state
    for event_id, t in state.events.items():
        if t.slot is not Slot.HELD:
            continue
        if t.event.event_type in NOT_BACK and t.phase in _GOES:
            out.append(ReleaseSlot(event_id))
            out.append(
                _note(
                    Level.INFO,
                    What.SLOT_RELEASED,
                    t.event,
                    reason=f"a {t.event.event_type}: this VM does not come back",
                )
            )
            state = _with(state, event_id, slot.move(t, slot.SlotOn.GOES, Slot.NONE))
            continue
        held = _note(
            Level.INFO,
            What.SLOT_HELD,
            t.event,
            hold_s=concurrency.hold_max,
            reason="the daemon stops holding it: held until it is back and its after-hooks "
            "succeeded, at most hold_max",
        )
        failed = _note(
            Level.WARNING,
            What.SLOT_FAILED,
            t.event,
            kind="hold",
            ttl_s=concurrency.ttl,
            reason="etcd could not be asked to hold the slot as the daemon stops: it is lost "
            "within ttl, and the next VM may go while this one is away",
        )
        # Said by the daemon once the key is on the hold lease (or could not be put there).
        out.append(HoldSlot(event_id, concurrency.hold_max, on_held=held, on_failed=failed))
        state = _with(state, event_id, slot.move(t, slot.SlotOn.STOPPED, Slot.HELD))
    return state


def keeps(state: State, tracked: Tracked, outcome: Outcome) -> bool:
    """After- or cancelled-hooks that did not succeed while the event holds its slot (or asks
    for it again: its lease expired in a partition): the slot stays held and they run again
    (`_retry_later`)."""
    return (
        outcome is not Outcome.SUCCEEDED
        and tracked.slot in (Slot.HELD, Slot.ASKED)
        and state.config.concurrency is not None
    )


def _retry_later(state: State, tracked: Tracked, now: float) -> Tracked:
    """Held, run again `after_retry` from now (`start_at`: when, run None: none running)."""
    concurrency = state.config.concurrency
    every = concurrency.after_retry if concurrency is not None else 0.0
    if tracked.slot is Slot.HELD:
        tracked = slot.move(tracked, slot.SlotOn.AFTER_FAILED, Slot.HELD)
    return replace(tracked, run=None, start_at=now + every)


def _slot_busy(state: State, msg: SlotBusy, now: float, out: list[Effect]) -> State:
    """The daemon's lease expired (a partition) while its VM is in the maintenance it was
    approved for: the slot is asked for again (the keeper takes it anew), not given back (given
    back, the next VM went while this one was still down, or its undrain failing). Any other
    SlotBusy is the slot gate's."""
    tracked = state.events.get(msg.event_id)
    if (
        tracked is None
        or not msg.expired
        or tracked.slot is not Slot.HELD
        or not through.in_maintenance(tracked)
        or tracked.phase is Phase.REBOOTED  # not judged yet: the slot gate asks again
    ):
        return slot._slot_busy(state, msg, now, out)
    out.append(
        _note(
            Level.WARNING,
            What.SLOT_LOST,
            tracked.event,
            reason="its lease expired after its approval: asked for again, held until it is over",
        )
    )
    state = slot._without_lease(state, msg.event_id)
    return _with(state, msg.event_id, slot.move(tracked, slot.SlotOn.EXPIRED, Slot.ASKED))


# ---- the hold's timer: failed after-hooks run again

DUE_PHASES = frozenset({Phase.AFTER})


def waiting(t: Tracked) -> bool:
    """An event whose after-hooks wait for their next try (run again while its slot is held;
    over once it is not: lost, or freed by an operator). Not one whose hooks wait for its
    node's restore (runs._awaiting_restore: its node still marked)."""
    waits = t.phase is Phase.AFTER and t.run is None and t.drain is Drain.NONE
    return waits and not t.unmarking  # put back: its stage waits for etcd (postponed)


def due_for(state: State, event_id: str, t: Tracked, now: float, allowed: float) -> Optional[float]:
    return t.start_at if waiting(t) and state.stopping is None else None


def fire(state: State, now: float, out: list[Effect]) -> State:
    """The hold's timer: after-hooks waiting for their next try run again while the slot is
    held; one no longer held (lost, freed by an operator) is over without them."""
    if state.stopping is not None:
        return state
    for event_id, t in ours(state.events):
        if not waiting(t) or t.start_at > now:
            continue
        rule = state.config.events.get(t.event.event_type)
        hooks = rule.hooks_for(t.stage.value) if rule is not None else ()
        if t.slot not in (Slot.HELD, Slot.ASKED) or not hooks:
            state, over = runs._over(state, t, On.LEAD_TIME)
            state = _with(state, event_id, over)
            continue
        rebooted = bool(t.boot_id and state.boot_id and t.boot_id != state.boot_id)
        state, run = runs._spawn(state, t, t.stage, hooks, out, rebooted=rebooted)
        state = _with(state, event_id, _move(t, On.LEAD_TIME, Phase.AFTER, run=run))
    return state
