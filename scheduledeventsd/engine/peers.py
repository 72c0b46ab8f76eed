"""Shared events: every VM an event names is ready (etcd), or the gate command says so."""

from __future__ import annotations

from typing import Optional

from ..records import Cause, Level, Record, What
from ..retry import Failures
from . import runs
from .frozen import replace
from .lifecycle import On, Phase
from .notes import _note, event_fields
from .state import Peers, State, Tracked, _move, _with
from .vocabulary.constants import CLUSTER_ASK, COORDINATION_BACKOFF, GATE_LATER
from .vocabulary.effects import (
    AskCluster,
    AskGate,
    Coordinate,
    Effect,
    ForgetShared,
    StopCoordinating,
)
from .vocabulary.messages import CoordinationFailed, GateAnswered, PeersChanged


def _peers_changed(state: State, msg: PeersChanged, now: float, out: list[Effect]) -> State:
    """Approve a shared event once every VM it names wrote ready; one failed: nobody does."""
    state = _coordination_works(state, out)  # even if the event was decided meanwhile
    tracked = state.events.get(msg.event_id)
    if tracked is not None and tracked.phase is Phase.HOOKS_FAILED:
        return _without_peers(state, msg.event_id)  # our `failed` is written: announced
    if tracked is None or tracked.phase is not Phase.COORDINATING:
        return state
    event = tracked.event
    names = sorted({r.casefold() for r in event.resources})
    states = {k.casefold(): v for k, v in msg.states.items()}
    failed = [n for n in names if states.get(n) == "failed"]
    ready = tuple(n for n in names if states.get(n) == "ready")
    if failed:
        out.append(
            _note(
                Level.WARNING,
                What.EVENT_NOT_APPROVED,
                event,
                cause=Cause.PEER_FAILED.value,
                failed=" ".join(failed),
                reason="another VM's hooks failed; nobody approves, it proceeds at NotBefore",
            )
        )
        state, tracked = _stop_asking(state, tracked, out)
        return _with(state, msg.event_id, _move(tracked, On.PEER_FAILED, Phase.NOT_APPROVED))
    if len(ready) == len(names):
        out.append(_note(Level.INFO, What.PEERS_READY, event, ready=" ".join(ready)))
        state, tracked = _stop_asking(state, tracked, out)
        return _with(state, msg.event_id, _move(tracked, On.PEERS_READY, Phase.APPROVING))
    peers = state.peers.get(msg.event_id, Peers(asking=True))
    if ready != peers.ready:
        out.append(
            _note(
                Level.INFO,
                What.PEERS_WAITING,
                event,
                ready=" ".join(ready),
                waiting_for=" ".join(n for n in names if n not in ready),
            )
        )
    return replace(state, peers={**state.peers, msg.event_id: replace(peers, ready=ready)})


def _coordination_failed(
    state: State, msg: CoordinationFailed, now: float, out: list[Effect]
) -> State:
    """Never a reason to approve: the event waits, asked again with backoff, or proceeds at
    NotBefore."""
    failures, log = state.coordination.failed(msg.kind, now, COORDINATION_BACKOFF)
    state = replace(state, coordination=failures)
    tracked = state.events.get(msg.event_id)
    if log:
        fields: dict[str, object] = (
            event_fields(tracked.event) if tracked is not None else {"event_id": msg.event_id}
        )
        out.append(
            Record(
                Level.WARNING,
                What.COORDINATION_FAILED,
                {
                    **fields,
                    "kind": msg.kind,
                    "error": msg.detail,
                    "failures": failures.count,
                    "retry_in_s": round(failures.retry_at - now, 2),
                    "reason": "not approved while the other VMs cannot be asked",
                },
            )
        )
    announcing = tracked is not None and tracked.phase is Phase.HOOKS_FAILED
    if tracked is None or not (tracked.phase is Phase.COORDINATING or announcing):
        return state
    if announcing and msg.event_id not in state.peers:
        return state
    peers = state.peers.get(msg.event_id, Peers())
    peers = replace(peers, asking=False, next_at=failures.retry_at)
    if tracked.run is not None:
        state = runs._without_run(state, tracked.run)
        state = _with(state, msg.event_id, replace(tracked, run=None))
    return replace(state, peers={**state.peers, msg.event_id: peers})


