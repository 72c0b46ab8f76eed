"""Every decision and every timer of the daemon, as one pure state machine.

`step(state, message, now) -> (state, effects)`, the sans-I/O shape of h11: the daemon feeds in
what happened (a document fetched, a poll failed, hooks of run R finished, a timer is due, a
signal) with the monotonic time, and carries out the effects it gets back (fetch, spawn hooks,
post an approval, persist, record, notify systemd, wake at T). Nothing here does I/O or reads a
clock, so every rule, backoff and retry is tested with a fake clock in milliseconds.

An event's phase changes only through `_move`, which checks it against `lifecycle.TABLE`:
the table says what may happen, the handlers below say which of it does.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Union

from .config import ApprovePolicy, Config, DrainMethod, EventRule, Pacemaker, UserEvents
from .host.hooks import GATE_LATER, KILL_GRACE, Outcome
from .lifecycle import (
    DURABLE,
    PREPARED,
    Drain,
    IllegalTransitionError,
    On,
    Phase,
    Rule,
    Slot,
    Stage,
    check,
)
from .model import SCHEDULED, STARTED, Document, Event, iso_utc
from .records import Cause, Level, Record, What
from .retry import Backoff, Failures
from .when import Held, fast_hooks, hold, lead

POLL_BACKOFF_CAP = 2.0  # a Preempt may give well under 30 s: never be blind for longer
APPROVAL_BACKOFF = Backoff(0.5, 8.0)
# At boot IMDS is often unreachable for a few seconds: ask for the name again soon, then rarely.
NAME_BACKOFF = Backoff(2.0, 60.0)
# etcd without quorum or a gate timing out: ask again soon, never more than every 10 s, so a
# cluster back before NotBefore is used at once.
COORDINATION_BACKOFF = Backoff(0.5, 10.0)
# After cancelling hooks at shutdown: the runner's SIGKILL comes KILL_GRACE after SIGTERM; the
# margin lets their results arrive before the daemon exits.
KILL_WAIT = KILL_GRACE + 2.0
STOP_MARGIN = 10.0  # beyond the grace and the kill wait, for the final state write
# A fetch in flight this much longer than its own timeouts means its worker is wedged: the
# watchdog is no longer pinged, so systemd restarts the daemon.
STALL_MARGIN = 30.0
# The wall clock moved against the monotonic one by more than this since NotBefore times were
# placed: place them again (an NTP step, a VM resumed from a pause).
CLOCK_STEP = 1.0
# IMDS answers 429 past 5 requests a second per VM, approvals included. Polls, approvals and
# name lookups share that budget: at 4 Hz an approval waits at most for the oldest poll of the
# second to leave the window (< 0.25 s), and the poll after it for the approval, rather than
# either being refused with a 429 (every approval cost one at 4 Hz before).
IMDS_RATE = 5
RATE_WINDOW = 1.02  # the margin covers up to 20 ms of jitter in the latency to IMDS
TAKE_BACK = 0.02  # a poll ordered for sooner than this may be under way: it is not taken back
# A shared event under pacemaker: how often the cluster is read for the other nodes' drains.
CLUSTER_ASK = 2.0
# Pacemaker: how often the cluster's readiness to drain this node is read again, for `status`.
CLUSTER_CHECK = 60.0
# An approval is sent only while its slot's lease is confirmed for this long more, so the POST
# reaches IMDS before the lease can expire and the slot go to another VM. Renewed every third
# of its ttl (5 s at least), a healthy lease always has more than 3 s left.
SLOT_MARGIN = 1.0
# A slot asked for when the hooks are due (at start_before's lead, a window's lead) gets this
# long for etcd's answer before they start without it: a healthy cluster answers within
# milliseconds, a leader election within a second or two. An answer that every slot is taken
# (or that etcd cannot be asked) ends the wait at once.
SLOT_GRACE = 5.0


@dataclass(frozen=True)
class Tracked:
    """One event as the engine knows it. Which fields mean something depends on `phase`."""

    event: Event
    phase: Phase
    run: Optional[int] = None  # RUNNING, ENDING, AFTER: its run; COORDINATING: a gate run
    boot_id: str = ""  # the boot on which it was first seen (before-hooks start then or later)
    stage: Stage = Stage.BEFORE  # ENDING, AFTER: the stage that runs when its hooks stop
    rule: Rule = Rule.HOOKS  # decided by a rule: never prepared, so no after-hooks
    start_at: float = 0.0  # WAITING: when its before-hooks start (monotonic; inf: not placed)
    vm_name: str = ""  # the name it was judged ours under: every stage's hooks get it
    incarnation: int = 0  # the last document that listed it: every stage's hooks get it
    slot: Slot = Slot.NONE  # its concurrency slot (QUEUED: asked; until it is over: held)
    drain: Drain = Drain.NONE  # this node in its Pacemaker cluster, for this event


Known = Mapping[str, Tracked]


@dataclass(frozen=True)
class ClusterMark:
    """What this daemon set on its Pacemaker node, kept in the state file until a restore took
    it off: only such a mark is ever taken off (an operator's standby, or an attribute someone
    else set, stays), the way it was set, whatever the configuration says by then."""

    method: DrainMethod
    attribute: str  # method health: the node attribute set to -1000000


def mark_of(settings: Pacemaker) -> ClusterMark:
    return ClusterMark(settings.method, settings.attribute)


# Re-exported: the engine's messages and effects speak in these.
__all__ = ["Drain", "Level", "On", "Outcome", "Phase", "Record", "Rule", "Stage", "What"]

# ---- messages: what happened ---------------------------------------------------------------


@dataclass(frozen=True)
class Boot:
    """The daemon has started: what the state file held, and why it could not be used if so."""

    loaded: Known
    state_problem: str = ""
    boot_id: str = ""  # /proc/sys/kernel/random/boot_id: a different one means we rebooted
    mark: Optional[ClusterMark] = None  # what the state file says this daemon set on its node
    # A state file written before marks were recorded, with an event that had the node drained:
    # that daemon marked it (it took off whatever it found at the end); it is taken as ours.
    mark_unrecorded: bool = False


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
    answered: Optional[float] = None  # monotonic: when IMDS' answer came (None: now)


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


@dataclass(frozen=True)
class ClusterChecked:
    """What the cluster looked like at start: problems an operator must fix, if any."""

    problems: tuple[str, ...]


@dataclass(frozen=True)
class ClusterMarked:
    """This node is marked as going away by this daemon (`ours`: sent just before the command,
    which may fail and still be applied), or was already, by someone else (an operator's
    standby): that mark is left as it is when the event is over."""

    event_id: str
    ours: bool
    # How the drainer set it (its own settings): a reload that removed or changed
    # coordination.pacemaker while the command ran must not make the mark go unrecorded.
    mark: Optional[ClusterMark] = None


@dataclass(frozen=True)
class ClusterDraining:
    """Resources still on this node (or still moving), on change."""

    event_id: str
    resources: tuple[str, ...]


@dataclass(frozen=True)
class ClusterDrained:
    event_id: str


@dataclass(frozen=True)
class ClusterHeld:
    """The cluster may not drain this node (too_few_healthy, no_quorum, node_unknown,
    tool_failed): nothing was marked, or the mark is left for the maintenance."""

    event_id: str
    reason: str
    detail: str = ""


@dataclass(frozen=True)
class ClusterRestored:
    """The node is back (error: it could not be; asked again with backoff). event_id "":
    the mark a previous daemon left was taken off at start."""

    event_id: str
    error: str = ""


@dataclass(frozen=True)
class SlotGranted:
    """This VM holds one of its group's concurrency slots for the event."""

    event_id: str
    # Monotonic: when the request that etcd last acknowledged for the slot's lease (its grant
    # or a keep-alive) was sent; the lease lives at least `ttl` from then. None: now.
    confirmed: Optional[float] = None


@dataclass(frozen=True)
class SlotKept:
    """etcd acknowledged a keep-alive of the slot's lease, sent at `confirmed` (monotonic)."""

    event_id: str
    confirmed: float


@dataclass(frozen=True)
class SlotBusy:
    """Every slot of the group is held, by these VMs (for the log; on change)."""

    event_id: str
    holders: tuple[str, ...]


@dataclass(frozen=True)
class SlotFailed:
    """etcd could not be asked for a slot; the worker asks again on its own."""

    event_id: str
    kind: str
    detail: str


@dataclass(frozen=True)
class Faulted:
    """The daemon caught an exception in a step or an effect (logged with its traceback there)
    and dropped what it was doing; it carries on, and says it is degraded."""

    where: str
    error: str
    dropped: Optional[Message] = None  # what it was handling: what that held is released


Message = Union[
    SlotGranted,
    SlotKept,
    SlotBusy,
    SlotFailed,
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
    Faulted,
    ClusterChecked,
    ClusterMarked,
    ClusterDraining,
    ClusterDrained,
    ClusterHeld,
    ClusterRestored,
]

# ---- effects: what the daemon must do ------------------------------------------------------


@dataclass(frozen=True)
class Fetch:
    """GET the document at monotonic `at` (off the loop; the result comes back as
    DocumentFetched/PollFailed). Ordered with the previous answer, so the loop wakes once a
    poll, not twice; a new order replaces one whose instant has not come."""

    at: float = 0.0


@dataclass(frozen=True)
class CancelFetch:
    """Take back the poll ordered for later, unless it has started (then its answer comes
    back as any other): an approval goes in its place."""


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
    stage: Stage = Stage.BEFORE
    rebooted: bool = False  # this VM booted since the before-hooks started
    # pacemaker: this mark (the daemon's own) is taken off the node first, then the hooks run
    restore: Optional[ClusterMark] = None


@dataclass(frozen=True)
class CancelRuns:
    """SIGTERM each run's process groups (SIGKILL 5 s later); its result says CANCELLED."""

    runs: tuple[int, ...]


