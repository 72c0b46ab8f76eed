"""The IMDS client against the simulator over loopback: no proxy, no redirects, bounded bodies."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest

from scheduledeventsd.imds import ImdsClient, ImdsError
from scheduledeventsd.simulator import Fault, Scenario, Simulator


@pytest.fixture
def sim():
    s = Simulator(Scenario(vm_name="vm_7"), rate_limit=False)
    s.start()
    yield s
    s.stop()


def client(url, timeout=1.0, first=1.0):
    return ImdsClient(url, "2020-07-01", timeout, first)


def test_fetches_the_document_and_approves(sim):
    event_id = sim.add_event("Reboot")
    c = client(sim.url)
    doc = c.fetch_document()
    assert [e.event_id for e in doc.events] == [event_id]
    c.approve([event_id])
    assert sim.approved(event_id)
    assert sim.requests[-1].headers["Content-Type"] == "application/json"


def test_learns_the_vm_name_from_compute_name(sim):
    assert client(sim.url).fetch_vm_name() == "vm_7"


def test_proxy_environment_is_not_used(sim, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    client(sim.url).fetch_document()


def test_an_http_error_names_its_status(sim):
    sim.add_fault(Fault("status", status=410))
    with pytest.raises(ImdsError) as info:
        client(sim.url).fetch_document()
    assert (info.value.kind, info.value.status) == ("http_410", 410)


def test_a_huge_response_is_refused_not_buffered():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 50000000\r\n\r\n")
        try:
            for _ in range(3000):
                conn.sendall(b"x" * 16384)
        except OSError:
            pass
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with pytest.raises(ImdsError) as info:
        client(f"http://127.0.0.1:{port}/metadata/scheduledevents").fetch_document()
    assert info.value.kind == "too_large"
    listener.close()


def test_a_trickling_body_gets_one_deadline_not_one_per_read():
    """20 bytes every 0.4 s, each read well inside a 1 s timeout: it held a poll for 8 s."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve():
        conn, _ = listener.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        with contextlib.suppress(OSError):
            for _ in range(50):  # 20 s of trickle in all
                conn.sendall(b"x" * 20)
                if stop.wait(0.4):
                    break
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    slow = ImdsClient(f"http://127.0.0.1:{port}/metadata/scheduledevents", "2020-07-01", 1.0, 1.0)
    started = time.monotonic()
    with pytest.raises(ImdsError) as info:
        slow.fetch_document()
    took = time.monotonic() - started
    stop.set()
    listener.close()
    assert info.value.kind == "timeout"
    assert took < 10, f"{took:.1f} s: cut by its deadline, not after the 20 s of trickle"


def test_connection_refused_is_a_connection_error():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(ImdsError) as info:
        client(f"http://127.0.0.1:{port}/metadata/scheduledevents").fetch_document()
    assert info.value.kind == "connection"


def test_the_first_call_waits_longer_than_later_ones(sim):
    c = client(sim.url, timeout=0.3, first=2.0)
    sim.add_fault(Fault("delay", delay=0.8))
    c.fetch_document()
    sim.add_fault(Fault("delay", delay=0.8))
    with pytest.raises(ImdsError) as info:
        c.fetch_document()
    assert info.value.kind == "timeout"
