"""Ending a read blocked on a socket from another thread, for a deadline or a stop.

requests' read timeout applies to every recv alone: a peer trickling a byte just inside it keeps
a response alive forever. Shutting the socket down wakes the read blocked on it (closing alone
does not): etcd's watch streams are stopped so, and the web server's slow requests. (The IMDS
client needs none of it: it reads each part with the time left of one deadline.)
"""

from __future__ import annotations

import contextlib
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only etcd's streams are requests'
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
