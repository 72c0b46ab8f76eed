"""A deadline for a whole HTTP response, not only for each read of it.

requests' read timeout applies to every recv alone: a peer trickling a byte just inside it keeps
a response alive forever. A timer shuts the socket down at the deadline, which wakes the read
blocked on it (closing alone does not); the IMDS and etcd clients share this one helper.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:  # only etcd's streams are requests'; the IMDS client needs none of it
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


class _Watch:
    """One thread for every deadline of the process: arming one is a heap push, not a new
    thread (a threading.Timer per poll was a third of a poll's CPU at 4 Hz). Cancelling only
    marks the entry; the thread drops it when it comes to the top."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[list[Any]] = []
        self._order = itertools.count()
        self._thread: Optional[threading.Thread] = None

    def arm(self, at: float, expire: Callable[[], None]) -> list[Any]:
        entry = [at, next(self._order), expire]
        with self._cond:
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="deadlines", daemon=True)
                self._thread.start()
            if self._heap[0] is entry:
                self._cond.notify()
        return entry

    def cancel(self, entry: list[Any]) -> None:
        entry[2] = None

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][2] is None:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                entry = heapq.heappop(self._heap)
                expire, entry[2] = entry[2], None
            with contextlib.suppress(Exception):  # an expiry must never end the watch
                expire()


_WATCH = _Watch()


class Deadline:
    """`with Deadline(on_expiry, seconds) as d:` past `seconds`, `on_expiry` runs (it shuts the
    socket a read is blocked on) and `d.expired` says so."""

    def __init__(self, on_expiry: Callable[[], object], seconds: float) -> None:
        self.expired = False
        self._on_expiry = on_expiry
        self._seconds = max(0.0, seconds)
        self._entry: Optional[list[Any]] = None

    def __enter__(self) -> Deadline:
        self._entry = _WATCH.arm(time.monotonic() + self._seconds, self._expire)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._entry is not None:
            _WATCH.cancel(self._entry)

    def _expire(self) -> None:
        self.expired = True
        self._on_expiry()
