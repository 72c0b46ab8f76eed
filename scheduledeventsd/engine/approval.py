"""Approval: the policy that decides it, and the one place approvals go out."""

from __future__ import annotations

from typing import Optional

from ..config import ApprovePolicy
from ..model import SCHEDULED, Event
from ..records import Cause, Level, Record, What
from ..retry import Failures
from .frozen import replace
from .lifecycle import Drain, On, Phase, Slot
from .notes import _note
from .poll import rate, timing, turns
from .state import State, Tracked, _move, _with, ours
from .vocabulary.constants import APPROVAL_BACKOFF
from .vocabulary.effects import Effect, PostApproval, WithdrawApproval
from .vocabulary.messages import ApprovalFailed, ApprovalSent


def _approval_sent(state: State, msg: ApprovalSent, now: float, out: list[Effect]) -> State:
    approvals = state.approvals
    attempts = approvals.failures.get(msg.event_id, Failures()).count + 1
    failures = {k: f for k, f in approvals.failures.items() if k != msg.event_id}
    state = replace(state, approvals=replace(approvals.answered(msg.event_id), failures=failures))
    tracked = state.events.get(msg.event_id)
    if tracked is None or tracked.phase is not Phase.APPROVING:
        return state
    late = tracked.slot is Slot.MISSING or _answered_late(state, msg, now)
    if late:
        out.append(
            _note(
                Level.WARNING,
                What.SLOT_LOST,
                tracked.event,
                reason="the approval was answered after its slot's lease could expire: IMDS "
                "has it, and another VM may have taken the slot and been approved meanwhile",
            )
        )
    out.append(
        _note(
            Level.INFO if not late else Level.WARNING,
            What.EVENT_APPROVED,
            tracked.event,
            attempts=attempts,
            duration_s=round(msg.duration_s, 3),
            **({"slot_lost": True} if late else {}),
        )
    )
    return _with(state, msg.event_id, _move(tracked, On.ACCEPTED, Phase.APPROVED))


def _answered_late(state: State, msg: ApprovalSent, now: float) -> bool:
    """An approval of an event holding a slot answered after the lease etcd last confirmed
    could expire (or the slot was found lost while it was under way): the daemon's lane gives
    up before that (PostApproval.deadline), so only an answer read just then, or a carrier
    that does not keep the deadline, is late."""
    lease_ = state.slot_leases.get(msg.event_id)
    answered = msg.answered if msg.answered is not None else now
    return lease_ is not None and lease_.until < answered


def _approval_failed(state: State, msg: ApprovalFailed, now: float, out: list[Effect]) -> State:
    approvals = state.approvals
    if msg.event_id in approvals.withdrawn:  # no longer wanted: nothing failed, nothing to say
        return replace(state, approvals=approvals.answered(msg.event_id))
    failures, log = approvals.failures.get(msg.event_id, Failures()).failed(
        msg.kind, now, APPROVAL_BACKOFF
    )
    tracked = state.events.get(msg.event_id)
    if log and tracked is not None:
        out.append(
            _note(
                Level.WARNING,
                What.APPROVAL_FAILED,
                tracked.event,
                kind=msg.kind,
                error=msg.detail,
                attempts=failures.count,
                retry_in_s=round(failures.retry_at - now, 2),
            )
        )
    failed = {**approvals.failures, msg.event_id: failures}
    return replace(state, approvals=replace(approvals.answered(msg.event_id), failures=failed))


def _withdraw(state: State, out: list[Effect]) -> State:
    """A coupling (compose): an approval asked for whose event stopped being APPROVING other
    than by its answer (it left, changed type, was put back) is withdrawn, once: one still
    queued behind another POST must not approve what the event is now (review5)."""
    approvals = state.approvals
    if not approvals.posting:
        return state
    unwanted = sorted(
        event_id
        for event_id in approvals.posting - approvals.withdrawn
        if (t := state.events.get(event_id)) is None or t.phase is not Phase.APPROVING
    )
    if not unwanted:
        return state
    out.extend(WithdrawApproval(event_id) for event_id in unwanted)
    return replace(
        state, approvals=replace(approvals, withdrawn=approvals.withdrawn | set(unwanted))
    )


