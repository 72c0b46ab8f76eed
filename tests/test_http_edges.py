"""The daemon's HTTP edges against hostile peers on loopback, end to end: a webhook receiver
whose reply never ends or drips a byte a second, and idle connections that crowd out /health."""

from __future__ import annotations

import socket
import threading
import time

import requests

from tests.conftest import VM, wait_for
from tests.etcd_cluster import free_ports


def _probe(port: int) -> str:
    """One load balancer probe: a fresh connection, GET /health; its answer or its failure."""
    try:
        with requests.Session() as session:
            session.trust_env = False
            answer = session.get(f"http://127.0.0.1:{port}/health", timeout=5)
        return str(answer.status_code)
    except requests.RequestException as e:
        return type(e).__name__


class _Idlers:
    """`count` clients that connect and send nothing, and connect again as soon as they are
    dropped: what starved /health. Loopback only, stopped by the test."""

    def __init__(self, port: int, count: int) -> None:
        self.port = port
        self.stopping = threading.Event()
        self.connects = 0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    with self._lock:
                        self.connects += 1
                    while not self.stopping.is_set():  # idle until the server drops it
                        try:
                            if sock.recv(1) == b"":
                                break
                        except (TimeoutError, socket.timeout):
                            continue
            except OSError:
                self.stopping.wait(0.01)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self._threads:
            thread.join(5)


def test_idle_connections_that_reconnect_at_once_do_not_starve_the_health_probe(daemons, sim):
    """20 idle connections, each reconnecting the moment it is dropped, held the 16 places of
    the daemon's HTTP server: 10 of 12 probes were closed unanswered ("Remote end closed
    connection") and the VM left the load balancer's rotation with no maintenance. Idle
    connections are dropped first, so every probe is answered."""
    (port,) = free_ports(1)
    daemon = daemons.start(daemons.config(vm_name=VM, http={"listen": f"127.0.0.1:{port}"}))
    assert _probe(port) == "200"
    idlers = _Idlers(port, 20)
    try:
        wait_for(lambda: idlers.connects >= 20, 10, "the idle connections")
        time.sleep(0.5)  # every place the server has is taken by an idle connection
        answers = []
        for _ in range(12):
            answers.append(_probe(port))
            time.sleep(0.25)
    finally:
        idlers.stop()
    assert answers == ["200"] * 12, answers
    daemon.polls_seen(sim)  # and the daemon polls on
    assert _probe(port) == "200"


def _rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in open(f"/proc/{pid}/status").read().splitlines():  # noqa: SIM115
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")
