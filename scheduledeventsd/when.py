"""When an event's before-hooks start, and which: lead time, maintenance windows, fast path.

Pure and on the wall clock (seconds since the epoch): the engine places the answer on its
monotonic clock; `scheduledeventsd events` shows it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .config import EventRule
from .model import Event
from .windows import Window, first_opening

# Where windows hold an event back and no start_before is set, the before-hooks start this long
# before NotBefore at the latest: a window that opens late never makes preparation too late.
WINDOW_LEAD = 600.0


@dataclass(frozen=True)
class Held:
    """Why and until when an event's before-hooks wait."""

    at: float  # wall clock
    reason: str  # "start_before" | "window"
    window: Optional[str] = None  # the window that opens then, as configured


def lead(rule: EventRule) -> float:
    """How long before NotBefore the before-hooks start at the latest when a window or a slot
    holds them: start_before, else WINDOW_LEAD."""
    return rule.start_before if rule.start_before is not None else WINDOW_LEAD


def hold(event: Event, rule: EventRule, windows: tuple[Window, ...], now: float) -> Optional[Held]:
    """When a lead time or a window holds back the before-hooks, the instant they start; None
    when they start now. Windows choose within what start_before allows: the first instant in
    a window that is no earlier than start_before before NotBefore and no later than the window
    lead (`window_lead`); a window that opens only after that gives way to the lead (start_before,
    else WINDOW_LEAD); none opening before NotBefore at all: as without windows."""
    if event.not_before is None:
        return None
    not_before = event.not_before.timestamp()
    held: Optional[Held] = None
    earliest = now
    if rule.start_before is not None and rule.before:
        held = Held(not_before - rule.start_before, "start_before")
        earliest = max(now, held.at)
    if windows and rule.obeys_windows(event.event_type):
        found = first_opening(windows, earliest, not_before)
        if found is not None:
            opens, window = found
            if opens > not_before - window_lead(rule):  # the window opens too late: the lead
                held = Held(not_before - lead(rule), "start_before")
            else:
                held = Held(opens, "window", window.describe())
    return held if held is not None and held.at > now else None


def window_lead(rule: EventRule) -> float:
    """How long before NotBefore a window must open to start the before-hooks: WINDOW_LEAD,
    or start_before when that is shorter (then only a window open at the lead counts)."""
    return min(lead(rule), WINDOW_LEAD)


def fast_hooks(rule: EventRule, seconds_left: Optional[float]) -> Optional[tuple[str, ...]]:
    """The `fast` hooks when they run instead of `before`, with this much time to NotBefore."""
    if rule.fast is None or seconds_left is None or seconds_left >= rule.fast_below:
        return None
    return rule.fast
