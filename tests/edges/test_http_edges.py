"""The daemon's HTTP edges against hostile peers on loopback, end to end: a webhook receiver
whose reply never ends or drips bytes for ever, and idle connections that crowd out /health."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import requests

from tests.conftest import VM, cli, wait_for
from tests.etcd_cluster import free_ports
from tests.system.test_observability import Receiver


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


class Hostile:
    """A webhook receiver on loopback that answers by path: `/endless` 200 and a chunked body
    that never ends, `/endless503` the same with 503, `/drip-head` its status line and then a
    header byte every half second, `/drip-body` 200 and then a body byte every half second,
    `/drip-tls` (as `every`) a TLS handshake record a byte every half second.
    Each reply stops at `cap` bytes, after `seconds`, or when the daemon hangs up (bounded,
    whatever the daemon does). `sent[path]`: bytes sent; `requests[path]`: requests received."""

    def __init__(self, cap: int = 256 << 20, seconds: float = 60.0, every: str = "") -> None:
        self.every = every  # the reply to any path (an etcd client's), counted under it
        self.cap = cap
        self.seconds = seconds
        self.sent: dict[str, int] = {}
        self.requests: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                path = self.every or self._request(conn)
                if self.every and self.every != "/drip-tls":  # a TLS client speaks first
                    self._request(conn)
                with self._lock:
                    self.requests[path] = self.requests.get(path, 0) + 1
                self._reply(conn, path)
            except OSError:
                pass  # the daemon hung up: what it should do

    def _request(self, conn: socket.socket) -> str:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                raise OSError("closed")
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        length = next(
            (int(line.split(b":")[1]) for line in head.split(b"\r\n")
             if line.lower().startswith(b"content-length:")),
            0,
        )  # fmt: skip
        while len(body) < length:
            body += conn.recv(65536)
        return head.split(b" ")[1].decode()

    def _send(self, conn: socket.socket, path: str, data: bytes) -> None:
        conn.sendall(data)
        with self._lock:
            self.sent[path] = self.sent.get(path, 0) + len(data)

    def _reply(self, conn: socket.socket, path: str) -> None:
        started = time.monotonic()
        more = lambda: (  # noqa: E731
            not self._stop.is_set()
            and time.monotonic() - started < self.seconds
            and self.sent.get(path, 0) < self.cap
        )
        if path in ("/endless", "/endless503"):
            status = b"200 OK" if path == "/endless" else b"503 Service Unavailable"
            self._send(
                conn, path, b"HTTP/1.1 " + status + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            chunk = b"%x\r\n" % 65536 + b"x" * 65536 + b"\r\n"
            while more():
                self._send(conn, path, chunk)
        elif path == "/drip-head":
            self._send(conn, path, b"HTTP/1.1 200 OK\r\nX-Drip: ")
            while more():
                self._send(conn, path, b"x")
                self._stop.wait(0.5)
        elif path == "/drip-tls":  # a handshake record of 16 KiB, a byte every half second
            self._send(conn, path, b"\x16\x03\x03\x40\x00")
            while more():
                self._send(conn, path, b"\x00")
                self._stop.wait(0.5)
        elif path == "/drip-body":
            self._send(conn, path, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            while more():
                self._send(conn, path, b"1\r\nx\r\n")
                self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        for thread in self._threads:
            thread.join(10)


def _hostile_daemon(daemons, hooks, hostile, good, *paths):
    """A daemon whose webhooks are `paths` of the hostile receiver (timeout 2 s, `detected`
    only; /endless503 retried once) and the good receiver (every message)."""
    cfg = daemons.config(
        vm_name=VM,
        hooks={"drain": [{"command": [hooks.recorder("drain")]}]},
        events={"Reboot": ["drain"]},
        webhooks=[
            *(
                {
                    "url": hostile.url(path),
                    "retries": 1 if path == "/endless503" else 0,
                    "on": ["detected"],
                    "timeout": 2,
                }
                for path in paths
            ),
            {"url": good.url},
        ],
    )
    return daemons.start(cfg)


def _outcomes(daemon, hostile, count: int, timeout: float = 30) -> list[tuple[str, int]]:
    """The hostile receiver's messages as (logged, status or 0), once `count` are logged."""
    url = f"http://127.0.0.1:{hostile.port}/..."

    def logged() -> list[tuple[str, int]]:
        return sorted(
            (r["event"], r.get("status", 0))
            for r in list(daemon.records)
            if r.get("url") == url and r.get("event") in ("webhook_delivered", "webhook_failed")
        )

    try:
        return wait_for(lambda: len(logged()) >= count and logged(), timeout, f"{count} logged")
    except AssertionError as e:
        raise AssertionError(f"{e}: only {logged()}") from None


