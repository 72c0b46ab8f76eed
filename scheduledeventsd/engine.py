"""Every decision and every timer of the daemon, as one pure state machine.

`step(state, message, now) -> (state, effects)`, the sans-I/O shape of h11: the daemon feeds in
what happened (a document fetched, a poll failed, hooks of run R finished, a timer is due, a
signal) with the monotonic time, and carries out the effects it gets back (fetch, spawn hooks,
post an approval, persist, log, notify systemd, wake at T). Nothing here does I/O or reads a
clock, so every rule, backoff and retry is tested with a fake clock in milliseconds.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Union

from .config import ApprovePolicy, Config, EventRule, UserEvents
from .model import SCHEDULED, STARTED, Document, Event, iso_utc
from .retry import Backoff, Failures

POLL_BACKOFF_CAP = 2.0  # a Preempt may give well under 30 s: never be blind for longer
APPROVAL_BACKOFF = Backoff(0.5, 8.0)
# At boot IMDS is often unreachable for a few seconds: ask for the name again soon, then rarely.
NAME_BACKOFF = Backoff(2.0, 60.0)
# etcd without quorum or a gate timing out: ask again soon, never more than every 10 s, so a
# cluster back before NotBefore is used at once.
COORDINATION_BACKOFF = Backoff(0.5, 10.0)
GATE_LATER = 75  # EX_TEMPFAIL: "not yet"
KILL_WAIT = 7.0  # after cancelling hooks at shutdown: the runner's SIGKILL comes 5 s after SIGTERM
# A fetch in flight this much longer than its own timeouts means its worker is wedged: the
# watchdog is no longer pinged, so systemd restarts the daemon.
STALL_MARGIN = 30.0


class Phase(str, enum.Enum):
    """Where an event stands for this VM; persisted, so values are stable strings."""

    NOT_OURS = "not_ours"  # Resources does not name this VM
    UNHANDLED = "unhandled"  # no `events` entry for its type
    MISSED = "missed"  # first seen already Started: no chance to prepare
    WAITING = "waiting"  # ours, but NotBefore is further away than its type's start_before
    RUNNING = "running"  # hooks are running
    COORDINATING = "coordinating"  # hooks succeeded; a shared event waits for the others' ready
    APPROVING = "approving"  # hooks succeeded, StartRequests not yet accepted
    APPROVED = "approved"
    NOT_APPROVED = "not_approved"  # hooks succeeded, policy says it proceeds at NotBefore
    HOOKS_FAILED = "hooks_failed"
    DONE = "done"  # ours, handled, and already Started: nothing left to do
    AFTER = "after"  # it is over or cancelled: its after/cancelled hooks run (at most once)
    OVER = "over"  # after/cancelled hooks done (or none): nothing is left to do for it


# Phases in which an event's before-hooks have started: it gets after- or cancelled-hooks.
PREPARED = frozenset(
    {
        Phase.RUNNING,
        Phase.COORDINATING,
        Phase.APPROVING,
        Phase.APPROVED,
        Phase.NOT_APPROVED,
        Phase.HOOKS_FAILED,
        Phase.DONE,
    }
)


class Level(str, enum.Enum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class Outcome(str, enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a command failed, timed out, or could not start
    CANCELLED = "cancelled"  # we stopped it (shutdown, or its event left): it did not finish


@dataclass(frozen=True)
class Tracked:
    event: Event
    phase: Phase
    run: Optional[int] = None  # the current hook run (RUNNING, AFTER); not persisted
    boot_id: str = ""  # the boot on which its before-hooks started
    pending: str = ""  # a stage (after, cancelled) waiting for its before-run to stop
    stage: str = ""  # the stage of the run in AFTER: after | cancelled
    rule: str = ""  # short | user: decided without before-hooks, so no after-hooks either
    start_at: float = 0.0  # WAITING: when its before-hooks start (monotonic); not persisted
    in_document: bool = True  # False once it left the document (kept for its after-run)


Known = Mapping[str, Tracked]

# ---- messages: what happened ---------------------------------------------------------------


@dataclass(frozen=True)
class Boot:
    """The daemon has started: what the state file held, and why it could not be used if so."""

    loaded: Known
    state_problem: str = ""
    boot_id: str = ""  # /proc/sys/kernel/random/boot_id: a different one means we rebooted


@dataclass(frozen=True)
class DocumentFetched:
    document: Document
    wall: Optional[float] = None  # time.time() when it was fetched, to place NotBefore


@dataclass(frozen=True)
class PollFailed:
    kind: str
    detail: str
    status: Optional[int] = None
    retry_after: Optional[float] = None


@dataclass(frozen=True)
class NameResolved:
    name: str
    source: str  # config | imds | hostname
    problem: str = ""


@dataclass(frozen=True)
class HooksFinished:
    run: int
    outcome: Outcome
    detail: str = ""


@dataclass(frozen=True)
class ApprovalSent:
    event_id: str
    duration_s: float = 0.0


@dataclass(frozen=True)
class ApprovalFailed:
    event_id: str
    kind: str
    detail: str


@dataclass(frozen=True)
class Persisted:
    problem: str = ""  # empty: written


@dataclass(frozen=True)
class Tick:
    """A timer the engine asked for (WakeAt) is due; nothing else happened."""


@dataclass(frozen=True)
class ReloadRequested:
    """SIGHUP; the daemon reads the file next and reports Reloaded or ReloadFailed."""


@dataclass(frozen=True)
class Reloaded:
    config: Config


@dataclass(frozen=True)
class ReloadFailed:
    problems: tuple[str, ...]


@dataclass(frozen=True)
class StopRequested:
    signal: str = "SIGTERM"


@dataclass(frozen=True)
class PeersChanged:
    """What the fleet's keys say now for one shared event: VM name (lower case) -> state."""

    event_id: str
    states: Mapping[str, str]


@dataclass(frozen=True)
class CoordinationFailed:
    event_id: str
    kind: str
    detail: str


@dataclass(frozen=True)
class GateAnswered:
    run: int
    exit_status: Optional[int]  # None: it could not start, timed out or was stopped
    timed_out: bool = False
    cancelled: bool = False
    detail: str = ""


