"""systemd's notify protocol (READY=1, STATUS=, WATCHDOG=1, STOPPING=1) over NOTIFY_SOCKET.

Written against the socket directly, not systemd-python's C binding: it is a datagram of
text, and doing it here keeps it working (and testable) where that binding is not built.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Optional


class Notifier:
    """Silent no-op when not started by systemd (no NOTIFY_SOCKET)."""

    def __init__(self, environ: Optional[Mapping[str, str]] = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):
            address = "\0" + address[1:]  # Linux abstract namespace
        self._address = address if address.startswith(("/", "\0")) else ""
        self.watchdog_interval = _watchdog_interval(env)
        self._sock: Optional[socket.socket] = None

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def send(self, **fields: str) -> bool:
        """One datagram of KEY=value lines; failure is reported, never raised."""
        if not self._address:
            return False
        payload = "\n".join(f"{k}={v.replace(chr(10), ' ')}" for k, v in fields.items())
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(payload.encode(), self._address)
        except OSError:
            return False
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _watchdog_interval(env: Mapping[str, str]) -> Optional[float]:
    """WATCHDOG_USEC in seconds, if the watchdog is meant for this process."""
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 1_000_000 if usec > 0 else None
