"""The events of a document: what is new (engine/first_sight), listed again, or gone."""

from __future__ import annotations

from typing import Optional

from ..model import SCHEDULED, STARTED, Document, Event
from ..records import Level, Record, What
from . import copies, first_sight, peers, postponed, returned, runs, stages
from .frozen import replace
from .gates import drain, onward, pipeline, slot, window
from .lifecycle import PREPARED, Drain, On, Phase, Rule, Stage
from .notes import _note, _unhandled
from .poll import timing
from .state import Events, Known, State, Tracked, _forget, _marked, _move
from .vocabulary.constants import CLOCK_STEP
from .vocabulary.effects import Effect, StopDraining
from .vocabulary.messages import DocumentFetched


def _document_fetched(state: State, msg: DocumentFetched, now: float, out: list[Effect]) -> State:
    poll = state.poll
    if poll.failures.count:
        out.append(
            Record(
                Level.INFO,
                What.POLL_RECOVERED,
                {"failures": poll.failures.count, "outage_s": round(now - poll.failures.since, 1)},
            )
        )
    state = replace(state, poll=timing._answered(poll, state.config, now))
    if state.stopping is not None:
        return state
    doc = msg.document
    offset = None if msg.wall is None else msg.wall - now
    if doc.incarnation == state.incarnation:
        if offset is None or state.wall_offset is None:
            return state
        if abs(offset - state.wall_offset) <= CLOCK_STEP:
            return state
        out.append(
            Record(
                Level.WARNING,
                What.CLOCK_MOVED,
                {
                    "moved_s": round(offset - state.wall_offset, 3),
                    "reason": "the wall clock moved against the monotonic one; NotBefore "
                    "times are placed again",
                },
            )
        )
        moved = offset - state.wall_offset
        state = replace(state, wall_offset=offset)
        return window._replace_waiting(state, now, out, moved)
    out.append(
        Record(
            Level.INFO,
            What.DOCUMENT_CHANGED,
            {
                "incarnation": doc.incarnation,
                "previous_incarnation": state.incarnation,
                "events": len(doc.events),
            },
        )
    )
    for problem in doc.skipped:
        out.append(
            Record(
                Level.WARNING,
                What.EVENT_SKIPPED,
                {"incarnation": doc.incarnation, "reason": problem},
            )
        )
    doc = copies.chosen(state, doc, out)
    state = replace(state, incarnation=doc.incarnation)
    if offset is not None:
        jumped = None if state.wall_offset is None else offset - state.wall_offset
        state = replace(state, wall_offset=offset)
        if jumped is not None and abs(jumped) > CLOCK_STEP:  # a step that came with news
            state = window._replace_waiting(state, now, out, jumped)
    return _on_document(state, doc, now, out)


def _on_document(state: State, doc: Document, now: float, out: list[Effect]) -> State:
    """Compare a new document with what we know; events that left it are over or cancelled."""
    listed, was_listed = frozenset(e.event_id for e in doc.events), state.listed
    state = replace(state, listed=listed)
    known = state.events
    events: dict[str, Tracked] = {}
    for event in doc.events:
        was = known.get(event.event_id)
        if was is not None and was.phase is Phase.NOT_OURS and was.event == event:
            events[event.event_id] = was  # another VM's, as it was: the most of them, at once
            continue
        state, before = returned.over_and_back(state, was, event, On.LISTED)
        state = returned.mark_taken_back(state, before, was_listed)
        if before is not None and before.event.resources != event.resources:
            state, before = _resources_changed(state, before, event, out)
        if before is None:
            state, tracked = first_sight.first_sight(event, state, doc.incarnation, now, out)
        elif before.phase is Phase.NOT_OURS:
            tracked = before if before.event == event else replace(before, event=event)
        elif not event.names(before.vm_name or state.vm_name):
            tracked = before  # it dropped this VM: its stage runs with the event that named it
        elif before.event.event_type != event.event_type:
            state, tracked = _retyped(state, before, event, doc.incarnation, now, out)
        else:
            state, tracked = _listed(state, before, event, doc.incarnation, now, out)
        if tracked.phase is not Phase.GONE:
            events[event.event_id] = tracked
        else:
            state = _forget(state, tracked)
        state = _seen_by_the_next(state, was, tracked)
    state = _unlisted(state, known, listed, events, out)
    state = replace(state, events=Events(events))
    failures = {k: f for k, f in state.approvals.failures.items() if k in state.events}
    return replace(state, approvals=replace(state.approvals, failures=failures))