Message = Union[
    Boot,
    DocumentFetched,
    PollFailed,
    NameResolved,
    HooksFinished,
    ApprovalSent,
    ApprovalFailed,
    Persisted,
    Tick,
    ReloadRequested,
    Reloaded,
    ReloadFailed,
    StopRequested,
    PeersChanged,
    CoordinationFailed,
    GateAnswered,
]

# ---- effects: what the daemon must do ------------------------------------------------------


@dataclass(frozen=True)
class Fetch:
    """GET the document (off the loop; the result comes back as DocumentFetched/PollFailed)."""


@dataclass(frozen=True)
class ResolveName:
    """Ask IMDS for this VM's name; NameResolved comes back (the hostname if IMDS fails)."""


@dataclass(frozen=True)
class SpawnHooks:
    run: int
    event: Event
    hooks: tuple[str, ...]
    incarnation: int
    vm_name: str
    stage: str = "before"  # before | after | cancelled
    rebooted: bool = False  # this VM booted since the before-hooks started


@dataclass(frozen=True)
class CancelRuns:
    """SIGTERM each run's process groups (SIGKILL 5 s later); its result says CANCELLED."""

    runs: tuple[int, ...]


@dataclass(frozen=True)
class PostApproval:
    event: Event


@dataclass(frozen=True)
class Persist:
    events: Known  # only what matters after a restart


@dataclass(frozen=True)
class Log:
    level: Level
    name: str
    fields: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Notify:
    """One sd_notify datagram (READY=1, STATUS=..., WATCHDOG=1, STOPPING=1, RELOADING=1)."""

    fields: Mapping[str, str]


@dataclass(frozen=True)
class UseConfig:
    """A reloaded configuration is now in force (the daemon rebuilds its IMDS clients)."""

    config: Config


@dataclass(frozen=True)
class Coordinate:
    """Write this VM's state for a shared event (etcd); when ready, watch the other VMs' keys
    and report them as PeersChanged until StopCoordinating (or CoordinationFailed)."""

    event: Event
    vm_name: str
    ready: bool
    incarnation: int


@dataclass(frozen=True)
class StopCoordinating:
    event_ids: tuple[str, ...]


@dataclass(frozen=True)
class AskGate:
    """Run the gate command for a shared event; GateAnswered(run) comes back."""

    run: int
    event: Event
    incarnation: int
    vm_name: str


@dataclass(frozen=True)
class WakeAt:
    at: float


@dataclass(frozen=True)
class Exit:
    status: int


Effect = Union[
    Fetch,
    ResolveName,
    SpawnHooks,
    CancelRuns,
    PostApproval,
    Persist,
    Log,
    Notify,
    UseConfig,
    Coordinate,
    StopCoordinating,
    AskGate,
    WakeAt,
    Exit,
]

# ---- state ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Poll:
    next_at: float = 0.0
    in_flight_since: Optional[float] = None
    scheduled_at: float = 0.0  # the tick the fetch in flight belongs to
    failures: Failures = field(default_factory=Failures)
    rejected: str = ""  # IMDS answered 400: our request is wrong until a reload fixes it
    last: str = "not yet"
    stalled: bool = False


@dataclass(frozen=True)
class Approvals:
    failures: Mapping[str, Failures] = field(default_factory=dict)
    posting: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Peers:
    """A shared event waiting for the other VMs it names; not persisted (asked again after a
    restart: writing our own ready twice is harmless)."""

    asking: bool = False  # a watch (etcd) or a gate run is in progress
    next_at: float = 0.0  # when to ask (again)
    ready: tuple[str, ...] = ()  # the names last seen ready, to log only changes
    not_yet: int = 0  # how many times the gate said "not yet"


@dataclass(frozen=True)
class Stopping:
    grace_until: float
    kill_until: Optional[float] = None  # set once hooks were cancelled


@dataclass(frozen=True)
class State:
    config: Config
    watchdog_every: Optional[float] = None  # half of WATCHDOG_USEC, if systemd watches us
    vm_name: str = ""
    name_source: str = ""
    name_failures: Failures = field(default_factory=Failures)
    resolving: bool = False
    ready: bool = False
    events: Known = field(default_factory=dict)
    incarnation: Optional[int] = None
    runs: Mapping[int, str] = field(default_factory=dict)  # live run id -> event id
    next_run: int = 1
    poll: Poll = Poll()
    approvals: Approvals = Approvals()
    state_problem: str = ""
    boot_id: str = ""
    watchdog_at: float = 0.0
    status_sent: str = ""
    stopping: Optional[Stopping] = None
    wall_offset: Optional[float] = None  # wall clock minus monotonic, from the last document
    peers: Mapping[str, Peers] = field(default_factory=dict)  # COORDINATING events
    coordination: Failures = field(default_factory=Failures)  # etcd or the gate, all events


def initial(config: Config, watchdog_usec: Optional[int] = None) -> State:
    every = None if not watchdog_usec else watchdog_usec / 2_000_000
    return State(config=config, watchdog_every=every)


# ---- the step function ---------------------------------------------------------------------


def step(state: State, message: Message, now: float) -> tuple[State, tuple[Effect, ...]]:
    """Apply one message at monotonic time `now`; returns the new state and what to do."""
    out: list[Effect] = []
    new = _HANDLERS[type(message)](state, message, now, out)
    new = _timers(new, now, out)
    changed = new.events is not state.events and durable_events(new.events) != durable_events(
        state.events
    )
    if changed and not any(isinstance(e, Persist) for e in out):
        # Written ahead of any hook it starts, so a crash mid-hook is always known after the
        # restart (hooks_interrupted); written after an approval's POST, which need not wait.
        spawn = [i for i, e in enumerate(out) if isinstance(e, SpawnHooks)]
        out.insert(spawn[0] if spawn else len(out), Persist(durable_events(new.events)))
    new = _status(new, out)
    if not any(isinstance(e, Exit) for e in out):
        out.append(WakeAt(next_wakeup(new, now)))
    return new, tuple(out)


