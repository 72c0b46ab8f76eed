"""Hook runs: the before-stage, and the after- or cancelled-stage once an event is over."""

from __future__ import annotations

from dataclasses import replace

from ..config import EventRule
from ..model import SCHEDULED
from ..records import Cause, Level, Record, What
from . import approval, peers
from .gates import drain, hold, window
from .lifecycle import Drain, On, Phase, Rule, Slot, Stage
from .notes import _note, _why
from .state import Peers, State, Tracked, _move, _with
from .vocabulary.constants import Outcome
from .vocabulary.effects import CancelRuns, Effect, RestoreNode, SpawnHooks, StopDraining
from .vocabulary.messages import HooksFinished

_BEFORE_ENDED = {
    Outcome.SUCCEEDED: On.HOOKS_OK,
    Outcome.FAILED: On.HOOKS_FAILED,
    Outcome.CANCELLED: On.HOOKS_CANCELLED,
}


def _hooks_finished(state: State, msg: HooksFinished, now: float, out: list[Effect]) -> State:
    event_id = state.runs.get(msg.run, "")
    # A run we stopped did not finish, whatever its exit status says.
    outcome = Outcome.CANCELLED if msg.run in state.cancelled else msg.outcome
    state = _without_run(state, msg.run)
    tracked = state.events.get(event_id)
    if (
        tracked is None
        or tracked.run != msg.run
        or tracked.phase not in (Phase.RUNNING, Phase.ENDING, Phase.AFTER)
    ):
        out.append(
            Record(
                Level.INFO,
                What.HOOK_RESULT_IGNORED,
                {
                    "run": msg.run,
                    "event_id": event_id or None,
                    "outcome": outcome.value,
                    "reason": "this run is no longer the event's current one",
                },
            )
        )
        return state
    event = tracked.event
    if tracked.phase is Phase.AFTER:
        if hold.keeps(state, tracked, outcome):
            return _stage_retried_later(state, tracked, outcome, now, out, detail=msg.detail)
        return _stage_finished(state, tracked, outcome, out, msg.detail)
    on = _BEFORE_ENDED[outcome]
    if tracked.phase is Phase.ENDING:
        if state.stopping is not None:  # its stage runs after the restart, not in the grace
            return _with(state, event_id, _move(tracked, on, Phase.ENDING, run=None))
        state, tracked = _start_stage(state, tracked, on, tracked.stage, out)
        return _with(state, event_id, tracked)
    if outcome is Outcome.CANCELLED:
        return _with(state, event_id, _move(tracked, on, Phase.INTERRUPTED, run=None))
    if outcome is Outcome.FAILED:
        out.append(
            _note(
                Level.ERROR,
                What.EVENT_NOT_APPROVED,
                event,
                cause=Cause.HOOKS_FAILED.value,
                reason="a hook failed; the event proceeds at NotBefore without this VM's approval",
                **_why(msg.detail),
            )
        )
        if approval._approval(event, state)[0] is Phase.COORDINATING and peers._etcd(state):
            # The others stop waiting for us, once `failed` is written: `_coordinate` writes
            # it, again after a failure, until the keys come back (a VM that never writes is
            # waited out the same).
            state = replace(state, peers={**state.peers, event_id: Peers()})
        return _with(state, event_id, _move(tracked, on, Phase.HOOKS_FAILED, run=None))
    phase, note = approval._approval_of(tracked, state)
    if note is not None:
        out.append(note)
    return _with(state, event_id, _move(tracked, on, phase, run=None))


def _stage_finished(
    state: State, tracked: Tracked, outcome: Outcome, out: list[Effect], detail: str = ""
) -> State:
    """After- and cancelled-hooks run once: a failure is reported, never retried."""
    event = tracked.event
    stage = tracked.stage.value
    if outcome is Outcome.SUCCEEDED:
        out.append(_note(Level.INFO, What.AFTER_HOOKS_FINISHED, event, stage=stage))
    elif outcome is Outcome.FAILED:
        out.append(
            _note(
                Level.ERROR,
                What.AFTER_HOOKS_FAILED,
                event,
                stage=stage,
                reason="not retried: after- and cancelled-hooks run at most once",
                **_why(detail),
            )
        )
    else:
        out.append(_note(Level.WARNING, What.AFTER_HOOKS_INTERRUPTED, event, stage=stage))
    state, over = _over(state, tracked, On.STAGE_ENDED)
    return _with(state, event.event_id, over)