def _gate_answered(state: State, msg: GateAnswered, now: float, out: list[Effect]) -> State:
    """0: approve now; 75 (EX_TEMPFAIL): ask again after `interval`; anything else: never."""
    event_id = state.runs.get(msg.run, "")
    tracked = state.events.get(event_id)
    if msg.run in state.cancelled:
        return replace(state, cancelled=state.cancelled - {msg.run})
    if tracked is None or tracked.run != msg.run or tracked.phase is not Phase.COORDINATING:
        return state
    if msg.cancelled:
        return state
    if msg.exit_status is None:
        reason = "timed out" if msg.timed_out else msg.detail or "did not run"
        return _coordination_failed(
            state,
            CoordinationFailed(event_id, "gate_timeout" if msg.timed_out else "gate", reason),
            now,
            out,
        )
    state = _coordination_works(state, out)
    state = runs._without_run(state, msg.run)
    tracked = replace(tracked, run=None)
    event = tracked.event
    if msg.exit_status == 0:
        out.append(_note(Level.INFO, What.GATE_APPROVED, event))
        state = _without_peers(state, event_id)
        return _with(state, event_id, _move(tracked, On.GATE_YES, Phase.APPROVING))
    if msg.exit_status == GATE_LATER:
        gate = state.config.coordination.gate if state.config.coordination else None
        interval = gate.interval if gate is not None else CLUSTER_ASK
        peers = state.peers.get(event_id, Peers())
        level = Level.DEBUG if peers.not_yet else Level.INFO
        out.append(_note(level, What.GATE_NOT_YET, event, ask_again_in_s=interval))
        peers = Peers(asking=False, next_at=now + interval, not_yet=peers.not_yet + 1)
        state = replace(state, peers={**state.peers, event_id: peers})
        return _with(state, event_id, tracked)
    out.append(
        _note(
            Level.WARNING,
            What.EVENT_NOT_APPROVED,
            event,
            cause=Cause.GATE_REFUSED.value,
            exit_status=msg.exit_status,
            reason="the gate command said never; it proceeds at NotBefore",
        )
    )
    state = _without_peers(state, event_id)
    return _with(state, event_id, _move(tracked, On.GATE_NEVER, Phase.NOT_APPROVED))


def _coordination_works(state: State, out: list[Effect]) -> State:
    failures = state.coordination
    if failures.count:
        out.append(
            Record(
                Level.INFO,
                What.COORDINATION_RECOVERED,
                {"failures": failures.count, "kind": failures.kind},
            )
        )
        state = replace(state, coordination=Failures())
    return state


def _stop_asking(state: State, tracked: Tracked, out: list[Effect]) -> tuple[State, Tracked]:
    """A COORDINATING event that is decided, started or gone: end its watch or gate run."""
    event_id = tracked.event.event_id
    if tracked.run is not None:
        state = runs._cancel(runs._without_run(state, tracked.run), (tracked.run,), out)
    elif event_id in state.peers and _etcd(state):
        out.append(StopCoordinating((event_id,)))
    state = _without_peers(state, event_id)
    return state, replace(tracked, run=None)


def _without_peers(state: State, event_id: str) -> State:
    """The event no longer waits for the other VMs (decided, started or gone)."""
    return replace(state, peers={k: p for k, p in state.peers.items() if k != event_id})


def _etcd(state: State) -> bool:
    return state.config.coordination is not None and state.config.coordination.etcd is not None


def _coordinate(state: State, now: float, out: list[Effect]) -> State:
    """Shared events waiting for the other VMs: start (or restart) the watch or the gate."""
    via = state.config.ready_via
    if via is None:
        return state
    for event_id, t in state.events.items():
        announce = t.phase is Phase.HOOKS_FAILED and event_id in state.peers
        if t.phase is not Phase.COORDINATING and not announce:
            continue
        peers = state.peers.get(event_id, Peers())
        if peers.asking or now < peers.next_at:
            continue
        vm_name = t.vm_name or state.vm_name
        if via == "etcd":
            out.append(Coordinate(t.event, vm_name, not announce, t.incarnation))
        else:  # the gate command, or the cluster alone: its drains say
            state, run = runs._new_run(state, event_id)
            ask = AskCluster if via == "pacemaker" else AskGate
            out.append(ask(run, t.event, t.incarnation, vm_name))
            state = _with(state, event_id, replace(t, run=run))
        state = replace(state, peers={**state.peers, event_id: replace(peers, asking=True)})
    return state


# ---- the peers' timer: when a shared event's watch or gate is (re)started

DUE_PHASES = frozenset({Phase.COORDINATING, Phase.HOOKS_FAILED})


def due_for(state: State, event_id: str, t: Tracked, now: float, allowed: float) -> Optional[float]:
    """Now for a shared event not asked yet; after a failure or a "not yet", its next ask. A
    HOOKS_FAILED one only while its `failed` is being announced."""
    if state.stopping is not None:
        return None
    asked = state.peers.get(event_id)
    if asked is None:
        return now if t.phase is Phase.COORDINATING else None
    return None if asked.asking else asked.next_at


def fire(state: State, now: float, out: list[Effect]) -> State:
    return _coordinate(_forget_marks(state, out), now, out)


def _forget_marks(state: State, out: list[Effect]) -> State:
    """A coupling (compose), and first in the peers' timer, so it comes before a Coordinate of
    an event judged anew under the same EventId: a shared event forgotten (its stage has run,
    it left) has its mark deleted, once. Not sooner: until then another VM may still read it
    to decide (and the event, over, needs no approval any more once forgotten)."""
    if not state.unmarked:
        return state
    for gone in state.unmarked:
        out.append(ForgetShared(gone.event.event_id, gone.vm_name or state.vm_name))
    return replace(state, unmarked=())
