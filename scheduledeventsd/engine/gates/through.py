"""The hold through the maintenance, while the daemon lives: once an event holding its VM's slot
is approved (or Started without our approval, or its after-hooks run, or its VM booted while it
was prepared), the slot moves to the daemon's hold lease of `hold_max`, renewed while the daemon
lives (HoldSlot `alive`). A daemon killed then, or a VM pulled away without a clean stop, leaves
its slot held until it is back or `hold_max` has passed, not lost within `ttl`; only a daemon
killed outside a maintenance loses it within `ttl`."""

from __future__ import annotations

from ...config import NOT_BACK
from ...model import STARTED
from ...records import Level, What
from ..frozen import replace
from ..lifecycle import Phase, Slot
from ..notes import _note
from ..state import State, Tracked
from ..vocabulary.effects import Effect, HoldSlot
from ..vocabulary.messages import SlotMoved

# Phases of an approved event whose VM is in its maintenance, or back and not healthy yet; and
# REBOOTED: its VM booted while it was prepared, most likely its maintenance (the next document
# says), so the slot taken back after that boot goes straight to the hold lease: a daemon
# killed before that document (or before its after-hooks start) leaves it held, not lost
# within ttl. Judged not the maintenance (still Scheduled), it stays there until given back.
IN_MAINTENANCE = frozenset({Phase.APPROVED, Phase.DONE, Phase.AFTER, Phase.REBOOTED})
# Prepared but decided without an early approval: the platform starts it at NotBefore anyway,
# and these phases stay as they are when it is listed Started (COORDINATING and APPROVING go
# to DONE): in its maintenance from then on.
_STARTED_WITHOUT_US = frozenset({Phase.NOT_APPROVED, Phase.HOOKS_FAILED})


def in_maintenance(tracked: Tracked) -> bool:
    """Its VM is in the maintenance of this event (or back, and its after-hooks not done)."""
    return tracked.phase in IN_MAINTENANCE or (
        tracked.phase in _STARTED_WITHOUT_US and tracked.event.status == STARTED
    )


def seconds(state: State, tracked: Tracked) -> int:
    """`hold_max` when the event's slot is held through its VM's maintenance, else 0 (not
    approved yet: a daemon killed then loses it within `ttl`; or its VM does not come back)."""
    concurrency = state.config.concurrency
    if (
        concurrency is None
        or tracked.slot is not Slot.HELD
        or not in_maintenance(tracked)
        or tracked.event.event_type in NOT_BACK
    ):
        return 0
    return concurrency.hold_max


def _hold_through(state: State, out: list[Effect]) -> State:
    """A coupling (compose.COUPLINGS): each slot that comes to be held through a maintenance is
    moved to the hold lease once (`State.kept`: forgotten once it is not held any more, so a
    slot held again after a partition is moved again)."""
    if state.config.concurrency is None and not state.kept:
        return state  # no slots: nothing to hold (a scan of every event, at every step, saved)
    kept = frozenset(
        k for k in state.kept if k in state.events and state.events[k].slot is Slot.HELD
    )
    for event_id, tracked in state.events.items():
        hold = seconds(state, tracked)
        if hold and event_id not in kept:
            out.append(HoldSlot(event_id, hold, alive=True))
            kept |= {event_id}
    return state if kept == state.kept else replace(state, kept=kept)


def _slot_moved(state: State, msg: SlotMoved, now: float, out: list[Effect]) -> State:
    """Said once per move: on the hold lease now (a daemon killed from here on leaves the slot
    held), or loudly that the move failed (tried again every third of `ttl`: until it works a
    daemon that dies loses the slot within `ttl`, and the next VM may go while this one is in
    its maintenance)."""
    tracked = state.events.get(msg.event_id)
    concurrency = state.config.concurrency
    if tracked is None or concurrency is None:
        return state
    if not msg.error:
        out.append(
            _note(
                Level.INFO,
                What.SLOT_HELD_THROUGH,
                tracked.event,
                slots=list(msg.slots),
                hold_s=msg.seconds,
                reason="its VM is in its maintenance: the slot is on the daemon's hold lease, "
                "held until it is back and its after-hooks succeeded, at most hold_max after "
                "the daemon's last renewal",
            )
        )
        return state
    out.append(
        _note(
            Level.WARNING,
            What.SLOT_FAILED,
            tracked.event,
            kind="hold_through",
            slots=list(msg.slots),
            error=msg.error,
            ttl_s=concurrency.ttl,
            reason="the slot could not be moved to the hold lease (tried again every third of "
            "ttl): should the daemon die now, it is lost within ttl and the next VM may go "
            "while this one is in its maintenance",
        )
    )
    return state
