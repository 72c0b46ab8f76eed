"""The lead: how long before NotBefore an event's before-hooks start at the latest when a gate
holds them back, a maintenance window (gates/window) or a concurrency slot (gates/slot)."""

from __future__ import annotations

from ...config import EventRule

# Where windows hold an event back and no start_before is set, the before-hooks start this long
# before NotBefore at the latest: a window that opens late never makes preparation too late.
WINDOW_LEAD = 600.0


def lead(rule: EventRule) -> float:
    """How long before NotBefore the before-hooks start at the latest when a window or a slot
    holds them: start_before, else WINDOW_LEAD."""
    return rule.start_before if rule.start_before is not None else WINDOW_LEAD
