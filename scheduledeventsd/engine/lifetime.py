"""The daemon's own life: boot, restart, stop, the watchdog and faults it survived."""

from __future__ import annotations

import math

from ..records import Level, Record, What
from . import approval, events, postponed, reload, runs, stages
from .frozen import replace
from .gates import drain, hold, onward, slot, through, window
from .lifecycle import Drain, On, Phase, Slot, Stage
from .notes import _note, _persist, _state_warning
from .poll import names
from .state import Events, State, Stopping, Tracked, _move, _with, mark_of
from .vocabulary.constants import KILL_WAIT, POLL_BACKOFF_CAP, STALL_MARGIN, STOP_MARGIN
from .vocabulary.effects import (
    AcquireSlot,
    CheckCluster,
    Effect,
    Exit,
    Notify,
    ResolveName,
    RestoreNode,
)
from .vocabulary.messages import (
    ApprovalFailed,
    ApprovalSent,
    Boot,
    DocumentFetched,
    Faulted,
    GateAnswered,
    HooksFinished,
    NameResolved,
    Persisted,
    PollFailed,
    StopRequested,
    Tick,
)


def _boot(state: State, msg: Boot, now: float, out: list[Effect]) -> State:
    cfg = state.config
    md = cfg.metadata
    out.append(
        Record(
            Level.INFO,
            What.DAEMON_STARTING,
            {
                "config": str(cfg.path) if cfg.path else None,
                "provider": cfg.provider.value,
                "url": md.url,
                # only Azure's endpoint takes an api-version: elsewhere it was a false detail
                **({"api_version": md.api_version} if cfg.provider.can_approve else {}),
                "poll_interval": md.poll_interval,
                "approve": cfg.approve.value,
            },
        )
    )
    if msg.state_problem:
        out.append(_state_warning(msg.state_problem))
    for repair in msg.repaired:  # read all the same, without what no step could use
        out.append(Record(Level.WARNING, What.STATE_REPAIRED, {"error": repair}))
    state = replace(
        state,
        state_problem=msg.state_problem,
        boot_id=msg.boot_id,
        watchdog_at=now,
        listed=frozenset(msg.loaded),  # as last written; the first document says what left
        events=Events(),
        cluster_mark=msg.mark,
    )
    settings = drain._pacemaker(state)
    if msg.mark is None and msg.mark_unrecorded and settings is not None:
        state = replace(state, cluster_mark=mark_of(settings))
    for event_id, loaded in msg.loaded.items():
        tracked = replace(loaded, run=None)
        rebooted = bool(tracked.boot_id and msg.boot_id and tracked.boot_id != msg.boot_id)
        state, tracked = _restarted(state, tracked, On.REBOOTED if rebooted else On.RESTARTED, out)
        state, tracked = reload._rule_removed(state, tracked, "restarted with", out)
        if tracked.phase is Phase.GATED:  # its gate asks again
            state, tracked = onward.restarted(state, tracked, now, out)
        if tracked.slot in (Slot.ASKED, Slot.HELD):  # asked for again; a held one taken back
            if tracked.phase in slot._SLOT_ENDS:
                tracked = slot.move(tracked, slot.SlotOn.OVER_AT_BOOT, Slot.NONE)
            else:
                vm, keep = tracked.vm_name or state.vm_name or "", through.seconds(state, tracked)
                out.append(AcquireSlot(tracked.event, vm, keep))  # keep: in its maintenance
                if tracked.slot is Slot.HELD:
                    state = slot._slot_unconfirmed(state, tracked, now)
        if tracked.phase is Phase.DRAINING:  # marked at most once: the worker finds it set
            out.append(drain._drain_effect(state, tracked))
            tracked = replace(tracked, start_at=drain._drain_deadline(state, tracked.event, now))
        state = _with(state, event_id, tracked)
    if drain._pacemaker(state) is not None:
        out.append(CheckCluster())
    drain._restore_unwanted(state, out)
    if cfg.vm_name:
        return names._name_known(state, NameResolved(cfg.vm_name, "config"), now, out)
    out.append(ResolveName())
    # READY=1 waits for the name, whose first IMDS call may outlast the unit's TimeoutStartSec.
    wait = md.first_call_timeout + md.timeout + STALL_MARGIN
    out.append(Notify({"EXTEND_TIMEOUT_USEC": str(int(wait * 1_000_000))}))
    return replace(state, resolving=True)


