"""The daemon's own HTTP endpoint: /health for a load balancer's probe, /metrics for Prometheus,
/status for people and scripts. Knows HTTP; what to answer comes from the callables it is given.

Listening on a non-loopback address is for the load balancer: other hosts get /health only.
"""

from __future__ import annotations

import ipaddress
import json
import select
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

from ..config import Listen
from ..host.deadline import shut_down
from ..model import Event

REQUEST_TIMEOUT = 5.0  # a client that sends nothing is dropped, it cannot hold a thread
# At most this many connections are handled at once, so no number of clients can take the
# descriptors hooks and the state file need. Past it the connection waiting longest for its
# request (idle, or trickling one in) is dropped to make room: idle clients that reconnect at
# once starved the load balancer's probe when the newcomer was the one turned away. Only when
# every place is answering a request is the newcomer closed at once.
MAX_CONNECTIONS = 16
REQUEST_DEADLINE = 10.0  # seconds for a whole request: one byte every 4 s no longer keeps it


@dataclass(frozen=True)
class Answers:
    health: Callable[[], Optional[Event]]  # the event taking this VM out of rotation, if any
    metrics: Callable[[], bytes]
    metrics_type: str
    status: Callable[[], dict[str, Any]]


class _Place:
    """One connection being handled: since when, and whether its request is in (answering)."""

    __slots__ = ("answering", "since", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.since = time.monotonic()
        self.answering = False

    def pending(self) -> bool:
        """Bytes of a request wait to be read: a probe just arrived, not an idle client."""
        try:  # not recv(MSG_DONTWAIT): a socket with a timeout waits for it first
            poll = select.poll()
            poll.register(self.sock, select.POLLIN)
            return bool(poll.poll(0))
        except (OSError, ValueError):  # closed meanwhile
            return False


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, listen: Listen, handler: type[BaseHTTPRequestHandler], deadline: float
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
        self._lock = threading.Lock()
        self._places: dict[int, _Place] = {}  # by id() of the request socket
        self._deadline = deadline
        super().__init__((listen.host, listen.port), handler)

    def process_request(self, request: Any, client_address: Any) -> None:  # noqa: ANN401
        with self._lock:
            if len(self._places) >= MAX_CONNECTIONS and not self._evict():
                self.shutdown_request(request)  # all answering: closed, never a thread of its own
                return
            self._places[id(request)] = _Place(request)
        try:
            super().process_request(request, client_address)
        except RuntimeError:  # no thread for it
            self._release(request)
            self.shutdown_request(request)

    def _evict(self) -> bool:
        """Drop the connection waiting longest for its request (one with nothing to read
        first), its place the newcomer's; False when every place is answering. Under _lock."""
        waiting = sorted(
            (p for p in self._places.values() if not p.answering),
            key=lambda p: (p.pending(), p.since),
        )
        if not waiting:
            return False
        victim = waiting[0]
        del self._places[id(victim.sock)]  # its place is taken now, not when its thread ends
        shut_down(victim.sock)  # wakes its thread, which reads the end and goes
        return True

    def answering(self, request: object) -> None:
        """The request is in: from now on its connection is not dropped for a newcomer."""
        with self._lock:
            place = self._places.get(id(request))
            if place is not None:
                place.answering = True

    def _release(self, request: object) -> None:
        with self._lock:
            place = self._places.get(id(request))
            if place is not None and place.sock is request:
                del self._places[id(request)]

    def process_request_thread(self, request: Any, client_address: Any) -> None:  # noqa: ANN401
        timer = threading.Timer(self._deadline, shut_down, args=(request,))  # the deadline
        timer.daemon = True
        timer.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            timer.cancel()
            self._release(request)

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hangs up mid-answer is not worth a traceback on stderr."""


class WebServer:
    def __init__(
        self, listen: Listen, answers: Answers, *, deadline: float = REQUEST_DEADLINE
    ) -> None:
        self.listen = listen
        self._server = _Server(listen, _handler(answers), deadline)
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _local(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _handler(answers: Answers) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "scheduledeventsd"
        sys_version = ""
        timeout = REQUEST_TIMEOUT

        def log_message(self, format: str, *args: Any) -> None:  # noqa: ANN401
            """Probes every few seconds would flood the journal."""

        def do_HEAD(self) -> None:
            self._answer(head=True)

        def do_GET(self) -> None:
            self._answer(head=False)

        def _answer(self, *, head: bool) -> None:
            server = self.server
            if isinstance(server, _Server):
                server.answering(self.request)
            path = self.path.split("?", 1)[0]
            local = _local(self.client_address[0])
            if path == "/health":
                event = answers.health()
                if event is None:
                    self._send(200, b"ok\n", "text/plain; charset=utf-8", head)
                else:
                    text = f"maintenance: {event.event_type} {event.event_id}\n"
                    self._send(503, text.encode(), "text/plain; charset=utf-8", head)
            elif path == "/metrics" and local:
                self._send(200, answers.metrics(), answers.metrics_type, head)
            elif path == "/status" and local:
                body = json.dumps(answers.status(), indent=2).encode() + b"\n"
                self._send(200, body, "application/json", head)
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8", head)

        def _send(self, code: int, body: bytes, content_type: str, head: bool) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if not head:
                self.wfile.write(body)

    return Handler
