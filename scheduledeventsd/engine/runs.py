"""Hook runs: the one allocation of run ids (hooks and gate runs alike), starting and stopping
them; the before-stage's hooks (`fast` instead of `before` when little time is left), which the
gates start once an event may go on; an after- or cancelled-stage's hooks, once its node is
restored (gates/drain), and the event's end. What starts the after-stage: stages."""

from __future__ import annotations

from typing import Optional

from ..config import EventRule
from ..model import Event
from ..records import Level, What
from . import approval, returned
from .frozen import replace
from .lifecycle import Drain, On, Phase, Rule, Stage
from .notes import _note
from .state import State, Tracked, _move
from .vocabulary.effects import CancelRuns, Effect, SpawnHooks


def _spawn(
    state: State,
    tracked: Tracked,
    stage: Stage,
    hooks: tuple[str, ...],
    out: list[Effect],
    *,
    rebooted: bool = False,
) -> tuple[State, int]:
    """Start a hook run for an event, with the name and incarnation it was seen under."""
    state, run = _new_run(state, tracked.event.event_id)
    vm_name = tracked.vm_name or state.vm_name  # a state file of version 1 did not keep it
    incarnation = tracked.incarnation or state.incarnation or 0
    out.append(SpawnHooks(run, tracked.event, hooks, incarnation, vm_name, stage, rebooted))
    return state, run


def _new_run(state: State, event_id: str) -> tuple[State, int]:
    """The one allocation of run ids (hooks and gate runs alike)."""
    run = state.next_run
    return replace(state, runs={**state.runs, run: event_id}, next_run=run + 1), run


def _cancel(state: State, runs: tuple[int, ...], out: list[Effect]) -> State:
    """Stop runs; their results will say CANCELLED whatever their exit status."""
    out.append(CancelRuns(runs))
    return replace(state, cancelled=state.cancelled | frozenset(runs))


def _without_run(state: State, run: int) -> State:
    return replace(
        state,
        runs={r: e for r, e in state.runs.items() if r != run},
        cancelled=state.cancelled - {run} if run in state.cancelled else state.cancelled,
    )


def _before_hooks(
    state: State, tracked: Tracked, on: On, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """The before-stage's hooks: `fast` instead of `before` when fewer than `fast_below`
    seconds are left; with none to run, approval per policy at once."""
    event = tracked.event
    rule = state.config.events.get(event.event_type, EventRule())
    hooks = rule.before
    left = _seconds_left(event, state, now)
    quick = fast_hooks(rule, left)
    if quick is not None:
        hooks = quick
        seconds = max(0.0, left or 0.0)
        out.append(
            _note(
                Level.INFO,
                What.EVENT_RULE,
                event,
                rule=Rule.FAST.value,
                hooks=list(hooks),
                seconds_left=int(seconds),
                reason=f"{seconds:.0f} s to NotBefore < fast_below {rule.fast_below:g}: the "
                "fast hooks run instead of before",
            )
        )
    if not hooks:
        return state, approval._decide(state, replace(tracked, start_at=0.0), on, out)
    state, run = _spawn(state, tracked, Stage.BEFORE, hooks, out)
    return state, _move(tracked, on, Phase.RUNNING, run=run, start_at=0.0)


def fast_hooks(rule: EventRule, seconds_left: Optional[float]) -> Optional[tuple[str, ...]]:
    """The `fast` hooks when they run instead of `before`, with this much time to NotBefore."""
    if rule.fast is None or seconds_left is None or seconds_left >= rule.fast_below:
        return None
    return rule.fast


def _seconds_left(event: Event, state: State, now: float) -> Optional[float]:
    if event.not_before is None or state.wall_offset is None:
        return None
    return event.not_before.timestamp() - (now + state.wall_offset)


def _run_stage(state: State, tracked: Tracked, out: list[Effect]) -> tuple[State, Tracked]:
    """Spawn the hooks of the stage an AFTER event is in, once (at once, or when the restore
    of its node has been answered)."""
    rule = state.config.events.get(tracked.event.event_type)
    stage = tracked.stage
    hooks = rule.hooks_for(stage.value) if rule is not None else ()
    if not hooks:  # a reload took them away while the node was restored
        return _over(state, tracked, On.STAGE_ENDED)
    rebooted = bool(tracked.boot_id and state.boot_id and tracked.boot_id != state.boot_id)
    state, run = _spawn(state, tracked, stage, hooks, out, rebooted=rebooted)
    return state, replace(tracked, run=run)


def _awaiting_restore(tracked: Tracked) -> bool:
    """Its after- or cancelled-hooks wait for its node's restore to be answered (not for their
    next try, gates/hold: the node restored, or never marked for it)."""
    if tracked.unmarking:  # the restore waits too (postponed: until etcd drops its ready)
        return False
    return tracked.phase is Phase.AFTER and tracked.run is None and tracked.drain is not Drain.NONE


def _keeps_mark(tracked: Tracked) -> bool:
    """Its node's mark is still wanted: its stage not reached, or put back while etcd has not
    confirmed its ready deleted (postponed: it stays prepared until then)."""
    return tracked.phase not in (Phase.AFTER, Phase.OVER) or tracked.unmarking


def _over(state: State, tracked: Tracked, on: On) -> tuple[State, Tracked]:
    """Nothing is left to do for it: kept while listed, else forgotten. One that came back
    (returned.came_back) is forgotten too, and judged anew at the next poll: never left
    unprepared because it once left the document."""
    listed = tracked.event.event_id in state.listed
    back = returned.came_back(state, tracked)
    if back:
        state = replace(state, incarnation=None)
    return state, _move(tracked, on, Phase.OVER if listed and not back else Phase.GONE, run=None)
