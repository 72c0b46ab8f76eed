"""The Scheduled Events document as typed, frozen data, parsed tolerantly once at the edge.

IMDS has shipped several api-versions with different fields, and re-serialising tools reorder
keys and rewrite dates, so parsing accepts every shape seen in the field and skips (with a
reason) only what cannot be acted on.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import re
from dataclasses import dataclass
from typing import Any, Optional

# Azure's five, and AWS's rebalance recommendation (a spot instance at elevated risk).
EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate", "Rebalance")
SCHEDULED = "Scheduled"
MAX_EVENT_ID = 200
STARTED = "Started"


class DocumentError(ValueError):
    """The response is not a Scheduled Events document at all."""


_TEXT_FIELDS = (
    "event_id",
    "event_type",
    "status",
    "resource_type",
    "description",
    "source",
    "notice",
)


@dataclass(frozen=True)
class Event:
    """One scheduled event, with every optional field normalised."""

    event_id: str
    event_type: str
    status: str
    resource_type: str
    resources: tuple[str, ...]
    not_before: Optional[dt.datetime]
    description: str = ""
    source: str = ""
    duration_seconds: Optional[int] = None
    provider: str = "azure"  # whose notice it came from (aws, gcp: mapped at the edge)
    notice: str = ""  # that provider's own notice, as JSON (hooks get it on stdin)

    def __post_init__(self) -> None:
        """Whoever built it (Azure's, AWS's or Google's parser, a state file), its text is
        text every consumer can carry: see `encodable`."""
        for name in _TEXT_FIELDS:
            _set_encodable(self, name, getattr(self, name))
        resources = tuple(encodable(r) for r in self.resources)
        if resources != self.resources:
            object.__setattr__(self, "resources", resources)

    def names(self, vm_name: str) -> bool:
        """Azure's resource names are case-insensitive; an event may name many VMs."""
        wanted = vm_name.casefold()
        return any(r.casefold() == wanted for r in self.resources)

    def to_json(self) -> dict[str, Any]:
        """The event as IMDS spells it, with NotBefore in ISO 8601 UTC (hooks get this)."""
        return {
            "EventId": self.event_id,
            "EventType": self.event_type,
            "EventStatus": self.status,
            "ResourceType": self.resource_type,
            "Resources": list(self.resources),
            "NotBefore": iso_utc(self.not_before),
            "Description": self.description,
            "EventSource": self.source,
            "DurationInSeconds": self.duration_seconds,
        }


@dataclass(frozen=True)
class Copy:
    """A later entry of Events under an EventId already listed, unlike the first (IMDS is
    untrusted input). Which of them is this VM's the parser cannot say (it does not know the
    VM's name): each is kept for the engine to choose (engine/copies); an identical one is
    skipped."""

    index: int  # its place in Events
    first: int  # the place of the first entry under its EventId (the one in `events`)
    event: Event


@dataclass(frozen=True)
class Document:
    """A whole response; `skipped` says why any event in it could not be used."""

    incarnation: int
    events: tuple[Event, ...]
    skipped: tuple[str, ...] = ()
    copies: tuple[Copy, ...] = ()  # unlike copies of an EventId in `events`: the engine chooses


def iso_utc(when: Optional[dt.datetime]) -> str:
    return "" if when is None else when.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_not_before(text: str) -> Optional[dt.datetime]:
    """RFC 1123 as IMDS sends it (weekday ignored: the docs' examples get it wrong), or ISO 8601.

    Empty means "no time" (IMDS clears NotBefore once an event has Started).
    """
    text = text.strip()
    if not text:
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        iso = text[:-1] + "+00:00" if text[-1:] in "zZ" else text
        try:
            parsed = dt.datetime.fromisoformat(iso)
        except ValueError:
            raise ValueError(f"NotBefore is neither RFC 1123 nor ISO 8601: {short(text)}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    try:  # every consumer needs it in UTC and as a timestamp: refuse what has neither
        parsed.astimezone(dt.timezone.utc).timestamp()
    except (OverflowError, ValueError, OSError):
        raise ValueError(f"NotBefore is out of range: {short(text)}") from None
    return parsed


# NUL, and every surrogate code point: in a str they are lone (JSON's "\ud800" is valid JSON).
_UNENCODABLE = re.compile("[\x00\ud800-\udfff]")


def encodable(value: str) -> str:
    """`value` with what no consumer can carry replaced by U+FFFD. NUL cannot travel in
    environment variables or journal fields; a lone surrogate cannot be encoded as UTF-8 at
    all, so not into a hook's environment or stdin, a journal field, a file or a request
    (`Description: "Host update \\ud800"` stopped every hook). Neither is ever meaningful."""
    if value.isascii() and "\x00" not in value:
        return value
    return _UNENCODABLE.sub("\ufffd", value)


def _set_encodable(event: Event, name: str, value: str) -> None:
    clean = encodable(value)
    if clean != value:
        object.__setattr__(event, name, clean)


def _lower_keys(raw: dict[Any, Any]) -> dict[str, Any]:
    return {k.casefold(): v for k, v in raw.items() if isinstance(k, str)}


def _text(fields: dict[str, Any], key: str, *, required: bool) -> str:
    value = fields.get(key.casefold())
    if value is None:
        if required:
            raise ValueError(f"{key} is missing")
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{key} is not a string: {short(value)}")
    if required and not value.strip():
        raise ValueError(f"{key} is empty")
    return encodable(value)


def parse_event(raw: Any) -> Event:  # noqa: ANN401 - this is the untyped edge
    """Raise ValueError naming the first problem that makes the event unusable."""
    if not isinstance(raw, dict):
        raise ValueError(f"event is not an object: {short(raw)}")
    fields = _lower_keys(raw)
    resources_raw = fields.get("resources", [])
    if not isinstance(resources_raw, list) or not all(isinstance(r, str) for r in resources_raw):
        raise ValueError(f"Resources is not a list of strings: {short(resources_raw)}")
    duration = fields.get("durationinseconds")
    if isinstance(duration, bool) or not isinstance(duration, (int, type(None))):
        duration = None
    event_id = event_identifier(_text(fields, "EventId", required=True))
    return Event(
        event_id=event_id,
        event_type=_text(fields, "EventType", required=True).strip(),
        status=_text(fields, "EventStatus", required=True).strip(),
        resource_type=_text(fields, "ResourceType", required=False),
        resources=tuple(encodable(r).strip() for r in resources_raw if r.strip()),
        not_before=parse_not_before(_text(fields, "NotBefore", required=False)),
        description=_text(fields, "Description", required=False),
        source=_text(fields, "EventSource", required=False),
        duration_seconds=duration,
    )


def event_identifier(text: str) -> str:
    """An EventId as every cloud's events carry it, or ValueError. A GUID in every Azure
    document: anything else would travel into keys, logs and environments as an identifier,
    so it is refused, never escaped on the way: nor replaced (U+FFFD stands for a NUL or a lone
    surrogate the parser replaced, and an id IMDS never sent could not be approved)."""
    event_id = text.strip()
    if (
        not event_id
        or len(event_id) > MAX_EVENT_ID
        or any(ord(ch) < 0x20 or ord(ch) == 0x7F or _replaced(ch) for ch in event_id)
    ):
        raise ValueError(f"EventId is not an identifier: {short(event_id)}")
    return event_id


def _replaced(ch: str) -> bool:
    """A lone surrogate, or the U+FFFD `encodable` put in place of one (or of a NUL)."""
    return 0xD800 <= ord(ch) <= 0xDFFF or ch == "\ufffd"


def short(value: Any) -> str:  # noqa: ANN401 - for error messages about untyped input
    """A value as an error message quotes it: its repr, at most 100 characters."""
    try:
        text = repr(value)
    except RecursionError:
        text = f"<a {type(value).__name__} nested too deeply>"
    return text if len(text) <= 100 else text[:97] + "..."


class EventCache:
    """Parsed events keyed by their raw JSON value: a busy document changes every second while
    most of its events do not, and parsing them again each time was most of the churn CPU.

    Holds the events of the last two documents only: under churn new events arrive every
    second, and a cache kept to a fixed size grew the daemon by 5 MB in an hour's soak.
    """

    def __init__(self) -> None:
        self._current: dict[str, Event] = {}
        self._previous: dict[str, Event] = {}

    def parse(self, raw: Any) -> Event:  # noqa: ANN401 - this is the untyped edge
        key = repr(raw)  # C-fast and exact; a reordered event only misses the cache
        found = self._current.get(key) or self._previous.get(key)
        if found is None:
            found = parse_event(raw)
        self._current[key] = found
        return found

    def __len__(self) -> int:
        return len(self._current) + len(self._previous)

    def rotate(self) -> None:
        """A document was parsed: what it did not use is forgotten after the next one."""
        self._previous, self._current = self._current, {}


def parse_document(body: bytes, cache: Optional[EventCache] = None) -> Document:
    """Any bytes become a Document or a DocumentError, never another exception.

    DocumentError means there is no usable incarnation or event list; a single unusable event
    is skipped with its reason.
    """
    try:
        return _parse_document(body, cache)
    except RecursionError:
        raise DocumentError("nested too deeply to be a Scheduled Events document") from None


def _parse_document(body: bytes, cache: Optional[EventCache]) -> Document:
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise DocumentError(f"not JSON: {short(str(e))}") from None
    if not isinstance(raw, dict):
        raise DocumentError("not a JSON object")
    fields = _lower_keys(raw)
    incarnation = fields.get("documentincarnation")
    if isinstance(incarnation, str) and re.fullmatch(r"\s*[0-9]+\s*", incarnation):
        incarnation = int(incarnation)  # not isdigit(): "²" is a digit int() refuses
    if isinstance(incarnation, bool) or not isinstance(incarnation, int):
        raise DocumentError(
            f"DocumentIncarnation is missing or not an integer: {short(incarnation)}"
        )
    raw_events = fields.get("events", [])
    if raw_events is None:
        raw_events = []
    if not isinstance(raw_events, list):
        raise DocumentError(f"Events is not a list: {short(raw_events)}")
    events: list[Event] = []
    skipped: list[str] = []
    copies: list[Copy] = []
    seen: dict[str, tuple[int, Event]] = {}
    for index, raw_event in enumerate(raw_events):
        try:
            event = parse_event(raw_event) if cache is None else cache.parse(raw_event)
        except (ValueError, TypeError, RecursionError) as e:
            skipped.append(f"Events[{index}]: {e}")
            continue
        first = seen.get(event.event_id)
        if first is not None:
            if event == first[1]:
                skipped.append(f"Events[{index}]: duplicate EventId {event.event_id}")
            else:  # another VM's copy listed first must not hide this VM's: engine/copies
                copies.append(Copy(index, first[0], event))
            continue
        seen[event.event_id] = (index, event)
        events.append(event)
    if cache is not None:
        cache.rotate()
    return Document(incarnation, tuple(events), tuple(skipped), tuple(copies))
