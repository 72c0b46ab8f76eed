"""Human-readable views of a document, for `scheduledeventsd events`."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any, Optional

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
    return ("" if seconds >= 0 else "-") + countdown_seconds(abs(seconds))


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


def status(doc: Mapping[str, Any], now: float, problems: list[str]) -> str:
    """`scheduledeventsd status`: the daemon's view, the events of this VM, what is wrong."""
    poll = doc.get("poll") or {}
    health = doc.get("health") or {}
    last_ok = poll.get("last_ok_unix")
    ago = f"{now - last_ok:.1f} s ago" if isinstance(last_ok, (int, float)) else "never"
    lines = [
        f"scheduledeventsd {doc.get('version')} on {doc.get('vm_name') or '?'}, "
        f"started {doc.get('started_at')}",
        f"last poll: {poll.get('last')}; last success {ago}; incarnation {poll.get('incarnation')}",
        "health: ok"
        if health.get("ok")
        else f"health: 503 for {health.get('event_type')} {health.get('event_id')} "
        f"(from {health.get('unhealthy_from')})",
        f"coordination: {doc.get('coordination')}; state file: {doc.get('state_file')}",
    ]
    events = doc.get("events") or []
    lines.append("events of this VM:" if events else "no events of this VM")
    for e in events:
        seconds = e.get("seconds_to_not_before")
        when = "-"
        if e.get("not_before"):
            left = seconds - (now - doc.get("written_at_unix", now)) if seconds is not None else 0
            when = f"{e['not_before']} ({_span(left)})"
        lines.append(
            f"  {e.get('event_type')} {e.get('event_id')}: {e.get('phase')}, "
            f"{e.get('status')}, NotBefore {when}"
        )
        moments = [
            f"{label} {_clock(e.get(key))}"
            for label, key in (
                ("detected", "detected_at"),
                ("hooks done", "hooks_done_at"),
                ("approved", "approved_at"),
                ("after-hooks", "after_hooks_at"),
            )
            if e.get(key)
        ]
        if moments:
            lines.append("    " + ", ".join(moments))
        for h in e.get("hooks") or []:
            took = h.get("duration_s") or 0.0
            lines.append(f"    {h.get('stage')} {h.get('hook')}: {h.get('result')} in {took:.1f}s")
    lines += [f"PROBLEM: {p}" for p in problems]
    return "\n".join(lines)


def _span(seconds: float) -> str:
    sign = "in " if seconds >= 0 else ""
    suffix = "" if seconds >= 0 else " ago"
    return f"{sign}{countdown_seconds(abs(int(seconds)))}{suffix}"


def countdown_seconds(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _clock(iso: Optional[str]) -> str:
    return "-" if not iso else iso[11:19]
