"""AWS: EC2's instance metadata (IMDSv2 only) as the same events Azure sends.

What the metadata service says is mapped here, pure (`document_of`), and `AwsClient` fetches it
through the one HTTP client (imds.ImdsClient) with a session token: PUT /latest/api/token, then
the token on every request, a new one on 401. Every notice there is this VM's.

- `spot/instance-action` {"action", "time"} (404: none) -> Preempt, NotBefore `time`;
- `events/recommendations/rebalance` {"noticeTime"} (404: none) -> Rebalance, NotBefore
  `noticeTime` (a recommendation: the spot instance is at elevated risk; no default hooks);
- `events/maintenance/scheduled` [{"Code", "EventId", "NotBefore", "State", ...}] ->
  instance-reboot, system-reboot: Reboot; system-maintenance: Freeze; instance-stop: Redeploy;
  instance-retirement: Terminate. `canceled` leaves the document (cancelled); `completed` is
  listed Started once, then leaves (over).

No approval exists on AWS: nothing is ever posted.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import zlib
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from ..model import (
    MAX_EVENT_ID,
    SCHEDULED,
    STARTED,
    Document,
    Event,
    event_identifier,
    iso_utc,
    parse_not_before,
    short,
)
from .imds import ImdsClient, ImdsError

TOKEN_TTL = 21600  # seconds: AWS's maximum
TOKEN_PATH = "/latest/api/token"  # noqa: S105 - a path, not a secret
SPOT_PATH = "/latest/meta-data/spot/instance-action"
SCHEDULED_PATH = "/latest/meta-data/events/maintenance/scheduled"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
INSTANCE_ID_PATH = "/latest/meta-data/instance-id"
CODES = {
    "instance-reboot": "Reboot",
    "system-reboot": "Reboot",
    "system-maintenance": "Freeze",
    "instance-stop": "Redeploy",
    "instance-retirement": "Terminate",
}
MAX_NOTICE = 4096  # characters of a raw notice kept for hooks


class AwsError(ValueError):
    """A notice that cannot be read (the rest of the document still is)."""


def document_of(
    spot: Optional[bytes],
    scheduled: Optional[bytes],
    rebalance: Optional[bytes] = None,
    *,
    vm_name: str,
    now: float,
    completed_shown: Iterable[str] = (),
) -> Document:
    """The notices as one Document. `completed_shown`: completed events already listed as
    Started once (they leave now). The incarnation changes whenever any event does."""
    events: list[Event] = []
    skipped: list[str] = []
    if spot:
        try:
            events.append(_spot(spot, vm_name, now))
        except AwsError as e:
            skipped.append(f"spot/instance-action: {e}")
    if rebalance:
        try:
            events.append(_rebalance(rebalance, vm_name))
        except AwsError as e:
            skipped.append(f"events/recommendations/rebalance: {e}")
    if scheduled:
        shown = frozenset(completed_shown)
        try:
            items = json.loads(scheduled)
        except (ValueError, UnicodeDecodeError, RecursionError):
            items = None
            skipped.append("events/maintenance/scheduled: not JSON")
        if items is not None and not isinstance(items, list):
            skipped.append("events/maintenance/scheduled: not a list")
            items = None
        for index, item in enumerate(items or []):
            try:
                event = _maintenance(item, vm_name, now)
            except AwsError as e:
                skipped.append(f"events/maintenance/scheduled[{index}]: {e}")
                continue
            if event is not None and event.event_id not in shown:
                events.append(event)
    unique = {e.event_id: e for e in events}
    # What was skipped counts too: a notice that cannot be read is news (event_skipped) even
    # when nothing else changed.
    canonical = json.dumps([[e.to_json() for e in unique.values()], skipped], sort_keys=True)
    return Document(zlib.crc32(canonical.encode()), tuple(unique.values()), tuple(skipped))


def completed_in(document: Document) -> set[str]:
    """The completed events this document lists for the last time (see `document_of`)."""
    return {e.event_id for e in document.events if _state(e.notice) == "completed"}


def completed_listed(scheduled: Optional[bytes]) -> set[str]:
    """The ids this answer still lists as completed: a completed event the answer no longer
    lists need not be remembered as shown (AWS drops them after a while; kept, they grew the
    remembered set for the whole life of the daemon)."""
    try:
        items = json.loads(scheduled) if scheduled else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        return set()
    listed = set()
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("State") == "completed":
            raw_id = item.get("EventId")
            try:
                listed.add(event_identifier(raw_id if isinstance(raw_id, str) else ""))
            except ValueError:
                continue
    return listed


def _state(notice: str) -> object:
    try:
        raw = json.loads(notice)
    except ValueError:
        return None
    return raw.get("State") if isinstance(raw, dict) else None


def _spot(body: bytes, vm_name: str, now: float) -> Event:
    raw = _object(body)
    action, when = raw.get("action"), _time(raw.get("time"))
    if not isinstance(action, str) or when is None:
        raise AwsError(f"no action and time: {short(body)}")
    return Event(
        event_id=f"spot-{action}-{iso_utc(when)}"[:MAX_EVENT_ID],
        event_type="Preempt",
        status=STARTED if now >= when.timestamp() else SCHEDULED,
        resource_type="VirtualMachine",
        resources=(vm_name,),
        not_before=when,
        description=f"spot instance-action: {action}"[:200],
        source="Platform",
        provider="aws",
        notice=_notice(raw),
    )


def _rebalance(body: bytes, vm_name: str) -> Event:
    raw = _object(body)
    when = _time(raw.get("noticeTime"))
    if when is None:
        raise AwsError(f"no noticeTime: {short(body)}")
    return Event(
        event_id=f"rebalance-{iso_utc(when)}",
        event_type="Rebalance",
        status=SCHEDULED,  # a recommendation: it never starts, it only goes away
        resource_type="VirtualMachine",
        resources=(vm_name,),
        not_before=when,
        description="rebalance recommendation: this spot instance is at elevated risk",
        source="Platform",
        provider="aws",
        notice=_notice(raw),
    )


def _maintenance(raw: Any, vm_name: str, now: float) -> Optional[Event]:  # noqa: ANN401
    if not isinstance(raw, dict):
        raise AwsError(f"not an object: {short(raw)}")
    code, raw_id, state = raw.get("Code"), raw.get("EventId"), raw.get("State")
    try:
        event_id = event_identifier(raw_id if isinstance(raw_id, str) else "")
    except ValueError as e:
        raise AwsError(str(e)) from None
    event_type = CODES.get(code) if isinstance(code, str) else None
    if event_type is None:
        raise AwsError(f"unknown Code {short(code)} (known: {', '.join(CODES)})")
    if state == "canceled":
        return None  # it leaves the document: cancelled
    when = _time(raw.get("NotBefore"))
    started = state == "completed" or (when is not None and now >= when.timestamp())
    description = raw.get("Description")
    text = description if isinstance(description, str) else ""
    return Event(
        event_id=event_id,
        event_type=event_type,
        status=STARTED if started else SCHEDULED,
        resource_type="VirtualMachine",
        resources=(vm_name,),
        not_before=when,
        description=text[:1000],
        source="Platform",
        provider="aws",
        notice=_notice(raw),
    )


def _object(body: bytes) -> dict[str, Any]:
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise AwsError(f"not JSON: {short(body)}") from None
    if not isinstance(raw, dict):
        raise AwsError(f"not an object: {short(raw)}")
    return raw


def _time(value: Any) -> Optional[dt.datetime]:  # noqa: ANN401
    """`2026-11-26T10:00:00Z` (spot, rebalance) or `21 Jan 2019 09:00:43 GMT` (scheduled
    events): both are forms Azure's NotBefore parser reads."""
    if not isinstance(value, str):
        return None
    try:
        return parse_not_before(value)
    except ValueError:
        return None