def _restarted(state: State, tracked: Tracked, on: On, out: list[Effect]) -> tuple[State, Tracked]:
    """What a restart means for an event the state file kept: its runs died with us."""
    phase = tracked.phase
    if tracked.unmarking:  # put back: its stage still waits for etcd to drop its ready
        return postponed.restarted(state, tracked, on, out)
    if phase is Phase.AFTER and tracked.drain is not Drain.NONE:
        # They never started: they waited for the node's restore, asked again now (a mark
        # kept as drained, by the coupling drain._restore_first); not cut off.
        if tracked.drain is Drain.RESTORING and state.cluster_mark is not None:
            out.append(RestoreNode(tracked.event.event_id, state.cluster_mark))
        return state, _move(tracked, on, Phase.AFTER, start_at=math.inf)
    if phase is Phase.AFTER and tracked.slot is Slot.HELD and state.config.concurrency:
        # Held until they succeed (gates/hold.py): the stage runs again, its slot taken back.
        out.append(_note(Level.WARNING, What.AFTER_HOOKS_INTERRUPTED, tracked.event, again=True))
        return stages._start_stage(state, tracked, on, tracked.stage, out)
    if phase is Phase.AFTER:
        out.append(
            _note(
                Level.WARNING,
                What.AFTER_HOOKS_INTERRUPTED,
                tracked.event,
                stage=tracked.stage.value,
                reason="cut off by a stop; after- and cancelled-hooks run at most once",
            )
        )
        return state, _move(tracked, on, Phase.OVER)
    if on is On.REBOOTED and events._prepared(tracked) and events._judged_later(tracked):
        # A crash or an operator's reboot is not the maintenance: only the next document tells
        # (Started or gone: it was; still Scheduled: prepared again). A gate holding it lets
        # it go (requeued, then gated).
        state, tracked = onward.left(state, tracked, out)
        return state, _move(tracked, on, Phase.REBOOTED, run=None)
    if on is On.REBOOTED and (events._prepared(tracked) or phase is Phase.ENDING):
        # The maintenance happened (it had Started, or left): after-hooks, whether IMDS
        # answers or not.
        out.append(_note(Level.INFO, What.REBOOT_DETECTED, tracked.event, stage="after"))
        return stages._start_stage(state, tracked, on, Stage.AFTER, out)
    if phase is Phase.ENDING:
        return stages._start_stage(state, tracked, on, tracked.stage, out)
    if phase is Phase.RUNNING:
        out.append(
            _note(
                Level.WARNING,
                What.HOOKS_INTERRUPTED,
                tracked.event,
                reason="cut off by a stop; they run again if the event is still Scheduled",
            )
        )
        return state, _move(tracked, on, Phase.INTERRUPTED)
    if phase is Phase.WAITING:
        return state, window._restarted(tracked, on)
    if phase in (Phase.QUEUED, Phase.GATED):  # its deadline placed again (document, gate)
        return state, _move(tracked, on, phase, start_at=math.inf)
    return state, _move(tracked, on, phase)


def _persisted(state: State, msg: Persisted, now: float, out: list[Effect]) -> State:
    if msg.problem == state.state_problem:
        return state
    if msg.problem:
        out.append(_state_warning(msg.problem))
    else:
        out.append(
            Record(Level.INFO, What.STATE_RECOVERED, {"previous_error": state.state_problem})
        )
    return replace(state, state_problem=msg.problem)


def _tick(state: State, msg: Tick, now: float, out: list[Effect]) -> State:
    return state


def _faulted(state: State, msg: Faulted, now: float, out: list[Effect]) -> State:
    """Release what the dropped message held, by the plainest means (its own handler is what
    failed): a poll in flight, a run, an approval in flight, a name lookup."""
    state = replace(state, faults=state.faults + 1)
    dropped = msg.dropped
    if isinstance(dropped, (DocumentFetched, PollFailed)):
        poll = replace(state.poll, in_flight_since=None, next_at=now + POLL_BACKOFF_CAP)
        state = replace(state, poll=poll)
    elif isinstance(dropped, (HooksFinished, GateAnswered)):
        state = runs._without_run(state, dropped.run)
    elif isinstance(dropped, (ApprovalSent, ApprovalFailed)):
        state = replace(state, approvals=state.approvals.answered(dropped.event_id))
    elif isinstance(dropped, NameResolved):
        state = replace(state, resolving=False)
    return state


