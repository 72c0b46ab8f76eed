"""A real HTTP server that behaves like IMDS Scheduled Events, for demos, tests and benchmarks.

It enforces what IMDS enforces (Metadata header, api-version, no X-Forwarded-For, 5 requests/s),
answers with IMDS' error bodies, moves approved events to Started and then out of the document,
plays scenario files on a timeline, and injects faults. `/_simulator/...` is its control API.
"""

from __future__ import annotations

import collections
import email.utils
import json
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any, Optional

from .scenario import Scenario, Step
from .serving import Serving, reply

SCHEDULED_EVENTS_PATH = "/metadata/scheduledevents"
NAME_PATH = "/metadata/instance/compute/name"
CONTROL_PREFIX = "/_simulator/"
API_VERSIONS = (
    "2017-03-01",
    "2017-08-01",
    "2017-11-01",
    "2019-01-01",
    "2019-04-01",
    "2019-08-01",
    "2020-07-01",
)
NAME_API_VERSIONS = ("2017-08-01", "2019-06-01", "2020-09-01", "2021-02-01", "2021-12-13")
NEWEST = ["2020-07-01", "2019-08-01", "2019-04-01"]
RATE_LIMIT = 5  # requests per second per VM, as IMDS enforces
HISTORY = 100_000  # requests, approvals and changes kept for tests and the bench
FAULT_KINDS = ("status", "delay", "garbage", "drop", "redirect", "body")


@dataclass
class Fault:
    """Applied to the next `count` matching requests (0: until cleared)."""

    kind: str
    status: int = 500
    delay: float = 0.0
    location: str = ""
    body: str = ""  # kind "body": this exact text is the 200 answer
    count: int = 1
    method: str = "GET"  # GET, POST or ANY
    path: str = ""  # only requests whose path starts with this (empty: any)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(
                f"fault kind must be one of {', '.join(FAULT_KINDS)}, got {self.kind!r}"
            )
        if self.method not in ("GET", "POST", "ANY"):
            raise ValueError(f"fault method must be GET, POST or ANY, got {self.method!r}")


@dataclass(frozen=True)
class Approval:
    event_id: str
    at: float  # time.time() when the POST arrived
    monotonic: float


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    client: tuple[str, int]
    at: float  # time.monotonic()
    wall: float  # time.time(), to compare with other processes' clocks


@dataclass
class _Event:
    fields: dict[str, Any]
    approved_at: Optional[float] = None
    started_at: Optional[float] = None


def rfc1123(when: float) -> str:
    return email.utils.formatdate(when, usegmt=True)


