"""HTTP to the Instance Metadata Service: fetch the document, approve events, learn the VM name.

Knows HTTP and nothing of hooks. One kept-alive connection; never a proxy (IMDS must not be
proxied, whatever the environment says), never a redirect, a cap on response size, and every
failure raised as one ImdsError whose `kind` is stable enough to log only on change.
"""

from __future__ import annotations

import ipaddress
import json
import re
import select
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Literal, Optional, Protocol

import httptools

from .. import __version__
from ..model import Document, DocumentError, Event, EventCache, parse_document

NAME_API_VERSION = "2021-02-01"
# A real document is a few KiB; this leaves room for 10 000 events or a 1 MB Description (a
# hostile or broken answer must not blind the daemon) and still bounds the memory one read takes.
MAX_BODY = 16 << 20
MAX_HEAD = 64 << 10  # a real answer's headers are a few hundred bytes
# What a request may carry: a target of visible ASCII, header names of token characters, values
# of printable ASCII or tabs. Nothing that could end a line early: an AWS token is the server's
# own text, and a value with CR LF in it would be a header of its own.
_TARGET = re.compile(r"[!-~]+")
_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE = re.compile(r"[\t -~]*")

Failure = Literal[
    "timeout", "connection", "request", "redirect", "too_large", "bad_document", "bad_name", "http"
]


