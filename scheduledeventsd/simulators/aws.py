"""EC2's instance metadata service, simulated: IMDSv2 tokens and the notices providers/aws.py reads.

`PUT /latest/api/token` (with `X-aws-ec2-metadata-token-ttl-seconds`) gives a token; every GET
needs a valid one (401 otherwise: IMDSv2 only). `spot/instance-action` answers 404 until a spot
notice is set, `events/maintenance/scheduled` the list of scheduled events with AWS's own time
format, `instance-id` the instance. Tests and `scheduledeventsd simulate --provider aws` drive it
in-process (`spot`, `schedule`, `set_state`, `expire_tokens`, `fail_next`).
"""

from __future__ import annotations

import datetime as dt
import secrets
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable, Optional

from .serving import Serving, reply

INSTANCE_ID = "i-0123456789abcdef0"
MAX_TTL = 21600


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    token: str
    at: float  # time.monotonic()


def aws_time(when: float) -> str:
    """AWS's scheduled-event time format: `21 Jan 2019 09:00:43 GMT`."""
    return dt.datetime.fromtimestamp(when, dt.timezone.utc).strftime("%d %b %Y %H:%M:%S GMT")


def iso(when: float) -> str:
    return dt.datetime.fromtimestamp(when, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class AwsSimulator(Serving):
    def __init__(self, instance_id: str = INSTANCE_ID) -> None:
        self.instance_id = instance_id
        self._lock = threading.Lock()
        self._tokens: dict[str, float] = {}  # token -> monotonic expiry
        self._spot: Optional[dict[str, str]] = None
        self._rebalance: Optional[dict[str, str]] = None
        self._scheduled: dict[str, dict[str, str]] = {}
        self._failures: list[int] = []  # statuses the next GETs answer with
        self.requests: deque[Request] = deque(maxlen=10_000)
        self.tokens_issued = 0

    # ---- what the tests set -----------------------------------------------------------------

    def spot(self, action: str = "terminate", in_seconds: float = 120) -> None:
        with self._lock:
            self._spot = {"action": action, "time": iso(time.time() + in_seconds)}

    def rebalance(self) -> None:
        with self._lock:
            self._rebalance = {"noticeTime": iso(time.time())}

    def clear_spot(self) -> None:
        with self._lock:
            self._spot = None

    def schedule(
        self,
        code: str = "system-reboot",
        in_seconds: float = 600,
        *,
        event_id: Optional[str] = None,
        duration: float = 7200,
        description: str = "scheduled reboot",
    ) -> str:
        event_id = event_id or f"instance-event-{secrets.token_hex(8)}"
        start = time.time() + in_seconds
        with self._lock:
            self._scheduled[event_id] = {
                "Code": code,
                "Description": description,
                "EventId": event_id,
                "NotBefore": aws_time(start),
                "NotAfter": aws_time(start + duration),
                "State": "active",
            }
        return event_id

    def set_state(self, event_id: str, state: str) -> None:
        """`canceled` or `completed`, as AWS marks them (they stay listed)."""
        with self._lock:
            self._scheduled[event_id]["State"] = state

    def remove(self, event_id: str) -> None:
        with self._lock:
            self._scheduled.pop(event_id, None)

    def expire_tokens(self) -> None:
        with self._lock:
            self._tokens.clear()

    def fail_next(self, *statuses: int) -> None:
        with self._lock:
            self._failures.extend(statuses)

    def complete_all(self) -> None:
        with self._lock:
            for event in self._scheduled.values():
                event["State"] = "completed"

    def gets(self, path: str = "") -> int:
        return sum(1 for r in list(self.requests) if r.method == "GET" and path in r.path)

    # ---- serving ----------------------------------------------------------------------------

    def answer(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, Any]:
        now = time.monotonic()
        with self._lock:
            token = headers.get("x-aws-ec2-metadata-token", "")
            self.requests.append(Request(method, path, token, now))
            if method == "PUT":
                if path != "/latest/api/token":
                    return 404, "Not Found"
                ttl = headers.get("x-aws-ec2-metadata-token-ttl-seconds", "")
                if not ttl.isdigit() or not 1 <= int(ttl) <= MAX_TTL:
                    return 400, "Bad Request"
                fresh = secrets.token_urlsafe(32)
                self._tokens[fresh] = now + int(ttl)
                self.tokens_issued += 1
                return 200, fresh
            if self._tokens.get(token, 0.0) <= now:
                return 401, "Unauthorized"
            if self._failures:
                return self._failures.pop(0), "Service Unavailable"
            if path == "/latest/meta-data/instance-id":
                return 200, self.instance_id
            if path == "/latest/meta-data/spot/instance-action":
                return (404, "Not Found") if self._spot is None else (200, self._spot)
            if path == "/latest/meta-data/events/recommendations/rebalance":
                return (404, "Not Found") if self._rebalance is None else (200, self._rebalance)
            if path == "/latest/meta-data/events/maintenance/scheduled":
                return 200, list(self._scheduled.values())
            return 404, "Not Found"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        return _handler_for(self)


def demo_steps(sim: AwsSimulator) -> list[tuple[float, str, Callable[[], object]]]:
    """What `simulate --provider aws` and `demo --provider aws` play: (at s, what, do)."""
    return [
        (2, "scheduled system-reboot in 10 minutes", lambda: sim.schedule("system-reboot", 600)),
        (6, "spot instance-action: terminate in 2 minutes", lambda: sim.spot("terminate", 120)),
        (12, "the reboot completed", sim.complete_all),
    ]


def _handler_for(sim: AwsSimulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True
        server_version = "EC2ws"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # noqa: ANN401
            """Quiet."""

        def do_GET(self) -> None:
            self._handle("GET")

        def do_PUT(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > 0:
                self.rfile.read(min(length, 1 << 16))
            self._handle("PUT")

        def _handle(self, method: str) -> None:
            path = urllib.parse.urlsplit(self.path).path
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, body = sim.answer(method, path, headers)
            reply(self, status, body, "text/plain" if isinstance(body, str) else "application/json")

    return Handler