def _stop_requested(state: State, msg: StopRequested, now: float, out: list[Effect]) -> State:
    if state.stopping is not None:
        return state
    grace = state.config.shutdown_grace
    out.append(
        Notify(
            {
                "STOPPING": "1",
                "STATUS": f"stopping; waiting up to {grace:g}s for {len(state.runs)} hook run(s)",
                # systemd's TimeoutStopSec follows shutdown_grace, whatever the unit says.
                "EXTEND_TIMEOUT_USEC": str(int((grace + KILL_WAIT + STOP_MARGIN) * 1_000_000)),
            }
        )
    )
    out.append(
        Record(
            Level.INFO,
            What.DAEMON_STOPPING,
            {"signal": msg.signal, "hooks_running": len(state.runs), "grace_s": grace},
        )
    )
    return replace(state, stopping=Stopping(grace_until=now + grace))


def _watchdog(state: State, now: float, out: list[Effect]) -> State:
    every = state.watchdog_every
    if every is None or now < state.watchdog_at:
        return state
    poll = state.poll
    md = state.config.metadata
    limit = md.first_call_timeout + md.timeout + STALL_MARGIN
    if poll.in_flight_since is not None and now - poll.in_flight_since > limit:
        if not poll.stalled:
            out.append(
                Record(
                    Level.ERROR,
                    What.POLL_STALLED,
                    {
                        "in_flight_s": round(now - poll.in_flight_since, 1),
                        "reason": "the IMDS request outlived its timeouts; no longer pinging "
                        "the watchdog, so systemd restarts the daemon",
                    },
                )
            )
            state = replace(state, poll=replace(poll, stalled=True))
        return state
    out.append(Notify({"WATCHDOG": "1"}))
    return replace(state, watchdog_at=now + every)


def _shutdown(state: State, now: float, out: list[Effect]) -> State:
    """Wait for running hooks (and approvals already on their way) within the grace period;
    then cancel the hooks: INTERRUPTED, they run again after the restart."""
    stopping = state.stopping
    assert stopping is not None  # noqa: S101 - only called while stopping
    state = approval._retry_approvals(state, now, out)
    # After-hooks waiting for their node's restore are waited for as a run is (started then).
    # After-hooks waiting for their next try (gates/hold.py), or holding a slot for a restore
    # that failed (its retries stop with the daemon), are not: they run after a restart.
    restoring = any(
        runs._awaiting_restore(t) and not hold.waiting(t) and not _retried(state, t)
        for t in state.events.values()
    )
    if not state.runs and not state.approvals.posting and not restoring:
        return _exit(state, out)
    if stopping.kill_until is None and now >= stopping.grace_until:
        if state.runs:
            out.append(
                Record(
                    Level.WARNING,
                    What.HOOKS_CANCELLED,
                    {
                        "events": " ".join(sorted(set(state.runs.values()))),
                        "reason": "shutdown grace expired",
                    },
                )
            )
            state = runs._cancel(state, tuple(sorted(state.runs)), out)
        return replace(state, stopping=replace(stopping, kill_until=now + KILL_WAIT))
    if stopping.kill_until is not None and now >= stopping.kill_until:
        return _exit(state, out)
    return state


def _retried(state: State, t: Tracked) -> bool:
    """Its restore failed while it holds a slot: its hooks wait for a retry (drain gate)."""
    return bool(state.restore_error) and t.drain is Drain.RESTORING and t.slot is not Slot.NONE


def _exit(state: State, out: list[Effect]) -> State:
    state = hold._stopped(state, out)  # held slots stay held while the VM is away
    out.append(_persist(state))
    out.append(Record(Level.INFO, What.DAEMON_STOPPED, {}))
    out.append(Exit(0))
    return state


# ---- the daemon's own timers: the watchdog's ping, the end of the stop's grace or kill wait


def due(state: State, now: float, allowed: float) -> tuple[float, ...]:
    times: tuple[float, ...] = () if state.watchdog_every is None else (state.watchdog_at,)
    stopping = state.stopping
    if stopping is not None:
        end = stopping.kill_until if stopping.kill_until is not None else stopping.grace_until
        times = (*times, end)
    return times