def _retry_approvals(state: State, now: float, out: list[Effect]) -> State:
    """The approvals due now, by the one rule the wake-up is derived from (turns.approval_due:
    not on their way, past their backoff, their slot confirmed, a document read since the start),
    as far as the rate limit allows."""
    approvals = state.approvals
    due = [
        t.event
        for event_id, t in ours(state.events)
        if t.phase is Phase.APPROVING
        and (at := turns.approval_due(state, event_id, t, now, now)) is not None
        and at <= now
    ]
    posting = set()
    for event in due:
        if rate._allowed_at(state, now) > now:
            break  # the rest when the rate limit allows (next_wakeup)
        held = state.slot_leases.get(event.event_id)
        out.append(PostApproval(event, held.until if held is not None else None))
        state = rate._spend(state, now)
        posting.add(event.event_id)
    if posting:
        state = replace(
            state, approvals=replace(state.approvals, posting=approvals.posting | posting)
        )
    return state


def _decide(state: State, tracked: Tracked, on: On, out: list[Effect]) -> Tracked:
    phase, note = _approval_of(tracked, state)
    if note is not None:
        out.append(note)
    return _move(tracked, on, phase)


def _approval_of(tracked: Tracked, state: State) -> tuple[Phase, Optional[Record]]:
    """`_approval`, except that an event prepared without its concurrency slot is never
    approved early: more of the group than `max` could be down at once."""
    phase, note = _approval(tracked.event, state)
    if tracked.drain is Drain.HELD and phase in (Phase.APPROVING, Phase.COORDINATING):
        return Phase.NOT_APPROVED, _note(
            Level.WARNING,
            What.EVENT_NOT_APPROVED,
            tracked.event,
            cause=Cause.CLUSTER_HOLD.value,
            reason="the cluster could not spare this node: it proceeds at NotBefore",
        )
    if tracked.slot is Slot.MISSING and phase in (Phase.APPROVING, Phase.COORDINATING):
        return Phase.NOT_APPROVED, _note(
            Level.WARNING,
            What.EVENT_NOT_APPROVED,
            tracked.event,
            cause=Cause.SLOT_UNAVAILABLE.value,
            reason="prepared without a concurrency slot: it proceeds at NotBefore",
        )
    return phase, note


def _approval(event: Event, state: State) -> tuple[Phase, Optional[Record]]:
    """Approving lets the event proceed for every VM it names, hence the `sole` default.

    APPROVING events are posted by `_retry_approvals`, the one place approvals go out.
    """
    policy = state.config.policy(event.event_type)
    if event.status != SCHEDULED:
        return Phase.DONE, _note(
            Level.INFO, What.APPROVAL_NOT_NEEDED, event, reason="already started"
        )
    if not state.config.provider.can_approve:
        return Phase.NOT_APPROVED, _note(
            Level.INFO,
            What.APPROVAL_SKIPPED,
            event,
            reason=f"{state.config.provider.value} takes no approval; it proceeds at its own time",
        )
    if policy is ApprovePolicy.NEVER:
        return Phase.NOT_APPROVED, _note(
            Level.INFO,
            What.APPROVAL_SKIPPED,
            event,
            reason=f"approve: {policy.value}; it proceeds at NotBefore",
        )
    others = [r for r in event.resources if r.casefold() != state.vm_name.casefold()]
    via = state.config.ready_via
    if policy is ApprovePolicy.ALL and others and via is not None:
        return Phase.COORDINATING, _note(
            Level.INFO,
            What.EVENT_COORDINATING,
            event,
            via=via,
            other_resources=" ".join(others),
            reason="shared: approved once every VM it names is ready",
        )
    if policy in (ApprovePolicy.SOLE, ApprovePolicy.ALL) and others:
        return Phase.NOT_APPROVED, _note(
            Level.INFO,
            What.APPROVAL_SKIPPED,
            event,
            reason=f"shared with {len(others)} other VM(s), approving would rush them; "
            f"it proceeds at NotBefore (approve: {policy.value})",
            other_resources=" ".join(others),
        )
    return Phase.APPROVING, None


# ---- the approvals' timer: an APPROVING event's next POST (when: poll/turns.approval_due)

DUE_PHASES = frozenset({Phase.APPROVING})


def fire(state: State, now: float, out: list[Effect]) -> State:
    state = timing._make_room(state, now, out)  # a poll ordered for later gives way to it
    return _retry_approvals(state, now, out)