def _unlisted(
    state: State,
    known: Known,
    listed: frozenset[str],
    events: dict[str, Tracked],
    out: list[Effect],
) -> State:
    """The events that left the document, after those it lists (added to `events` if kept)."""
    for event_id, gone in known.items():
        if event_id not in listed:
            state, tracked = _left(state, gone, out)
            if tracked.phase is not Phase.GONE:
                events[event_id] = tracked = returned.left(tracked)
            else:
                state = _forget(state, tracked)
            state = _seen_by_the_next(state, gone, tracked)
    return state


def _seen_by_the_next(state: State, was: Optional[Tracked], tracked: Tracked) -> State:
    """An event whose drain changed (its stage gave up the node's mark), as the next event of
    this document sees it: two that leave in one document each left the mark to the other,
    and the node stayed marked for good (found by test_promises' GatedPromises)."""
    if was is None or was.drain is tracked.drain:
        return state
    return replace(state, events=Events({**state.events, tracked.event.event_id: tracked}))


def _resources_changed(
    state: State, before: Tracked, event: Event, out: list[Effect]
) -> tuple[State, Optional[Tracked]]:
    """Resources of a listed event changed: judged again. One that now names this VM and was
    not ours is forgotten (None) and judged anew, as at first sight; one of ours that no longer
    names it is handled as leaving (its after- or cancelled-hooks, once)."""
    name = before.vm_name or state.vm_name
    named = event.names(name)
    if named and not before.event.names(name) and before.phase in (Phase.NOT_OURS, Phase.OVER):
        _move(before, On.NAMED, Phase.GONE)
        return state, None
    if named or before.phase in (Phase.NOT_OURS, Phase.AFTER, Phase.ENDING):
        return state, before
    out.append(
        _note(
            Level.INFO,
            What.EVENT_IGNORED,
            event,
            previous_resources=" ".join(before.event.resources),
            reason="its Resources no longer name this VM: handled as leaving",
        )
    )
    # Its stage's hooks get the event as it was when it named this VM.
    state, tracked = _ended(state, before, out)
    if tracked.phase is Phase.GONE:
        return _forget(state, tracked), None
    return state, tracked


def _ended(
    state: State, before: Tracked, out: list[Effect], why: str = "it left the document"
) -> tuple[State, Tracked]:
    """Handled as leaving, where what is listed now proves nothing of a boot since its before-
    hooks (its Resources dropped this VM, its type changed)."""
    if before.phase is not Phase.REBOOTED:
        return _left(state, before, out, why)
    # Not `_left`: gone after a boot proves the maintenance; this does not: cancelled-hooks, as
    # without a boot.
    stage = Stage.CANCELLED
    fields = {"phase": before.phase.value, "stage": stage.value}
    out.append(_note(Level.WARNING, What.EVENT_CANCELLED, before.event, **fields))
    return stages._start_stage(state, before, On.LEFT, stage, out)


