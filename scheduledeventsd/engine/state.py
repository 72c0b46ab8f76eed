"""What the engine knows: one frozen State, the events it tracks, and the helpers that change one
event in it."""

from __future__ import annotations

import datetime as dt
import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Optional

from ..config import Config, DrainMethod, Pacemaker
from ..model import Event
from ..retry import Failures
from .frozen import replace
from .lifecycle import PREPARED, Drain, On, Phase, Rule, Slot, Stage, check


class Hold(str, enum.Enum):
    """The window gate for an event (gates/window): why its before-hooks are held back while
    its phase is `waiting`. Not in the state file: a restart places it again from a document."""

    NONE = ""  # never held, or no longer (the state file does not keep it)
    LEAD = "lead"  # until its lead time (start_before; the lead, where a window opens too late)
    WINDOW = "window"  # until a maintenance window opens
    UNPLACED = "unplaced"  # the daemon restarted: placed again by the next document
    OPEN = "open"  # its start instant came: on to the slot and drain gates


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
    window: Hold = Hold.NONE  # WAITING: what holds its before-hooks back (never stored)
    # Its preparation started once (drained, its before-hooks): its after- or cancelled-hooks
    # are owed also while it waits in a gate again (queued after a restart, its slot taken back).
    prepared: bool = False
    # The NotBefore its preparation began for (postponed.moved_later's reference): a move seen
    # while its before-hooks ran, or it waited for the peers or the cluster, is not lost.
    prepared_for: Optional[dt.datetime] = None
    # Every other gate's slice, (its name, its state's value), none kept as (); changed only by
    # component.gate_move, as its table declares, and kept in the state file as it is.
    gates: tuple[tuple[str, str], ...] = ()
    gated: str = ""  # GATED: the name of the gate that holds it (component.wait_at)
    left: bool = False  # it left while its stage was owed: listed again, a new one (returned)
    # AFTER, put back (postponed) while its `ready` stood in etcd: its cancelled stage (the
    # node's restore, its hooks) waits until etcd confirms that mark deleted (SharedForgotten).
    unmarking: bool = False


Known = Mapping[str, Tracked]
Item = tuple[str, Tracked]


class Events(dict[str, Tracked]):
    """A State's events, by EventId: a dict never changed once built (a change builds another,
    as it builds another State), so what is derived from it is kept with it: `ours`."""

    __slots__ = ("_ours",)

    def ours(self) -> tuple[Item, ...]:
        try:
            return self._ours
        except AttributeError:
            self._ours: tuple[Item, ...] = _ours(self)
            return self._ours

    def _changed(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("a State's events are never changed: build new ones (state._with)")

    __setitem__ = __delitem__ = __ior__ = _changed
    clear = pop = popitem = setdefault = update = _changed

    def __reduce__(self) -> tuple[type[Events], tuple[dict[str, Tracked]]]:
        return Events, (dict(self),)  # copied or pickled whole, never item by item


def ours(events: Known) -> Sequence[Item]:
    """The events of this VM, in their order: all that a timer or a coupling looks at, and what
    it scans after every message (under churn, a few among the other VMs' fifty; those change
    only with the next document, events.py). Derived once per Events."""
    return events.ours() if type(events) is Events else _ours(events)


def _ours(events: Known) -> tuple[Item, ...]:
    return tuple(item for item in events.items() if item[1].phase is not Phase.NOT_OURS)


@dataclass(frozen=True)
class ClusterMark:
    """What this daemon set on its Pacemaker node, kept in the state file until a restore took
    it off: only such a mark is ever taken off (an operator's standby, or an attribute someone
    else set, stays), the way it was set, whatever the configuration says by then."""

    method: DrainMethod
    attribute: str  # method health: the node attribute set to -1000000


def mark_of(settings: Pacemaker) -> ClusterMark:
    return ClusterMark(settings.method, settings.attribute)


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
    # Posting, but no longer wanted (the event stopped being APPROVING): WithdrawApproval said.
    withdrawn: frozenset[str] = frozenset()

    def answered(self, event_id: str) -> Approvals:
        """Its POST (or its withdrawal) has answered: neither posting nor withdrawn."""
        return replace(
            self, posting=self.posting - {event_id}, withdrawn=self.withdrawn - {event_id}
        )


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
    events: Events = field(default_factory=Events)
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
    slot_holders: tuple[str, ...] = ()  # who held the group's slots when last refused or taken
    slot_leases: Mapping[str, SlotLease] = field(default_factory=dict)  # HELD slots, by EventId
    kept: frozenset[str] = frozenset()  # HELD slots moved to the hold lease (gates/through)
    sent: tuple[float, ...] = ()  # when the last IMDS requests went out (the rate limit's window)
    cluster_mark: Optional[ClusterMark] = None  # set by this daemon, until taken off: persisted
    cluster_problems: Optional[tuple[str, ...]] = None  # the last check (None: none yet)
    cluster_check_at: float = math.inf  # when the cluster is checked again
    restore_error: str = ""  # the last restore of cluster_mark failed (retried): why
    # Events forgotten in this step that still asked for or held a concurrency slot: the slot
    # gate gives it back (the coupling slot._release_when_over), then they are gone for good.
    forgotten: tuple[Tracked, ...] = ()
    # Shared events forgotten in this step whose etcd mark this VM may have written (or listed
    # again while their stage runs: returned.mark_taken_back): peers asks for it to be deleted
    # (ForgetShared).
    unmarked: tuple[Tracked, ...] = ()
    # The incarnation of the last document refused whole (transition_refused), said once: the
    # same one served again (the poll after a refusal reads it) is refused quietly.
    refused_document: Optional[int] = None


def initial(config: Config, watchdog_usec: Optional[int] = None, *, strict: bool = False) -> State:
    every = None if not watchdog_usec else watchdog_usec / 2_000_000
    return State(config=config, watchdog_every=every, strict=strict)


def _move(tracked: Tracked, on: On, to: Phase, **changes: Any) -> Tracked:  # noqa: ANN401
    """The one place an event's phase changes: only as `lifecycle.TABLE` declares; and the one
    place it becomes `prepared`, on entering a phase of preparation."""
    check(tracked.phase, on, to)
    if to in PREPARED and not tracked.prepared:
        changes["prepared"] = True
        changes.setdefault("prepared_for", tracked.event.not_before)
    return replace(tracked, phase=to, **changes)


def _with(state: State, event_id: str, tracked: Tracked) -> State:
    if tracked.phase is Phase.GONE:
        state = _forget(state, tracked)
        return replace(
            state, events=Events({k: t for k, t in state.events.items() if k != event_id})
        )
    return replace(state, events=Events({**state.events, event_id: tracked}))


def _forget(state: State, gone: Tracked) -> State:
    """An event is forgotten (GONE): one that still asked for or held a slot is kept in
    `forgotten` until the slot gate has given it back, after this step's handler; a shared one
    this VM may have written its etcd mark for, in `unmarked` until peers asks to delete it."""
    if gone.slot in (Slot.ASKED, Slot.HELD):
        state = replace(state, forgotten=(*state.forgotten, gone))
    if _marked(state, gone):
        state = replace(state, unmarked=(*state.unmarked, gone))
    return state


def _marked(state: State, t: Tracked) -> bool:
    """Prepared for a shared event while etcd says who is ready: it wrote (or may have) its
    mark, ready or failed (COORDINATING and HOOKS_FAILED are prepared)."""
    if not t.prepared or state.config.ready_via != "etcd":
        return False
    name = (t.vm_name or state.vm_name).casefold()
    return any(r.casefold() != name for r in t.event.resources)