class Simulator(Serving):
    PATH = SCHEDULED_EVENTS_PATH

    """Thread-safe state plus the HTTP server around it; time is read lazily on each request."""

    def __init__(self, scenario: Optional[Scenario] = None, *, rate_limit: bool = True) -> None:
        self.scenario = scenario or Scenario()
        self.vm_name = self.scenario.vm_name
        self.rate_limit = rate_limit
        self._lock = threading.RLock()
        self._incarnation = self.scenario.incarnation
        self._events: dict[str, _Event] = {}
        self._faults: list[Fault] = []
        self._steps = sorted(self.scenario.steps, key=lambda s: s.at)
        self._origin = time.monotonic()
        self._recent: collections.deque[float] = collections.deque()
        self._gets = 0
        # Bounded: a simulator left running for days must not grow without limit.
        self.approvals: collections.deque[Approval] = collections.deque(maxlen=HISTORY)
        self.requests: collections.deque[Request] = collections.deque(maxlen=HISTORY)
        self.changes: collections.deque[tuple[float, int]] = collections.deque(maxlen=HISTORY)
        # (time.time(), EventId, added | started | removed): what a campaign checks against.
        self.history: collections.deque[tuple[float, str, str]] = collections.deque(maxlen=HISTORY)

    # ---- state --------------------------------------------------------------------------------

    @property
    def incarnation(self) -> int:
        with self._lock:
            self._advance()
            return self._incarnation

    def _changed(self) -> None:
        self._incarnation += 1
        self.changes.append((time.monotonic(), self._incarnation))

    def add_event(
        self,
        event_type: str = "Reboot",
        resources: Optional[list[str]] = None,
        *,
        event_id: Optional[str] = None,
        status: str = "Scheduled",
        not_before_in: Optional[float] = 900.0,
        description: str = "Host server is undergoing maintenance.",
        source: str = "Platform",
        duration: int = -1,
        raw: Optional[dict[str, Any]] = None,
    ) -> str:
        """Add an event (or, with `raw`, exactly the given JSON object); returns its EventId."""
        if raw is None:
            return self.add_from_spec(
                {
                    "EventType": event_type,
                    "Resources": resources,
                    "EventId": event_id,
                    "EventStatus": status,
                    "not_before_in": not_before_in,
                    "Description": description,
                    "EventSource": source,
                    "DurationInSeconds": duration,
                }
            )
        fields = dict(raw)
        event_id = str(fields.get("EventId", event_id or uuid.uuid4()))
        with self._lock:
            self._advance()
            self._add(event_id, fields)
        return event_id

    def _add(self, event_id: str, fields: dict[str, Any], *, quiet: bool = False) -> None:
        started = time.monotonic() if fields.get("EventStatus") == "Started" else None
        self._events[event_id] = _Event(fields, started_at=started)
        self._note(event_id, "added")
        if started is not None:
            self._note(event_id, "started")
        if not quiet:
            self._changed()

    def _note(self, event_id: str, what: str) -> None:
        self.history.append((time.time(), event_id, what))

    def update_event(self, event_id: str, **fields: Any) -> None:  # noqa: ANN401
        with self._lock:
            self._advance()
            self._update(event_id, fields)

    def _update(self, event_id: str, fields: Mapping[str, Any]) -> None:
        event = self._events[event_id]
        event.fields.update(fields)
        if fields.get("EventStatus") == "Started" and event.started_at is None:
            event.started_at = time.monotonic()
            event.fields["NotBefore"] = ""
            self._note(event_id, "started")
        self._changed()

    def remove_event(self, event_id: str) -> None:
        with self._lock:
            self._advance()
            self._remove(event_id)

    def _remove(self, event_id: str) -> None:
        if self._events.pop(event_id, None) is not None:
            self._note(event_id, "removed")
            self._changed()

    def add_fault(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def gets(self) -> int:
        """How many GETs of the document were answered so far (tests wait on this)."""
        with self._lock:
            return self._gets

    def approved(self, event_id: str) -> bool:
        with self._lock:
            return any(a.event_id == event_id for a in self.approvals)

    def event_ids(self) -> list[str]:
        with self._lock:
            self._advance()
            return list(self._events)

    def _advance(self) -> None:
        """Apply due scenario steps and the platform's own transitions."""
        now = time.monotonic()
        while self._steps and self._origin + self._steps[0].at <= now:
            self._apply_step(self._steps.pop(0))
        sc = self.scenario
        for event_id, event in list(self._events.items()):
            f = event.fields
            if f.get("EventStatus") == "Scheduled":
                due_by_approval = (
                    event.approved_at is not None
                    and event.approved_at + sc.start_after_approval <= now
                )
                not_before = _parse_rfc1123(f.get("NotBefore"))
                if due_by_approval or (not_before is not None and not_before <= time.time()):
                    f["EventStatus"] = "Started"
                    f["NotBefore"] = ""
                    event.started_at = now
                    self._note(event_id, "started")
                    self._changed()
            elif (
                f.get("EventStatus") == "Started"
                and sc.started_for is not None
                and event.started_at is not None
                and event.started_at + sc.started_for <= now
            ):
                del self._events[event_id]
                self._note(event_id, "removed")
                self._changed()

    def add_from_spec(self, spec: Mapping[str, Any]) -> str:
        """An event given with IMDS' field names (plus `not_before_in`), as scenarios and the
        control API give them."""
        with self._lock:
            self._advance()
            return self._add_spec(spec)

    def add_many(self, specs: list[Mapping[str, Any]]) -> list[str]:
        """Many events as one change of the document (10 000 at once for a hostile test)."""
        with self._lock:
            self._advance()
            ids = [self._add_spec(spec, quiet=True) for spec in specs]
            self._changed()
            return ids

    def _add_spec(self, spec: Mapping[str, Any], *, quiet: bool = False) -> str:
        status = spec.get("EventStatus", "Scheduled")
        not_before_in = spec.get("not_before_in", 900.0)
        event_id = str(spec.get("EventId") or str(uuid.uuid4()).upper())
        fields = {
            "EventId": event_id,
            "EventStatus": status,
            "EventType": spec.get("EventType", "Reboot"),
            "ResourceType": "VirtualMachine",
            "Resources": [self.vm_name]
            if spec.get("Resources") is None
            else list(spec["Resources"]),
            "NotBefore": str(spec["NotBefore"])  # as given: tests send what IMDS should not
            if "NotBefore" in spec
            else ""
            if status == "Started" or not_before_in is None
            else rfc1123(time.time() + float(not_before_in)),
            "Description": spec.get("Description", "Host server is undergoing maintenance."),
            "EventSource": spec.get("EventSource", "Platform"),
            "DurationInSeconds": spec.get("DurationInSeconds", -1),
        }
        self._add(event_id, fields, quiet=quiet)
        return event_id

    def _apply_step(self, step: Step) -> None:
        """Called by `_advance` with the lock held: uses the inner versions, which do not
        advance again (re-entering it applied later steps first and lost both)."""
        if step.action == "add":
            self._add_spec(step.value)
        elif step.action == "update":
            spec = dict(step.value)
            self._update(spec.pop("EventId"), spec)
        elif step.action == "remove":
            self._remove(str(step.value))
        elif step.action == "fault":
            self._faults.append(Fault(**step.value))

    def document(self, api_version: str = API_VERSIONS[-1]) -> dict[str, Any]:
        """The document as IMDS would render it for this api-version (older ones lack fields)."""
        with self._lock:
            self._advance()
            events = []
            for event in self._events.values():
                f = dict(event.fields)
                if api_version < "2017-11-01" and f.get("EventType") == "Preempt":
                    continue
                if api_version < "2019-01-01" and f.get("EventType") == "Terminate":
                    continue
                for key, since in (
                    ("Description", "2019-04-01"),
                    ("EventSource", "2019-08-01"),
                    ("DurationInSeconds", "2020-07-01"),
                ):
                    if api_version < since:
                        f.pop(key, None)
                events.append(f)
            return {"DocumentIncarnation": self._incarnation, "Events": events}

    def _take_fault(self, method: str, path: str) -> Optional[Fault]:
        with self._lock:
            for fault in self._faults:
                if fault.method in (method, "ANY") and path.startswith(fault.path):
                    if fault.count > 0:
                        fault.count -= 1
                        if fault.count == 0:
                            self._faults.remove(fault)
                    return fault
        return None

    def _over_rate(self) -> bool:
        with self._lock:
            now = time.monotonic()
            while self._recent and self._recent[0] <= now - 1.0:
                self._recent.popleft()
            self._recent.append(now)
            return self.rate_limit and len(self._recent) > RATE_LIMIT

    def _approve(self, event_ids: list[str]) -> None:
        with self._lock:
            self._advance()
            now_wall, now = time.time(), time.monotonic()
            for event_id in event_ids:
                self.approvals.append(Approval(event_id, now_wall, now))
                event = self._events.get(event_id)
                if event is not None and event.approved_at is None:
                    event.approved_at = now

    def state(self) -> dict[str, Any]:
        with self._lock:
            doc = self.document()
            return {
                "incarnation": doc["DocumentIncarnation"],
                "events": doc["Events"],
                "approvals": [{"EventId": a.event_id, "at": a.at} for a in self.approvals],
                "requests": len(self.requests),
            }

    # ---- serving ------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        return _handler_for(self)

    def __enter__(self) -> Simulator:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def _parse_rfc1123(text: Any) -> Optional[float]:  # noqa: ANN401
    if not isinstance(text, str) or not text:
        return None
    try:
        return email.utils.parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, OverflowError):
        return None


