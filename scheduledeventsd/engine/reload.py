"""A reload (SIGHUP): the new configuration in force, every timer placed again."""

from __future__ import annotations

from ..records import Level, Record, What
from . import peers, postponed
from .frozen import replace
from .gates import drain, onward, slot, window
from .lifecycle import On, Phase
from .notes import _unhandled
from .poll import names, timing
from .state import State, Tracked, _move, _with
from .vocabulary.effects import Effect, Notify, ResolveName, UseConfig
from .vocabulary.messages import NameResolved, Reloaded, ReloadFailed, ReloadRequested


def _reload_requested(state: State, msg: ReloadRequested, now: float, out: list[Effect]) -> State:
    if state.stopping is not None:
        out.append(Record(Level.INFO, What.RELOAD_IGNORED, {"reason": "the daemon is stopping"}))
        return state
    out.append(Notify({"RELOADING": "1", "MONOTONIC_USEC": str(int(now * 1_000_000))}))
    return state


def _reloaded(state: State, msg: Reloaded, now: float, out: list[Effect]) -> State:
    if state.stopping is not None:  # systemd was told STOPPING=1: never READY=1 again
        return state
    old, new = state.config, msg.config
    if new.state_dir != old.state_dir:
        return _reload_failed(
            state,
            ReloadFailed(
                (
                    f"{new.path}: state_dir: cannot change on reload (the running daemon holds "
                    f"the lock on {old.state_dir}); restart the service to move it",
                )
            ),
            now,
            out,
        )
    out.append(UseConfig(new))
    if (new.coordination, new.cluster) != (old.coordination, old.cluster):
        # Shared events still waiting ask again, through the new etcd, gate or cluster.
        for event_id, t in state.events.items():
            if t.phase is Phase.COORDINATING:
                state, t = peers._stop_asking(state, t, out)  # noqa: PLW2901
                state = _with(state, event_id, t)
    state = replace(state, config=new)
    state = postponed.reloaded(state, new.coordination != old.coordination, out)
    state = drain._cluster_reloaded(state, old, out)
    state = slot._slots_reloaded(state, old, now, out)
    for event_id, t in state.events.items():
        state, removed = _rule_removed(state, t, "the reload left", out)
        if removed is not t:
            state = _with(state, event_id, removed)
    state = window._replace_waiting(state, now, out)  # windows, lead times may have changed
    if new.metadata != old.metadata:
        # A fixed url/api_version is tried at once, not after the rejected request's backoff
        # nor the old interval: an order whose instant has not come is replaced.
        state = timing._poll_now(state, now, out)
    if new.vm_name != old.vm_name or (new.metadata != old.metadata and not new.vm_name):
        if new.vm_name:
            state = names._name_known(state, NameResolved(new.vm_name, "config"), now, out)
        elif not state.resolving:
            out.append(ResolveName())
            state = replace(state, resolving=True)
    out.append(
        Record(
            Level.INFO,
            What.CONFIG_RELOADED,
            {"config": str(new.path) if new.path else None, "approve": new.approve.value},
        )
    )
    out.append(Notify({"READY": "1"}))
    return state


def _rule_removed(
    state: State, tracked: Tracked, by: str, out: list[Effect]
) -> tuple[State, Tracked]:
    """A waiting, queued, draining or gated event whose type has no rule any more (`by` a
    reload, or a restart with a new configuration) is left alone: never an empty run or an
    early approval by accident, never a timer its gate skips but keeps due (a daemon woken at
    once, for ever); a drain's mark is given up (drain._release_left_alone), any other gate
    holding it lets it go (onward.left)."""
    event = tracked.event
    if tracked.phase not in _HELD or event.event_type in state.config.events:
        return state, tracked
    reason = f"{by} no hooks configured for {event.event_type}; left alone"
    out.append(_unhandled(event, reason))
    state, tracked = onward.left(state, tracked, out)
    return state, _move(window._dropped(tracked), On.TYPE_REMOVED, Phase.UNHANDLED)


_HELD = (Phase.WAITING, Phase.QUEUED, Phase.DRAINING, Phase.GATED)


def _reload_failed(state: State, msg: ReloadFailed, now: float, out: list[Effect]) -> State:
    if state.stopping is not None:
        return state
    for problem in msg.problems:
        out.append(Record(Level.ERROR, What.CONFIG_INVALID, {"error": problem}))
    out.append(
        Record(
            Level.ERROR,
            What.CONFIG_RELOAD_FAILED,
            {"reason": "keeping the previous configuration"},
        )
    )
    out.append(Notify({"READY": "1"}))
    return state