def _boot(state: State, msg: Boot, now: float, out: list[Effect]) -> State:
    cfg = state.config
    md = cfg.metadata
    out.append(
        Log(
            Level.INFO,
            "daemon_starting",
            {
                "config": str(cfg.path) if cfg.path else None,
                "url": md.url,
                "api_version": md.api_version,
                "poll_interval": md.poll_interval,
                "approve": cfg.approve.value,
            },
        )
    )
    if msg.state_problem:
        out.append(_state_warning(msg.state_problem))
    state = replace(state, state_problem=msg.state_problem, boot_id=msg.boot_id, watchdog_at=now)
    kept: dict[str, Tracked] = {}
    for event_id, tracked in msg.loaded.items():
        tracked = replace(tracked, run=None, pending="")  # noqa: PLW2901 - runs died with us
        rebooted = bool(tracked.boot_id and msg.boot_id and tracked.boot_id != msg.boot_id)
        if _prepared(tracked) and rebooted:
            # The maintenance happened: after-hooks, whether IMDS answers or not.
            out.append(_note(Level.INFO, "reboot_detected", tracked.event, stage="after"))
            state, kept[event_id] = _start_stage(state, tracked, "after", out)
        elif tracked.phase is Phase.RUNNING:
            out.append(
                _note(
                    Level.WARNING,
                    "hooks_interrupted",
                    tracked.event,
                    reason="cut off by a stop; they run again if the event is still Scheduled",
                )
            )
        elif tracked.phase is Phase.AFTER:
            out.append(
                _note(
                    Level.WARNING,
                    "after_hooks_interrupted",
                    tracked.event,
                    reason="cut off by a stop; after- and cancelled-hooks run at most once",
                )
            )
            kept[event_id] = replace(tracked, phase=Phase.OVER)
        elif tracked.phase is Phase.WAITING:
            # Its lead time is placed again by the next document (the clock may have jumped).
            kept[event_id] = replace(tracked, start_at=float("inf"))
        else:
            kept[event_id] = tracked
    state = replace(state, events=kept)
    if cfg.vm_name:
        return _name_known(state, NameResolved(cfg.vm_name, "config"), now, out)
    out.append(ResolveName())
    return replace(state, resolving=True)


def _state_warning(problem: str) -> Log:
    return Log(
        Level.WARNING,
        "state_degraded",
        {
            "error": problem,
            "reason": "events are still handled, but a restart may run their hooks again",
        },
    )


def _name_resolved(state: State, msg: NameResolved, now: float, out: list[Effect]) -> State:
    state = replace(state, resolving=False)
    if state.stopping is not None:
        return state
    return _name_known(state, msg, now, out)


def _name_known(state: State, msg: NameResolved, now: float, out: list[Effect]) -> State:
    previous = state.vm_name
    if msg.source == "hostname":
        failures, _ = state.name_failures.failed("hostname", now, NAME_BACKOFF)
        if state.name_source != "hostname":
            out.append(
                Log(
                    Level.WARNING,
                    "vm_name_fallback",
                    {
                        "vm_name": msg.name,
                        "error": msg.problem,
                        "retry_in_s": round(failures.retry_at - now, 2),
                        "reason": "IMDS did not tell the VM name; using the hostname, which "
                        "differs from Resources on scale sets. Set vm_name in the config to be "
                        "sure.",
                    },
                )
            )
    else:
        failures = Failures()
        if msg.name != previous or state.name_source == "hostname":
            out.append(Log(Level.INFO, "vm_name", {"vm_name": msg.name, "source": msg.source}))
    state = replace(state, vm_name=msg.name, name_source=msg.source, name_failures=failures)
    if previous and previous.casefold() != msg.name.casefold():
        # Events judged "not ours" under the old name are judged again at the next poll.
        state = replace(
            state,
            events={k: t for k, t in state.events.items() if t.phase is not Phase.NOT_OURS},
            incarnation=None,
        )
    if not state.ready:
        state = replace(state, ready=True, poll=replace(state.poll, next_at=now))
        out.append(Notify({"READY": "1", "STATUS": status_text(state)}))
        state = replace(state, status_sent=status_text(state))
    return state


