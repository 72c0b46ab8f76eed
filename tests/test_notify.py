"""systemd's notify protocol against a real datagram socket, from the class and from the daemon."""

from __future__ import annotations

import os
import socket
import time

import pytest

from scheduledeventsd.notify import Notifier

from .conftest import VM, wait_for


@pytest.fixture
def notify_socket(tmp_path):
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.05)
    yield path, sock
    sock.close()


def receive(sock) -> list[dict[str, str]]:
    out = []
    while True:
        try:
            data = sock.recv(4096)
        except (TimeoutError, socket.timeout):
            return out
        out.append(dict(line.split("=", 1) for line in data.decode().splitlines()))


def test_without_notify_socket_every_call_is_a_quiet_no_op():
    n = Notifier({})
    assert not n.enabled
    assert not n.ready("x")
    assert not n.watchdog()


def test_messages_arrive_as_key_value_datagrams(notify_socket):
    path, sock = notify_socket
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"})
    assert n.watchdog_interval == 2.0
    assert n.ready("polling")
    assert n.watchdog()
    assert n.status("line one\nline two")
    assert n.stopping("bye")
    assert receive(sock) == [
        {"READY": "1", "STATUS": "polling"},
        {"WATCHDOG": "1"},
        {"STATUS": "line one line two"},
        {"STOPPING": "1", "STATUS": "bye"},
    ]


def test_watchdog_meant_for_another_pid_is_ignored(notify_socket):
    path, _ = notify_socket
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert n.watchdog_interval is None or os.getpid() == 1


def test_the_daemon_reports_ready_status_watchdog_and_stopping(daemons, sim, notify_socket):
    path, sock = notify_socket
    daemon = daemons.start(env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "3000000"})
    messages: list[dict[str, str]] = []

    def seen(key):
        messages.extend(receive(sock))
        return any(key in m for m in messages)

    wait_for(lambda: seen("READY"), 10, "READY=1")
    sim.add_event("Reboot", [VM])
    wait_for(
        lambda: seen("WATCHDOG") and any("1 event(s)" in m.get("STATUS", "") for m in messages),
        10,
        "watchdog pings and a status naming the event",
    )
    ready = next(m for m in messages if "READY" in m)
    assert f"for {VM}" in ready["STATUS"]
    # The first answer may take minutes, so the watchdog is widened, then restored.
    usecs = [int(m["WATCHDOG_USEC"]) for m in messages if "WATCHDOG_USEC" in m]
    assert usecs[0] > 3_000_000
    assert usecs[-1] == 3_000_000
    time.sleep(0.5)
    assert daemon.stop() == 0
    messages.extend(receive(sock))
    assert any("STOPPING" in m for m in messages)