class ImdsError(Exception):
    """A failed exchange: `failure` its class, `status` the HTTP code if IMDS answered."""

    def __init__(
        self,
        failure: Failure,
        detail: str,
        status: Optional[int] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        self.failure = failure
        self.detail = detail
        self.status = status
        self.retry_after = retry_after
        super().__init__(f"{self.kind}: {detail}")

    @property
    def kind(self) -> str:
        """Stable enough to log only on change: `http_503`, `timeout`, ..."""
        return f"http_{self.status}" if self.failure == "http" else self.failure


class MetadataClient(Protocol):
    """What the daemon asks of a cloud's metadata service (Azure's ImdsClient, aws.AwsClient,
    gcp.GcpClient): the events as a Document, an approval, this VM's name."""

    url: str

    def fetch_document(self) -> Document: ...

    def approve(self, event_ids: Iterable[str], *, deadline: Optional[float] = None) -> None:
        """POST StartRequests, answered by `deadline` (monotonic) if given, or ImdsError."""

    def fetch_vm_name(self) -> str: ...

    def recall(self, events: Iterable[Event]) -> None:
        """The events the daemon saved before a restart (Google Cloud's NotBefore counts from
        a first sighting the metadata server does not tell)."""

    def close(self) -> None: ...


class ImdsClient:
    """One kept-alive connection, HTTP/1.1 parsed by httptools (llhttp): it reads no proxy
    variables, follows no redirect, and the document's GET is prepared bytes. At 4 Hz the GET is
    the daemon's CPU at rest: this costs a third of http.client's (its headers go through the
    email parser) and a sixth of requests'."""

    def __init__(
        self,
        url: str,
        api_version: str,
        timeout: float,
        first_call_timeout: float,
        headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.url = url
        self.api_version = api_version
        self.timeout = timeout
        self.first_call_timeout = first_call_timeout
        self._answered = False  # IMDS takes up to 2 min to answer until it first has
        parts = urllib.parse.urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._path = parts.path or "/"
        self._link: Optional[_Link] = None  # the kept-alive socket and its parser
        self._lookup: Optional[_Lookup] = None  # of a host name (Google Cloud's), under way
        host = f"[{self._host}]" if ":" in self._host else self._host
        default = self._port == (443 if self._https else 80)
        self._headers = {
            "Host": host if default else f"{host}:{self._port}",
            "User-Agent": f"scheduledeventsd/{__version__}",
            "Accept-Encoding": "identity",
        }
        self._headers.update({"Metadata": "true"} if headers is None else headers)
        query = urllib.parse.urlencode({"api-version": api_version})
        self._document_request = self._wire("GET", f"{self._path}?{query}", {}, None)
        self._events = EventCache()
        self.etag = ""  # of the last answer (Google Cloud's long-poll asks with it)
        self._last: tuple[bytes, Document] = (b"", Document(0, ()))

    def recall(self, events: Iterable[Event]) -> None:
        """Nothing to recall: Azure's document carries every time it means."""

    def close(self) -> None:
        if self._link is not None:
            self._link.sock.close()
            self._link = None

    def fetch_document(self) -> Document:
        body = self._send(self._document_request)
        if body and body == self._last[0]:
            return self._last[1]  # at rest the same bytes come back every second
        try:
            document = parse_document(body, self._events)
        except DocumentError as e:
            raise ImdsError("bad_document", str(e)) from None
        self._last = (body, document)
        return document

    def approve(self, event_ids: Iterable[str], *, deadline: Optional[float] = None) -> None:
        payload = {"StartRequests": [{"EventId": event_id} for event_id in event_ids]}
        query = urllib.parse.urlencode({"api-version": self.api_version})
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        self._send(self._wire("POST", f"{self._path}?{query}", headers, body), until=deadline)

    def send(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: Optional[bytes] = None,
        *,
        timeout: Optional[float] = None,
    ) -> bytes:
        """One exchange with this endpoint (the other clouds' clients speak through this);
        `timeout`: a longer read for a long-poll."""
        wire = self._wire(method, f"{self._path.rstrip('/')}{target}", headers, body)
        return self._send(wire, timeout)

    def fetch_vm_name(self) -> str:
        """The name as Resources spells it (`<scaleset>_<id>` on scale sets), not the hostname."""
        query = urllib.parse.urlencode({"api-version": NAME_API_VERSION, "format": "text"})
        body = self._send(self._wire("GET", f"/metadata/instance/compute/name?{query}", {}, None))
        name = body.decode("utf-8", "replace").strip()
        if not name or any(ch.isspace() or not ch.isprintable() for ch in name):
            raise ImdsError("bad_name", f"unusable VM name {name[:80]!r}")
        return name

    def _wire(
        self, method: str, target: str, headers: Mapping[str, str], body: Optional[bytes]
    ) -> bytes:
        """The request as it goes on the wire. A header or target that could end a line (an
        AWS token is the server's own text) is refused, never sent."""
        fields = {**self._headers, **headers}
        if body is not None:
            fields["Content-Length"] = str(len(body))
        bad = [] if _TARGET.fullmatch(target) else [f"target {target[:200]!r}"]
        bad += [
            f"header {name[:100]!r}"
            for name, value in fields.items()
            if not (_NAME.fullmatch(name) and _VALUE.fullmatch(value))
        ]
        if bad:
            raise ImdsError("request", f"refused to send a {', '.join(bad)}: it could end a line")
        lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in fields.items())]
        return "\r\n".join(lines).encode("ascii") + b"\r\n\r\n" + (body or b"")

    def _connect(self, deadline: float) -> _Link:
        link = self._link
        if link is not None and select.select([link.sock], [], [], 0)[0]:
            self.close()  # IMDS closed the idle connection (readable at EOF): a fresh one
        if self._link is None:
            sock = self._open(deadline)
            if self._https:
                context = ssl.create_default_context()
                sock = context.wrap_socket(sock, server_hostname=self._host)
            self._link = _Link(sock)
        return self._link

    def _open(self, deadline: float) -> socket.socket:
        """A connection to the first address that takes one, name lookup included, within the
        request's deadline: the C library's resolver keeps its own timeouts (5 s per try and
        server by default), which no socket timeout bounds."""
        addresses = [(self._host, self._port)]
        if not _literal(self._host):
            if self._lookup is None:
                self._lookup = _Lookup(self._host, self._port)
            lookup = self._lookup
            if not lookup.done.wait(max(0.0, deadline - time.monotonic())):
                raise ImdsError("timeout", f"the lookup of {self._host} outlived the timeout")
            self._lookup = None  # the next connection looks it up again
            if lookup.error is not None:
                raise lookup.error
            addresses = lookup.addresses
        error: OSError = OSError(f"no address for {self._host}")
        for address in addresses:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ImdsError("timeout", f"connecting to {self._host} outlived the timeout")
            try:
                return socket.create_connection(address, timeout=min(self.timeout, left))
            except OSError as e:
                error = e
        raise error

    def _send(
        self, wire: bytes, timeout: Optional[float] = None, until: Optional[float] = None
    ) -> bytes:
        """One exchange. A kept-alive connection IMDS closed meanwhile is opened again once;
        any other failure closes it, so the next call starts clean. `until` (monotonic): an
        earlier end for the whole exchange (an approval must be answered within its slot)."""
        read_timeout = self.timeout if self._answered else self.first_call_timeout
        if timeout is not None:
            read_timeout = max(read_timeout, timeout)
        deadline = time.monotonic() + read_timeout
        if until is not None:
            deadline = min(deadline, until)
        for attempt in (1, 2):
            reused = self._link is not None
            try:
                return self._exchange(self._connect(deadline), wire, deadline)
            except _StaleConnectionError:
                self.close()
                if attempt == 2 or not reused:
                    raise ImdsError(
                        "connection", "the connection closed before an answer"
                    ) from None
            except ImdsError:
                self.close()
                raise
            except (socket.timeout, TimeoutError) as e:
                self.close()
                raise ImdsError("timeout", _root(e)) from None
            except OSError as e:
                self.close()
                raise ImdsError("connection", _root(e)) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _exchange(self, link: _Link, wire: bytes, deadline: float) -> bytes:
        try:
            link.sock.sendall(wire)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise _StaleConnectionError from e
        answer = link.receive(deadline)
        self._answered = True
        self.etag = answer.header(b"etag")
        if not link.keep_alive():
            self.close()
        return _checked(answer)