def _handler_for(sim: Simulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as IMDS does
        # Headers and body go out in separate writes; without this, Nagle's algorithm and the
        # client's delayed ACK add 40 ms to every kept-alive exchange.
        disable_nagle_algorithm = True
        server_version = "Microsoft-IIS/10.0"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # noqa: ANN401
            """Quiet: the daemon's log is what matters."""

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def do_DELETE(self) -> None:
            self._handle("DELETE")

        def _reply(
            self,
            status: int,
            body: object,
            content_type: str = "application/json; charset=utf-8",
        ) -> None:
            reply(self, status, body, content_type)

        def _body(self) -> bytes:
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(min(length, 1 << 20)) if length > 0 else b""

        def _handle(self, method: str) -> None:
            parts = urllib.parse.urlsplit(self.path)
            body = self._body() if method in ("POST", "DELETE") else b""
            if parts.path.startswith(CONTROL_PREFIX):
                self._control(method, parts.path[len(CONTROL_PREFIX) :], body)
                return
            sim.requests.append(
                Request(
                    method,
                    parts.path,
                    parts.query,
                    dict(self.headers.items()),
                    self.client_address[:2],
                    time.monotonic(),
                    time.time(),
                )
            )
            if sim._over_rate():
                self._reply(429, {"error": "Too many requests"})
                return
            query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
            refused = refusal(
                method, parts.path, query, self.headers.keys(), self.headers.get("Metadata", "")
            )
            if refused is not None:
                self._reply(*refused)
                return
            fault = sim._take_fault(method, parts.path)
            if fault is not None and self._inject(fault):
                return
            if parts.path == NAME_PATH:
                self._reply(200, sim.vm_name, "text/plain; charset=utf-8")
                return
            if method == "GET":
                self._reply(200, sim.document(query["api-version"][0]))
                with sim._lock:
                    sim._gets += 1
                return
            ids = _start_requests(body)
            if ids is None:
                self._reply(400, {"error": "Bad request. Invalid StartRequests body"})
                return
            sim._approve(ids)
            self._reply(200, b"")

        def _inject(self, fault: Fault) -> bool:
            """True if the fault answered (or dropped) the request itself."""
            if fault.kind == "delay":
                time.sleep(fault.delay)
                return False
            if fault.kind == "status":
                self._reply(fault.status, {"error": "simulated failure"})
            elif fault.kind == "garbage":
                self._reply(200, b"<html><body>Service Unavailable</body></html>", "text/html")
            elif fault.kind == "body":
                self._reply(200, fault.body)
            elif fault.kind == "redirect":
                self.send_response(fault.status if 300 <= fault.status < 400 else 307)
                self.send_header("Location", fault.location)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif fault.kind == "drop":
                self.close_connection = True
                self.connection.shutdown(2)
            return True

        def _control(self, method: str, path: str, body: bytes) -> None:
            try:
                spec = json.loads(body) if body else {}
                if method == "GET" and path == "state":
                    self._reply(200, sim.state())
                elif method == "GET" and path == "requests":
                    self._reply(
                        200,
                        [
                            {"method": r.method, "path": r.path, "at": r.at, "wall": r.wall}
                            for r in list(sim.requests)
                        ],
                    )
                elif method == "POST" and path == "events":
                    event_id = sim.add_from_spec(spec)
                    self._reply(
                        201,
                        {"EventId": event_id, "incarnation": sim.incarnation, "at": time.time()},
                    )
                elif method == "DELETE" and path.startswith("events/"):
                    sim.remove_event(path[len("events/") :])
                    self._reply(200, {"incarnation": sim.incarnation})
                elif method == "POST" and path == "faults":
                    sim.add_fault(Fault(**spec))
                    self._reply(201, {})
                elif method == "DELETE" and path == "faults":
                    sim.clear_faults()
                    self._reply(200, {})
                else:
                    self._reply(404, {"error": f"no control endpoint {method} {path}"})
            except (ValueError, TypeError, KeyError) as e:
                self._reply(400, {"error": str(e)})

    return Handler


_BAD_VERSION = (
    "Bad request. api-version is invalid or was not specified in the request. "
    "For more information refer to aka.ms/azureimds"
)
_NO_VERSION = (
    "Bad request. api-version was not specified in the request. "
    "For more information refer to aka.ms/azureimds"
)


def refusal(
    method: str,
    path: str,
    query: dict[str, list[str]],
    header_names: Iterable[str],
    metadata_header: str,
) -> Optional[tuple[int, dict[str, Any]]]:
    """The status and body IMDS answers a request it will not serve, or None."""
    if "x-forwarded-for" in {k.lower() for k in header_names}:
        return 400, {"error": "Bad request. X-Forwarded-For header is not allowed"}
    if metadata_header.lower() != "true":
        return 400, {"error": "Bad request. Required metadata header not specified"}
    if any(len(v) > 1 for v in query.values()):
        return 400, {"error": "Bad request. Query parameters should not be duplicated"}
    api_version = query.get("api-version", [""])[0]
    if not api_version:
        return 400, {"error": _NO_VERSION, "newest-versions": NEWEST}
    if path not in (SCHEDULED_EVENTS_PATH, NAME_PATH) or method == "DELETE":
        return 404, {"error": "Not found"}
    versions = API_VERSIONS if path == SCHEDULED_EVENTS_PATH else NAME_API_VERSIONS
    if api_version not in versions:
        return 400, {"error": _BAD_VERSION, "newest-versions": NEWEST}
    if path == NAME_PATH and method != "GET":
        return 405, {"error": "Method not allowed"}
    if path == NAME_PATH and query.get("format", [""])[0] != "text":
        return 400, {"error": "Bad request. Leaf nodes only support text format"}
    return None


def _start_requests(body: bytes) -> Optional[list[str]]:
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError):
        return None
    requests = raw.get("StartRequests") if isinstance(raw, dict) else None
    if not isinstance(requests, list) or not requests:
        return None
    ids = [r.get("EventId") for r in requests if isinstance(r, dict)]
    if len(ids) != len(requests) or not all(isinstance(i, str) and i for i in ids):
        return None
    return [str(i) for i in ids]
