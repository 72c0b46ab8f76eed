"""The after- and cancelled-stages once an event is over (the node restored before them), and what
a finished hook run leads to. Starting runs, the before-stage and the end: runs."""

from __future__ import annotations

from ..records import Cause, Level, Record, What
from . import approval, peers, runs
from .frozen import replace
from .gates import drain, hold
from .lifecycle import Drain, On, Phase, Stage
from .notes import _note, _why
from .state import Peers, State, Tracked, _move, _with
from .vocabulary.constants import Outcome
from .vocabulary.effects import Effect, StopDraining
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
    state = runs._without_run(state, msg.run)
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
    state, over = runs._over(state, tracked, On.STAGE_ENDED)
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


def _start_stage(
    state: State, tracked: Tracked, on: On, stage: Stage, out: list[Effect]
) -> tuple[State, Tracked]:
    """Run the event's after- or cancelled-hooks, once; with none it is over (its node restored)."""
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
    if restore is not None:  # the node first (drain._restore_first): its hooks wait for the answer
        # With none, it waits too: over (its slot given back) only once the node is back.
        return state, _move(tracked, on, Phase.AFTER, run=None, stage=stage)
    if not hooks:
        return runs._over(state, replace(tracked, stage=stage), on)
    return runs._run_stage(state, _move(tracked, on, Phase.AFTER, stage=stage), out)
