"""The tests' TCP proxy (tests/tcp_proxy.py) forwards, holds silent when cut, resets on
demand and forwards again when restored: what the partition tests rely on."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.tcp_proxy import ProxySet, TcpProxy


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """An echo server on loopback: every byte comes back."""
    server = socket.create_server(("127.0.0.1", 0))
    stopped = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while not stopped.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[:2]
    stopped.set()
    with contextlib.suppress(OSError):
        server.shutdown(socket.SHUT_RDWR)  # wakes accept(); close alone does not
    server.close()
    thread.join(5)


def roundtrip(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    return sock.recv(4096)


def talk(sock, address=None):
    """Send and read until the connection fails (an orderly close counts as a reset here)."""
    with sock or socket.create_connection(address, timeout=2) as conn:
        for _ in range(3):
            if not roundtrip(conn, b"two"):
                raise ConnectionResetError("closed")


def test_forwards_holds_silent_when_cut_and_resumes_when_restored(echo):
    with TcpProxy(echo, "127.0.0.2") as proxy:
        assert proxy.host == "127.0.0.2"
        with socket.create_connection((proxy.host, proxy.port), timeout=2) as sock:
            assert roundtrip(sock, b"one") == b"one"
            proxy.cut()
            sock.settimeout(0.5)
            with pytest.raises(socket.timeout):  # TimeoutError only from 3.10
                roundtrip(sock, b"two")
            with socket.create_connection((proxy.host, proxy.port), timeout=2) as fresh:
                fresh.settimeout(0.5)
                with pytest.raises(socket.timeout):  # TimeoutError only from 3.10
                    roundtrip(fresh, b"new")  # a connection made during the cut waits too
                proxy.restore()
                fresh.settimeout(2)
                assert fresh.recv(4096) == b"new"
            sock.settimeout(2)
            assert sock.recv(4096) == b"two", "held bytes are delivered once restored"


def test_a_cut_with_reset_resets_live_and_new_connections_until_restored(echo):
    with TcpProxy(echo, "127.0.0.3") as proxy:
        sock = socket.create_connection((proxy.host, proxy.port), timeout=2)
        assert roundtrip(sock, b"one") == b"one"
        proxy.cut(reset=True)
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            talk(sock)
        sock.close()
        with pytest.raises((ConnectionResetError, BrokenPipeError)):  # at connect or after
            talk(None, (proxy.host, proxy.port))
        proxy.restore()
        with socket.create_connection((proxy.host, proxy.port), timeout=2) as again:
            assert roundtrip(again, b"back") == b"back"


def test_a_proxy_set_gives_one_endpoint_per_target_and_cuts_them_together(echo):
    url = f"http://{echo[0]}:{echo[1]}"
    with ProxySet([url, url], host="127.0.0.4") as path:
        assert len(path.endpoints) == 2
        assert all(e.startswith("http://127.0.0.4:") for e in path.endpoints)
        path.cut()
        assert all(p.is_cut for p in path.proxies)
        path.restore()
        for proxy in path.proxies:
            with socket.create_connection((proxy.host, proxy.port), timeout=2) as sock:
                assert roundtrip(sock, b"hi") == b"hi"
        assert path.accepted == 2
