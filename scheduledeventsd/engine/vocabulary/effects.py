"""Effects: what the engine asks the daemon to do."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional, Union

from ...config import Config
from ...model import Event
from ...records import Record
from ..lifecycle import Stage
from ..state import ClusterMark, Known
from .messages import (
    ApprovalFailed,
    ClusterChecked,
    ClusterHeld,
    ClusterRestored,
    CoordinationFailed,
    GateAnswered,
    GateMessage,
    HooksFinished,
    NameResolved,
    Persisted,
    PollFailed,
    SlotFailed,
)


class GateEffect:
    """What a gate asks its executor to do: declared in its gate's modules, carried out by the
    daemon's executor that declares it (runtime/executors). `failed` is the message that
    reports its failure (None: nothing waits for its answer), sent when carrying it out raised,
    in place of a `FAILURE` entry, and `planned` what the planner answers in the executor's
    place, so a new gate adds its effects without touching this module or the planner.
    `Effect` includes every one."""

    __slots__ = ()

    def failed(self, detail: str) -> Optional[GateMessage]:
        return None

    def planned(self) -> Optional[GateMessage]:
        """The answer `scheduledeventsd plan` sends at once in its executor's place (None:
        nothing answers, as for an effect no one waits on; a gate that holds an event until
        the answer declares it, or the plan holds the event until its gate's own deadline).
        The planner's own executors (plan/executors) carry out the existing gates' effects."""
        return None


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
class WithdrawApproval:
    """An approval asked for is no longer wanted (its event stopped being APPROVING: it left,
    changed type, was put back): not sent if still queued, answered ApprovalFailed("withdrawn").
    One already on the wire cannot be taken back."""

    event_id: str


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
class ForgetShared:
    """A shared event this VM may have written its mark for (etcd) is forgotten: over for it
    (its stage has run, it left the document) or judged anew; or listed again while that stage
    still runs (returned.mark_taken_back); or put back (postponed). Its mark is deleted, and the
    event's settled key by the last VM to forget it (idempotent); SharedForgotten once etcd
    answered the delete, which only a put-back's undo waits for."""

    event_id: str
    vm_name: str


@dataclass(frozen=True)
class AskGate:
    """Run the gate command for a shared event; GateAnswered(run) comes back."""

    run: int
    event: Event
    incarnation: int
    vm_name: str


@dataclass(frozen=True)
class AskCluster:
    """Ask the Pacemaker cluster whether every node a shared event names is drained and done
    (this node says it is, first); GateAnswered(run) comes back, as for AskGate. The engine
    decides which is asked: the daemon routes nothing by its configuration."""

    run: int
    event: Event
    incarnation: int
    vm_name: str


@dataclass(frozen=True)
class AcquireSlot(GateEffect):
    """Ask for (or take back, after a restart) one of the group's slots for this event. `hold`:
    its VM is in the maintenance it holds the slot for: taken back under the daemon's hold
    lease of that many seconds (HoldSlot `alive`), and only the keys it still holds (a group a
    reload added is for the next event)."""

    event: Event
    vm_name: str
    hold: int = 0

    def failed(self, detail: str) -> GateMessage:
        return SlotFailed(self.event.event_id, "internal", detail)


@dataclass(frozen=True)
class ReleaseSlot(GateEffect):
    """Give the event's slot back, or stop asking for one."""

    event_id: str


@dataclass(frozen=True)
class HoldSlot(GateEffect):
    """The event's slot is held through its maintenance, under the daemon's hold lease of
    `seconds` (a second lease per daemon, renewed while it lives): `alive`, at its approval,
    the key moves there and the daemon goes on (a daemon killed then leaves it held, not lost
    within ttl); else the daemon stops (for its maintenance, most likely): moved there if not
    yet, renewed one last time, and nothing renews it after, so the next VM waits until this
    one is back (and takes it back) or `seconds` have passed. The daemon logs `on_held` once
    the key is there, or `on_failed` (with the slot's keys and etcd's error) when it could not
    be moved: it is then lost within `ttl`."""

    event_id: str
    seconds: int
    alive: bool = False
    on_held: Optional[Record] = None
    on_failed: Optional[Record] = None


@dataclass(frozen=True)
class CheckCluster(GateEffect):
    """Read the cluster once at start: ClusterChecked comes back."""

    def failed(self, detail: str) -> GateMessage:
        return ClusterChecked((detail,))  # the problem shown, checked again later


@dataclass(frozen=True)
class DrainNode(GateEffect):
    """Mark this node as going away when the cluster can spare it, then watch its resources
    leave: ClusterDraining on change, then ClusterDrained, or ClusterHeld."""

    event: Event
    going: tuple[str, ...]  # the other cluster nodes the event names
    ours: bool = False  # the state file says this daemon marked the node: found so, it is ours

    def failed(self, detail: str) -> GateMessage:
        return ClusterHeld(self.event.event_id, "tool_failed", detail)  # not early


@dataclass(frozen=True)
class StopDraining(GateEffect):
    """Stop watching (the mark stays until RestoreNode)."""

    event_id: str


@dataclass(frozen=True)
class RestoreNode(GateEffect):
    """Take this daemon's mark off this node (event_id "": one no event wants any more, left
    by a previous run, a failed restore or a reload); ClusterRestored comes back."""

    event_id: str
    mark: Optional[ClusterMark] = None

    def failed(self, detail: str) -> GateMessage:
        return ClusterRestored(self.event_id, detail)  # asked again until it works


@dataclass(frozen=True)
class WakeAt:
    at: float


@dataclass(frozen=True)
class Exit:
    status: int


Effect = Union[
    GateEffect,  # each gate's own (AcquireSlot, DrainNode, ...)
    Fetch,
    CancelFetch,
    ResolveName,
    SpawnHooks,
    CancelRuns,
    PostApproval,
    WithdrawApproval,
    Persist,
    Record,
    Notify,
    UseConfig,
    Coordinate,
    StopCoordinating,
    ForgetShared,
    AskGate,
    AskCluster,
    WakeAt,
    Exit,
]

# The message that reports an effect's failure: the daemon sends it when carrying the effect out
# raised, so the engine's own rules (a backoff, a failed run, a hold) take it from there and
# nothing waits for an answer that never comes. None: nothing waits for this effect's answer.
# A gate's effects declare theirs (GateEffect.failed).
FAILURE: Mapping[type, Optional[type]] = {
    Fetch: PollFailed,
    PostApproval: ApprovalFailed,
    ResolveName: NameResolved,  # the hostname stands in, asked again with backoff
    SpawnHooks: HooksFinished,  # FAILED
    AskGate: GateAnswered,  # no exit status: a coordination failure, asked again
    AskCluster: GateAnswered,
    Coordinate: CoordinationFailed,
    Persist: Persisted,  # with the error: state_degraded
    CancelFetch: None,
    CancelRuns: None,
    WithdrawApproval: None,  # its PostApproval's answer says it (ApprovalFailed "withdrawn")
    StopCoordinating: None,
    ForgetShared: None,  # its keys go with the daemon's lease at worst (never a false answer)
    Record: None,
    Notify: None,
    UseConfig: None,
    WakeAt: None,
    Exit: None,
}
