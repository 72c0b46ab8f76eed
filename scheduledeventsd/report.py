"""Human-readable views of a document, for `scheduledeventsd events`."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Optional

from .config import EventRule
from .model import Document, Event, iso_utc

Rules = Mapping[str, EventRule]


def hooks_start(event: Event, rules: Rules) -> Optional[dt.datetime]:
    """When `start_before` holds the before-hooks back: the instant they start."""
    rule = rules.get(event.event_type)
    if rule is None or rule.start_before is None or event.not_before is None:
        return None
    return event.not_before - dt.timedelta(seconds=rule.start_before)


def countdown(not_before: Optional[dt.datetime], now: dt.datetime) -> str:
    if not_before is None:
        return "-"
    seconds = int((not_before - now).total_seconds())
    sign = "" if seconds >= 0 else "-"
    seconds = abs(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{sign}{hours}h{minutes:02d}m"
    return f"{sign}{minutes}m{secs:02d}s"


def _local(when: Optional[dt.datetime]) -> str:
    return "-" if when is None else when.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def table(doc: Document, vm_name: str, now: dt.datetime, rules: Rules) -> str:
    header = ("OURS", "EVENT ID", "TYPE", "STATUS", "NOT BEFORE", "IN", "HOOKS IN", "RESOURCES")
    rows = [header]
    for event in doc.events:
        start = hooks_start(event, rules) if event.names(vm_name) else None
        rows.append(
            (
                "yes" if event.names(vm_name) else "no",
                event.event_id,
                event.event_type,
                event.status,
                _local(event.not_before),
                countdown(event.not_before, now),
                "-" if start is None or start <= now else countdown(start, now),
                ", ".join(event.resources),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [f"DocumentIncarnation {doc.incarnation}; this VM is {vm_name}"]
    if len(rows) == 1:
        lines.append("no scheduled events")
    else:
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines += [f"skipped: {s}" for s in doc.skipped]
    return "\n".join(lines)


def as_json(doc: Document, vm_name: str, rules: Rules) -> str:
    def one(event: Event) -> dict[str, object]:
        start = hooks_start(event, rules) if event.names(vm_name) else None
        return dict(
            event.to_json(),
            ForThisVM=event.names(vm_name),
            HooksStartAt=None if start is None else iso_utc(start),
        )

    return json.dumps(
        {
            "DocumentIncarnation": doc.incarnation,
            "VmName": vm_name,
            "Events": [one(e) for e in doc.events],
            "Skipped": list(doc.skipped),
        },
        indent=2,
    )