@dataclass(frozen=True)
class PostApproval:
    event: Event
    # Monotonic: an event holding a slot must be answered by then, the end of its lease as
    # etcd last confirmed it (an answer proves IMDS had the approval before the slot could
    # go to another VM). The lane does not send it once this has passed (it may have queued
    # behind another POST) and gives up on an answer not back by then.
    deadline: Optional[float] = None


@dataclass(frozen=True)
class Persist:
    events: Known  # only what matters after a restart
    mark: Optional[ClusterMark] = None  # what this daemon set on its cluster node


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
class AcquireSlot:
    """Ask for (or take back, after a restart) one of the group's slots for this event."""

    event: Event
    vm_name: str


@dataclass(frozen=True)
class ReleaseSlot:
    """Give the event's slot back, or stop asking for one."""

    event_id: str


@dataclass(frozen=True)
class CheckCluster:
    """Read the cluster once at start: ClusterChecked comes back."""


@dataclass(frozen=True)
class DrainNode:
    """Mark this node as going away when the cluster can spare it, then watch its resources
    leave: ClusterDraining on change, then ClusterDrained, or ClusterHeld."""

    event: Event
    going: tuple[str, ...]  # the other cluster nodes the event names
    ours: bool = False  # the state file says this daemon marked the node: found so, it is ours


@dataclass(frozen=True)
class StopDraining:
    """Stop watching (the mark stays until RestoreNode)."""

    event_id: str


@dataclass(frozen=True)
class RestoreNode:
    """Take this daemon's mark off this node (event_id "": one no event wants any more, left
    by a previous run, a failed restore or a reload); ClusterRestored comes back."""

    event_id: str
    mark: Optional[ClusterMark] = None


@dataclass(frozen=True)
class WakeAt:
    at: float


@dataclass(frozen=True)
class Exit:
    status: int


Effect = Union[
    CheckCluster,
    DrainNode,
    StopDraining,
    RestoreNode,
    AcquireSlot,
    ReleaseSlot,
    Fetch,
    CancelFetch,
    ResolveName,
    SpawnHooks,
    CancelRuns,
    PostApproval,
    Persist,
    Record,
    Notify,
    UseConfig,
    Coordinate,
    StopCoordinating,
    AskGate,
    WakeAt,
    Exit,
]

# ---- state ---------------------------------------------------------------------------------


NO_FAILURES = Failures()


@dataclass(frozen=True)
class Poll:
    next_at: float = 0.0
    in_flight_since: Optional[float] = None
    scheduled_at: float = 0.0  # the tick the fetch in flight belongs to
    failures: Failures = NO_FAILURES  # one shared (frozen), not one made for every poll
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
class SlotLease:
    """Until when this daemon knows an event's slot is its own: etcd acknowledged its lease's
    grant or keep-alive sent `ttl` before `until`. Unconfirmed: after a restart (or before the
    first grant), the slot is being taken back, and `until` is how long that may take."""

    until: float  # monotonic
    confirmed: bool = True


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
    cancelled: frozenset[int] = frozenset()  # runs we stopped: they did not finish, whatever
    listed: frozenset[str] = frozenset()  # the EventIds of the last document
    poll: Poll = Poll()
    approvals: Approvals = Approvals()
    state_problem: str = ""
    boot_id: str = ""
    watchdog_at: float = 0.0
    status_sent: str = ""
    stopping: Optional[Stopping] = None
    wall_offset: Optional[float] = None  # wall clock minus monotonic, as NotBefore was placed
    peers: Mapping[str, Peers] = field(default_factory=dict)  # COORDINATING events
    coordination: Failures = field(default_factory=Failures)  # etcd or the gate, all events
    strict: bool = False  # tests: a transition the table does not declare raises
    faults: int = 0  # exceptions the daemon caught and survived (a defect: see the journal)
    slot_holders: tuple[str, ...] = ()  # who held the group's slots when one was last refused
    slot_leases: Mapping[str, SlotLease] = field(default_factory=dict)  # HELD slots, by EventId
    sent: tuple[float, ...] = ()  # when the last IMDS requests went out (the rate limit's window)
    cluster_mark: Optional[ClusterMark] = None  # set by this daemon, until taken off: persisted
    cluster_problems: Optional[tuple[str, ...]] = None  # the last check (None: none yet)
    cluster_check_at: float = math.inf  # when the cluster is checked again
    restore_error: str = ""  # the last restore of cluster_mark failed (retried): why


def initial(config: Config, watchdog_usec: Optional[int] = None, *, strict: bool = False) -> State:
    every = None if not watchdog_usec else watchdog_usec / 2_000_000
    return State(config=config, watchdog_every=every, strict=strict)


# ---- the step function ---------------------------------------------------------------------


def step(state: State, message: Message, now: float) -> tuple[State, tuple[Effect, ...]]:
    """Apply one message at monotonic time `now`; returns the new state and what to do.

    A transition the lifecycle table does not declare raises in strict mode (tests); otherwise
    the message is refused whole (`transition_refused`) and the state stays as it was.
    """
    if type(message) is DocumentFetched:
        quiet = _quiet_answer(state, message, now)
        if quiet is not None:
            return quiet
    return full_step(state, message, now)


def _quiet_answer(
    state: State, msg: DocumentFetched, now: float
) -> Optional[tuple[State, tuple[Effect, ...]]]:
    """The same incarnation again, on time, while no timer is due: all a step would do is
    order the next poll, so that is all this does (at rest, at 4 Hz, the walk over every timer
    was most of the daemon's CPU). test_promises checks it equals `full_step` in every history.
    None: take the whole step."""
    wall, offset = msg.wall, state.wall_offset
    if (
        msg.document.incarnation != state.incarnation
        or state.stopping is not None
        or state.poll.failures.count
        or wall is None
        or offset is None
        or abs(wall - now - offset) > CLOCK_STEP
        or next_wakeup(state, now) <= now
        or _others_due(state, now)
    ):
        return None
    out: list[Effect] = []
    new = _order_next_poll(state, now, out)
    out.append(WakeAt(next_wakeup(new, now)))
    return new, tuple(out)


def full_step(state: State, message: Message, now: float) -> tuple[State, tuple[Effect, ...]]:
    """`step` without its shortcut for a quiet answer."""
    out: list[Effect] = []
    refused = False
    try:
        new = _HANDLERS[type(message)](state, message, now, out)
        if type(message) is Faulted:
            new, refused = _timers_after_fault(new, now, out)
        else:
            new = _timers(new, now, out)
        new = _release_slots(state, new, out)
    except IllegalTransitionError as e:
        if state.strict:
            raise
        out = [
            Record(
                Level.ERROR,
                What.TRANSITION_REFUSED,
                {"message": type(message).__name__, "error": str(e)},
            )
        ]
        new = _refused(state, message, now, out)
        refused = True
    changed = new.events is not state.events and _durable_view(new.events) != _durable_view(
        state.events
    )
    changed = changed or new.cluster_mark != state.cluster_mark
    if changed and not any(isinstance(e, Persist) for e in out):
        # Written ahead of any hook it starts, so a crash mid-hook is always known after the
        # restart (hooks_interrupted); written after an approval's POST, which need not wait.
        spawn = [i for i, e in enumerate(out) if isinstance(e, SpawnHooks)]
        out.insert(spawn[0] if spawn else len(out), _persist(new))
    new = _status(new, out)
    if not any(isinstance(e, Exit) for e in out):
        wake = next_wakeup(new, now)
        if refused:  # a due timer that raises is not tried again at once, in a busy loop
            wake = max(wake, now + POLL_BACKOFF_CAP)
        out.append(WakeAt(wake))
    return new, tuple(out)


def _timers_after_fault(state: State, now: float, out: list[Effect]) -> tuple[State, bool]:
    """`_timers` after a fault, whose cause may be a due timer that raises again: then the poll
    is ordered all the same (True: wake no sooner than the poll backoff's cap). Otherwise the
    daemon, which drops a Faulted step that raises, woke at once for ever and never polled."""
    mark = len(out)
    try:
        return _timers(state, now, out), False
    except Exception:  # the daemon logged this defect (internal_error) for the first message
        if state.strict:
            raise
        del out[mark:]
        state = _watchdog(state, now, out)  # it still polls: systemd need not restart it
        if state.ready and state.stopping is None and state.poll.in_flight_since is None:
            state = _order_poll(state, state.poll, now, out)
        return state, True


def _refused(state: State, message: Message, now: float, out: list[Effect]) -> State:
    """A refused message changes nothing, except that what it held is released as for a
    `Faulted` one: a document refused whole once left its poll "in flight" for ever, so no
    poll was ordered again (issue 26 #16). The next poll is ordered here, not by `_timers`,
    whose own due timer may be what raised."""
    state = _faulted(state, Faulted("transition", "", message), now, out)
    if state.ready and state.stopping is None and state.poll.in_flight_since is None:
        state = _order_poll(state, state.poll, now, out)
    return state


def _move(tracked: Tracked, on: On, to: Phase, **changes: Any) -> Tracked:  # noqa: ANN401
    """The one place an event's phase changes: only as `lifecycle.TABLE` declares."""
    check(tracked.phase, on, to)
    return replace(tracked, phase=to, **changes)


