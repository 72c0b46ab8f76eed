"""A prepared event whose NotBefore moved later by more than its lead (Google Cloud moves its
upcoming window by days): the node is not kept drained for the whole delay. Its cancelled-hooks
run (the node restored first), then it is judged anew, as first seen, and waits for its new lead
as an event that far away waits. A shared one waiting for its peers stops waiting and takes its
`ready` back first, and its node is undone only once etcd confirmed that `ready` deleted: it
coordinates again, for the same EventId, once prepared again."""

from __future__ import annotations

import math
from typing import Optional

from ..config import EventRule
from ..model import SCHEDULED, Event
from ..records import Level, What
from . import peers, stages
from .frozen import replace
from .gates import window
from .gates.lead import lead
from .lifecycle import On, Phase, Rule, Stage
from .notes import _iso_wall, _note
from .state import State, Tracked, _marked, _move, _with
from .vocabulary.effects import Effect
from .vocabulary.messages import HooksFinished, PeersChanged, SharedForgotten

# Prepared and left to proceed at NotBefore (no hook runs for it, no approval is posted), or
# waiting for its peers: put_back stops that (its watch or gate, a failure it still tells them)
# and takes its `ready` back, so no VM is approved on it while this node is not prepared.
POSTPONABLE = frozenset({Phase.NOT_APPROVED, Phase.HOOKS_FAILED, Phase.COORDINATING})


def moved_later(state: State, before: Tracked, event: Event, now: float) -> Optional[float]:
    """The seconds NotBefore moved later by, when that undoes a preparation: a prepared event
    (POSTPONABLE, still Scheduled) whose NotBefore moved later by more than its lead, and whose
    before-hooks a lead or a window would now hold back (an event first seen now would wait).
    Later than the NotBefore it was prepared for: a move seen while its before-hooks ran (or it
    waited for its cluster) counts once they are done, as do small moves adding up."""
    rule = state.config.events.get(event.event_type)
    was, new = before.prepared_for or before.event.not_before, event.not_before
    if (
        before.phase not in POSTPONABLE
        or before.rule is not Rule.HOOKS
        or event.status != SCHEDULED
        or rule is None
        or was is None
        or new is None
    ):
        return None
    moved = new.timestamp() - was.timestamp()
    if moved <= lead(rule) or window._start_at(event, rule, state, now) is None:
        return None
    return moved


def listed(  # noqa: PLR0917 - one call site, events._listed
    state: State, before: Tracked, tracked: Tracked, on: On, now: float, out: list[Effect]
) -> Optional[tuple[State, Tracked]]:
    """Listed again: moved later than its lead, it is put back (prepared again at its new
    lead); put back and still prepared (its undo waits for etcd) as it Starts, it is in its
    maintenance: not undone under it, its after-hooks once it is over. None: neither."""
    if on is On.STARTED and tracked.phase is Phase.AFTER and tracked.unmarking:
        return state, _move(tracked, on, Phase.DONE, unmarking=False, stage=Stage.BEFORE)
    moved = moved_later(state, before, tracked.event, now)
    return None if moved is None else put_back(state, tracked, moved, now, out)


