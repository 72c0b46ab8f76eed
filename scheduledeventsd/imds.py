"""HTTP to the Instance Metadata Service: fetch the document, approve events, learn the VM name.

Knows HTTP and nothing of hooks. One kept-alive connection; never a proxy (IMDS must not be
proxied, whatever the environment says), never a redirect, a cap on response size, and every
failure raised as one ImdsError whose `kind` is stable enough to log only on change.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Optional, Protocol

from . import __version__
from .deadline import Deadline, shut_down
from .model import Document, DocumentError, EventCache, parse_document

NAME_API_VERSION = "2021-02-01"
# A real document is a few KiB; this leaves room for 10 000 events or a 1 MB Description (a
# hostile or broken answer must not blind the daemon) and still bounds the memory one read takes.
MAX_BODY = 16 << 20

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


@dataclass(frozen=True)
class _Request:
    method: str
    target: str  # path and query
    body: Optional[bytes] = None
    headers: tuple[tuple[str, str], ...] = ()  # beside the client's own


class MetadataClient(Protocol):
    """What the daemon asks of a cloud's metadata service (Azure's ImdsClient, aws.AwsClient,
    gcp.GcpClient): the events as a Document, an approval, this VM's name."""

    url: str

    def fetch_document(self) -> Document: ...

    def approve(self, event_ids: Iterable[str]) -> None: ...

    def fetch_vm_name(self) -> str: ...

    def close(self) -> None: ...


class ImdsClient:
    """http.client on one kept-alive connection: it reads no proxy variables, follows no
    redirect, and a GET costs a third of what requests' did (at 4 Hz that is the daemon's
    CPU at rest)."""

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
        self._connection: Optional[http.client.HTTPConnection] = None
        self._headers = {"User-Agent": f"scheduledeventsd/{__version__}"}
        self._headers.update({"Metadata": "true"} if headers is None else headers)
        self._document_request = _Request(
            "GET", f"{self._path}?{urllib.parse.urlencode({'api-version': api_version})}"
        )
        self._events = EventCache()
        self.etag = ""  # of the last answer (Google Cloud's long-poll asks with it)
        self._last: tuple[bytes, Document] = (b"", Document(0, ()))

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

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

    def approve(self, event_ids: Iterable[str]) -> None:
        payload = {"StartRequests": [{"EventId": event_id} for event_id in event_ids]}
        query = urllib.parse.urlencode({"api-version": self.api_version})
        self._send(_Request("POST", f"{self._path}?{query}", json.dumps(payload).encode()))

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
        request = _Request(
            method, f"{self._path.rstrip('/')}{target}", body, tuple(headers.items())
        )
        return self._send(request, timeout)

    def fetch_vm_name(self) -> str:
        """The name as Resources spells it (`<scaleset>_<id>` on scale sets), not the hostname."""
        query = urllib.parse.urlencode({"api-version": NAME_API_VERSION, "format": "text"})
        body = self._send(_Request("GET", f"/metadata/instance/compute/name?{query}"))
        name = body.decode("utf-8", "replace").strip()
        if not name or any(ch.isspace() or not ch.isprintable() for ch in name):
            raise ImdsError("bad_name", f"unusable VM name {name[:80]!r}")
        return name

    def _connect(self) -> http.client.HTTPConnection:
        sock = None if self._connection is None else self._connection.sock
        if sock is not None and select.select([sock], [], [], 0)[0]:
            self.close()  # IMDS closed the idle connection (readable at EOF): a fresh one
        if self._connection is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._connection = kind(self._host, self._port, timeout=self.timeout)
        return self._connection

    def _send(self, request: _Request, timeout: Optional[float] = None) -> bytes:
        """One exchange. A kept-alive connection IMDS closed meanwhile is opened again once;
        any other failure closes it, so the next call starts clean."""
        read_timeout = self.timeout if self._answered else self.first_call_timeout
        if timeout is not None:
            read_timeout = max(read_timeout, timeout)
        deadline = time.monotonic() + read_timeout
        for attempt in (1, 2):
            connection = self._connect()
            reused = connection.sock is not None
            try:
                return self._exchange(connection, request, read_timeout, deadline)
            except _StaleConnectionError:
                self.close()
                if attempt == 2 or not reused:
                    raise ImdsError(
                        "connection", "the connection closed before an answer"
                    ) from None
            except ImdsError:
                self.close()
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _exchange(
        self,
        connection: http.client.HTTPConnection,
        request: _Request,
        read_timeout: float,
        deadline: float,
    ) -> bytes:
        headers = dict(self._headers)
        headers.update(request.headers)
        if request.body is not None:
            headers["Content-Type"] = "application/json"
        try:
            connection.request(request.method, request.target, request.body, headers)
            response, body = _receive(connection, read_timeout, deadline)
        except (socket.timeout, TimeoutError) as e:
            raise ImdsError("timeout", _root(e)) from None
        except (BrokenPipeError, ConnectionResetError) as e:
            raise _StaleConnectionError from e
        except OSError as e:
            raise ImdsError("connection", _root(e)) from None
        except http.client.HTTPException as e:
            raise ImdsError("request", _root(e)) from None
        self._answered = True
        self.etag = response.getheader("ETag") or ""
        if response.will_close:
            self.close()
        return _answer(response, body)


