"""A deadline for a whole HTTP response, not only for each read of it.

requests' read timeout applies to every recv alone: a peer trickling a byte just inside it keeps
a response alive forever. A timer shuts the socket down at the deadline, which wakes the read
blocked on it (closing alone does not); the IMDS and etcd clients share this one helper.
"""

from __future__ import annotations

import contextlib
import socket
import threading

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


class Deadline:
    """`with Deadline(response, seconds) as d:` reads past `seconds` fail; `d.expired` says so."""

    def __init__(self, response: requests.Response, seconds: float) -> None:
        self.expired = False
        self._response = response
        self._timer = threading.Timer(max(0.0, seconds), self._expire)
        self._timer.daemon = True

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._timer.cancel()

    def _expire(self) -> None:
        self.expired = True
        abort(self._response)