def put_back(
    state: State, tracked: Tracked, moved: float, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """Undo its preparation: event_cancelled (its hooks_start_at, the new wait), then its
    cancelled-hooks after the node's restore; their end forgets it and the next poll judges it
    anew (returned.came_back: listed, cancelled, Scheduled). A shared one waiting for its peers
    stops (peers._stop_asking: its watch ends, its `ready` withdrawn) and its mark is deleted
    now (ForgetShared, retried until etcd answers), not once its cancelled-hooks end: a VM that
    sees the move later would count that `ready`. Its undo (restore, cancelled-hooks) waits
    for etcd to confirm that delete (SharedForgotten: `unmarking`): a VM cut off from etcd
    stays prepared while its `ready` may complete the others' set."""
    event = tracked.event
    rule = state.config.events.get(event.event_type, EventRule())
    held = window._start_at(event, rule, state, now)
    waiting = tracked.phase is Phase.COORDINATING
    # Its ready written, or being written (or by the process before a restart): the peers'
    # timer asks after every step, a Boot's too; one that became coordinating in this step
    # (its before-hooks just ended) never wrote it, and is undone at once.
    asked = event.event_id in state.peers
    unmarking = waiting and asked and _marked(state, tracked)  # as returned.mark_taken_back
    fields: dict[str, object] = {"phase": tracked.phase.value, "stage": Stage.CANCELLED.value}
    if held is not None:
        fields["hooks_start_at"] = _iso_wall(held.at + (state.wall_offset or 0.0))
    if unmarking:
        fields["waits_for"] = "etcd"
    out.append(
        _note(
            Level.WARNING,
            What.EVENT_CANCELLED,
            event,
            **fields,
            moved_s=round(moved),
            reason=f"its NotBefore moved {moved:.0f} s later, more than its lead "
            f"({lead(rule):.0f} s): its node is not kept prepared meanwhile; its cancelled-hooks "
            + (_WAITS if unmarking else "run, ")
            + "then it waits for its new lead and is prepared again",
        )
    )
    if waiting or event.event_id in state.peers:  # HOOKS_FAILED told its peers so: over too
        state, tracked = peers._stop_asking(state, tracked, out)
    if unmarking:
        state = replace(state, unmarked=(*state.unmarked, tracked))
        stage = {"run": None, "stage": Stage.CANCELLED, "start_at": math.inf}
        return state, _move(tracked, On.LISTED, Phase.AFTER, **stage, unmarking=True)
    return stages._start_stage(state, tracked, On.LISTED, Stage.CANCELLED, out)


_WAITS = "run once etcd confirmed this VM's ready deleted (until then another VM may count it), "


def _shared_forgotten(state: State, msg: SharedForgotten, now: float, out: list[Effect]) -> State:
    """etcd confirmed this VM's mark deleted: a put-back event waiting for that is undone now."""
    tracked = state.events.get(msg.event_id)
    if tracked is None or not tracked.unmarking or state.stopping is not None:
        return state  # another round's mark, or nothing waits; stopping: after the restart
    return undo(state, tracked, "etcd confirmed this VM's ready deleted", out)


def undo(
    state: State, tracked: Tracked, why: str, out: list[Effect], level: Level = Level.INFO
) -> State:
    """The cancelled stage of a put-back event that waited for its mark's delete, now."""
    out.append(
        _note(
            level,
            What.EVENT_UNMARKED,
            tracked.event,
            stage=Stage.CANCELLED.value,
            reason=f"{why}: its cancelled-hooks run now (the node restored first)",
        )
    )
    cancelled = replace(tracked, unmarking=False)
    state, tracked = stages._start_stage(state, cancelled, On.UNMARKED, Stage.CANCELLED, out)
    return _with(state, tracked.event.event_id, tracked)


def restarted(state: State, tracked: Tracked, on: On, out: list[Effect]) -> tuple[State, Tracked]:
    """A restart while it waits for its mark's delete: asked again (ForgetShared; the old
    process's thread died with it), and it still waits; restarted without etcd, nothing can
    confirm it, and the wait ends as at a reload that removes etcd (`reloaded`)."""
    tracked = _move(tracked, on, Phase.AFTER, start_at=math.inf)
    if state.config.ready_via != "etcd":
        state = undo(state, tracked, _NO_ETCD.format(by="a restart"), out, Level.WARNING)
        return state, state.events[tracked.event.event_id]
    return replace(state, unmarked=(*state.unmarked, tracked)), tracked


_NO_ETCD = "{by} removed etcd coordination: nothing can confirm this VM's ready deleted (it goes "
_NO_ETCD += "with its lease, within ttl)"


def reloaded(state: State, changed: bool, out: list[Effect]) -> State:
    """A reload: the delete asked again through a new etcd (`changed`: the old one's attempts
    end with it); with etcd no longer configured nothing can confirm it, and the wait ends (the
    mark goes with the old lease, within its ttl): the node is not kept prepared for days."""
    for t in state.events.values():
        if not t.unmarking:
            continue
        if state.config.ready_via != "etcd":
            state = undo(state, t, _NO_ETCD.format(by="a reload"), out, Level.WARNING)
        elif changed:
            state = replace(state, unmarked=(*state.unmarked, t))
    return state


def _hooks_finished(state: State, msg: HooksFinished, now: float, out: list[Effect]) -> State:
    """Its before-hooks ended: a move seen while they ran (its document, unchanged since, is not
    judged again) puts it back now."""
    event_id = state.runs.get(msg.run, "")
    return _recheck(stages._hooks_finished(state, msg, now, out), event_id, now, out)


def _peers_changed(state: State, msg: PeersChanged, now: float, out: list[Effect]) -> State:
    """Not approved (a peer failed) after a move seen while it waited for its peers: the same."""
    return _recheck(peers._peers_changed(state, msg, now, out), msg.event_id, now, out)


def _recheck(state: State, event_id: str, now: float, out: list[Effect]) -> State:
    tracked = state.events.get(event_id)
    moved = None if tracked is None else moved_later(state, tracked, tracked.event, now)
    if tracked is None or moved is None:
        return state
    state, tracked = put_back(state, tracked, moved, now, out)
    return _with(state, event_id, tracked)