def _boot(state: State, msg: Boot, now: float, out: list[Effect]) -> State:
    cfg = state.config
    md = cfg.metadata
    out.append(
        Record(
            Level.INFO,
            What.DAEMON_STARTING,
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
    state = replace(
        state,
        state_problem=msg.state_problem,
        boot_id=msg.boot_id,
        watchdog_at=now,
        listed=frozenset(msg.loaded),  # as last written; the first document says what left
        events={},
        cluster_mark=msg.mark,
    )
    settings = _pacemaker(state)
    if msg.mark is None and msg.mark_unrecorded and settings is not None:
        state = replace(state, cluster_mark=mark_of(settings))
    for event_id, loaded in msg.loaded.items():
        tracked = replace(loaded, run=None)
        rebooted = bool(tracked.boot_id and msg.boot_id and tracked.boot_id != msg.boot_id)
        state, tracked = _restarted(state, tracked, On.REBOOTED if rebooted else On.RESTARTED, out)
        if tracked.slot in (Slot.ASKED, Slot.HELD):  # asked for again; a held one taken back
            if tracked.phase in _SLOT_ENDS:
                tracked = replace(tracked, slot=Slot.NONE)
            else:
                out.append(AcquireSlot(tracked.event, tracked.vm_name or state.vm_name or ""))
                if tracked.slot is Slot.HELD:
                    state = _slot_unconfirmed(state, tracked, now)
        if tracked.phase is Phase.DRAINING:  # marked at most once: the worker finds it set
            out.append(_drain_effect(state, tracked))
            tracked = replace(tracked, start_at=_drain_deadline(state, tracked.event, now))
        state = _with(state, event_id, tracked)
    if _pacemaker(state) is not None:
        out.append(CheckCluster())
    _restore_unwanted(state, out)
    if cfg.vm_name:
        return _name_known(state, NameResolved(cfg.vm_name, "config"), now, out)
    out.append(ResolveName())
    # READY=1 waits for the name, whose first IMDS call may outlast the unit's TimeoutStartSec.
    wait = md.first_call_timeout + md.timeout + STALL_MARGIN
    out.append(Notify({"EXTEND_TIMEOUT_USEC": str(int(wait * 1_000_000))}))
    return replace(state, resolving=True)


def _restarted(state: State, tracked: Tracked, on: On, out: list[Effect]) -> tuple[State, Tracked]:
    """What a restart means for an event the state file kept: its runs died with us."""
    phase = tracked.phase
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
        if tracked.drain is not Drain.NONE and state.cluster_mark is not None:
            out.append(RestoreNode(tracked.event.event_id, state.cluster_mark))
        return state, _move(tracked, on, Phase.OVER)
    if on is On.REBOOTED and _prepared(tracked) and _judged_later(tracked):
        # A crash or an operator's reboot is not the maintenance: only the next document tells
        # (Started or gone: it was; still Scheduled: prepared again).
        return state, _move(tracked, on, Phase.REBOOTED, run=None)
    if on is On.REBOOTED and (_prepared(tracked) or phase is Phase.ENDING):
        # The maintenance happened (it had Started, or left): after-hooks, whether IMDS
        # answers or not.
        out.append(_note(Level.INFO, What.REBOOT_DETECTED, tracked.event, stage="after"))
        return _start_stage(state, tracked, on, Stage.AFTER, out)
    if phase is Phase.ENDING:
        return _start_stage(state, tracked, on, tracked.stage, out)
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
    if phase is Phase.WAITING:  # placed again by the next document (the clock may have jumped)
        return state, _move(tracked, on, phase, start_at=math.inf)
    if phase is Phase.QUEUED:  # its deadline placed again by the next document
        return state, _move(tracked, on, phase, start_at=math.inf)
    return state, _move(tracked, on, phase)


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
        return _start_stage(state, tracked, on, Stage.AFTER, out)
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
    settings = _pacemaker(state)
    if (
        tracked.drain is not Drain.NONE
        and settings is not None
        and settings.drains(event.event_type)
        and event.event_type in state.config.events
    ):
        # Marked before the boot: watched again until drained (the worker finds the mark set).
        out.append(_drain_effect(state, tracked))
        deadline = _drain_deadline(state, event, now)
        return state, _move(tracked, on, Phase.DRAINING, drain=Drain.ASKED, start_at=deadline)
    return _resume(state, tracked, on, now, out)


def _state_warning(problem: str) -> Record:
    return Record(
        Level.WARNING,
        What.STATE_DEGRADED,
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
                Record(
                    Level.WARNING,
                    What.VM_NAME_FALLBACK,
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
            out.append(
                Record(Level.INFO, What.VM_NAME, {"vm_name": msg.name, "source": msg.source})
            )
    state = replace(state, vm_name=msg.name, name_source=msg.source, name_failures=failures)
    if previous and previous.casefold() != msg.name.casefold():
        # Events judged "not ours" under the old name are judged again at the next poll.
        events = dict(state.events)
        for event_id, t in state.events.items():
            if t.phase is Phase.NOT_OURS:
                _move(t, On.RENAMED, Phase.GONE)
                del events[event_id]
        state = replace(state, events=events, incarnation=None)
    if not state.ready:
        state = replace(state, ready=True, poll=replace(state.poll, next_at=now))
        out.append(Notify({"READY": "1", "STATUS": status_text(state)}))
        state = replace(state, status_sent=status_text(state))
    return state


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
    state = replace(state, poll=_answered(poll, state.config, now))
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
        return _replace_waiting(state, now, out, moved)
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
    state = replace(state, incarnation=doc.incarnation)
    if offset is not None:
        jumped = None if state.wall_offset is None else offset - state.wall_offset
        state = replace(state, wall_offset=offset)
        if jumped is not None and abs(jumped) > CLOCK_STEP:  # a step that came with news
            state = _replace_waiting(state, now, out, jumped)
    return _on_document(state, doc, now, out)


def _replace_waiting(
    state: State, now: float, out: list[Effect], moved: Optional[float] = None
) -> State:
    """The clock moved within one document (by `moved` s), or a reload: every timer taken from
    the wall clock is placed again: WAITING events' lead or window, QUEUED events' slot
    deadline, and, after a step, a drain's cap at NotBefore."""
    for event_id, t in state.events.items():
        if t.phase is Phase.WAITING:
            state = _with(state, event_id, _still_waiting(t, state, now, out))
        elif t.phase is Phase.QUEUED and math.isfinite(t.start_at):
            state = _with(state, event_id, replace(t, start_at=_queued_until(t, state, now)))
        elif t.phase is Phase.DRAINING and moved is not None and t.event.not_before is not None:
            state = _with(state, event_id, replace(t, start_at=_drain_moved(state, t, moved)))
    return state


def _drain_moved(state: State, tracked: Tracked, moved: float) -> float:
    """A drain's deadline after the wall clock moved by `moved` s: its cap at NotBefore moves
    on the monotonic clock; drain_timeout counts from when it started and does not. Where the
    cap was what held (within a second), the new cap holds; else the sooner of the two."""
    not_before = tracked.event.not_before
    offset = state.wall_offset
    if not_before is None or offset is None:
        return tracked.start_at
    cap = not_before.timestamp() - offset
    was_cap = not_before.timestamp() - (offset - moved)
    return cap if abs(tracked.start_at - was_cap) <= 1.0 else min(tracked.start_at, cap)


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
            Record(
                Level.ERROR,
                What.IMDS_REJECTED_REQUEST,
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
            Record(
                Level.WARNING,
                What.POLL_FAILED,
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
        if _approval(event, state)[0] is Phase.COORDINATING and _etcd(state):
            # The others stop waiting for us, once `failed` is written: `_coordinate` writes
            # it, again after a failure, until the keys come back (a VM that never writes is
            # waited out the same).
            state = replace(state, peers={**state.peers, event_id: Peers()})
        return _with(state, event_id, _move(tracked, on, Phase.HOOKS_FAILED, run=None))
    phase, note = _approval_of(tracked, state)
    if note is not None:
        out.append(note)
    return _with(state, event_id, _move(tracked, on, phase, run=None))


def _why(detail: str) -> dict[str, str]:
    """A run that ended without any hook's own result (no thread for it, a defect in starting
    its commands) says why in the record, as `hook_failed` says it for a command."""
    return {"error": detail} if detail else {}


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
        restore is None or _drained_for_another(state, tracked.event.event_id)
    ):
        restore = None  # the node stays marked for the other event; restored at its end
        if tracked.drain is Drain.ASKED:  # a mark set after this comes back: _cluster_marked
            out.append(StopDraining(tracked.event.event_id))
        tracked = replace(tracked, drain=Drain.NONE)
    if not hooks:
        if restore is not None:
            out.append(RestoreNode(tracked.event.event_id, restore))
        return _over(state, replace(tracked, stage=stage), on)
    rebooted = bool(tracked.boot_id and state.boot_id and tracked.boot_id != state.boot_id)
    state, run = _spawn(state, tracked, stage, hooks, out, rebooted=rebooted, restore=restore)
    return state, _move(tracked, on, Phase.AFTER, run=run, stage=stage)


def _spawn(
    state: State,
    tracked: Tracked,
    stage: Stage,
    hooks: tuple[str, ...],
    out: list[Effect],
    *,
    rebooted: bool = False,
    restore: Optional[ClusterMark] = None,
) -> tuple[State, int]:
    """Start a hook run for an event, with the name and incarnation it was seen under."""
    state, run = _new_run(state, tracked.event.event_id)
    vm_name = tracked.vm_name or state.vm_name  # a state file of version 1 did not keep it
    incarnation = tracked.incarnation or state.incarnation or 0
    out.append(
        SpawnHooks(run, tracked.event, hooks, incarnation, vm_name, stage, rebooted, restore)
    )
    return state, run


def _new_run(state: State, event_id: str) -> tuple[State, int]:
    """The one allocation of run ids (hooks and gate runs alike)."""
    run = state.next_run
    return replace(state, runs={**state.runs, run: event_id}, next_run=run + 1), run


def _cancel(state: State, runs: tuple[int, ...], out: list[Effect]) -> State:
    """Stop runs; their results will say CANCELLED whatever their exit status."""
    out.append(CancelRuns(runs))
    return replace(state, cancelled=state.cancelled | frozenset(runs))


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
    lease = state.slot_leases.get(msg.event_id)
    answered = msg.answered if msg.answered is not None else now
    return lease is not None and lease.until < answered


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
                What.APPROVAL_FAILED,
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
        state = _without_run(state, dropped.run)
    elif isinstance(dropped, (ApprovalSent, ApprovalFailed)):
        posting = state.approvals.posting - {dropped.event_id}
        state = replace(state, approvals=replace(state.approvals, posting=posting))
    elif isinstance(dropped, NameResolved):
        state = replace(state, resolving=False)
    return state


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
                state, t = _stop_asking(state, t, out)  # noqa: PLW2901
                state = _with(state, event_id, t)
    state = replace(state, config=new)
    state = _cluster_reloaded(state, old, out)
    state = _slots_reloaded(state, old, now, out)
    for event_id, t in state.events.items():
        if t.phase in (Phase.WAITING, Phase.QUEUED) and t.event.event_type not in new.events:
            out.append(
                _unhandled(
                    t.event,
                    f"the reload left no hooks configured for {t.event.event_type}; left alone",
                )
            )
            state = _with(state, event_id, _move(t, On.TYPE_REMOVED, Phase.UNHANDLED))
    state = _replace_waiting(state, now, out)  # windows, lead times may have changed
    if new.metadata != old.metadata:
        # A fixed url/api_version is tried at once, not after the rejected request's backoff
        # nor the old interval: an order whose instant has not come is replaced.
        state = _poll_now(state, now, out)
    if new.vm_name != old.vm_name or (new.metadata != old.metadata and not new.vm_name):
        if new.vm_name:
            state = _name_known(state, NameResolved(new.vm_name, "config"), now, out)
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


def _slots_reloaded(state: State, old: Config, now: float, out: list[Effect]) -> State:
    """A reload that changes `concurrency` or etcd gives the daemon a new slot keeper (the old
    one hands its held slots over): every slot asked for or held is asked for again through
    it, held ones taken back under its own renewed lease, and unconfirmed until then (the new
    keeper may find the slot is no slot any more, e.g. `max` lowered). Without `concurrency`
    any more, held slots are given back (the keeper is gone), and no slot is needed."""
    new = state.config
    if (new.coordination, new.concurrency) == (old.coordination, old.concurrency):
        return state  # the daemon keeps its keeper (the same test as its _use_config)
    etcd = new.coordination.etcd if new.coordination is not None else None
    for event_id, t in state.events.items():
        if t.slot not in (Slot.ASKED, Slot.HELD) or t.phase in _SLOT_ENDS:
            continue
        if new.concurrency is not None and etcd is not None:
            out.append(AcquireSlot(t.event, t.vm_name or state.vm_name or ""))
            if t.slot is Slot.HELD:
                state = _slot_unconfirmed(state, t, now)
        elif t.slot is Slot.HELD:
            out.append(ReleaseSlot(event_id))
            out.append(_note(Level.INFO, What.SLOT_RELEASED, t.event))
            state = _with(state, event_id, replace(t, slot=Slot.NONE))
    return state


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
        state = _without_run(state, tracked.run)
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
    state = _without_run(state, msg.run)
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
        state = _cancel(_without_run(state, tracked.run), (tracked.run,), out)
    elif event_id in state.peers and _etcd(state):
        out.append(StopCoordinating((event_id,)))
    state = _without_peers(state, event_id)
    return state, replace(tracked, run=None)


def _without_run(state: State, run: int) -> State:
    return replace(
        state,
        runs={r: e for r, e in state.runs.items() if r != run},
        cancelled=state.cancelled - {run} if run in state.cancelled else state.cancelled,
    )


def _without_peers(state: State, event_id: str) -> State:
    """The event no longer waits for the other VMs (decided, started or gone)."""
    return replace(state, peers={k: p for k, p in state.peers.items() if k != event_id})


def _etcd(state: State) -> bool:
    return state.config.coordination is not None and state.config.coordination.etcd is not None


def _pacemaker(state: State) -> Optional[Pacemaker]:
    """`cluster.pacemaker` (an older file's `coordination.pacemaker` loads the same)."""
    return state.config.cluster


def _cluster_checked(state: State, msg: ClusterChecked, now: float, out: list[Effect]) -> State:
    """Kept for `status` (which exits 1 while there are problems) and read again every
    CLUSTER_CHECK; logged when it changes."""
    if _pacemaker(state) is None:  # answered after a reload took the section away
        return state
    changed = msg.problems != state.cluster_problems
    state = replace(state, cluster_problems=msg.problems, cluster_check_at=now + CLUSTER_CHECK)
    if not changed:
        return state
    if msg.problems:
        out.append(
            Record(
                Level.ERROR,
                What.CLUSTER_UNREADY,
                {
                    "problems": list(msg.problems),
                    "reason": "until this is fixed, events that drain this node are held (no "
                    "early approval)",
                },
            )
        )
    else:
        out.append(Record(Level.INFO, What.CLUSTER_READY, {}))
    return state


def _recheck_cluster(state: State, now: float, out: list[Effect]) -> State:
    if state.cluster_check_at <= now and _pacemaker(state) is not None:
        out.append(CheckCluster())
        state = replace(state, cluster_check_at=math.inf)  # until ClusterChecked comes back
    return state


def _cluster_reloaded(state: State, old: Config, out: list[Effect]) -> State:
    """A reload may change or remove `cluster.pacemaker`: the cluster is checked again,
    and a mark of ours that no event wants any more is taken off (the old configuration's
    restore stopped with it), the way it was set."""
    settings = _pacemaker(state)
    old_settings = old.cluster
    if settings != old_settings:
        state = replace(state, cluster_problems=None, cluster_check_at=math.inf)
        if settings is not None:
            out.append(CheckCluster())
    _restore_unwanted(state, out)
    return state


def _restore_unwanted(state: State, out: list[Effect]) -> None:
    """This daemon's mark is on the node and no event wants it drained (a restore failed, or
    the daemon stopped before it): take it off, whether pacemaker is still configured or not."""
    mark = state.cluster_mark
    if mark is None or _drained_for_another(state, ""):
        return
    if not any(isinstance(e, RestoreNode) for e in out):
        out.append(RestoreNode("", mark))


def _cluster_marked(state: State, msg: ClusterMarked, now: float, out: list[Effect]) -> State:
    """The mark set (ours) is in the state file from now until it is taken off; one found set
    by someone else is left as it is."""
    settings = _pacemaker(state)
    tracked = state.events.get(msg.event_id)
    mark = msg.mark if msg.mark is not None else mark_of(settings) if settings else None
    if msg.ours and mark is not None:
        state = replace(state, cluster_mark=mark)
        _restore_unwanted(state, out)  # its event ended while the mark was being set
        return state
    if not msg.ours and tracked is not None and state.cluster_mark is None:
        out.append(
            _note(
                Level.INFO,
                What.CLUSTER_DRAINING,
                tracked.event,
                marked_by="someone else",
                reason="this node was already marked as going away (an operator's standby?): "
                "it is left as it is when the event is over",
            )
        )
    return state


def _draining(state: State, event_id: str) -> Optional[Tracked]:
    tracked = state.events.get(event_id)
    return tracked if tracked is not None and tracked.phase is Phase.DRAINING else None


def _cluster_draining(state: State, msg: ClusterDraining, now: float, out: list[Effect]) -> State:
    tracked = _draining(state, msg.event_id)
    if tracked is not None:
        out.append(
            _note(Level.INFO, What.CLUSTER_DRAINING, tracked.event, resources=list(msg.resources))
        )
    return state


def _cluster_drained(state: State, msg: ClusterDrained, now: float, out: list[Effect]) -> State:
    tracked = _draining(state, msg.event_id)
    if tracked is None:
        return state
    out.append(_note(Level.INFO, What.CLUSTER_DRAINED, tracked.event))
    state, tracked = _before_hooks(state, replace(tracked, drain=Drain.DONE), On.DRAINED, now, out)
    return _with(state, msg.event_id, tracked)


def _cluster_held(state: State, msg: ClusterHeld, now: float, out: list[Effect]) -> State:
    tracked = _draining(state, msg.event_id)
    if tracked is None:
        return state
    state, tracked = _hold(state, tracked, msg.reason, msg.detail, now, out)
    return _with(state, msg.event_id, tracked)


def _hold(  # noqa: PLR0917 - the reason and its detail, beside the usual four
    state: State, tracked: Tracked, reason: str, detail: str, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """The cluster cannot spare this node: its before-hooks run, and it is not approved early;
    whatever was marked stays for the maintenance and is restored once the event is over."""
    out.append(
        _note(
            Level.WARNING,
            What.CLUSTER_HOLD,
            tracked.event,
            reason=reason,
            error=detail or None,
        )
    )
    return _before_hooks(state, replace(tracked, drain=Drain.HELD), On.DRAIN_HELD, now, out)


def _cluster_restored(state: State, msg: ClusterRestored, now: float, out: list[Effect]) -> State:
    tracked = state.events.get(msg.event_id)
    event_fields_ = {} if tracked is None else event_fields(tracked.event)
    if msg.error:
        out.append(
            Record(
                Level.ERROR,
                What.CLUSTER_RESTORE_FAILED,
                {**event_fields_, "error": msg.error, "reason": "asked again until it works"},
            )
        )
        return replace(state, restore_error=msg.error) if state.cluster_mark else state
    # The node is back: no event that is over holds a mark any more.
    state = replace(
        state,
        cluster_mark=None,
        restore_error="",
        events={
            k: replace(t, drain=Drain.NONE)
            if t.drain is not Drain.NONE and t.phase in (Phase.AFTER, Phase.OVER)
            else t
            for k, t in state.events.items()
        },
    )
    out.append(
        Record(
            Level.INFO,
            What.CLUSTER_RESTORED,
            event_fields_ or {"reason": "this daemon's mark, which no event wants any more"},
        )
    )
    if tracked is not None and tracked.drain is not Drain.NONE:
        state = _with(state, msg.event_id, replace(tracked, drain=Drain.NONE))
    return state


def _drained_for_another(state: State, event_id: str) -> bool:
    return any(
        t.drain is not Drain.NONE and k != event_id and t.phase not in (Phase.AFTER, Phase.OVER)
        for k, t in state.events.items()
    )


def _drain_deadline(state: State, event: Event, now: float) -> float:
    """drain_timeout from now, and never past NotBefore: its before-hooks still need to run."""
    settings = _pacemaker(state)
    deadline = now + (settings.drain_timeout if settings is not None else 0.0)
    if event.not_before is not None and state.wall_offset is not None:
        deadline = min(deadline, event.not_before.timestamp() - state.wall_offset)
    return deadline


def _drain_effect(state: State, tracked: Tracked) -> DrainNode:
    settings = _pacemaker(state)
    me = (tracked.vm_name or state.vm_name).casefold()
    going = tuple(
        settings.node_of(r) if settings is not None else r
        for r in tracked.event.resources
        if r.casefold() != me
    )
    return DrainNode(tracked.event, going, ours=state.cluster_mark is not None)


def _drain_timeouts(state: State, now: float, out: list[Effect]) -> State:
    for event_id, t in state.events.items():
        if t.phase is Phase.DRAINING and t.start_at <= now:
            out.append(StopDraining(event_id))
            settings = _pacemaker(state)
            timeout = settings.drain_timeout if settings is not None else 0
            state, tracked = _hold(
                state,
                t,
                "drain_timeout",
                f"resources still on this node after {timeout:g} s (or at NotBefore)",
                now,
                out,
            )
            state = _with(state, event_id, tracked)
    return state


def _slot_granted(state: State, msg: SlotGranted, now: float, out: list[Effect]) -> State:
    tracked = state.events.get(msg.event_id)
    if tracked is None or tracked.slot not in (Slot.ASKED, Slot.HELD):
        out.append(ReleaseSlot(msg.event_id))  # it went meanwhile, or gave up waiting
        return state
    group = state.config.concurrency.group if state.config.concurrency else None
    back = tracked.slot is Slot.HELD  # after a restart: the slot it held, under a new lease
    out.append(_note(Level.INFO, What.SLOT_ACQUIRED, tracked.event, group=group, taken_back=back))
    tracked = replace(tracked, slot=Slot.HELD)
    confirmed = now if msg.confirmed is None else msg.confirmed
    state = _slot_confirmed(state, msg.event_id, confirmed)
    if tracked.phase is not Phase.QUEUED:
        return _with(state, msg.event_id, tracked)
    state, tracked = _prepare(state, tracked, On.SLOT, now, out)
    return _with(state, msg.event_id, tracked)


def _slot_busy(state: State, msg: SlotBusy, now: float, out: list[Effect]) -> State:
    tracked = state.events.get(msg.event_id)
    if tracked is None:
        return state
    state = replace(state, slot_holders=msg.holders)
    if tracked.phase is Phase.QUEUED:
        out.append(_slot_waiting(tracked.event, tracked.start_at, msg.holders, state))
        if tracked.slot is Slot.HELD:  # not taken back (another VM's now): asked for anew
            leases = {k: v for k, v in state.slot_leases.items() if k != msg.event_id}
            state = replace(state, slot_leases=leases)
            tracked = replace(tracked, slot=Slot.ASKED)
            state = _with(state, msg.event_id, tracked)
        return _no_grace(state, tracked, now)
    if tracked.slot is Slot.HELD and tracked.phase in (Phase.INTERRUPTED, Phase.REBOOTED):
        # Its slot went to another VM while the daemon was down, before its before-hooks ran
        # again: asked for anew, they wait in the queue (`_prepare`).
        leases = {k: v for k, v in state.slot_leases.items() if k != msg.event_id}
        state = replace(state, slot_leases=leases)
        return _with(state, msg.event_id, replace(tracked, slot=Slot.ASKED))
    if tracked.slot is Slot.HELD:  # after a restart its slot had gone to another VM
        out.append(
            _note(
                Level.WARNING,
                What.SLOT_UNAVAILABLE,
                tracked.event,
                holders=list(msg.holders),
                reason="its slot was lost while the daemon was down: not approved early",
            )
        )
        out.append(ReleaseSlot(msg.event_id))
        return _with(state, msg.event_id, replace(tracked, slot=Slot.MISSING))
    return state


def _slot_kept(state: State, msg: SlotKept, now: float, out: list[Effect]) -> State:
    tracked = state.events.get(msg.event_id)
    lease = state.slot_leases.get(msg.event_id)
    if tracked is None or tracked.slot is not Slot.HELD or lease is None or not lease.confirmed:
        return state  # lost meanwhile, or not taken back yet (SlotGranted says so first)
    return _slot_confirmed(state, msg.event_id, msg.confirmed)


def _slot_confirmed(state: State, event_id: str, confirmed: float) -> State:
    """The slot is ours for `ttl` from when etcd's acknowledged request was sent."""
    concurrency = state.config.concurrency
    ttl = concurrency.ttl if concurrency is not None else 0
    lease = state.slot_leases.get(event_id)
    until = confirmed + ttl
    if lease is not None and lease.confirmed and lease.until >= until:
        return state
    return replace(state, slot_leases={**state.slot_leases, event_id: SlotLease(until)})


def _slot_unconfirmed(state: State, tracked: Tracked, now: float) -> State:
    """A held slot asked for again (a restart, a reload): no early approval until etcd says
    it is still ours, and lost if that takes longer than `ttl`."""
    concurrency = state.config.concurrency
    ttl = concurrency.ttl if concurrency is not None else 0
    lease = SlotLease(now + ttl, confirmed=False)
    return replace(state, slot_leases={**state.slot_leases, tracked.event.event_id: lease})


def _slot_failed(state: State, msg: SlotFailed, now: float, out: list[Effect]) -> State:
    tracked = state.events.get(msg.event_id)
    if tracked is None or tracked.slot not in (Slot.ASKED, Slot.HELD):
        return state
    out.append(
        _note(
            Level.WARNING,
            What.SLOT_FAILED,
            tracked.event,
            kind=msg.kind,
            error=msg.detail[:300],
            reason="etcd could not be asked for a slot; asked again; without one by the "
            "deadline its hooks start and it is not approved early",
        )
    )
    return _no_grace(state, tracked, now) if tracked.phase is Phase.QUEUED else state


def _no_grace(state: State, tracked: Tracked, now: float) -> State:
    """Past its lead, a queued event waits only for etcd's answer (SLOT_GRACE): an answer
    that gives no slot (every one taken, etcd unreachable) starts its hooks now, without one."""
    rule = state.config.events.get(tracked.event.event_type, EventRule())
    lead_at = _slot_deadline(tracked.event, rule, state)
    if lead_at is None or lead_at > now or tracked.start_at <= now:
        return state
    return _with(state, tracked.event.event_id, replace(tracked, start_at=now))


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
    Faulted: _faulted,
    SlotGranted: _slot_granted,
    SlotKept: _slot_kept,
    SlotBusy: _slot_busy,
    SlotFailed: _slot_failed,
    ClusterChecked: _cluster_checked,
    ClusterMarked: _cluster_marked,
    ClusterDraining: _cluster_draining,
    ClusterDrained: _cluster_drained,
    ClusterHeld: _cluster_held,
    ClusterRestored: _cluster_restored,
}


# ---- timers --------------------------------------------------------------------------------


def _timers(state: State, now: float, out: list[Effect]) -> State:
    """Start whatever is due; runs after every message, so no timer waits for a Tick."""
    state = _watchdog(state, now, out)
    if state.stopping is not None:
        return _shutdown(state, now, out)
    state = _slots_lost(state, now, out)
    state = _start_waiting(state, now, out)
    state = _drain_timeouts(state, now, out)
    state = _recheck_cluster(state, now, out)
    state = _coordinate(state, now, out)
    state = _make_room(state, now, out)
    state = _retry_approvals(state, now, out)
    if _name_due(state, now) and _allowed_at(state, now) <= now:
        out.append(ResolveName())
        state = replace(_spend(state, now), resolving=True)
    if state.ready and state.poll.in_flight_since is None and not _others_due(state, now):
        state = _order_poll(state, state.poll, now, out)
    return state


def _make_room(state: State, now: float, out: list[Effect]) -> State:
    """An approval or a name lookup that is due goes first: a poll ordered for later is taken
    back, and none is ordered until it has gone (`_timers`). At 4 Hz the polls alone fill IMDS'
    5 requests a second; an approval that waited for room among them queued behind them
    (measured: 10 s at p50 with an event a second). Polls then start from where the limit put
    them, so each approval costs the polls one slot, not a tick of delay for ever after."""
    if _pending_poll(state, now) is None or not _others_due(state, now):
        return state
    return _take_back(state, out)


def _others_due(state: State, now: float) -> bool:
    """An approval or a name lookup waits for its turn (not for a retry's backoff)."""
    posting, failures = state.approvals.posting, state.approvals.failures
    return _name_due(state, now) or any(
        t.phase is Phase.APPROVING
        and event_id not in posting
        and now >= failures.get(event_id, NO_FAILURES).retry_at
        and not _slot_pending(state, event_id, now)
        for event_id, t in state.events.items()
    )


def _name_due(state: State, now: float) -> bool:
    return (
        state.name_source == "hostname"
        and not state.resolving
        and now >= state.name_failures.retry_at
    )


def _pending_poll(state: State, now: float) -> Optional[float]:
    """The instant of a poll ordered for later, if it can still be taken back (one due within
    TAKE_BACK may be under way already)."""
    ordered = state.poll.in_flight_since
    return ordered if ordered is not None and ordered > now + TAKE_BACK else None


def _take_back(state: State, out: list[Effect]) -> State:
    """The ordered poll is cancelled and no longer counts against the rate limit."""
    ordered = state.poll.in_flight_since
    out.append(CancelFetch())
    sent = tuple(t for t in state.sent if t != ordered)
    return replace(state, sent=sent, poll=replace(state.poll, in_flight_since=None))


def _answered(poll: Poll, config: Config, now: float) -> Poll:
    return Poll(next_at=_next_tick(poll, config, now), last="ok")


def _next_tick(poll: Poll, config: Config, now: float) -> float:
    """After an answer: the next poll is due one interval after the last one's start (on the
    monotonic clock: a late poll skips ticks instead of drifting)."""
    interval = config.metadata.poll_interval
    base = poll.scheduled_at
    return base + interval * (max(0, int((now - base) // interval)) + 1)


def _order_next_poll(state: State, now: float, out: list[Effect]) -> State:
    """`_answered` and `_order_poll` for the quick path, building one Poll and one State: at
    rest that is the whole of a step."""
    next_at = _next_tick(state.poll, state.config, now)
    at = _poll_instant(state, next_at, now, out)
    poll = Poll(next_at=next_at, in_flight_since=at, scheduled_at=at, last="ok")
    return replace(state, poll=poll, sent=_spent(state.sent, now, at))


def _order_poll(state: State, poll: Poll, now: float, out: list[Effect]) -> State:
    """The first poll, the next after a failure, or one moved behind an approval."""
    at = _poll_instant(state, poll.next_at, now, out)
    poll = replace(poll, in_flight_since=at, scheduled_at=at)
    return replace(state, poll=poll, sent=_spent(state.sent, now, at))


def _poll_instant(state: State, next_at: float, now: float, out: list[Effect]) -> float:
    """The poll is ordered for its instant or when the rate limit allows, whichever is later."""
    at = max(now, next_at)
    at = max(at, _allowed_at(state, at))
    out.append(Fetch(at))
    return at


def _poll_now(state: State, now: float, out: list[Effect]) -> State:
    """Poll at once: a poll ordered for later is taken back (the lane replaces it), one under
    way is left to end."""
    if _pending_poll(state, now) is not None:
        state = _take_back(state, out)
    return replace(state, poll=replace(state.poll, next_at=now, rejected=""))


def _allowed_at(state: State, now: float, sent: Optional[tuple[float, ...]] = None) -> float:
    """When the next IMDS request fits in the rate limit (`now` if it does now)."""
    recent = [t for t in (state.sent if sent is None else sent) if t > now - RATE_WINDOW]
    if len(recent) < IMDS_RATE:
        return now
    return recent[len(recent) - IMDS_RATE] + RATE_WINDOW


def _allowed_first(state: State, now: float) -> float:
    """When a request that goes before an ordered poll (`_make_room`) fits in the rate limit."""
    ordered = _pending_poll(state, now)
    if ordered is None:
        return _allowed_at(state, now)
    return _allowed_at(state, now, tuple(t for t in state.sent if t != ordered))


def _spend(state: State, now: float) -> State:
    return replace(state, sent=_spent(state.sent, now, now))


def _spent(sent: tuple[float, ...], now: float, at: float) -> tuple[float, ...]:
    """The requests of the rate limit's window and one more `at` (a poll is ordered for its
    instant); in order, so a poll's future slot counts against an approval sent before it."""
    recent = [t for t in sent if t > now - RATE_WINDOW]
    bisect.insort(recent, at)
    return tuple(recent)


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
        else:
            state, run = _new_run(state, event_id)
            out.append(AskGate(run, t.event, t.incarnation, vm_name))
            state = _with(state, event_id, replace(t, run=run))
        state = replace(state, peers={**state.peers, event_id: replace(peers, asking=True)})
    return state


# Phases in which an event may still be approved early: a slot lost then means it is not.
_BEFORE_APPROVAL = frozenset(
    {Phase.DRAINING, Phase.RUNNING, Phase.INTERRUPTED, Phase.COORDINATING, Phase.APPROVING}
)


def _slots_lost(state: State, now: float, out: list[Effect]) -> State:
    """A slot etcd has not confirmed for `ttl` may be another VM's by now (its lease expired
    in a partition, or was not taken back after a restart): its event is not approved early.
    Counted from the last acknowledged keep-alive on the monotonic clock, not from when a
    failure is noticed (a keep-alive that hangs would notice it late). Hooks go on; an
    approval already under way is judged when it ends. After the approval the slot is kept
    asked for: it guards the undrain, and etcd says if it went (SlotBusy)."""
    for event_id, lease in list(state.slot_leases.items()):
        t = state.events.get(event_id)
        if t is None or t.slot is not Slot.HELD:  # over, given back, or lost otherwise
            leases = {k: v for k, v in state.slot_leases.items() if k != event_id}
            state = replace(state, slot_leases=leases)
        elif (
            lease.until <= now
            and t.phase in _BEFORE_APPROVAL
            and event_id not in state.approvals.posting
        ):
            state = _slot_lost(state, t, lease, out)
    for event_id, t in state.events.items():
        # Lost by any path (the timer above, etcd saying the lease expired or the slot is
        # another VM's) once the event had been decided: an approval not sent is never sent.
        if (
            t.slot is Slot.MISSING
            and t.phase in (Phase.COORDINATING, Phase.APPROVING)
            and event_id not in state.approvals.posting
        ):
            state = _not_approved_without_slot(state, t, out)
    return state


def _slot_lost(state: State, t: Tracked, lease: SlotLease, out: list[Effect]) -> State:
    event_id = t.event.event_id
    # An approval sent and given up unanswered at the lease's end (PostApproval.deadline) may
    # still reach IMDS late: said, not hidden.
    unanswered = state.approvals.failures.get(event_id, NO_FAILURES).kind == "timeout"
    out.append(
        _note(
            Level.WARNING,
            What.SLOT_LOST,
            t.event,
            reason="etcd did not confirm the slot within its ttl (its lease may have expired)"
            if lease.confirmed
            else "the slot was not taken back within its ttl after the restart",
            **({"approval": "unanswered"} if unanswered else {}),
        )
    )
    out.append(
        _note(
            Level.WARNING,
            What.SLOT_UNAVAILABLE,
            t.event,
            reason="its slot was lost: its hooks go on, and it is not approved early (it "
            "proceeds at NotBefore)",
        )
    )
    out.append(ReleaseSlot(event_id))
    leases = {k: v for k, v in state.slot_leases.items() if k != event_id}
    state = replace(state, slot_leases=leases)
    return _with(state, event_id, replace(t, slot=Slot.MISSING))


def _not_approved_without_slot(state: State, t: Tracked, out: list[Effect]) -> State:
    """A shared event waiting for its peers, or an approval not sent yet, whose slot went.
    A shared event's `ready` in etcd is taken back (`failed`: nobody approves it early), or
    another VM could approve, for this one too, once every VM said ready."""
    if t.phase is Phase.COORDINATING:
        state, t = _stop_asking(state, t, out)
        if _etcd(state):
            out.append(Coordinate(t.event, t.vm_name or state.vm_name, False, t.incarnation))
    out.append(
        _note(
            Level.WARNING,
            What.EVENT_NOT_APPROVED,
            t.event,
            cause=Cause.SLOT_UNAVAILABLE.value,
            reason="its concurrency slot was lost: it proceeds at NotBefore",
        )
    )
    return _with(state, t.event.event_id, _move(t, On.SLOT_LOST, Phase.NOT_APPROVED))


def _slot_pending(state: State, event_id: str, now: float) -> bool:
    """A held slot being taken back, or confirmed for less than SLOT_MARGIN more: its event's
    approval waits for etcd's next answer (or is lost at the lease's end)."""
    lease = state.slot_leases.get(event_id)
    return lease is not None and (not lease.confirmed or lease.until - now < SLOT_MARGIN)


def _start_waiting(state: State, now: float, out: list[Effect]) -> State:
    """Events whose lead time has come start their before-hooks (RUNNING is written first)."""
    for event_id, t in state.events.items():
        if t.phase not in (Phase.WAITING, Phase.QUEUED) or t.start_at > now:
            continue
        if t.phase is Phase.QUEUED:  # no slot by its deadline: prepare anyway, no early approval
            out.append(ReleaseSlot(event_id))
            out.append(
                _note(
                    Level.WARNING,
                    What.SLOT_UNAVAILABLE,
                    t.event,
                    reason="no concurrency slot by its deadline: its hooks start now, and it "
                    "is not approved early (it proceeds at NotBefore)",
                )
            )
            t = replace(t, slot=Slot.MISSING)  # noqa: PLW2901
        if t.event.event_type not in state.config.events:
            continue  # a reload removed it (handled there); never an empty run by accident
        state, tracked = _prepare(state, t, On.LEAD_TIME, now, out)
        state = _with(state, event_id, tracked)
    return state


def _retry_approvals(state: State, now: float, out: list[Effect]) -> State:
    approvals = state.approvals
    due = [
        t.event
        for event_id, t in state.events.items()
        if t.phase is Phase.APPROVING
        and event_id not in approvals.posting
        and now >= approvals.failures.get(event_id, Failures()).retry_at
        and not _slot_pending(state, event_id, now)
    ]
    posting = set()
    for event in due:
        if _allowed_at(state, now) > now:
            break  # the rest when the rate limit allows (next_wakeup)
        lease = state.slot_leases.get(event.event_id)
        out.append(PostApproval(event, lease.until if lease is not None else None))
        state = _spend(state, now)
        posting.add(event.event_id)
    if posting:
        state = replace(
            state, approvals=replace(state.approvals, posting=approvals.posting | posting)
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
    state = _retry_approvals(state, now, out)
    if not state.runs and not state.approvals.posting:
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
            state = _cancel(state, tuple(sorted(state.runs)), out)
        return replace(state, stopping=replace(stopping, kill_until=now + KILL_WAIT))
    if stopping.kill_until is not None and now >= stopping.kill_until:
        return _exit(state, out)
    return state


def _exit(state: State, out: list[Effect]) -> State:
    out.append(_persist(state))
    out.append(Record(Level.INFO, What.DAEMON_STOPPED, {}))
    out.append(Exit(0))
    return state


def next_wakeup(state: State, now: float) -> float:  # noqa: PLR0912 - one branch per timer
    """The earliest instant a timer of this state is due (never in the past)."""
    times: list[float] = []
    allowed = _allowed_first(state, now)  # none is due before the rate limit allows it
    if state.watchdog_every is not None:
        times.append(state.watchdog_at)
    if state.stopping is not None:
        s = state.stopping
        times.append(s.kill_until if s.kill_until is not None else s.grace_until)
    else:
        if state.ready and state.poll.in_flight_since is None:
            times.append(max(state.poll.next_at, allowed))
        if state.name_source == "hostname" and not state.resolving:
            times.append(max(state.name_failures.retry_at, allowed))
        md = state.config.metadata
        if state.poll.in_flight_since is not None and state.watchdog_every is not None:
            times.append(
                state.poll.in_flight_since + md.first_call_timeout + md.timeout + STALL_MARGIN
            )
    if state.stopping is None:
        times.append(state.cluster_check_at)
    for event_id, t in state.events.items():
        phase = t.phase
        if phase is Phase.NOT_OURS:  # most of them under churn, and never a timer
            continue
        if (
            phase is Phase.APPROVING
            and event_id not in state.approvals.posting
            and not _slot_pending(state, event_id, now)
        ):
            times.append(max(state.approvals.failures.get(event_id, Failures()).retry_at, allowed))
        lease = state.slot_leases.get(event_id)
        if lease is not None and phase in _BEFORE_APPROVAL:
            times.append(lease.until)
        if phase in (Phase.WAITING, Phase.QUEUED, Phase.DRAINING) and state.stopping is None:
            times.append(t.start_at)
        peers = state.peers.get(event_id)
        announce = phase is Phase.HOOKS_FAILED and peers is not None
        if (phase is Phase.COORDINATING or announce) and state.stopping is None:
            if peers is None:
                times.append(now)
            elif not peers.asking:
                times.append(peers.next_at)
    due = [t for t in times if math.isfinite(t)]  # an event waiting for a document is not
    return max(now, min(due)) if due else now + 3600.0


# ---- the events of a document --------------------------------------------------------------


def _on_document(state: State, doc: Document, now: float, out: list[Effect]) -> State:
    """Compare a new document with what we know; events that left it are over or cancelled."""
    listed = frozenset(e.event_id for e in doc.events)
    state = replace(state, listed=listed)
    known = state.events
    events: dict[str, Tracked] = {}
    for event in doc.events:
        before = known.get(event.event_id)
        if before is not None and before.event.resources != event.resources:
            state, before = _resources_changed(state, before, event, out)
        if before is None:
            state, tracked = _first_sight(event, state, doc.incarnation, now, out)
        elif before.phase is Phase.NOT_OURS:
            tracked = before if before.event == event else replace(before, event=event)
        elif not event.names(before.vm_name or state.vm_name):
            tracked = before  # it dropped this VM: its stage runs with the event that named it
        else:
            state, tracked = _listed(state, before, event, doc.incarnation, now, out)
        if tracked.phase is not Phase.GONE:
            events[event.event_id] = tracked
    for event_id, gone in known.items():
        if event_id not in listed:
            state, tracked = _left(state, gone, out)
            if tracked.phase is not Phase.GONE:
                events[event_id] = tracked
    state = replace(state, events=events)
    failures = {k: f for k, f in state.approvals.failures.items() if k in state.events}
    return replace(state, approvals=replace(state.approvals, failures=failures))


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
    if before.phase is Phase.REBOOTED:  # not `_left`: gone after a boot proves the maintenance
        # No longer naming this VM proves nothing of that boot (what is listed now is another
        # VM's): cancelled-hooks, as without a boot.
        stage = Stage.CANCELLED
        fields = {"phase": before.phase.value, "stage": stage.value}
        out.append(_note(Level.WARNING, What.EVENT_CANCELLED, before.event, **fields))
        state, tracked = _start_stage(state, before, On.LEFT, stage, out)
    else:
        state, tracked = _left(state, before, out)
    return state, None if tracked.phase is Phase.GONE else tracked


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
    phase = tracked.phase
    if phase in (Phase.WAITING, Phase.QUEUED):
        if on is On.STARTED:
            waited = "their lead time" if phase is Phase.WAITING else "a concurrency slot"
            out.append(
                _note(
                    Level.WARNING,
                    What.EVENT_MISSED,
                    event,
                    reason=f"it started while its hooks waited for {waited}",
                )
            )
            return state, _move(tracked, on, Phase.MISSED)
        if phase is Phase.WAITING:
            return state, _move(_still_waiting(tracked, state, now, out), on, phase)
        return state, _move(tracked, on, phase, start_at=_queued_until(tracked, state, now))
    if phase is Phase.INTERRUPTED:
        return _resume(state, tracked, on, now, out)
    if phase is Phase.REBOOTED:
        return _judge_reboot(state, tracked, on, now, out)
    if on is On.STARTED and phase in (Phase.APPROVING, Phase.COORDINATING, Phase.DRAINING):
        if phase is Phase.COORDINATING:
            state, tracked = _stop_asking(state, tracked, out)
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
    return _prepare(state, tracked, on, now, out)


def _decide(state: State, tracked: Tracked, on: On, out: list[Effect]) -> Tracked:
    phase, note = _approval_of(tracked, state)
    if note is not None:
        out.append(note)
    return _move(tracked, on, phase)


def _left(state: State, gone: Tracked, out: list[Effect]) -> tuple[State, Tracked]:
    """An event that left the document: over if it had started or we approved it, else
    cancelled by Azure. Hooks still running for it are stopped first (ENDING); then its after-
    or cancelled-hooks run (kept until they end)."""
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
        return _start_stage(state, gone, on, Stage.AFTER, out)
    if phase is Phase.COORDINATING or gone.event.event_id in state.peers:
        state, gone = _stop_asking(state, gone, out)
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
                reason="it left the document; its hooks are stopped",
            )
        )
        out.append(_note(level, what, gone.event, phase=phase.value, stage=stage.value))
        state = _cancel(state, (gone.run,), out)
        return state, _move(gone, on, Phase.ENDING, stage=stage)
    out.append(_note(level, what, gone.event, phase=phase.value, stage=stage.value))
    return _start_stage(state, gone, on, stage, out)


def _first_sight(
    event: Event, state: State, incarnation: int, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    new = Tracked(
        event, Phase.NEW, boot_id=state.boot_id, vm_name=state.vm_name, incarnation=incarnation
    )
    on = On.SEEN
    vm_name = state.vm_name
    if not event.names(vm_name):
        out.append(
            _note(Level.INFO, What.EVENT_IGNORED, event, reason="not for this VM", vm_name=vm_name)
        )
        return state, _move(new, on, Phase.NOT_OURS)
    out.append(_note(Level.INFO, What.EVENT_DETECTED, event))
    if event.status == STARTED:
        out.append(
            _note(
                Level.WARNING,
                What.EVENT_MISSED,
                event,
                reason="first seen already Started; no hooks run",
            )
        )
        return state, _move(new, on, Phase.MISSED)
    if event.status != SCHEDULED:
        out.append(_unhandled(event, f"unknown status {event.status!r}"))
        return state, _move(new, on, Phase.UNHANDLED)
    rule = state.config.events.get(event.event_type)
    if rule is None:
        out.append(_unhandled(event, f"no hooks configured for {event.event_type}; left alone"))
        return state, _move(new, on, Phase.UNHANDLED)
    decided = _rule(event, rule, state, out)
    if decided is not None:
        phase, why = decided
        return state, _move(new, on, phase, rule=why)
    held = _start_at(event, rule, state, now)
    if held is not None:
        out.append(_waiting(event, rule, held, state))
        return state, _move(new, on, Phase.WAITING, start_at=held.at)
    return _prepare(state, new, on, now, out)


def _prepare(
    state: State, tracked: Tracked, on: On, now: float, out: list[Effect]
) -> tuple[State, Tracked]:
    """Start the before-stage: `fast` instead of `before` when fewer than `fast_below` seconds
    are left; with no hooks to run, approval per policy at once."""
    event = tracked.event
    rule = state.config.events.get(event.event_type, EventRule())
    if _slot_awaited(state, tracked):
        # After a restart or a crash its slot may be another VM's by now: the hooks wait in
        # the queue until it is taken back (or lost, then granted), or until the lead, as any
        # queued event (`max` counts VMs from before-hooks start).
        deadline = _slot_deadline(event, rule, state)
        if deadline is not None and now < deadline + SLOT_GRACE:  # etcd's answer, at the lead
            deadline = max(deadline, now + SLOT_GRACE)
            out.append(_slot_waiting(event, deadline, state.slot_holders, state))
            return state, _move(tracked, on, Phase.QUEUED, start_at=deadline)
        if tracked.slot is Slot.ASKED:  # past its lead: prepared without it
            out.append(ReleaseSlot(event.event_id))
            tracked = replace(tracked, slot=Slot.NONE)
    if _needs_slot(state, tracked):
        deadline = _slot_deadline(event, rule, state)
        if deadline is not None and now < deadline + SLOT_GRACE:  # at the lead itself, too
            deadline = max(deadline, now + SLOT_GRACE)
            out.append(AcquireSlot(event, tracked.vm_name or state.vm_name or ""))
            out.append(_slot_waiting(event, deadline, (), state))
            return state, _move(tracked, on, Phase.QUEUED, slot=Slot.ASKED, start_at=deadline)
        out.append(
            _note(
                Level.WARNING,
                What.SLOT_UNAVAILABLE,
                event,
                reason="too close to NotBefore to wait for a concurrency slot: its hooks start "
                "now, and it is not approved early",
            )
        )
        tracked = replace(tracked, slot=Slot.MISSING)
    settings = _pacemaker(state)
    if settings is not None and settings.drains(event.event_type) and tracked.drain is Drain.NONE:
        out.append(_drain_effect(state, tracked))
        out.append(
            _note(
                Level.INFO,
                What.CLUSTER_DRAINING,
                event,
                method=settings.method.value,
                reason="this node is marked as going away once the cluster can spare it",
            )
        )
        deadline = _drain_deadline(state, event, now)
        return state, _move(tracked, on, Phase.DRAINING, drain=Drain.ASKED, start_at=deadline)
    return _before_hooks(state, tracked, on, now, out)


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
        return state, _decide(state, replace(tracked, start_at=0.0), on, out)
    state, run = _spawn(state, tracked, Stage.BEFORE, hooks, out)
    return state, _move(tracked, on, Phase.RUNNING, run=run, start_at=0.0)


def _slot_awaited(state: State, tracked: Tracked) -> bool:
    """A slot asked for and not granted, or held before a restart and not confirmed by etcd
    since (being taken back)."""
    lease = state.slot_leases.get(tracked.event.event_id)
    taking_back = tracked.slot is Slot.HELD and lease is not None and not lease.confirmed
    return taking_back or tracked.slot is Slot.ASKED


def _needs_slot(state: State, tracked: Tracked) -> bool:
    """Concurrency slots bound early maintenance: the types that obey windows (planned
    maintenance), once per event (not again once held, given up or missed)."""
    concurrency = state.config.concurrency
    rule = state.config.events.get(tracked.event.event_type)
    if concurrency is None or rule is None or not rule.obeys_windows(tracked.event.event_type):
        return False
    return tracked.slot is Slot.NONE


def _slot_deadline(event: Event, rule: EventRule, state: State) -> Optional[float]:
    """The monotonic instant its hooks start without a slot: its lead before NotBefore (a slot
    asked for at the lead or later gets SLOT_GRACE from then). None: no NotBefore, or no clock
    yet (no time to wait)."""
    if event.not_before is None or state.wall_offset is None:
        return None
    return event.not_before.timestamp() - lead(rule) - state.wall_offset


def _queued_until(tracked: Tracked, state: State, now: float) -> float:
    """A queued event's slot deadline placed again (a document, a clock step, a reload): its
    lead before NotBefore as the wall clock now says, but never less than SLOT_GRACE after the
    slot was asked (`start_at` keeps that instant, so a document does not push it on; inf after
    a restart: the grace counts from now). Now, with no NotBefore or clock."""
    rule = state.config.events.get(tracked.event.event_type, EventRule())
    deadline = _slot_deadline(tracked.event, rule, state)
    if deadline is None:
        return now
    return max(deadline, min(tracked.start_at, now + SLOT_GRACE))


def _slot_waiting(event: Event, deadline: float, holders: tuple[str, ...], state: State) -> Record:
    """`deadline` is inf after a restart until the next document places it: no instant then
    (fromtimestamp(inf) raised OverflowError: internal_error, holders never recorded)."""
    wall = deadline + (state.wall_offset or 0.0)
    concurrency = state.config.concurrency
    return _note(
        Level.INFO,
        What.EVENT_WAITING,
        event,
        reason="slot",
        group=concurrency.group if concurrency else None,
        holders=list(holders),
        hooks_start_at=_iso_wall(wall),
    )


def _iso_wall(wall: float) -> Optional[str]:
    """A wall-clock instant as the records show it; None where it is none (inf: not placed yet)
    or beyond what a datetime holds."""
    try:
        return iso_utc(dt.datetime.fromtimestamp(wall, dt.timezone.utc))
    except (OverflowError, ValueError, OSError):
        return None


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


# Phases in which an event's slot is given back: it is over, or it never will be prepared.
_SLOT_ENDS = frozenset({Phase.OVER, Phase.GONE, Phase.MISSED, Phase.UNHANDLED})


def _release_slots(before: State, after: State, out: list[Effect]) -> State:
    """A held or asked-for slot is given back once its event is over (after-hooks ended)."""
    for event_id, old in before.events.items():
        if old.slot not in (Slot.ASKED, Slot.HELD):
            continue
        now_ = after.events.get(event_id)
        if now_ is not None and now_.phase not in _SLOT_ENDS:
            continue
        out.append(ReleaseSlot(event_id))
        if old.slot is Slot.HELD:
            # The VM's events share its one slot (slots.SlotKeeper): it stays the VM's while
            # another of them holds it.
            kept = sorted(
                k for k, t in after.events.items() if k != event_id and t.slot is Slot.HELD
            )
            out.append(_note(Level.INFO, What.SLOT_RELEASED, old.event, kept_for=kept))
        if now_ is not None:
            after = _with(after, event_id, replace(now_, slot=Slot.NONE))
    return after


def _seconds_left(event: Event, state: State, now: float) -> Optional[float]:
    if event.not_before is None or state.wall_offset is None:
        return None
    return event.not_before.timestamp() - (now + state.wall_offset)


def _start_at(event: Event, rule: EventRule, state: State, now: float) -> Optional[Held]:
    """`when.hold` on the monotonic clock: the instant the before-hooks start, None for now."""
    if state.wall_offset is None:
        return None
    held = hold(event, rule, state.config.windows, now + state.wall_offset)
    return None if held is None else replace(held, at=held.at - state.wall_offset)


def _waiting(event: Event, rule: EventRule, held: Held, state: State) -> Record:
    wall = held.at + (state.wall_offset or 0.0)
    fields: dict[str, object] = {
        "hooks_start_at": _iso_wall(wall),
        "reason": held.reason,
    }
    if held.window is not None:
        fields["window"] = held.window
    if rule.start_before is not None:
        fields["start_before"] = rule.start_before
    return _note(Level.INFO, What.EVENT_WAITING, event, **fields)


def _still_waiting(tracked: Tracked, state: State, now: float, out: list[Effect]) -> Tracked:
    """A NotBefore that moves, a clock that steps, a reload that changes the windows: the wait
    is placed again."""
    event = tracked.event
    rule = state.config.events.get(event.event_type, EventRule())
    held = _start_at(event, rule, state, now)
    start_at = now if held is None else held.at
    if held is not None and abs(start_at - tracked.start_at) > 1:
        out.append(_waiting(event, rule, held, state))
    return replace(tracked, start_at=start_at)


def _rule(
    event: Event, rule: EventRule, state: State, out: list[Effect]
) -> Optional[tuple[Phase, Rule]]:
    """Rules that decide before any hook runs: events a person asked for, short Freezes."""
    user = state.config.user_events
    if event.source.casefold() == "user" and user is not UserEvents.HOOKS:
        out.append(
            _note(
                Level.INFO,
                What.EVENT_RULE,
                event,
                rule=Rule.USER.value,
                decision=user.value,
                reason=f"EventSource User and user_events: {user.value}",
            )
        )
        if user is UserEvents.IGNORE:
            return Phase.UNHANDLED, Rule.USER
        return Phase.APPROVING, Rule.USER
    duration = event.duration_seconds
    short = rule.short_seconds
    if short is not None and duration is not None and 0 <= duration <= short:
        out.append(
            _note(
                Level.INFO,
                What.EVENT_RULE,
                event,
                rule=Rule.SHORT.value,
                reason=f"DurationInSeconds {duration} <= short_seconds {short}: no hooks",
            )
        )
        phase, approval = _approval(event, state)
        if approval is not None:
            out.append(approval)
        return phase, Rule.SHORT
    return None


def _prepared(tracked: Tracked) -> bool:
    """Its before-hooks started (or it had none to run): it gets after/cancelled hooks."""
    return tracked.phase in PREPARED and tracked.rule is Rule.HOOKS


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


# ---- helpers -------------------------------------------------------------------------------


def event_fields(event: Event) -> dict[str, object]:
    return {
        "event_id": event.event_id,
        "event_type": event.event_type,
        "event_status": event.status,
        "not_before": iso_utc(event.not_before) or None,
        "resources": " ".join(event.resources),
    }


def _unhandled(event: Event, reason: str) -> Record:
    return _note(Level.WARNING, What.EVENT_UNHANDLED, event, reason=reason)


def _note(level: Level, what: What, event: Event, **fields: object) -> Record:
    return Record(level, what, {**event_fields(event), **fields})


def _with(state: State, event_id: str, tracked: Tracked) -> State:
    if tracked.phase is Phase.GONE:
        return replace(state, events={k: t for k, t in state.events.items() if k != event_id})
    return replace(state, events={**state.events, event_id: tracked})


def _durable_view(events: Known) -> Known:
    """What decides whether the state file must be written: a new incarnation listing the same
    events is not worth an fsync (the file gets it with the next real change)."""
    return {
        k: replace(t, run=None, start_at=0.0, incarnation=0)
        for k, t in events.items()
        if t.phase in DURABLE
    }


def durable_events(events: Known) -> Known:
    """What the state file keeps: events for other VMs cost a write a second under churn."""
    return {k: replace(t, run=None, start_at=0.0) for k, t in events.items() if t.phase in DURABLE}


def _persist(state: State) -> Persist:
    return Persist(durable_events(state.events), state.cluster_mark)


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
    queued = [t for t in state.events.values() if t.phase is Phase.QUEUED]
    if queued:
        text += f"; {len(queued)} waiting for a concurrency slot"
    coordinating = [t for t in state.events.values() if t.phase is Phase.COORDINATING]
    if coordinating:
        text += f"; {len(coordinating)} waiting for the other VMs"
    if state.coordination.count:
        text += f"; COORDINATION FAILING: {state.coordination.kind}"
    if state.poll.rejected:
        text += f"; IMDS REJECTS OUR REQUEST: {state.poll.rejected[:120]}"
    if state.state_problem:
        text += "; DEGRADED: state not saved"
    if state.faults:
        text += f"; DEGRADED: {state.faults} internal error(s), see the journal"
    return text


def _status(state: State, out: list[Effect]) -> State:
    if not state.ready or state.stopping is not None:
        return state
    text = status_text(state)
    if text == state.status_sent:
        return state
    out.append(Notify({"STATUS": text}))
    return replace(state, status_sent=text)