def _receive(
    connection: http.client.HTTPConnection, read_timeout: float, deadline: float
) -> tuple[http.client.HTTPResponse, bytes]:
    """The answer, within one deadline for the whole of it (headers and body)."""
    sock = connection.sock
    if sock is not None:
        sock.settimeout(read_timeout)

    def expire() -> None:
        if sock is not None:
            shut_down(sock)

    with Deadline(expire, deadline - time.monotonic()) as whole:
        try:
            response = connection.getresponse()
            body = _read_capped(response, deadline)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            if whole.expired:
                raise ImdsError("timeout", "the response outlived its timeout") from None
            raise _StaleConnectionError from None
        except (OSError, http.client.HTTPException) as e:
            if whole.expired or isinstance(e, TimeoutError):
                raise ImdsError("timeout", "the response outlived its timeout") from None
            raise ImdsError("connection", f"while reading the answer: {_root(e)}") from None
        if whole.expired:
            raise ImdsError("timeout", "the response outlived its timeout")
    return response, body


def _answer(response: http.client.HTTPResponse, body: bytes) -> bytes:
    status = response.status
    if 300 <= status < 400:
        location = (response.getheader("Location") or "")[:200]
        raise ImdsError("redirect", f"HTTP {status} to {location!r} (not followed)", status)
    if status != 200:
        snippet = body[:300].decode("utf-8", "replace").strip()
        raise ImdsError(
            "http",
            f"HTTP {status}: {snippet}",
            status,
            _retry_after(response.getheader("Retry-After") or ""),
        )
    return body


class _StaleConnectionError(Exception):
    """The kept-alive connection was closed by the other side before this request."""


def _retry_after(value: str) -> Optional[float]:
    """Seconds from a Retry-After header (delta-seconds; an HTTP date is not worth a clock)."""
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if 0 <= seconds < 86400 else None


def _read_capped(response: http.client.HTTPResponse, deadline: float) -> bytes:
    """A huge response must not hold the poll loop hostage (a trickling one is cut by the
    Deadline around this read)."""
    chunks: list[bytes] = []
    size = 0
    while not response.isclosed():
        chunk = response.read(65536)  # at most what Content-Length has left; closes at its end
        if not chunk:
            break
        size += len(chunk)
        if size > MAX_BODY:
            raise ImdsError("too_large", f"response larger than {MAX_BODY} bytes", response.status)
        if time.monotonic() > deadline:
            raise ImdsError("timeout", "response body took longer than the timeout")
        chunks.append(chunk)
    return b"".join(chunks)


def _root(error: BaseException) -> str:
    """requests nests the useful reason several exceptions deep; show the innermost."""
    while error.__context__ is not None and not str(error):
        error = error.__context__
    text = str(error)
    return text if len(text) <= 300 else text[:297] + "..."