def _retyped(  # noqa: PLR0917 - one call site, in the document loop
    state: State, before: Tracked, event: Event, incarnation: int, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """Its EventType changed under the same EventId: what was made ready for the old type is
    no preparation for the new one. The old event is taken as gone (`_left`: its before-hooks
    stopped, its node restored, its after- or cancelled-hooks of the old type run with the
    event as it was) and the new one as news (engine/returned): judged as first seen at once
    if nothing is owed, else once that stage has ended. Never approved on another type's hooks."""
    if not before.left:  # said once: while its owed stage runs, what is listed is news to come
        out.append(
            _note(
                Level.WARNING,
                What.EVENT_TYPE_CHANGED,
                event,
                previous_type=before.event.event_type,
                phase=before.phase.value,
                reason="the same EventId with another EventType: what was done for "
                f"{before.event.event_type} is undone, then it is judged anew",
            )
        )
    state, tracked = _ended(state, before, out, f"its EventType changed to {event.event_type}")
    if tracked.phase is Phase.OVER:  # its stage had no hooks: nothing is owed any more
        tracked = _move(tracked, On.LEFT, Phase.GONE)
    if tracked.phase is Phase.GONE:
        return first_sight.first_sight(event, _forget(state, tracked), incarnation, now, out)
    if not before.left and _marked(state, tracked):  # a `ready` that was not for the new type
        state = replace(state, unmarked=(*state.unmarked, tracked))  # deleted now (returned)
    return state, returned.left(tracked)


_WAITED = {Phase.WAITING: "their lead time", Phase.QUEUED: "a concurrency slot"}


def _listed(  # noqa: PLR0917 - one call site, in the document loop
    state: State, before: Tracked, event: Event, incarnation: int, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """An event of ours listed again: a status change is the news."""
    started = before.event.status != event.status
    if started:
        out.append(
            _note(Level.INFO, What.EVENT_STATUS_CHANGED, event, previous_status=before.event.status)
        )
    on = On.STARTED if started and event.status == STARTED else On.LISTED
    tracked = replace(before, event=event, incarnation=incarnation)
    undone = postponed.listed(state, before, tracked, on, now, out)
    if undone is not None:  # not kept drained for days; or kept as it starts
        return undone
    phase = tracked.phase
    if phase in (Phase.WAITING, Phase.QUEUED, Phase.GATED):
        if on is On.STARTED:
            state, tracked = onward.left(state, tracked, out)  # a gate holding it lets it go
            if _prepared(tracked):  # requeued: after-hooks once it is over
                return state, _move(tracked, on, Phase.DONE)
            waited = _WAITED.get(phase, f"the {before.gated} gate")
            out.append(
                _note(
                    Level.WARNING,
                    What.EVENT_MISSED,
                    event,
                    reason=f"it started while its hooks waited for {waited}",
                )
            )
            return state, _move(window._dropped(tracked), on, Phase.MISSED)
        if phase is Phase.WAITING:
            return state, _move(window._still_waiting(tracked, state, now, out), on, phase)
        if phase is Phase.QUEUED:
            until = slot._queued_until(tracked, state, now)
            return state, _move(tracked, on, phase, start_at=until)
    if phase is Phase.INTERRUPTED:
        return _resume(state, tracked, on, now, out)
    if phase is Phase.REBOOTED:
        return _judge_reboot(state, tracked, on, now, out)
    if on is On.STARTED and phase in (Phase.APPROVING, Phase.COORDINATING, Phase.DRAINING):
        if phase is Phase.COORDINATING:
            state, tracked = peers._stop_asking(state, tracked, out)
        if phase is Phase.DRAINING:
            out.append(StopDraining(event.event_id))
        return state, _move(tracked, on, Phase.DONE)
    return state, _move(tracked, on, phase)


def _resume(
    state: State, tracked: Tracked, on: On, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """Before-hooks cut off by a stop run again while the event is still Scheduled."""
    event = tracked.event
    if event.status != SCHEDULED:
        return state, _move(tracked, on, Phase.DONE)
    rule = state.config.events.get(event.event_type)
    if rule is None:  # a reload removed its type meanwhile: never an empty run by accident
        out.append(
            _unhandled(event, f"no hooks configured for {event.event_type} any more; left alone")
        )
        return state, _move(tracked, on, Phase.UNHANDLED)
    return pipeline._prepare(state, tracked, on, now, out)


def _left(
    state: State, gone: Tracked, out: list[Effect], why: str = "it left the document"
) -> tuple[State, Tracked]:
    """An event that left the document (or whose EventType changed: `why`): over if it had
    started or we approved it, else cancelled by Azure. Hooks still running for it are stopped
    first (ENDING); then its after- or cancelled-hooks run (kept until they end)."""
    on = On.LEFT
    phase = gone.phase
    if phase is Phase.NOT_OURS:
        out.append(_note(Level.DEBUG, What.EVENT_GONE, gone.event))
        return state, _move(gone, on, Phase.GONE)
    if phase in (Phase.AFTER, Phase.ENDING):
        return state, _move(gone, on, phase)
    if phase is Phase.REBOOTED:  # gone after a new boot: that boot was its maintenance
        out.append(_note(Level.INFO, What.REBOOT_DETECTED, gone.event, stage="after"))
        out.append(_note(Level.INFO, What.EVENT_COMPLETED, gone.event, phase=phase.value))
        return stages._start_stage(state, gone, on, Stage.AFTER, out)
    if phase is Phase.COORDINATING or gone.event.event_id in state.peers:
        state, gone = peers._stop_asking(state, gone, out)
    state, gone = onward.left(state, gone, out)  # a gate holding it lets it go
    if not _prepared(gone):
        out.append(_note(Level.INFO, What.EVENT_COMPLETED, gone.event, phase=phase.value))
        return state, _move(gone, on, Phase.GONE)
    over = gone.event.status == STARTED or phase in (Phase.APPROVED, Phase.DONE)
    stage = Stage.AFTER if over else Stage.CANCELLED
    what, level = (
        (What.EVENT_COMPLETED, Level.INFO) if over else (What.EVENT_CANCELLED, Level.WARNING)
    )
    if phase is Phase.RUNNING and gone.run is not None:
        out.append(
            _note(
                Level.WARNING,
                What.EVENT_GONE_WHILE_HOOKS_RUNNING,
                gone.event,
                phase=phase.value,
                reason=f"{why}; its hooks are stopped",
            )
        )
        out.append(_note(level, what, gone.event, phase=phase.value, stage=stage.value))
        state = runs._cancel(state, (gone.run,), out)
        return state, _move(gone, on, Phase.ENDING, stage=stage)
    out.append(_note(level, what, gone.event, phase=phase.value, stage=stage.value))
    return stages._start_stage(state, gone, on, stage, out)


def _prepared(tracked: Tracked) -> bool:
    """Its before-hooks started (or it had none to run): it gets after/cancelled hooks. Also
    when queued again after a restart (QUEUED, then GATED past its slot) before they run again."""
    requeued = tracked.phase in (Phase.QUEUED, Phase.GATED) and tracked.prepared
    return (tracked.phase in PREPARED or requeued) and tracked.rule is Rule.HOOKS


def _judged_later(tracked: Tracked) -> bool:
    """Prepared for an event last seen not yet Started (DONE and ENDING had Started or left):
    after a new boot, the next document says whether that boot was its maintenance."""
    return tracked.phase is not Phase.DONE and tracked.event.status != STARTED


def _judge_reboot(
    state: State, tracked: Tracked, on: On, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """The first document after a new boot, for an event prepared before it: Started means the
    boot was its maintenance (after-hooks, once); still Scheduled means it was not (a crash, an
    operator's reboot), so it is prepared again on this boot and approved as usual; an unknown
    status waits for it to be over (DONE), as `_resume` does."""
    event = tracked.event
    if event.status == STARTED:
        out.append(_note(Level.INFO, What.REBOOT_DETECTED, event, stage="after"))
        return stages._start_stage(state, tracked, on, Stage.AFTER, out)
    if event.status != SCHEDULED:
        return _resume(state, tracked, on, now, out)
    out.append(
        _note(
            Level.WARNING,
            What.REBOOT_DETECTED,
            event,
            stage="before",
            maintenance=False,
            reason="this VM booted, but the event is still Scheduled: that boot was not its "
            "maintenance; it is prepared again",
        )
    )
    tracked = replace(tracked, boot_id=state.boot_id)  # its before-hooks start on this boot
    settings = drain._pacemaker(state)
    if (
        tracked.drain is not Drain.NONE
        and settings is not None
        and settings.drains(event.event_type)
        and event.event_type in state.config.events
    ):
        # Marked before the boot: watched again until drained (the worker finds the mark set).
        out.append(drain._drain_effect(state, tracked))
        deadline = drain._drain_deadline(state, event, now)
        marked = drain.move(tracked, drain.DrainOn.REMARK, Drain.ASKED)
        return state, _move(marked, on, Phase.DRAINING, start_at=deadline)
    return _resume(state, tracked, on, now, out)