def _stage_retried_later(
    state: State, tracked: Tracked, outcome: Outcome, now: float, out: list[Effect], *, detail: str
) -> State:
    """After- or cancelled-hooks that failed (or were cut off) holding the event's slot: it
    stays held, the VM not healthy yet, and they run again (hold.py)."""
    retried = hold._retry_later(state, tracked, now)
    out.append(
        _note(
            Level.ERROR if outcome is Outcome.FAILED else Level.WARNING,
            What.AFTER_HOOKS_FAILED if outcome is Outcome.FAILED else What.AFTER_HOOKS_INTERRUPTED,
            tracked.event,
            stage=tracked.stage.value,
            retry_in_s=round(retried.start_at - now, 1),
            reason="its concurrency slot stays held until they succeed (or an operator frees "
            "it): they run again",
            **_why(detail),
        )
    )
    return _with(state, tracked.event.event_id, _move(retried, On.STAGE_ENDED, Phase.AFTER))


def retry_after(state: State, now: float, out: list[Effect]) -> State:
    """The hold's timer: after-hooks waiting for their next try run again while the slot is
    held; one no longer held (lost, freed by an operator) is over without them."""
    if state.stopping is not None:
        return state
    for event_id, t in state.events.items():
        if not hold.waiting(t) or t.start_at > now:
            continue
        rule = state.config.events.get(t.event.event_type)
        hooks = rule.hooks_for(t.stage.value) if rule is not None else ()
        if t.slot is not Slot.HELD or not hooks:
            state, over = _over(state, t, On.LEAD_TIME)
            state = _with(state, event_id, over)
            continue
        rebooted = bool(t.boot_id and state.boot_id and t.boot_id != state.boot_id)
        state, run = _spawn(state, t, t.stage, hooks, out, rebooted=rebooted)
        state = _with(state, event_id, _move(t, On.LEAD_TIME, Phase.AFTER, run=run))
    return state


def _over(state: State, tracked: Tracked, on: On) -> tuple[State, Tracked]:
    """Nothing is left to do for it: kept while listed, else forgotten. A cancelled event that
    came back Scheduled is forgotten too, and judged anew at the next poll: never left
    unprepared because it once left the document."""
    event = tracked.event
    listed = event.event_id in state.listed
    back = listed and tracked.stage is Stage.CANCELLED and event.status == SCHEDULED
    if back:
        state = replace(state, incarnation=None)
    return state, _move(tracked, on, Phase.OVER if listed and not back else Phase.GONE, run=None)


def _start_stage(
    state: State, tracked: Tracked, on: On, stage: Stage, out: list[Effect]
) -> tuple[State, Tracked]:
    """Run the event's after- or cancelled-hooks, once; with none configured it is over."""
    rule = state.config.events.get(tracked.event.event_type)
    hooks = rule.hooks_for(stage.value) if rule is not None else ()
    # Only this daemon's own mark is taken off (none: the node was marked by someone else).
    restore = state.cluster_mark if tracked.drain is not Drain.NONE else None
    if tracked.drain is not Drain.NONE and (
        restore is None or drain._drained_for_another(state, tracked.event.event_id)
    ):
        restore = None  # the node stays marked for the other event; restored at its end
        if tracked.drain is Drain.ASKED:  # a mark set after this comes back: _cluster_marked
            out.append(StopDraining(tracked.event.event_id))
        tracked = drain.move(tracked, drain.DrainOn.UNMARKED, Drain.NONE)
    if not hooks:
        if restore is not None:
            out.append(RestoreNode(tracked.event.event_id, restore))
        return _over(state, replace(tracked, stage=stage), on)
    if restore is not None:  # the node first (drain._restore_first): its hooks wait for the answer
        return state, _move(tracked, on, Phase.AFTER, run=None, stage=stage)
    return _run_stage(state, _move(tracked, on, Phase.AFTER, stage=stage), out)


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
    """Its after- or cancelled-hooks wait for its node's restore to be answered."""
    return tracked.phase is Phase.AFTER and tracked.run is None


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
    left = window._seconds_left(event, state, now)
    quick = window.fast_hooks(rule, left)
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
