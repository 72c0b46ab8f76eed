"""One simulated VM: its daemon's engine state, and what the plan's executors hold for it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from .. import engine
from ..config import Config
from ..engine import ClusterMark, Known, SlotBusy, Stage
from .fleet import VmSet

# What the plan's heap holds, by kind: a message for the engine, its wake-up, the poll it
# ordered, a document that changes, an event that starts, a VM back, a handed-over slot that
# expires, a keep-alive (replayed one by one), an event withdrawn.
MSG, TICK, FETCH, DOC, START, BACK, EXPIRE, KEEP, CANCEL = range(9)


@dataclass
class Run:
    event_id: str
    stage: Stage
    token: int


@dataclass
class Vm:
    """One VM: its daemon's engine state and what its executors hold."""

    index: int
    name: str
    spec: VmSet
    config: Config
    state: engine.State
    group: str
    alive: bool = True
    gone: bool = False  # Preempt, Terminate: it never comes back
    gen: int = 0  # bumped when its daemon dies: what was due for the old one is dropped
    boots: int = 1
    wake_at: float = math.inf
    wake_token: int = 0
    fetch_at: Optional[float] = None  # the poll it ordered
    fetch_token: int = 0
    quiet: bool = False  # that poll is taken as quiet: not in the heap until something else is
    shown: int = -1  # the incarnation it last saw
    kept_from: Optional[float] = None  # its slot's lease renewed every ttl/3 from then
    kept_to: float = -math.inf  # the last renewal it was told of
    keeping: Optional[float] = None  # the kept_from its renewals are told one by one for
    slot_events: set[str] = field(default_factory=set)
    persisted: Known = field(default_factory=dict)
    mark: Optional[ClusterMark] = None
    runs: dict[int, Run] = field(default_factory=dict)
    drains: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    waiting_after: set[str] = field(default_factory=set)  # back up: until the engine is done
    # A slot's news (SlotBusy) not stepped yet: only the last of a run of them is (run.py
    # `_defer`), while the state a probe found them harmless in is the VM's, until then.
    deferred: Optional[tuple[float, SlotBusy]] = None
    busy_probe: Optional[engine.State] = None
    busy_event: str = ""  # the event whose news the probe was about
    busy_until: float = -math.inf
    hook_runs: dict[str, int] = field(default_factory=dict)  # runs of each hook so far

    def token(self) -> int:
        self.tokens += 1
        return self.tokens


Guard = Optional[tuple[str, str, int]]  # ("run" | "drain", key, token): still wanted?
