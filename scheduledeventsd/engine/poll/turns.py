"""Whose turn at IMDS: an approval or a name lookup that is due goes before a poll ordered for
later (poll/timing takes that poll back, and orders none while they wait). Here, below the
approval, so that the poll can ask when an approval is due without importing it."""

from __future__ import annotations

from typing import Optional

from ..lifecycle import Phase
from ..state import NO_FAILURES, State, Tracked, ours
from ..vocabulary.constants import SLOT_MARGIN
from . import names


def approval_due(
    state: State, event_id: str, t: Tracked, now: float, allowed: float
) -> Optional[float]:
    """When an APPROVING event's approval goes out (approval's timer): after a failure's
    backoff, when the rate limit allows; none while it is on its way, or while its slot is
    being confirmed, or before a document since the start (or a rename) says the event is
    still what it was prepared for (its type may have changed while the daemon was down)."""
    if (
        state.incarnation is None
        or event_id in state.approvals.posting
        or _slot_pending(state, event_id, now)
    ):
        return None
    return max(state.approvals.failures.get(event_id, NO_FAILURES).retry_at, allowed)


def _slot_pending(state: State, event_id: str, now: float) -> bool:
    """A held slot being taken back, or confirmed for less than SLOT_MARGIN more: its event's
    approval waits for etcd's next answer (or is lost at the lease's end: gates/lease)."""
    lease = state.slot_leases.get(event_id)
    return lease is not None and (not lease.confirmed or lease.until - now < SLOT_MARGIN)


def _others_due(state: State, now: float) -> bool:
    """An approval or a name lookup waits for its turn (not for a retry's backoff): due by
    their own `due`, the rate limit aside."""
    if any(at <= now for at in names.due(state, now, now)):
        return True
    for event_id, t in ours(state.events):
        if t.phase is Phase.APPROVING:
            at = approval_due(state, event_id, t, now, now)
            if at is not None and at <= now:
                return True
    return False
