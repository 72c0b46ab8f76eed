"""What the loop saw happen to each VM's event, on the plan's clock (seconds after its start):
filled in by run.py from the engine's effects and the messages it was fed, read by report.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Seen:
    """One event of one VM. Instants are seconds after the plan's start; None: it did not
    happen."""

    vm: str
    group: str  # its concurrency group ("" without concurrency)
    event_id: str
    event_type: str
    posted: float
    not_before: float
    groups: tuple[str, ...] = ()  # every group of its concurrency, `group` first
    asked_slot: Optional[float] = None  # AcquireSlot: it waits in the queue
    slot_busy: bool = False  # etcd said every slot was taken while it waited
    waits: list[str] = field(default_factory=list)  # event_waiting's reasons, in order
    no_slot: bool = False  # slot_unavailable: prepared without one
    gated_from: Optional[float] = None  # event_waiting reason=gate: any other gate holds it
    drain_from: Optional[float] = None
    drain_to: Optional[float] = None
    hooks_start: Optional[float] = None  # its before-hooks (or fast) started
    hooks_end: Optional[float] = None
    hooks_failed: bool = False
    approved: Optional[float] = None  # the approval was accepted (early)
    down: Optional[float] = None
    back: Optional[float] = None
    after_start: Optional[float] = None
    after_runs: list[float] = field(default_factory=list)  # each run of its after-hooks began
    after_failed: list[float] = field(default_factory=list)  # ... failed (run again: a retry)
    after_done: Optional[float] = None  # the engine had nothing left to do for it, back up
    cut_off: bool = False  # its before-hooks were running when the VM went down
    missed: bool = False  # event_missed: it started before its before-hooks did
    slot_from: Optional[float] = None
    slot_to: Optional[float] = None
    never_back: bool = False  # Preempt, Terminate: the VM is gone
    cancelled: Optional[float] = None  # withdrawn by the cloud before it started

    @property
    def maintenance_from(self) -> Optional[float]:
        """When it entered maintenance as `concurrency` counts it: the earliest of its slot,
        its drain, its before-hooks and its start (down), prepared or not: a VM the cloud took
        before any hook ran is no less out of the tier."""
        found = (self.slot_from, self.drain_from, self.hooks_start, self.down)
        known = [t for t in found if t is not None]
        return min(known) if known else None

    @property
    def maintenance_to(self) -> Optional[float]:
        """When it left maintenance: its after-hooks done, else back, else down."""
        for t in (self.after_done, self.back, self.down):
            if t is not None:
                return t
        return None
