"""Messages: what happened, as the daemon tells the engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional, Union

from ...config import Config
from ...model import Document
from ..state import ClusterMark, Known
from ..vocabulary.constants import Outcome


class GateMessage:
    """What happened to a gate's own business (its executor says so): declared in its gate's
    modules and handled by its `GATE` (component.Gate), so a new gate adds its messages without
    touching this module. `Message` includes every one."""

    __slots__ = ()


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
    repaired: tuple[str, ...] = ()  # what the state file's edge dropped to read it (host/store)


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
class SharedForgotten:
    """etcd answered the delete of this VM's mark for a shared event (ForgetShared): a `ready`
    from before is gone, no VM counts it any more (engine/postponed: a put-back's undo waits)."""

    event_id: str


@dataclass(frozen=True)
class GateAnswered:
    run: int
    exit_status: Optional[int]  # None: it could not start, timed out or was stopped
    timed_out: bool = False
    cancelled: bool = False
    detail: str = ""


@dataclass(frozen=True)
class ClusterChecked(GateMessage):
    """What the cluster looked like at start: problems an operator must fix, if any."""

    problems: tuple[str, ...]


@dataclass(frozen=True)
class ClusterMarked(GateMessage):
    """This node is marked as going away by this daemon (`ours`: sent just before the command,
    which may fail and still be applied), or was already, by someone else (an operator's
    standby): that mark is left as it is when the event is over."""

    event_id: str
    ours: bool
    # How the drainer set it (its own settings): a reload that removed or changed
    # cluster.pacemaker while the command ran must not make the mark go unrecorded.
    mark: Optional[ClusterMark] = None


@dataclass(frozen=True)
class ClusterDraining(GateMessage):
    """Resources still on this node (or still moving), on change."""

    event_id: str
    resources: tuple[str, ...]


@dataclass(frozen=True)
class ClusterDrained(GateMessage):
    event_id: str


@dataclass(frozen=True)
class ClusterHeld(GateMessage):
    """The cluster may not drain this node (too_few_healthy, no_quorum, node_unknown,
    tool_failed): nothing was marked, or the mark is left for the maintenance."""

    event_id: str
    reason: str
    detail: str = ""


@dataclass(frozen=True)
class ClusterRestored(GateMessage):
    """The node is back (error: it could not be; asked again with backoff). event_id "":
    the mark a previous daemon left was taken off at start."""

    event_id: str
    error: str = ""


@dataclass(frozen=True)
class SlotGranted(GateMessage):
    """This VM holds one of its group's concurrency slots for the event."""

    event_id: str
    # Monotonic: when the request that etcd last acknowledged for the slot's lease (its grant
    # or a keep-alive) was sent; the lease lives at least `ttl` from then. None: now.
    confirmed: Optional[float] = None
    # Every VM holding a slot of its groups as it took its own, itself among them (`status`'s
    # last seen holders); empty: not known (another event joining a held slot).
    holders: tuple[str, ...] = ()


@dataclass(frozen=True)
class SlotKept(GateMessage):
    """etcd acknowledged a keep-alive of the slot's lease, sent at `confirmed` (monotonic)."""

    event_id: str
    confirmed: float


@dataclass(frozen=True)
class SlotBusy(GateMessage):
    """Every slot of a group is held, by these VMs (for the log; on change); `full` names
    the groups without a slot for this VM (with several groups, it holds one in each or none).
    `expired`: the slot was held and the daemon's lease expired (a partition); the keeper asks
    for it again on its own."""

    event_id: str
    holders: tuple[str, ...]
    full: tuple[str, ...] = ()
    expired: bool = False


@dataclass(frozen=True)
class SlotFreed(GateMessage):
    """An operator freed the slot this VM held for the event (`fleet free`), or it was freed
    before it could be taken back: it is not this VM's, and not asked for again."""

    event_id: str
    by: str  # who freed it, as the operator's mark says ("" when there is none)
    at: str  # when (ISO 8601, "" when unknown)


@dataclass(frozen=True)
class SlotFailed(GateMessage):
    """etcd could not be asked for a slot; the worker asks again on its own."""

    event_id: str
    kind: str
    detail: str


@dataclass(frozen=True)
class SlotMoved(GateMessage):
    """The slot held through its VM's maintenance (HoldSlot `alive`) is on the hold lease now
    (`error` ""); or the move failed (`error`: etcd's), said at the first failure of a series:
    the keeper tries again every third of `ttl`, and the slot is on the daemon's lease till
    then."""

    event_id: str
    slots: tuple[str, ...]
    seconds: int
    error: str = ""


@dataclass(frozen=True)
class Faulted:
    """The daemon caught an exception in a step or an effect (logged with its traceback there)
    and dropped what it was doing; it carries on, and says it is degraded."""

    where: str
    error: str
    dropped: Optional[Message] = None  # what it was handling: what that held is released


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
    SharedForgotten,
    GateAnswered,
    Faulted,
    GateMessage,  # each gate's own (SlotGranted, ClusterDrained, ...)
]
