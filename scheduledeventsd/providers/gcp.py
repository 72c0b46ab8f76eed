"""Google Cloud: the Compute Engine metadata server as the same events Azure sends.

The instance directory is long-polled (`instance/?recursive=true&wait_for_change=true&
last_etag=...`), so a change is seen when it happens, not at the next tick; each answer is
mapped here without I/O or clock (`document_of`, with the `Seen` record the client keeps):

- `maintenanceEvent`: MIGRATE_ON_HOST_MAINTENANCE -> Freeze (a live migration),
  TERMINATE_ON_HOST_MAINTENANCE -> Redeploy; NotBefore = first seen + 60 s (the documented
  notice); back to NONE -> over (listed Started once, then gone);
- `preempted`: TRUE -> Preempt, NotBefore = first seen + 30 s;
- `instance/upcoming-maintenance?alt=json` (asked beside each long-poll) {"maintenance_status":
  PENDING|ONGOING, "window_start_time", ...} -> Redeploy, NotBefore = window_start_time (long
  notice: start_before and windows apply). A window Google moves is the same event with a new
  NotBefore; one whose time cannot be read is skipped with its reason.

An answer that cannot say whether a notice is still up (not JSON, a `window_start_time` that is
not a time, an unknown `maintenanceEvent`) does not end it: the notice stays listed as it was
last read, with its first sighting, until a readable answer drops it.

Events get ids from their kind alone, so a restart keeps them and a moved window stays one event.
NotBefore counts from the first answer that showed the notice (kept across a restart: the
daemon hands the client the events it saved, `recall`).
Approval exists only through the Compute API: nothing is posted.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.parse
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from ..model import SCHEDULED, STARTED, Document, Event, parse_not_before, short
from .imds import ImdsClient, ImdsError

FLAVOR = {"Metadata-Flavor": "Google"}
LONG_POLL = 30  # seconds a long-poll may wait for a change (timeout_sec)
MAINTENANCE_NOTICE = 60.0  # seconds: Google's documented notice before a host maintenance
PREEMPT_NOTICE = 30.0
MAINTENANCE = {
    "MIGRATE_ON_HOST_MAINTENANCE": "Freeze",
    "TERMINATE_ON_HOST_MAINTENANCE": "Redeploy",
}
MAX_NOTICE = 4096
# Each notice of the instance directory: (event type, seconds of notice before it starts).
_KINDS = {
    **{value: (event_type, MAINTENANCE_NOTICE) for value, event_type in MAINTENANCE.items()},
    "PREEMPTED": ("Preempt", PREEMPT_NOTICE),
}


@dataclass
class Seen:
    """When each notice was first seen (wall clock): NotBefore and the id come from it, so the
    same notice stays the same event from one answer to the next. The client keeps it."""

    first: dict[str, float] = field(default_factory=dict)
    ending: dict[str, Event] = field(default_factory=dict)  # over: listed Started once more
    ended: set[str] = field(default_factory=set)  # listed Started once: not again until seen anew
    # Each notice as the last answer listed it: kept while an answer cannot say it is over.
    last: dict[str, Event] = field(default_factory=dict)


UPCOMING_ID = "gcp-upcoming-maintenance"  # one window at a time; moved, it is the same event


def sighted(instance: Optional[bytes], now: float, seen: Seen) -> None:
    """Notices this instance answer shows are first seen `now` unless seen before: NotBefore
    counts from the first answer that showed them, even if the rest of that poll failed."""
    fields = _object(instance, "instance", []) or {}
    for value, _event_type, _notice in _notices(fields, []):
        seen.first.setdefault(value, now)


def _notices(fields: Mapping[str, Any], skipped: list[str]) -> list[tuple[str, str, float]]:
    """(value, event type, notice in seconds) of each notice the instance directory shows."""
    found = []
    value = _text(fields, "maintenanceEvent", "maintenance-event")
    if value and value != "NONE":
        if value in MAINTENANCE:
            found.append((value, *_KINDS[value]))
        else:
            skipped.append(f"maintenanceEvent: unknown value {value[:40]!r}")
    if _text(fields, "preempted").upper() == "TRUE":
        found.append(("PREEMPTED", *_KINDS["PREEMPTED"]))
    return found


def _unread(fields: Optional[Mapping[str, Any]]) -> frozenset[str]:
    """The notices whose state this instance answer does not say (all of them if it could not
    be read; the host maintenance ones if `maintenanceEvent` is missing or unknown): one that
    was up is not over because of it."""
    if fields is None:
        return frozenset(_KINDS)
    unread = set()
    value = _text(fields, "maintenanceEvent", "maintenance-event")
    if not value or (value != "NONE" and value not in MAINTENANCE):
        unread |= set(MAINTENANCE)
    if not _text(fields, "preempted"):
        unread.add("PREEMPTED")
    return frozenset(unread)


def _kept(event: Event, now: float) -> Event:
    """A notice listed as last read, since this answer cannot say it is over: Started once its
    NotBefore has passed, as a readable answer would say."""
    due = event.not_before is not None and now >= event.not_before.timestamp()
    return replace(event, status=STARTED) if due else event


def document_of(
    instance: Optional[bytes], upcoming: Optional[bytes], *, vm_name: str, now: float, seen: Seen
) -> Document:
    """The answers as one Document; `seen` is updated (first sightings, notices that ended)."""
    events: list[Event] = []
    skipped: list[str] = []
    fields = _object(instance, "instance", skipped)
    for value, event_type, notice in _notices(fields or {}, skipped):
        events.append(_notice_event(value, event_type, notice, fields or {}, vm_name, now, seen))
    unread = _unread(fields)
    events += [_kept(e, now) for e in seen.last.values() if e.description in unread]
    coming = _object(upcoming, "upcoming-maintenance", skipped)
    window = seen.last.get(UPCOMING_ID)  # kept while the answer cannot say
    window = None if window is None else _kept(window, now)
    if coming is not None:
        try:
            window = _upcoming(coming, vm_name, now) if coming else None
        except ValueError as e:  # this notice cannot be read; the rest of the answer is used
            skipped.append(f"upcoming-maintenance: {e}")
    if window is not None:
        events.append(window)
    seen.last = {e.event_id: e for e in events}
    active = {e.description for e in events}
    for value in [v for v in seen.first if v not in active]:
        del seen.first[value]  # over: a later notice of the same kind is seen anew
    current = {e.event_id: e for e in events}
    seen.ended -= current.keys()  # listed again: when it ends, it is listed Started once more
    for event_id in [k for k in seen.ending if k in seen.ended or k in current]:
        del seen.ending[event_id]  # listed Started once already (or shown anew): now it leaves
    for event_id, event in seen.ending.items():
        current.setdefault(event_id, event)
        seen.ended.add(event_id)
    # What was skipped counts too: a notice that cannot be read is news (event_skipped) even
    # when nothing else changed.
    canonical = json.dumps([[e.to_json() for e in current.values()], skipped], sort_keys=True)
    return Document(zlib.crc32(canonical.encode()), tuple(current.values()), tuple(skipped))


def notice_over(previous: Document, current: Document, seen: Seen) -> None:
    """Notices of `previous` that `current` no longer lists are over: listed Started once more
    (after-hooks, not cancelled-hooks), then gone."""
    listed = {e.event_id for e in current.events}
    for event in previous.events:
        if event.event_id not in listed and event.event_id not in seen.ended:
            seen.ending[event.event_id] = replace(event, status=STARTED)


def _notice_event(  # noqa: PLR0917 - the notice, its type and notice time, and where from
    value: str,
    event_type: str,
    notice: float,
    fields: Mapping[str, Any],
    vm_name: str,
    now: float,
    seen: Seen,
) -> Event:
    first = seen.first.setdefault(value, now)
    when = dt.datetime.fromtimestamp(first + notice, dt.timezone.utc)
    raw = {k: fields.get(k) for k in ("maintenanceEvent", "preempted") if k in fields}
    return Event(
        event_id=f"gcp-{value.lower()}",  # one at a time of each: the same after a restart
        event_type=event_type,
        status=STARTED if now >= first + notice else SCHEDULED,
        resource_type="VirtualMachine",
        resources=(vm_name,),
        not_before=when,
        description=value,
        source="Platform",
        provider="gcp",
        notice=json.dumps(raw, sort_keys=True)[:MAX_NOTICE],
    )


def _upcoming(raw: Mapping[str, Any], vm_name: str, now: float) -> Event:
    """The upcoming window as an event, or ValueError saying why it cannot be read."""
    start = raw.get("window_start_time") or raw.get("windowStartTime")
    try:
        when = parse_not_before(start) if isinstance(start, str) else None
    except ValueError:
        when = None
    if when is None:
        raise ValueError(f"window_start_time is not a time: {short(start)}")
    status = raw.get("maintenance_status") or raw.get("maintenanceStatus")
    started = status == "ONGOING" or now >= when.timestamp()
    kind = raw.get("type") if isinstance(raw.get("type"), str) else "SCHEDULED"
    return Event(
        event_id=UPCOMING_ID,
        event_type="Redeploy",
        status=STARTED if started else SCHEDULED,
        resource_type="VirtualMachine",
        resources=(vm_name,),
        not_before=when,
        description=f"upcoming maintenance ({kind})"[:200],
        source="Platform",
        provider="gcp",
        notice=json.dumps(raw, sort_keys=True)[:MAX_NOTICE],
    )


def _object(body: Optional[bytes], what: str, skipped: list[str]) -> Optional[dict[str, Any]]:
    """The answer as an object ({} for no answer at all, a 404), or None if it cannot be read."""
    if body is None:
        return {}
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        skipped.append(f"{what}: not JSON")
        return None
    if not isinstance(raw, dict):
        skipped.append(f"{what}: not an object")
        return None
    return raw


def _text(fields: Mapping[str, Any], *names: str) -> str:
    for name in names:
        value = fields.get(name)
        if isinstance(value, str):
            return value.strip()
    return ""


class GcpClient:
    """The same calls as ImdsClient (fetch_document, approve, fetch_vm_name, close)."""

    def __init__(
        self, url: str, timeout: float, first_call_timeout: float, vm_name: Optional[str] = None
    ) -> None:
        self.url = url
        self._http = ImdsClient(url, "", timeout, first_call_timeout, headers=FLAVOR)
        self._etag = ""
        self._vm_name = vm_name or ""
        self._seen = Seen()
        self._last = Document(0, ())
        self._quick = False  # something just ended: ask again at once, not by long-poll

    def close(self) -> None:
        self._http.close()

    def fetch_document(self) -> Document:
        etag, self._etag = self._etag, ""  # kept only if this whole poll succeeds
        vm_name = self._vm_name or self.fetch_vm_name()
        query = {"recursive": "true", "alt": "json"}
        waits = bool(etag) and not self._quick  # at once the first time and after a failure
        if waits:  # then on a change: the answer may take LONG_POLL seconds
            query |= {"wait_for_change": "true", "last_etag": etag,
                      "timeout_sec": str(LONG_POLL)}  # fmt: skip
        instance = self._http.send(
            "GET",
            f"/instance/?{urllib.parse.urlencode(query)}",
            FLAVOR,
            timeout=LONG_POLL + 5 if waits else None,
        )
        answered, now = self._http.etag, time.time()
        sighted(instance, now, self._seen)  # even if the next GET fails
        try:
            upcoming: Optional[bytes] = self._http.send(
                "GET", "/instance/upcoming-maintenance?alt=json", FLAVOR
            )
        except ImdsError as e:
            if e.status != 404:  # not offered for this machine type
                raise
            upcoming = None
        document = document_of(instance, upcoming, vm_name=vm_name, now=now, seen=self._seen)
        notice_over(self._last, document, self._seen)
        self._quick = bool(self._seen.ending)
        if self._quick:  # what just ended is listed Started in this answer, gone in the next
            document = document_of(instance, upcoming, vm_name=vm_name, now=now, seen=self._seen)
        self._last = document
        if _object(instance, "instance", []) is not None:  # else the next poll asks at once
            self._etag = answered
        return document

    def recall(self, events: Iterable[Event]) -> None:
        """The events the daemon saved before a restart: a notice still shown keeps the
        NotBefore it had, counted from its first sighting then, not from now; one that ended
        while the daemon was down is over (listed Started once), as if it had been watched."""
        notices = {f"gcp-{v.lower()}": (v, n) for v, (_t, n) in _KINDS.items()}
        saved = tuple(e for e in events if e.provider == "gcp")
        for event in saved:
            known = notices.get(event.event_id)
            if known is not None and event.not_before is not None:
                value, notice = known
                self._seen.first.setdefault(value, event.not_before.timestamp() - notice)
        self._seen.last = {e.event_id: e for e in saved}  # kept if the next answer is unreadable
        self._last = Document(0, saved)

    def approve(self, event_ids: Iterable[str], *, deadline: Optional[float] = None) -> None:
        raise ImdsError("request", "Google Cloud takes no approval through its metadata server")

    def fetch_vm_name(self) -> str:
        name = self._http.send("GET", "/instance/name", FLAVOR).decode("utf-8", "replace").strip()
        if not name or len(name) > 63 or any(ch.isspace() or not ch.isprintable() for ch in name):
            raise ImdsError("bad_name", f"unusable instance name {name[:80]!r}")
        self._vm_name = self._vm_name or name
        return name