def _works_on(daemon, sim, good) -> None:
    """The daemon works on: the good receiver has detected, approved and completed, polls go
    on, a second event is approved."""
    wait_for(lambda: len(good.bodies()) >= 3, 15, "detected, approved, completed")
    daemon.polls_seen(sim)
    second = sim.add_event("Reboot", [VM], not_before_in=600)
    daemon.wait_log("event_approved", event_id=second, timeout=30)


@pytest.fixture
def hostile():
    server = Hostile()
    yield server
    server.stop()


@pytest.fixture
def good():
    """A receiver that answers 200 at once."""
    server = Receiver()
    yield server
    server.stop()


def test_a_webhook_reply_that_never_ends_costs_a_few_kib_not_the_daemons_memory(
    daemons, hooks, sim, hostile, good
):
    """A receiver answering 200 with a 1.5 GiB chunked body took the daemon from 36 MB to
    1.58 GB: the reply was read whole (and urllib3 read a retried 503's whole body before
    retrying). Of a reply only a few KiB are read: the daemon's peak memory (VmHWM) stays
    within 64 MiB of its size before, though each endless reply could send 256 MiB; a 200 is
    delivered, a 503 retried once and failed, and the daemon works on."""
    daemon = _hostile_daemon(daemons, hooks, hostile, good, "/endless", "/endless503")
    before = _rss_kib(daemon.proc.pid)
    event_id = sim.add_event("Reboot", [VM], not_before_in=600)
    daemon.wait_log("event_approved", event_id=event_id, timeout=30)
    outcome = _outcomes(daemon, hostile, 2)
    peak = _rss_kib(daemon.proc.pid, "VmHWM")
    assert peak < before + 64 * 1024, f"VmHWM {peak} KiB, VmRSS {before} KiB before"
    assert outcome == [("webhook_delivered", 200), ("webhook_failed", 503)], outcome
    assert hostile.requests["/endless503"] == 2, "retried once"
    assert hostile.sent["/endless"] < 64 << 20, "the daemon hung up on the endless body"
    _works_on(daemon, sim, good)


def test_a_webhook_receiver_dripping_a_byte_a_second_holds_its_sender_only_to_the_timeout(
    daemons, hooks, sim, hostile, good
):
    """Suspected in review, confirmed: requests' timeout is per read, so a receiver dripping
    its headers or its body a byte every half second kept the exchange, and the webhook's
    only thread, for ever (no message after it was ever sent). The whole exchange has one
    deadline (the webhook's `timeout`, 2 s): headers not whole by then fail as a timeout; a
    2xx whose body drips is delivered at the deadline."""
    daemon = _hostile_daemon(daemons, hooks, hostile, good, "/drip-head", "/drip-body")
    sent = time.monotonic()
    event_id = sim.add_event("Reboot", [VM], not_before_in=600)
    outcome = _outcomes(daemon, hostile, 2)
    took = time.monotonic() - sent
    assert outcome == [("webhook_delivered", 200), ("webhook_failed", 0)], outcome
    (timed_out,) = daemon.logs("webhook_failed", url=f"http://127.0.0.1:{hostile.port}/...")
    assert "timeout" in timed_out["error"], timed_out
    assert took < 10, f"{took:.1f}s with a timeout of 2 s for each"
    daemon.wait_log("event_approved", event_id=event_id, timeout=30)
    _works_on(daemon, sim, good)


def test_an_https_receiver_dripping_its_tls_handshake_is_cut_at_the_timeout(
    daemons, hooks, sim, good
):
    """The TLS handshake is within the deadline too, though the watch cannot shut its socket
    (urllib3 has handed it to ssl, detached): CPython gives a whole handshake one deadline, the
    socket's timeout, which is the time left. (Passes on the code before the watch as well:
    it guards that the timeout given to requests stays the time left.)"""
    hostile = Hostile(every="/drip-tls", seconds=30)
    try:
        cfg = daemons.config(
            vm_name=VM,
            events={"Reboot": []},
            webhooks=[
                {"url": f"https://127.0.0.1:{hostile.port}/hook", "retries": 0, "timeout": 2},
                {"url": good.url},
            ],
        )
        daemon = daemons.start(cfg)
        sent = time.monotonic()
        sim.add_event("Reboot", [VM], not_before_in=600)
        url = f"https://127.0.0.1:{hostile.port}/..."
        failed = daemon.wait_log("webhook_failed", url=url, timeout=15)
        assert time.monotonic() - sent < 10
        assert "timeout" in failed["error"], failed
        _works_on(daemon, sim, good)
    finally:
        hostile.stop()


# ---- etcd's client: the same bounds, per call and per message of a watch --------------------


