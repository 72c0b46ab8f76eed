"""systemd's notify protocol against a real datagram socket, from the class and from the daemon."""

from __future__ import annotations

import os
import time

from scheduledeventsd.runtime.notify import Notifier
from scheduledeventsd.simulators.azure import Fault
from tests.conftest import VM, receive, wait_for


def test_without_notify_socket_every_call_is_a_quiet_no_op():
    n = Notifier({})
    assert not n.enabled
    assert not n.send(READY="1", STATUS="x")


def test_messages_arrive_as_key_value_datagrams(notify_socket):
    path, sock = notify_socket
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"})
    assert n.watchdog_interval == 2.0
    assert n.send(READY="1", STATUS="polling")
    assert n.send(WATCHDOG="1")
    assert n.send(STATUS="line one\nline two")
    assert n.send(STOPPING="1", STATUS="bye")
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


def test_the_watchdog_is_pinged_from_the_loop_even_when_polls_are_rare(daemons, sim, notify_socket):
    """poll_interval 20 s with WatchdogSec 2 s: pings must come at least every second."""
    path, sock = notify_socket
    daemons.start(
        daemons.config(metadata={"poll_interval": 20}),
        env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"},
    )
    pings: list[float] = []
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        pings.extend(time.monotonic() for m in receive(sock) if "WATCHDOG" in m)
    assert len(pings) >= 2
    gaps = [b - a for a, b in zip(pings, pings[1:])]
    # Cause: pinged by the loop's own timer, not by the polls 20 s apart.
    assert max(gaps) < 5, gaps


def test_the_watchdog_is_pinged_while_a_poll_hangs(daemons, sim, notify_socket):
    """A GET that hangs for its whole timeout must not starve the watchdog."""
    path, sock = notify_socket
    daemons.start(
        daemons.config(metadata={"timeout": 8, "first_call_timeout": 8}),
        env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"},
    )
    receive(sock)
    sim.add_fault(Fault("delay", delay=4.5, count=1))
    wait_for(lambda: any(r.at for r in list(sim.requests)[-1:]), what="a request")
    pings: list[float] = []
    deadline = time.monotonic() + 4.5
    while time.monotonic() < deadline:
        pings.extend(time.monotonic() for m in receive(sock) if "WATCHDOG" in m)
    gaps = [b - a for a, b in zip(pings, pings[1:])]
    assert len(pings) >= 2
    # Cause: pings went on while the GET hung (behind it, one gap would be its 4.5 s).
    assert max(gaps) < 3, gaps


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
    assert daemon.stop() == 0
    messages.extend(receive(sock))
    assert any("STOPPING" in m for m in messages)
