"""Ending a read blocked on a socket from another thread, for a deadline or a stop.

requests' read timeout applies to every recv alone: a peer trickling a byte just inside it keeps
a response alive forever. Shutting the socket down wakes the read blocked on it (closing alone
does not): etcd's watch streams are stopped so, the web server's slow requests, and every
exchange of webhooks, etcd's calls and `status` at its one deadline (`Watch`). (The IMDS
client needs none of it: it reads each part with the time left of one deadline.)
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # requests is imported only by those using it (etcd, webhooks, `status`)
    import requests


def shut_down(sock: socket.socket) -> None:
    """Wake a thread blocked reading `sock`: shutting it down does, closing alone does not."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def abort(response: requests.Response) -> None:
    """Close a streaming response under a thread blocked reading it."""
    raw = getattr(response, "raw", None)
    connection = getattr(raw, "_connection", None) or getattr(raw, "connection", None)
    sock = getattr(connection, "sock", None)
    if sock is not None:
        shut_down(sock)
    response.close()


class Watch:
    """One deadline over a whole exchange made with requests: connect, request, headers, body.

    requests' timeout bounds each read alone, so a peer dripping a byte a second (into the
    headers or the body) kept an exchange, and its thread, for ever. The adapter
    (`WatchedAdapter`) hands the watch each connection the exchange uses; at the deadline the
    watch shuts their sockets down, waking any read blocked on them, and again every 0.1 s until
    the exchange ends (a connection that completes just past the deadline is cut too).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.until = time.monotonic() + seconds
        self.expired = False
        self._lock = threading.Lock()
        self._connections: list[object] = []
        self._ended = False
        self._timer = self._arm(seconds)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()

    def left(self) -> float:
        """Seconds to the deadline, for requests' own timeouts (never 0: that means none)."""
        return max(0.01, self.until - time.monotonic())

    def watch(self, connection: object) -> None:
        with self._lock:
            if not self._ended:
                self._connections.append(connection)

    def end(self) -> None:
        with self._lock:
            self._ended = True
            self._connections.clear()
            self._timer.cancel()

    def _arm(self, seconds: float) -> threading.Timer:
        timer = threading.Timer(seconds, self._fire)
        timer.daemon = True
        timer.start()
        return timer

    def _fire(self) -> None:
        with self._lock:
            if self._ended:
                return
            self.expired = True
            for connection in self._connections:
                sock = getattr(connection, "sock", None)
                if isinstance(sock, socket.socket):
                    shut_down(sock)
            self._timer = self._arm(0.1)
