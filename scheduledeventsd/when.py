"""When an event's before-hooks start, and which: lead time, maintenance windows, fast path.

Pure and on the wall clock (seconds since the epoch): the engine places the answer on its
monotonic clock; `scheduledeventsd events` shows it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .config import EventRule
from .model import Event
from .windows import Window, opening

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
    when they start now. Windows: the first opening before NotBefore, or the lead (start_before,
    else WINDOW_LEAD) if that comes first; none opening before NotBefore: as without windows."""
    if event.not_before is None:
        return None
    not_before = event.not_before.timestamp()
    held: Optional[Held] = None
    if rule.start_before is not None and rule.before:
        held = Held(not_before - rule.start_before, "start_before")
    if windows and rule.obeys_windows(event.event_type):
        opens = opening(windows, now, not_before)
        if opens is not None:
            latest = not_before - lead(rule)
            if opens > latest:  # the window opens too late: the lead rules
                held = Held(latest, "start_before")
            else:
                window = next(w for w in windows if opening((w,), opens, opens + 1) == opens)
                held = Held(opens, "window", window.describe())
    return held if held is not None and held.at > now else None


def fast_hooks(rule: EventRule, seconds_left: Optional[float]) -> Optional[tuple[str, ...]]:
    """The `fast` hooks when they run instead of `before`, with this much time to NotBefore."""
    if rule.fast is None or seconds_left is None or seconds_left >= rule.fast_below:
        return None
    return rule.fast