class _Answer:
    """One response as httptools reports it, kept within bounds: headers up to MAX_HEAD, the
    body up to MAX_BODY (what is past a bound is counted, not kept)."""

    __slots__ = (
        "begun", "body", "complete", "head_size", "headed", "headers", "size", "status",
        "trailing",
    )  # fmt: skip

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.status = 0
        self.begun = 0  # messages begun: a second one is bytes past this answer
        self.headed = False
        self.complete = False
        self.trailing = False
        self.headers: dict[bytes, bytes] = {}  # names in lower case; the first of a repeat
        self.head_size = 0
        self.body: list[bytes] = []
        self.size = 0

    def on_message_begin(self) -> None:
        self.begun += 1

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value) + 4
        if self.head_size <= MAX_HEAD and not self.complete:
            self.headers.setdefault(name.lower(), value)

    def on_headers_complete(self) -> None:
        self.headed = True

    def on_body(self, chunk: bytes) -> None:
        if not self.complete:
            self.size += len(chunk)
            if self.size <= MAX_BODY:
                self.body.append(chunk)

    def on_message_complete(self) -> None:
        self.begun = max(self.begun, 1)
        self.complete = True

    def header(self, name: bytes) -> str:
        return self.headers.get(name, b"").decode("latin-1")


class _Link:
    """A connection and the parser of its answers: one parser reads a kept-alive connection's
    answers one after the other, so a poll makes neither."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.answer = _Answer()
        self.parser = httptools.HttpResponseParser(self.answer)

    def receive(self, deadline: float) -> _Answer:
        """The answer, within one deadline for the whole of it: each read may wait only for
        what is left of it, so a peer trickling bytes cannot stretch it."""
        answer = self.answer
        answer.reset()
        first = True
        fed = 0
        while not answer.complete:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ImdsError("timeout", "the response outlived its timeout")
            self.sock.settimeout(left)
            data = _read(self.sock, first=first)
            first = False
            if not data:
                if _until_close(self.parser, answer):
                    break  # a body that ends where the connection does
                raise ImdsError("connection", "the connection closed in the middle of the answer")
            _feed(self.parser, answer, data)
            fed += len(data)
            if not answer.headed and fed > MAX_HEAD:  # a line the parser keeps, never ending
                raise ImdsError("too_large", f"response headers larger than {MAX_HEAD} bytes")
        answer.status = self.parser.get_status_code()
        return answer

    def keep_alive(self) -> bool:
        answer = self.answer
        if not answer.complete or answer.begun != 1 or answer.trailing:
            return False
        connection = answer.headers.get(b"connection")
        return _keeps_alive(self.parser.get_http_version(), connection)


def _read(sock: socket.socket, *, first: bool) -> bytes:
    """One read of the answer; nothing at all where it should `first` begin is a kept-alive
    connection the other side had closed."""
    try:
        data = sock.recv(65536)
    except (ConnectionResetError, BrokenPipeError):
        if first:
            raise _StaleConnectionError from None
        raise ImdsError("connection", "reset while reading the answer") from None
    except OSError as e:
        if isinstance(e, (socket.timeout, TimeoutError)):  # one class only from Python 3.10
            raise ImdsError("timeout", "the response outlived its timeout") from None
        raise ImdsError("connection", f"while reading the answer: {_root(e)}") from None
    if not data and first:
        raise _StaleConnectionError
    return data


def _feed(parser: httptools.HttpResponseParser, answer: _Answer, data: bytes) -> None:
    try:
        parser.feed_data(data)
    except httptools.HttpParserError as e:
        if not answer.complete:
            raise ImdsError("connection", f"a malformed answer: {_root(e)}") from None
        answer.trailing = True  # bytes after a whole answer: it stands, the link goes
    if answer.head_size > MAX_HEAD:
        raise ImdsError("too_large", f"response headers larger than {MAX_HEAD} bytes")
    if answer.size > MAX_BODY:
        raise ImdsError("too_large", f"response larger than {MAX_BODY} bytes")


def _keeps_alive(version: str, connection: Optional[bytes]) -> bool:
    """HTTP/1.1 keeps the connection unless told to close, 1.0 only if told to keep it
    (httptools' own answer is gone once the message is complete)."""
    if connection is None:
        return version == "1.1"
    tokens = {token.strip() for token in connection.lower().split(b",")}
    return b"close" not in tokens if version == "1.1" else b"keep-alive" in tokens


def _until_close(parser: httptools.HttpResponseParser, answer: _Answer) -> bool:
    """A response framed by neither Content-Length nor chunks ends at the connection's end."""
    headers = answer.headers
    return (
        parser.get_status_code() >= 200
        and b"content-length" not in headers
        and b"transfer-encoding" not in headers
        and answer.headed
    )


def _checked(answer: _Answer) -> bytes:
    body = b"".join(answer.body)
    status = answer.status
    if status == 200:
        return body
    if 300 <= status < 400:
        location = answer.header(b"location")[:200]
        raise ImdsError("redirect", f"HTTP {status} to {location!r} (not followed)", status)
    snippet = body[:300].decode("utf-8", "replace").strip()
    retry_after = _retry_after(answer.header(b"retry-after"))
    raise ImdsError("http", f"HTTP {status}: {snippet}", status, retry_after)


class _Lookup:
    """getaddrinfo on a thread of its own, so a request waits for it only until its deadline.
    A lookup that outlives one request is not started again: the next request waits on it (and
    the thread ends when the resolver gives up), so a resolver that never answers costs one
    thread, not one per poll."""

    def __init__(self, host: str, port: int) -> None:
        self.done = threading.Event()
        self.addresses: list[tuple[str, int]] = []
        self.error: Optional[OSError] = None
        worker = threading.Thread(target=self._run, args=(host, port), daemon=True)
        worker.name = "imds-lookup"
        worker.start()

    def _run(self, host: str, port: int) -> None:
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            self.addresses = list(dict.fromkeys((str(a[4][0]), port) for a in found))
        except OSError as e:  # socket.gaierror among them
            self.error = e
        except (UnicodeError, ValueError) as e:  # a name IDNA cannot encode
            self.error = OSError(f"{host!r}: {e}")
        finally:
            self.done.set()


def _literal(host: str) -> bool:
    """An IP address needs no lookup (Azure's and AWS's 169.254.169.254)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _StaleConnectionError(Exception):
    """The kept-alive connection was closed by the other side before this request."""


def _retry_after(value: str) -> Optional[float]:
    """Seconds from a Retry-After header (delta-seconds; an HTTP date is not worth a clock)."""
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if 0 <= seconds < 86400 else None


def _root(error: BaseException) -> str:
    """requests nests the useful reason several exceptions deep; show the innermost."""
    while error.__context__ is not None and not str(error):
        error = error.__context__
    text = str(error)
    return text if len(text) <= 300 else text[:297] + "..."
