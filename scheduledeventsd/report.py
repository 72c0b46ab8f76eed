"""Human-readable views of a document, for `scheduledeventsd events`."""

from __future__ import annotations

import datetime as dt
import json
from typing import Optional

from .model import Document, Event


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


def table(doc: Document, vm_name: str, now: dt.datetime) -> str:
    header = ("OURS", "EVENT ID", "TYPE", "STATUS", "NOT BEFORE", "IN", "RESOURCES")
    rows = [header]
    for event in doc.events:
        rows.append(
            (
                "yes" if event.names(vm_name) else "no",
                event.event_id,
                event.event_type,
                event.status,
                _local(event.not_before),
                countdown(event.not_before, now),
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


def as_json(doc: Document, vm_name: str) -> str:
    def one(event: Event) -> dict[str, object]:
        return dict(event.to_json(), ForThisVM=event.names(vm_name))

    return json.dumps(
        {
            "DocumentIncarnation": doc.incarnation,
            "VmName": vm_name,
            "Events": [one(e) for e in doc.events],
            "Skipped": list(doc.skipped),
        },
        indent=2,
    )