def _etcd(hostile: Hostile, timeout: float = 2.0):
    from scheduledeventsd.config import Etcd  # noqa: PLC0415
    from scheduledeventsd.coordination.etcd import EtcdClient  # noqa: PLC0415

    return EtcdClient(Etcd(endpoints=(f"http://127.0.0.1:{hostile.port}",), timeout=timeout))


def test_an_etcd_answer_that_never_ends_is_refused_after_a_few_mib():
    """A range answer was read whole (requests' `content`): an endpoint answering an endless
    body had the daemon read it to its end. An answer is read up to MAX_MESSAGE (4 MiB)."""
    from scheduledeventsd.coordination.etcd import MAX_MESSAGE, EtcdError  # noqa: PLC0415

    hostile = Hostile(every="/endless", cap=128 << 20)
    client = _etcd(hostile, timeout=10)
    try:
        with pytest.raises(EtcdError) as raised:
            client.range("/scheduledeventsd/")
        assert hostile.sent["/endless"] < MAX_MESSAGE + (8 << 20), "it hung up at the bound"
        assert raised.value.kind == "bad_answer", raised.value
    finally:
        client.close()
        hostile.stop()


def test_an_etcd_endpoint_dripping_bytes_fails_the_call_at_its_timeout():
    """requests' timeout is per read: an endpoint sending a byte every half second kept a
    call (a lease keep-alive, a slot's take) for ever. The whole call has the timeout."""
    from scheduledeventsd.coordination.etcd import EtcdError  # noqa: PLC0415

    for path in ("/drip-head", "/drip-body"):
        hostile = Hostile(every=path, seconds=30)
        client = _etcd(hostile, timeout=1)
        started = time.monotonic()
        try:
            with pytest.raises(EtcdError) as raised:
                client.keep_alive("7587879012345")
            took = time.monotonic() - started
            assert raised.value.kind == "timeout", (path, raised.value)
            assert took < 5, (path, took)
        finally:
            client.close()
            hostile.stop()


def test_an_etcd_watch_message_that_never_ends_is_refused_after_a_few_mib():
    """A watch message was kept whole until its newline (requests' iter_lines): a stream that
    never sends one grew without bound. Each message is read up to MAX_MESSAGE."""
    from scheduledeventsd.coordination.etcd import MAX_MESSAGE, EtcdError  # noqa: PLC0415

    hostile = Hostile(every="/endless", cap=128 << 20)
    client = _etcd(hostile, timeout=10)
    try:
        with pytest.raises(EtcdError) as raised:
            for _ in client.watch("/scheduledeventsd/", 1, idle=10):
                pass
        assert hostile.sent["/endless"] < MAX_MESSAGE + (8 << 20), "it hung up at the bound"
        assert raised.value.kind == "bad_answer", raised.value
    finally:
        client.close()
        hostile.stop()


# ---- `status` over HTTP ----------------------------------------------------------------------


def test_status_against_a_reply_that_never_ends_or_drips_answers_within_its_timeout(daemons):
    """`scheduledeventsd status` read /status whole with a per-read timeout: whatever answered
    on the port with an endless body was read to its end, one dripping bytes held it as long as
    it dripped. It reads at most 16 MiB, within 3 s for all of it, then says there is no
    status (no daemon ran here)."""
    for path in ("/endless", "/drip-head", "/drip-body"):
        hostile = Hostile(every=path, cap=128 << 20, seconds=30)
        try:
            cfg = daemons.config(vm_name=VM, http={"listen": f"127.0.0.1:{hostile.port}"})
            config_path = daemons.write_config(cfg)
            started = time.monotonic()
            shown = cli("status", "--config", str(config_path))
            took = time.monotonic() - started
            assert shown.returncode == 1, (path, shown.stdout, shown.stderr)
            assert "no status" in shown.stderr, (path, shown.stderr)
            assert took < 15, (path, took, shown.stderr)  # 3 s, and Python's start
            assert hostile.sent[path] < 32 << 20, (path, "it hung up at the bound")
        finally:
            hostile.stop()


def test_a_webhook_receivers_retry_after_parks_its_sender_a_minute_at_most():
    """urllib3 slept whatever Retry-After said (a day: the webhook's thread for a day); the
    wait between attempts is BACKOFF doubled, or Retry-After, and never over BACKOFF_MAX."""
    from scheduledeventsd.observe.webhooks import BACKOFF_MAX, _backoff  # noqa: PLC0415

    assert [_backoff(n, None) for n in range(4)] == [0.5, 1.0, 2.0, 4.0]
    assert _backoff(0, 3.0) == 3.0
    assert _backoff(0, 86399.0) == BACKOFF_MAX == 60.0
    assert _backoff(30, None) == BACKOFF_MAX