def _document_fetched(state: State, msg: DocumentFetched, now: float, out: list[Effect]) -> State:
    poll = state.poll
    if poll.failures.count:
        out.append(
            Log(
                Level.INFO,
                "poll_recovered",
                {"failures": poll.failures.count, "outage_s": round(now - poll.failures.since, 1)},
            )
        )
    interval = state.config.metadata.poll_interval
    # Start to start on the monotonic clock: a late poll skips ticks instead of drifting.
    base = poll.scheduled_at
    missed = max(0, int((now - base) // interval))
    state = replace(
        state,
        poll=Poll(next_at=base + interval * (missed + 1), last="ok"),
    )
    doc = msg.document
    if doc.incarnation == state.incarnation or state.stopping is not None:
        return state
    out.append(
        Log(
            Level.INFO,
            "document_changed",
            {
                "incarnation": doc.incarnation,
                "previous_incarnation": state.incarnation,
                "events": len(doc.events),
            },
        )
    )
    for problem in doc.skipped:
        out.append(
            Log(Level.WARNING, "event_skipped", {"incarnation": doc.incarnation, "reason": problem})
        )
    state = replace(state, incarnation=doc.incarnation)
    if msg.wall is not None:
        state = replace(state, wall_offset=msg.wall - now)
    return _on_document(state, doc, now, out)


def _poll_failed(state: State, msg: PollFailed, now: float, out: list[Effect]) -> State:
    poll = state.poll
    md = state.config.metadata
    backoff = Backoff(md.poll_interval, max(POLL_BACKOFF_CAP, md.poll_interval))
    rejected = msg.status == 400
    failures, log = poll.failures.failed(
        msg.kind,
        now,
        backoff,
        at_least=backoff.cap if rejected else (msg.retry_after or 0.0),
    )
    if log and rejected:
        out.append(
            Log(
                Level.ERROR,
                "imds_rejected_request",
                {
                    "kind": msg.kind,
                    "error": msg.detail,
                    "api_version": md.api_version,
                    "url": md.url,
                    "retry_in_s": round(failures.retry_at - now, 2),
                    "reason": "IMDS says our request is wrong (check metadata.url and "
                    "metadata.api_version), then reload",
                },
            )
        )
    elif log:
        out.append(
            Log(
                Level.WARNING,
                "poll_failed",
                {
                    "kind": msg.kind,
                    "error": msg.detail,
                    "failures": failures.count,
                    "retry_in_s": round(failures.retry_at - now, 2),
                },
            )
        )
    return replace(
        state,
        poll=Poll(
            next_at=failures.retry_at,
            failures=failures,
            rejected=msg.detail if rejected else "",
            last=f"{msg.kind} ({failures.count} failures)",
        ),
    )


def _hooks_finished(state: State, msg: HooksFinished, now: float, out: list[Effect]) -> State:
    event_id = state.runs.get(msg.run, "")
    runs = {r: e for r, e in state.runs.items() if r != msg.run}
    state = replace(state, runs=runs)
    tracked = state.events.get(event_id)
    if (
        tracked is None
        or tracked.run != msg.run
        or tracked.phase not in (Phase.RUNNING, Phase.AFTER)
    ):
        out.append(
            Log(
                Level.INFO,
                "hook_result_ignored",
                {
                    "run": msg.run,
                    "event_id": event_id or None,
                    "outcome": msg.outcome.value,
                    "reason": "this run is no longer the event's current one",
                },
            )
        )
        return state
    event = tracked.event
    if tracked.phase is Phase.AFTER:
        return _stage_finished(state, tracked, msg, out)
    if tracked.pending:
        state, tracked = _start_stage(state, tracked, tracked.pending, out)
        return _with(state, event_id, tracked)
    if msg.outcome is Outcome.CANCELLED:
        # Still RUNNING on disk: they did not finish preparing, so a restart runs them again.
        return _with(state, event_id, replace(tracked, run=None))
    if msg.outcome is Outcome.FAILED:
        out.append(
            _note(
                Level.ERROR,
                "event_not_approved",
                event,
                cause="hooks_failed",
                reason="a hook failed; the event proceeds at NotBefore without this VM's approval",
            )
        )
        if _approval(event, state)[0] is Phase.COORDINATING and _etcd(state):
            # The others stop waiting for us (a VM that never writes is waited out the same).
            out.append(Coordinate(event, state.vm_name, False, state.incarnation or 0))
        return _with(state, event_id, replace(tracked, phase=Phase.HOOKS_FAILED, run=None))
    phase, note = _approval(event, state)
    if note is not None:
        out.append(note)
    return _with(state, event_id, replace(tracked, phase=phase, run=None))


def _stage_finished(state: State, tracked: Tracked, msg: HooksFinished, out: list[Effect]) -> State:
    """After- and cancelled-hooks run once: a failure is reported, never retried."""
    event = tracked.event
    if msg.outcome is Outcome.SUCCEEDED:
        out.append(_note(Level.INFO, "after_hooks_finished", event, stage=tracked.stage))
    elif msg.outcome is Outcome.FAILED:
        out.append(
            _note(
                Level.ERROR,
                "after_hooks_failed",
                event,
                stage=tracked.stage,
                reason="not retried: after- and cancelled-hooks run at most once",
            )
        )
    else:
        out.append(_note(Level.WARNING, "after_hooks_interrupted", event, stage=tracked.stage))
    if not tracked.in_document:
        return replace(state, events={k: t for k, t in state.events.items() if k != event.event_id})
    return _with(state, event.event_id, replace(tracked, phase=Phase.OVER, run=None))


def _start_stage(
    state: State, tracked: Tracked, stage: str, out: list[Effect]
) -> tuple[State, Tracked]:
    """Run the event's after- or cancelled-hooks, once; with none configured it is over."""
    hooks = state.config.events.get(tracked.event.event_type, EventRule()).hooks_for(stage)
    if not hooks:
        return state, replace(tracked, phase=Phase.OVER, run=None, pending="", stage=stage)
    run = state.next_run
    rebooted = bool(tracked.boot_id and state.boot_id and tracked.boot_id != state.boot_id)
    out.append(
        SpawnHooks(
            run, tracked.event, hooks, state.incarnation or 0, state.vm_name, stage, rebooted
        )
    )
    state = replace(state, runs={**state.runs, run: tracked.event.event_id}, next_run=run + 1)
    return state, replace(tracked, phase=Phase.AFTER, run=run, pending="", stage=stage)


def _approval_sent(state: State, msg: ApprovalSent, now: float, out: list[Effect]) -> State:
    approvals = state.approvals
    attempts = approvals.failures.get(msg.event_id, Failures()).count + 1
    state = replace(
        state,
        approvals=Approvals(
            {k: f for k, f in approvals.failures.items() if k != msg.event_id},
            approvals.posting - {msg.event_id},
        ),
    )
    tracked = state.events.get(msg.event_id)
    if tracked is None or tracked.phase is not Phase.APPROVING:
        return state
    out.append(
        _note(
            Level.INFO,
            "event_approved",
            tracked.event,
            attempts=attempts,
            duration_s=round(msg.duration_s, 3),
        )
    )
    return _with(state, msg.event_id, replace(tracked, phase=Phase.APPROVED))


def _approval_failed(state: State, msg: ApprovalFailed, now: float, out: list[Effect]) -> State:
    approvals = state.approvals
    failures, log = approvals.failures.get(msg.event_id, Failures()).failed(
        msg.kind, now, APPROVAL_BACKOFF
    )
    tracked = state.events.get(msg.event_id)
    if log and tracked is not None:
        out.append(
            _note(
                Level.WARNING,
                "approval_failed",
                tracked.event,
                kind=msg.kind,
                error=msg.detail,
                attempts=failures.count,
                retry_in_s=round(failures.retry_at - now, 2),
            )
        )
    return replace(
        state,
        approvals=Approvals(
            {**approvals.failures, msg.event_id: failures},
            approvals.posting - {msg.event_id},
        ),
    )


def _persisted(state: State, msg: Persisted, now: float, out: list[Effect]) -> State:
    if msg.problem == state.state_problem:
        return state
    if msg.problem:
        out.append(_state_warning(msg.problem))
    else:
        out.append(Log(Level.INFO, "state_recovered", {"previous_error": state.state_problem}))
    return replace(state, state_problem=msg.problem)


def _tick(state: State, msg: Tick, now: float, out: list[Effect]) -> State:
    return state


def _reload_requested(state: State, msg: ReloadRequested, now: float, out: list[Effect]) -> State:
    out.append(Notify({"RELOADING": "1", "MONOTONIC_USEC": str(int(now * 1_000_000))}))
    return state


def _reloaded(state: State, msg: Reloaded, now: float, out: list[Effect]) -> State:
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
    if new.coordination != old.coordination:
        # Shared events still waiting ask again, through the new etcd or gate.
        for event_id, t in state.events.items():
            if t.phase is Phase.COORDINATING:
                state, t = _stop_asking(state, t, out)  # noqa: PLW2901
                state = _with(state, event_id, t)
    state = replace(state, config=new)
    if new.metadata != old.metadata:
        # A fixed url/api_version is tried at once, not after the rejected request's backoff.
        state = replace(state, poll=replace(state.poll, next_at=now, rejected=""))
    if new.vm_name != old.vm_name or (new.metadata != old.metadata and not new.vm_name):
        if new.vm_name:
            state = _name_known(state, NameResolved(new.vm_name, "config"), now, out)
        elif not state.resolving:
            out.append(ResolveName())
            state = replace(state, resolving=True)
    out.append(
        Log(
            Level.INFO,
            "config_reloaded",
            {"config": str(new.path) if new.path else None, "approve": new.approve.value},
        )
    )
    out.append(Notify({"READY": "1"}))
    return state


def _reload_failed(state: State, msg: ReloadFailed, now: float, out: list[Effect]) -> State:
    for problem in msg.problems:
        out.append(Log(Level.ERROR, "config_invalid", {"error": problem}))
    out.append(
        Log(Level.ERROR, "config_reload_failed", {"reason": "keeping the previous configuration"})
    )
    out.append(Notify({"READY": "1"}))
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
            }
        )
    )
    out.append(
        Log(
            Level.INFO,
            "daemon_stopping",
            {"signal": msg.signal, "hooks_running": len(state.runs), "grace_s": grace},
        )
    )
    return replace(state, stopping=Stopping(grace_until=now + grace))