def _notice(raw: Any) -> str:  # noqa: ANN401
    text = json.dumps(raw, sort_keys=True)
    return text if len(text) <= MAX_NOTICE else text[:MAX_NOTICE]


class AwsClient:
    """The same calls as ImdsClient (fetch_document, approve, fetch_vm_name, close), for EC2."""

    def __init__(
        self,
        url: str,
        timeout: float,
        first_call_timeout: float,
        vm_name: Optional[str] = None,
    ) -> None:
        self.url = url
        self._http = ImdsClient(url, "", timeout, first_call_timeout, headers={})
        self._token = ""
        self._token_until = 0.0
        self._vm_name = vm_name or ""
        self._completed: set[str] = set()

    def recall(self, events: Iterable[Event]) -> None:
        """Nothing to recall: every AWS notice carries its own time."""

    def close(self) -> None:
        self._http.close()

    def fetch_document(self) -> Document:
        vm_name = self._vm_name or self.fetch_vm_name()
        spot = self._get(SPOT_PATH, missing_ok=True)
        scheduled = self._get(SCHEDULED_PATH, missing_ok=True)
        rebalance = self._get(REBALANCE_PATH, missing_ok=True)
        document = document_of(
            spot,
            scheduled,
            rebalance,
            vm_name=vm_name,
            now=time.time(),
            completed_shown=self._completed,
        )
        shown = self._completed | completed_in(document)
        self._completed = shown & completed_listed(scheduled)
        return document

    def approve(self, event_ids: Iterable[str], *, deadline: Optional[float] = None) -> None:
        raise ImdsError("request", "AWS takes no approval through instance metadata")

    def fetch_vm_name(self) -> str:
        """The instance id: every notice in this instance's metadata is its own."""
        name = (self._get(INSTANCE_ID_PATH) or b"").decode("utf-8", "replace").strip()
        if not name or len(name) > 64 or any(ch.isspace() or not ch.isprintable() for ch in name):
            raise ImdsError("bad_name", f"unusable instance id {name[:80]!r}")
        self._vm_name = self._vm_name or name
        return name

    def _get(self, path: str, *, missing_ok: bool = False) -> Optional[bytes]:
        for attempt in (1, 2):
            headers = {"X-aws-ec2-metadata-token": self._session_token()}
            try:
                return self._http.send("GET", path, headers)
            except ImdsError as e:
                if e.status == 404 and missing_ok:
                    return None
                if e.status == 401 and attempt == 1:
                    self._token_until = 0.0  # expired or revoked: a new one, once
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _session_token(self) -> str:
        now = time.monotonic()
        if not self._token or now >= self._token_until:
            headers: Mapping[str, str] = {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)}
            token = self._http.send("PUT", TOKEN_PATH, headers, b"").decode("ascii", "replace")
            token = token.strip()
            if not token or len(token) > 1024 or not token.isprintable():
                raise ImdsError("bad_document", "IMDSv2 answered no usable token")
            self._token, self._token_until = token, now + TOKEN_TTL - 60
        return self._token
