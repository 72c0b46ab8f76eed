"""The IMDS client against the simulator over loopback: no proxy, no redirects, bounded bodies."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass

import pytest

from scheduledeventsd.engine import ApprovalFailed
from scheduledeventsd.providers.imds import ImdsClient, ImdsError
from scheduledeventsd.runtime.lanes import approve
from scheduledeventsd.simulators.azure import Fault, Simulator
from scheduledeventsd.simulators.scenario import Scenario


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


@dataclass(frozen=True)
class Close:
    answer: bytes


class Scripted:
    """A raw HTTP server on loopback answering each request with the next scripted bytes, so
    the client meets framings and faults the simulator's http.server never sends. `None`
    closes the connection instead of answering; `Close(answer)` answers, then closes it."""

    def __init__(self, answers, *, pieces=1):
        self.answers = list(answers)
        self.pieces = pieces
        self.connections = 0
        self.requests: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/metadata/scheduledevents"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        with contextlib.suppress(OSError):
            while self.answers:
                conn, _ = self._listener.accept()
                self.connections += 1
                with conn:
                    self._answer(conn)

    def _answer(self, conn):
        while self.answers:
            request = b""
            while b"\r\n\r\n" not in request:
                data = conn.recv(65536)
                if not data:
                    return
                request += data
            self.requests.append(request)
            answer = self.answers.pop(0)
            if answer is None:
                return
            closing = isinstance(answer, Close)
            answer = answer.answer if closing else answer
            size = max(1, len(answer) // self.pieces)
            for i in range(0, len(answer), size):
                conn.sendall(answer[i : i + size])
                if self.pieces > 1:
                    time.sleep(0.001)
            if closing:
                return

    def close(self):
        self._listener.close()


DOC = b'{"DocumentIncarnation": 3, "Events": []}'
OK = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(DOC), DOC)


def test_an_answer_arriving_a_byte_at_a_time_is_read_whole():
    server = Scripted([OK], pieces=len(OK))
    assert client(server.url).fetch_document().incarnation == 3
    server.close()


def test_a_chunked_answer_is_decoded():
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n" + DOC[:5]
    chunked += b"\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(DOC) - 5, DOC[5:])
    server = Scripted([chunked, OK])
    c = client(server.url)
    assert c.fetch_document().incarnation == 3
    assert c.fetch_document().incarnation == 3
    assert server.connections == 1, "a chunked answer leaves the connection usable"
    server.close()


def test_an_answer_ending_with_its_connection_is_read_and_the_connection_not_reused():
    server = Scripted([Close(b"HTTP/1.0 200 OK\r\n\r\n" + DOC), OK])
    c = client(server.url)
    assert c.fetch_document().incarnation == 3
    assert c.fetch_document().incarnation == 3
    assert server.connections == 2
    server.close()


def test_a_connection_closed_mid_answer_is_an_error_not_a_short_document():
    server = Scripted([Close(OK[:-10])])
    with pytest.raises(ImdsError) as info:
        client(server.url).fetch_document()
    assert info.value.kind == "connection"
    assert "middle of the answer" in info.value.detail
    server.close()


def test_a_kept_alive_connection_closed_by_imds_is_opened_again_once():
    server = Scripted([OK, None, OK])
    c = client(server.url)
    c.fetch_document()
    time.sleep(0.1)
    assert c.fetch_document().incarnation == 3
    assert server.connections == 2
    server.close()


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (b"SPDY/9 200 OK\r\n\r\n", "connection"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "connection"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * (70 << 10) + b"\r\n\r\n", "too_large"),
        (
            b"HTTP/1.1 307 Temporary\r\nLocation: http://elsewhere/\r\nContent-Length: 0\r\n\r\n",
            "redirect",
        ),
        (b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nContent-Length: 4\r\n\r\nbusy", "http_503"),
    ],
)
def test_a_malformed_or_refusing_answer_is_one_error_of_its_kind(answer, kind):
    server = Scripted([answer])
    with pytest.raises(ImdsError) as info:
        client(server.url).fetch_document()
    assert info.value.kind == kind
    if kind == "http_503":
        assert info.value.retry_after == 7
    server.close()


def test_bytes_after_a_whole_answer_leave_the_answer_but_not_the_connection():
    server = Scripted([OK + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", OK])
    c = client(server.url)
    assert c.fetch_document().incarnation == 3
    assert c.fetch_document().incarnation == 3, "the stray answer is not taken for the next"
    assert server.connections == 2
    server.close()


@pytest.mark.parametrize(
    "headers",
    [{"X-aws-ec2-metadata-token": "a\r\nInjected: 1"}, {"X": "a\nb"}, {"Bad Name": "v"}],
)
def test_a_header_that_could_end_a_line_is_refused_before_anything_is_sent(headers):
    server = Scripted([OK])
    with pytest.raises(ImdsError) as info:
        client(server.url).send("GET", "/x", headers)
    assert info.value.kind == "request"
    assert server.requests == []
    server.close()


def test_the_request_carries_host_metadata_and_no_proxy_or_encoding_surprises():
    server = Scripted([OK])
    client(server.url).fetch_document()
    head = server.requests[0].decode()
    port = server.url.split(":")[2].split("/")[0]
    assert head.startswith("GET /metadata/scheduledevents?api-version=2020-07-01 HTTP/1.1\r\n")
    assert f"\r\nHost: 127.0.0.1:{port}\r\n" in head
    assert "\r\nMetadata: true\r\n" in head
    assert "\r\nAccept-Encoding: identity\r\n" in head
    server.close()


def test_a_header_that_never_ends_is_refused_at_the_head_bound_not_buffered():
    """The parser keeps a header's bytes until its line ends: an endless one would fill memory
    for as long as the deadline lasts, gigabytes on loopback."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        conn.recv(4096)
        with contextlib.suppress(OSError):
            conn.sendall(b"HTTP/1.1 200 OK\r\nX: ")
            for _ in range(2000):  # 32 MB, if nobody stops reading
                conn.sendall(b"y" * 16384)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    port = listener.getsockname()[1]
    c = ImdsClient(f"http://127.0.0.1:{port}/metadata/scheduledevents", "2020-07-01", 5.0, 5.0)
    started = time.monotonic()
    with pytest.raises(ImdsError) as info:
        c.fetch_document()
    took = time.monotonic() - started
    listener.close()
    assert info.value.kind == "too_large"
    assert took < 2.5, f"{took:.1f} s: refused at the bound, not at the 5 s deadline"


def test_an_approval_with_a_deadline_is_not_sent_after_it_and_given_up_at_it(sim):
    """Review of issue 26 #3: a slot-holding event's POST must be answered within its lease.
    Queued past its deadline (behind another POST on the one approver lane) it is not sent;
    under way at its deadline it is given up then, not after metadata.timeout."""
    event_id = sim.add_event("Reboot")
    c = client(sim.url, timeout=10.0, first=10.0)
    late = approve(c, event_id=event_id, deadline=time.monotonic() - 0.01)
    assert isinstance(late, ApprovalFailed)
    assert late.kind == "deadline"
    assert not [r for r in sim.requests if r.method == "POST"], "never sent"
    sim.add_fault(Fault("delay", delay=3.0, method="POST", count=1))
    started = time.monotonic()
    cut = approve(c, event_id=event_id, deadline=started + 0.5)
    assert isinstance(cut, ApprovalFailed)
    assert cut.kind == "timeout"
    assert time.monotonic() - started < 1.0