def _peers_changed(state: State, msg: PeersChanged, now: float, out: list[Effect]) -> State:
    """Approve a shared event once every VM it names wrote ready; one failed: nobody does."""
    state = _coordination_works(state, out)  # even if the event was decided meanwhile
    tracked = state.events.get(msg.event_id)
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
                "event_not_approved",
                event,
                cause="peer_failed",
                failed=" ".join(failed),
                reason="another VM's hooks failed; nobody approves, it proceeds at NotBefore",
            )
        )
        state, tracked = _stop_asking(state, tracked, out)
        return _with(state, msg.event_id, replace(tracked, phase=Phase.NOT_APPROVED))
    if len(ready) == len(names):
        out.append(_note(Level.INFO, "peers_ready", event, ready=" ".join(ready)))
        state, tracked = _stop_asking(state, tracked, out)
        return _with(state, msg.event_id, replace(tracked, phase=Phase.APPROVING))
    peers = state.peers.get(msg.event_id, Peers(asking=True))
    if ready != peers.ready:
        out.append(
            _note(
                Level.INFO,
                "peers_waiting",
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
            Log(
                Level.WARNING,
                "coordination_failed",
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
    if tracked is None or tracked.phase is not Phase.COORDINATING:
        return state
    peers = state.peers.get(msg.event_id, Peers())
    peers = replace(peers, asking=False, next_at=failures.retry_at)
    if tracked.run is not None:
        state = _without_run(state, tracked.run)
        state = _with(state, msg.event_id, replace(tracked, run=None))
    return replace(state, peers={**state.peers, msg.event_id: peers})


def _gate_answered(state: State, msg: GateAnswered, now: float, out: list[Effect]) -> State:
    """0: approve now; 75 (EX_TEMPFAIL): ask again after `interval`; anything else: never."""
    event_id = state.runs.get(msg.run, "")
    tracked = state.events.get(event_id)
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
    state = _without_run(state, msg.run)
    tracked = replace(tracked, run=None)
    event = tracked.event
    if msg.exit_status == 0:
        out.append(_note(Level.INFO, "gate_approved", event))
        state = _without_peers(state, event_id)
        return _with(state, event_id, replace(tracked, phase=Phase.APPROVING))
    if msg.exit_status == GATE_LATER:
        gate = state.config.coordination.gate if state.config.coordination else None
        interval = gate.interval if gate is not None else COORDINATION_BACKOFF.cap
        peers = state.peers.get(event_id, Peers())
        level = Level.DEBUG if peers.not_yet else Level.INFO
        out.append(_note(level, "gate_not_yet", event, ask_again_in_s=interval))
        peers = Peers(asking=False, next_at=now + interval, not_yet=peers.not_yet + 1)
        state = replace(state, peers={**state.peers, event_id: peers})
        return _with(state, event_id, tracked)
    out.append(
        _note(
            Level.WARNING,
            "event_not_approved",
            event,
            cause="gate_refused",
            exit_status=msg.exit_status,
            reason="the gate command said never; it proceeds at NotBefore",
        )
    )
    state = _without_peers(state, event_id)
    return _with(state, event_id, replace(tracked, phase=Phase.NOT_APPROVED))


def _coordination_works(state: State, out: list[Effect]) -> State:
    failures = state.coordination
    if failures.count:
        out.append(
            Log(
                Level.INFO,
                "coordination_recovered",
                {"failures": failures.count, "kind": failures.kind},
            )
        )
        state = replace(state, coordination=Failures())
    return state


def _stop_asking(state: State, tracked: Tracked, out: list[Effect]) -> tuple[State, Tracked]:
    """A COORDINATING event that is decided, started or gone: end its watch or gate run."""
    event_id = tracked.event.event_id
    if tracked.run is not None:
        out.append(CancelRuns((tracked.run,)))
        state = _without_run(state, tracked.run)
    elif event_id in state.peers and _etcd(state):
        out.append(StopCoordinating((event_id,)))
    state = _without_peers(state, event_id)
    return state, replace(tracked, run=None)


def _without_run(state: State, run: int) -> State:
    return replace(state, runs={r: e for r, e in state.runs.items() if r != run})


def _without_peers(state: State, event_id: str) -> State:
    """The event no longer waits for the other VMs (decided, started or gone)."""
    return replace(state, peers={k: p for k, p in state.peers.items() if k != event_id})


def _etcd(state: State) -> bool:
    return state.config.coordination is not None and state.config.coordination.etcd is not None


_HANDLERS: Mapping[type, Callable[[State, Any, float, list[Effect]], State]] = {
    Boot: _boot,
    DocumentFetched: _document_fetched,
    PollFailed: _poll_failed,
    NameResolved: _name_resolved,
    HooksFinished: _hooks_finished,
    ApprovalSent: _approval_sent,
    ApprovalFailed: _approval_failed,
    Persisted: _persisted,
    Tick: _tick,
    ReloadRequested: _reload_requested,
    Reloaded: _reloaded,
    ReloadFailed: _reload_failed,
    StopRequested: _stop_requested,
    PeersChanged: _peers_changed,
    CoordinationFailed: _coordination_failed,
    GateAnswered: _gate_answered,
}


# ---- timers --------------------------------------------------------------------------------


def _timers(state: State, now: float, out: list[Effect]) -> State:
    """Start whatever is due; runs after every message, so no timer waits for a Tick."""
    state = _watchdog(state, now, out)
    if state.stopping is not None:
        return _shutdown(state, now, out)
    poll = state.poll
    if state.ready and poll.in_flight_since is None and now >= poll.next_at:
        out.append(Fetch())
        state = replace(state, poll=replace(poll, in_flight_since=now, scheduled_at=poll.next_at))
    if (
        state.name_source == "hostname"
        and not state.resolving
        and now >= state.name_failures.retry_at
    ):
        out.append(ResolveName())
        state = replace(state, resolving=True)
    state = _start_waiting(state, now, out)
    state = _coordinate(state, now, out)
    return _retry_approvals(state, now, out)


def _coordinate(state: State, now: float, out: list[Effect]) -> State:
    """Shared events waiting for the other VMs: start (or restart) the watch or the gate."""
    coordination = state.config.coordination
    if coordination is None:
        return state
    for event_id, t in state.events.items():
        if t.phase is not Phase.COORDINATING:
            continue
        peers = state.peers.get(event_id, Peers())
        if peers.asking or now < peers.next_at:
            continue
        incarnation = state.incarnation or 0
        if coordination.etcd is not None:
            out.append(Coordinate(t.event, state.vm_name, True, incarnation))
        else:
            run = state.next_run
            out.append(AskGate(run, t.event, incarnation, state.vm_name))
            state = replace(state, runs={**state.runs, run: event_id}, next_run=run + 1)
            state = _with(state, event_id, replace(t, run=run))
        state = replace(state, peers={**state.peers, event_id: replace(peers, asking=True)})
    return state


def _start_waiting(state: State, now: float, out: list[Effect]) -> State:
    """Events whose lead time has come start their before-hooks (RUNNING is written first)."""
    for event_id, t in state.events.items():
        if t.phase is not Phase.WAITING or t.start_at > now:
            continue
        rule = state.config.events.get(t.event.event_type, EventRule())
        run = state.next_run
        out.append(SpawnHooks(run, t.event, rule.before, state.incarnation or 0, state.vm_name))
        state = replace(state, runs={**state.runs, run: event_id}, next_run=run + 1)
        state = _with(state, event_id, replace(t, phase=Phase.RUNNING, run=run, start_at=0.0))
    return state


def _retry_approvals(state: State, now: float, out: list[Effect]) -> State:
    approvals = state.approvals
    due = [
        t.event
        for event_id, t in state.events.items()
        if t.phase is Phase.APPROVING
        and event_id not in approvals.posting
        and now >= approvals.failures.get(event_id, Failures()).retry_at
    ]
    for event in due:
        out.append(PostApproval(event))
    if due:
        state = replace(
            state,
            approvals=replace(approvals, posting=approvals.posting | {e.event_id for e in due}),
        )
    return state


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
                Log(
                    Level.ERROR,
                    "poll_stalled",
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
    then cancel the hooks, which stay RUNNING on disk and run again after the restart."""
    stopping = state.stopping
    assert stopping is not None  # noqa: S101 - only called while stopping
    state = _retry_approvals(state, now, out)
    if not state.runs and not state.approvals.posting:
        return _exit(state, out)
    if stopping.kill_until is None and now >= stopping.grace_until:
        if state.runs:
            out.append(
                Log(
                    Level.WARNING,
                    "hooks_cancelled",
                    {
                        "events": " ".join(sorted(set(state.runs.values()))),
                        "reason": "shutdown grace expired",
                    },
                )
            )
            out.append(CancelRuns(tuple(sorted(state.runs))))
        return replace(state, stopping=replace(stopping, kill_until=now + KILL_WAIT))
    if stopping.kill_until is not None and now >= stopping.kill_until:
        return _exit(state, out)
    return state


def _exit(state: State, out: list[Effect]) -> State:
    out.append(Persist(durable_events(state.events)))
    out.append(Log(Level.INFO, "daemon_stopped", {}))
    out.append(Exit(0))
    return state


def next_wakeup(state: State, now: float) -> float:
    """The earliest instant a timer of this state is due (never in the past)."""
    times: list[float] = []
    if state.watchdog_every is not None:
        times.append(state.watchdog_at)
    if state.stopping is not None:
        s = state.stopping
        times.append(s.kill_until if s.kill_until is not None else s.grace_until)
    else:
        if state.ready and state.poll.in_flight_since is None:
            times.append(state.poll.next_at)
        if state.name_source == "hostname" and not state.resolving:
            times.append(state.name_failures.retry_at)
        md = state.config.metadata
        if state.poll.in_flight_since is not None and state.watchdog_every is not None:
            times.append(
                state.poll.in_flight_since + md.first_call_timeout + md.timeout + STALL_MARGIN
            )
    for event_id, t in state.events.items():
        if t.phase is Phase.APPROVING and event_id not in state.approvals.posting:
            times.append(state.approvals.failures.get(event_id, Failures()).retry_at)
        if t.phase is Phase.WAITING and state.stopping is None:
            times.append(t.start_at)
        peers = state.peers.get(event_id)
        if t.phase is Phase.COORDINATING and state.stopping is None:
            if peers is None:
                times.append(now)
            elif not peers.asking:
                times.append(peers.next_at)
    due = [t for t in times if math.isfinite(t)]  # an event waiting for a document is not
    return max(now, min(due)) if due else now + 3600.0


# ---- the events of a document --------------------------------------------------------------


def _on_document(state: State, doc: Document, now: float, out: list[Effect]) -> State:
    """Compare a new document with what we know; events that left it are over or cancelled."""
    events: dict[str, Tracked] = {}
    for event in doc.events:
        before = state.events.get(event.event_id)
        if before is None:
            phase, effects = _first_sight(event, state, now)
            rule = next(
                (str(e.fields["rule"]) for e in effects if isinstance(e, Log) and e.name == RULED),
                "",
            )
            tracked = Tracked(event, phase, boot_id=state.boot_id, rule=rule)
            if phase is Phase.WAITING:
                tracked = replace(tracked, start_at=_lead(event, state, now))
            for effect in effects:
                if isinstance(effect, SpawnHooks):
                    run = state.next_run
                    state = replace(
                        state, runs={**state.runs, run: event.event_id}, next_run=run + 1
                    )
                    effect = replace(effect, run=run)  # noqa: PLW2901 - numbered here
                    tracked = replace(tracked, run=run)
                out.append(effect)
            events[event.event_id] = tracked
            continue
        phase = before.phase
        if before.event.status != event.status and phase is not Phase.NOT_OURS:
            out.append(
                _note(
                    Level.INFO,
                    "event_status_changed",
                    event,
                    previous_status=before.event.status,
                )
            )
            if phase in (Phase.APPROVING, Phase.COORDINATING) and event.status == STARTED:
                if phase is Phase.COORDINATING:
                    state, before = _stop_asking(state, before, out)
                phase = Phase.DONE
        tracked = replace(before, event=event, phase=phase, in_document=True)
        if phase is Phase.WAITING:
            tracked = _still_waiting(tracked, state, now, out)
        events[event.event_id] = tracked
    state = _gone(state, events, out)
    failures = {k: f for k, f in state.approvals.failures.items() if k in events}
    return replace(state, events=events, approvals=replace(state.approvals, failures=failures))


def _gone(state: State, events: dict[str, Tracked], out: list[Effect]) -> State:
    """Events that left the document: over if they had started or we approved them, else
    cancelled by Azure. Hooks still running for one are stopped first; then its after- or
    cancelled-hooks run (kept in `events` until they end)."""
    cancel: list[int] = []
    for event_id, gone in state.events.items():
        if event_id in events:
            continue
        if gone.phase is Phase.NOT_OURS:
            out.append(_note(Level.DEBUG, "event_gone", gone.event))
            continue
        if gone.phase is Phase.AFTER or gone.pending:
            events[event_id] = replace(gone, in_document=False)
            continue
        if gone.phase is Phase.COORDINATING:
            state, gone = _stop_asking(state, gone, out)  # noqa: PLW2901
        if not _prepared(gone):
            out.append(_note(Level.INFO, "event_completed", gone.event, phase=gone.phase.value))
            continue
        over = gone.event.status == STARTED or gone.phase in (Phase.APPROVED, Phase.DONE)
        stage = "after" if over else "cancelled"
        hooks = state.config.events.get(gone.event.event_type, EventRule()).hooks_for(stage)
        run = gone.run if gone.phase is Phase.RUNNING else None
        running = run is not None
        if run is not None:
            out.append(
                _note(
                    Level.WARNING,
                    "event_gone_while_hooks_running",
                    gone.event,
                    phase=gone.phase.value,
                    reason="it left the document; its hooks are stopped",
                )
            )
            cancel.append(run)
        name = "event_completed" if over else "event_cancelled"
        level = Level.INFO if over else Level.WARNING
        out.append(_note(level, name, gone.event, phase=gone.phase.value, stage=stage))
        if not hooks:
            continue
        if running:
            events[event_id] = replace(gone, pending=stage, in_document=False)
        else:
            state, events[event_id] = _start_stage(
                state, replace(gone, in_document=False), stage, out
            )
    if cancel:
        out.append(CancelRuns(tuple(cancel)))
    return state


def _first_sight(event: Event, state: State, now: float) -> tuple[Phase, list[Effect]]:
    vm_name = state.vm_name
    if not event.names(vm_name):
        return Phase.NOT_OURS, [
            _note(Level.INFO, "event_ignored", event, reason="not for this VM", vm_name=vm_name)
        ]
    detected = _note(Level.INFO, "event_detected", event)
    if event.status == STARTED:
        return Phase.MISSED, [
            detected,
            _note(
                Level.WARNING,
                "event_missed",
                event,
                reason="first seen already Started; no hooks run",
            ),
        ]
    if event.status != SCHEDULED:
        return Phase.UNHANDLED, [
            detected,
            _note(
                Level.WARNING, "event_unhandled", event, reason=f"unknown status {event.status!r}"
            ),
        ]
    rule = state.config.events.get(event.event_type)
    if rule is None:
        return Phase.UNHANDLED, [
            detected,
            _note(
                Level.WARNING,
                "event_unhandled",
                event,
                reason=f"no hooks configured for {event.event_type}; left alone",
            ),
        ]
    decided = _rule(event, rule, state)
    if decided is not None:
        return decided[0], [detected, *decided[1]]
    start_at = _start_at(event, rule, state, now)
    if start_at is not None:
        return Phase.WAITING, [detected, _waiting(event, rule, start_at, state)]
    if rule.before:
        spawn = SpawnHooks(0, event, rule.before, state.incarnation or 0, vm_name)
        return Phase.RUNNING, [detected, spawn]
    phase, note = _approval(event, state)
    return phase, [detected] if note is None else [detected, note]


def _start_at(event: Event, rule: EventRule, state: State, now: float) -> Optional[float]:
    """When a lead time holds back the before-hooks, the monotonic instant they start; None
    when they start now (no start_before, no NotBefore, or NotBefore already close enough)."""
    if rule.start_before is None or event.not_before is None or not rule.before:
        return None
    if state.wall_offset is None:
        return None
    start_at = event.not_before.timestamp() - rule.start_before - state.wall_offset
    return start_at if start_at > now else None


def _waiting(event: Event, rule: EventRule, start_at: float, state: State) -> Log:
    wall = start_at + (state.wall_offset or 0.0)
    return _note(
        Level.INFO,
        "event_waiting",
        event,
        hooks_start_at=iso_utc(dt.datetime.fromtimestamp(wall, dt.timezone.utc)),
        start_before=rule.start_before,
        reason=f"NotBefore is more than start_before ({rule.start_before:g} s) away",
    )


def _lead(event: Event, state: State, now: float) -> float:
    rule = state.config.events.get(event.event_type, EventRule())
    start_at = _start_at(event, rule, state, now)
    return now if start_at is None else start_at


def _still_waiting(tracked: Tracked, state: State, now: float, out: list[Effect]) -> Tracked:
    """A NotBefore that moves is followed; an event that starts meanwhile was missed."""
    event = tracked.event
    if event.status == STARTED:
        out.append(
            _note(
                Level.WARNING,
                "event_missed",
                event,
                reason="it started while its hooks waited for their lead time",
            )
        )
        return replace(tracked, phase=Phase.MISSED)
    start_at = _lead(event, state, now)
    if abs(start_at - tracked.start_at) > 1 and start_at > now:
        rule = state.config.events.get(event.event_type, EventRule())
        out.append(_waiting(event, rule, start_at, state))
    return replace(tracked, start_at=start_at)


RULED = "event_rule"  # the log record that says which rule decided, and marks the event


def _rule(event: Event, rule: EventRule, state: State) -> Optional[tuple[Phase, list[Effect]]]:
    """Rules that decide before any hook runs: events a person asked for, short Freezes."""
    user = state.config.user_events
    if event.source.casefold() == "user" and user is not UserEvents.HOOKS:
        note = _note(
            Level.INFO,
            RULED,
            event,
            rule="user",
            decision=user.value,
            reason=f"EventSource User and user_events: {user.value}",
        )
        if user is UserEvents.IGNORE:
            return Phase.UNHANDLED, [note]
        return Phase.APPROVING, [note]
    duration = event.duration_seconds
    short = rule.short_seconds
    if short is not None and duration is not None and 0 <= duration <= short:
        note = _note(
            Level.INFO,
            RULED,
            event,
            rule="short",
            reason=f"DurationInSeconds {duration} <= short_seconds {short}: no hooks",
        )
        phase, approval = _approval(event, state)
        return phase, [note] if approval is None else [note, approval]
    return None


def _prepared(tracked: Tracked) -> bool:
    """Its before-hooks started (or it had none to run): it gets after/cancelled hooks."""
    return tracked.phase in PREPARED and not tracked.rule


def _approval(event: Event, state: State) -> tuple[Phase, Optional[Log]]:
    """Approving lets the event proceed for every VM it names, hence the `sole` default.

    APPROVING events are posted by `_retry_approvals`, the one place approvals go out.
    """
    policy = state.config.policy(event.event_type)
    if event.status != SCHEDULED:
        return Phase.DONE, _note(Level.INFO, "approval_not_needed", event, reason="already started")
    if policy is ApprovePolicy.NEVER:
        return Phase.NOT_APPROVED, _note(
            Level.INFO,
            "approval_skipped",
            event,
            reason=f"approve: {policy.value}; it proceeds at NotBefore",
        )
    others = [r for r in event.resources if r.casefold() != state.vm_name.casefold()]
    coordination = state.config.coordination
    if policy is ApprovePolicy.ALL and others and coordination is not None:
        return Phase.COORDINATING, _note(
            Level.INFO,
            "event_coordinating",
            event,
            via="etcd" if coordination.etcd is not None else "gate",
            other_resources=" ".join(others),
            reason="shared: approved once every VM it names is ready",
        )
    if policy in (ApprovePolicy.SOLE, ApprovePolicy.ALL) and others:
        return Phase.NOT_APPROVED, _note(
            Level.INFO,
            "approval_skipped",
            event,
            reason=f"shared with {len(others)} other VM(s), approving would rush them; "
            f"it proceeds at NotBefore (approve: {policy.value})",
            other_resources=" ".join(others),
        )
    return Phase.APPROVING, None


# ---- helpers -------------------------------------------------------------------------------


def event_fields(event: Event) -> dict[str, object]:
    return {
        "event_id": event.event_id,
        "event_type": event.event_type,
        "event_status": event.status,
        "not_before": iso_utc(event.not_before) or None,
        "resources": " ".join(event.resources),
    }


def _note(level: Level, name: str, event: Event, **fields: object) -> Log:
    return Log(level, name, {**event_fields(event), **fields})


def _with(state: State, event_id: str, tracked: Tracked) -> State:
    return replace(state, events={**state.events, event_id: tracked})


def durable_events(events: Known) -> Known:
    """What the state file keeps: events for other VMs cost a write a second under churn."""
    return {
        k: replace(t, run=None, pending="", stage="", in_document=True, start_at=0.0)
        for k, t in events.items()
        if t.phase is not Phase.NOT_OURS
    }


def status_text(state: State) -> str:
    ours = sum(1 for t in state.events.values() if t.phase is not Phase.NOT_OURS)
    incarnation = state.incarnation if state.incarnation is not None else "-"
    text = (
        f"incarnation {incarnation}; {ours} event(s) for {state.vm_name or '?'}; "
        f"{len(state.runs)} running hook run(s); last poll {state.poll.last}"
    )
    waiting = [t for t in state.events.values() if t.phase is Phase.WAITING]
    if waiting:
        text += f"; {len(waiting)} waiting for their lead time"
    coordinating = [t for t in state.events.values() if t.phase is Phase.COORDINATING]
    if coordinating:
        text += f"; {len(coordinating)} waiting for the other VMs"
    if state.coordination.count:
        text += f"; COORDINATION FAILING: {state.coordination.kind}"
    if state.poll.rejected:
        text += f"; IMDS REJECTS OUR REQUEST: {state.poll.rejected[:120]}"
    if state.state_problem:
        text += "; DEGRADED: state not saved"
    return text


def _status(state: State, out: list[Effect]) -> State:
    if not state.ready or state.stopping is not None:
        return state
    text = status_text(state)
    if text == state.status_sent:
        return state
    out.append(Notify({"STATUS": text}))
    return replace(state, status_sent=text)
