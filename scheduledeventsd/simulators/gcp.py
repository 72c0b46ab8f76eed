"""The Compute Engine metadata server, simulated: the keys providers/gcp.py reads, with long-polls.

Every request needs `Metadata-Flavor: Google` (403 otherwise). `instance/?recursive=true`
answers the instance directory with an ETag; with `wait_for_change=true&last_etag=E` it holds
the request until the directory changes or `timeout_sec` passes, as the real server does.
`instance/upcoming-maintenance?alt=json` answers `{}` or the upcoming window; `instance/name`
the instance. Tests and `scheduledeventsd simulate --provider gcp` drive it in-process
(`maintenance`, `preempt`, `upcoming`, `attribute`, `fail_next`).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable, Optional

from .serving import Serving, reply

INSTANCE_NAME = "gce-vm-1"
PREFIX = "/computeMetadata/v1"
MAX_WAIT = 3600


@dataclass(frozen=True)
class Request:
    path: str
    query: str
    at: float  # time.monotonic()


class GcpSimulator(Serving):
    PATH = PREFIX

    def __init__(self, name: str = INSTANCE_NAME) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._instance: dict[str, Any] = {
            "name": name,
            "id": 1234567890123456789,
            "maintenanceEvent": "NONE",
            "preempted": "FALSE",
            "attributes": {},
        }
        self._upcoming: dict[str, Any] = {}
        self._failures: list[tuple[int, str]] = []  # (status, the path it fails)
        self.requests: deque[Request] = deque(maxlen=10_000)

    # ---- what the tests set -----------------------------------------------------------------

    def maintenance(self, value: str = "MIGRATE_ON_HOST_MAINTENANCE") -> None:
        """NONE when it is over."""
        self._set("maintenanceEvent", value)

    def preempt(self, preempted: bool = True) -> None:
        """FALSE again: a stopped instance started anew (tests and the bench reuse it)."""
        self._set("preempted", "TRUE" if preempted else "FALSE")

    def attribute(self, key: str, value: str) -> None:
        """A custom metadata value set (as `gcloud compute instances add-metadata` does): the
        directory changes, so a long-poll answers, with no notice in it."""
        with self._cond:
            self._instance["attributes"] = {**self._instance["attributes"], key: value}
            self._cond.notify_all()

    def upcoming(self, window_start: Optional[str], status: str = "PENDING") -> None:
        """An upcoming maintenance window (None: none)."""
        with self._cond:
            self._upcoming = (
                {}
                if window_start is None
                else {
                    "type": "SCHEDULED",
                    "maintenance_status": status,
                    "window_start_time": window_start,
                    "can_reschedule": True,
                }
            )

    def fail_next(self, *statuses: int, path: str = "") -> None:
        """The next requests answer these statuses, one each; with `path` (e.g.
        "/instance/upcoming-maintenance") only requests whose path ends so, the others are
        answered as usual."""
        with self._cond:
            self._failures.extend((status, path) for status in statuses)

    def gets(self, path: str = "") -> int:
        return sum(1 for r in list(self.requests) if path in r.path)

    def _set(self, key: str, value: str) -> None:
        with self._cond:
            self._instance[key] = value
            self._cond.notify_all()

    def _etag(self) -> str:
        text = json.dumps(self._instance, sort_keys=True).encode()
        return hashlib.sha256(text).hexdigest()[:16]

    # ---- serving ----------------------------------------------------------------------------

    def answer(self, path: str, query: dict[str, list[str]], flavor: str) -> tuple[int, Any, str]:
        """(status, body, etag); a long-poll blocks here until a change or its timeout."""
        self.requests.append(
            Request(path, urllib.parse.urlencode(query, doseq=True), time.monotonic())
        )
        if flavor != "Google":
            return 403, "Missing Metadata-Flavor:Google header.", ""
        with self._cond:
            for index, (status, failing) in enumerate(self._failures):
                if path.endswith(failing):
                    del self._failures[index]
                    return status, "Service Unavailable", ""
            if path == f"{PREFIX}/instance/name":
                return 200, self.name, ""
            if path == f"{PREFIX}/instance/upcoming-maintenance":
                return 200, dict(self._upcoming), ""
            if path != f"{PREFIX}/instance/":
                return 404, "Not Found", ""
            if query.get("wait_for_change") == ["true"]:
                last = (query.get("last_etag") or [""])[0]
                wait = min(float((query.get("timeout_sec") or ["60"])[0] or 60), MAX_WAIT)
                deadline = time.monotonic() + wait
                while self._etag() == last and time.monotonic() < deadline:
                    self._cond.wait(deadline - time.monotonic())
            return 200, dict(self._instance), self._etag()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        return _handler_for(self)

    def stop(self) -> None:
        with self._cond:  # long-polls under way answer now
            self._cond.notify_all()
        super().stop()


def demo_steps(sim: GcpSimulator) -> list[tuple[float, str, Callable[[], object]]]:
    """What `simulate --provider gcp` and `demo --provider gcp` play: (at s, what, do)."""
    return [
        (2, "maintenance-event: MIGRATE_ON_HOST_MAINTENANCE", sim.maintenance),
        (8, "maintenance-event: NONE (migrated)", lambda: sim.maintenance("NONE")),
        (12, "preempted: TRUE", sim.preempt),
    ]


def _handler_for(sim: GcpSimulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True
        server_version = "Metadata Server for VM"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # noqa: ANN401
            """Quiet."""

        def do_GET(self) -> None:
            parts = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
            status, body, etag = sim.answer(
                parts.path, query, self.headers.get("Metadata-Flavor", "")
            )
            kind = "text/plain" if isinstance(body, str) else "application/json"
            reply(self, status, body, kind, (("ETag", etag),) if etag else ())

    return Handler
