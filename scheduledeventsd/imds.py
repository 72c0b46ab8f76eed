"""HTTP to the Instance Metadata Service: fetch the document, approve events, learn the VM name.

Knows HTTP and nothing of hooks. One kept-alive connection; never a proxy (IMDS must not be
proxied, whatever the environment says), never a redirect, a cap on response size, and every
failure raised as one ImdsError whose `kind` is stable enough to log only on change.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterable
from typing import Literal, Optional

import requests
from requests.adapters import HTTPAdapter

from . import __version__
from .deadline import Deadline
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


class ImdsClient:
    def __init__(
        self,
        url: str,
        api_version: str,
        timeout: float,
        first_call_timeout: float,
    ) -> None:
        self.url = url
        self.api_version = api_version
        self.timeout = timeout
        self.first_call_timeout = first_call_timeout
        self._answered = False  # IMDS takes up to 2 min to answer until it first has
        self._document_request: Optional[requests.PreparedRequest] = None
        self._events = EventCache()
        self._last: tuple[bytes, Document] = (b"", Document(0, ()))
        self._session = requests.Session()
        self._session.trust_env = False  # ignore HTTP(S)_PROXY, ALL_PROXY, .netrc
        self._session.proxies = {}
        self._session.headers.clear()
        self._session.headers.update(
            {"Metadata": "true", "User-Agent": f"scheduledeventsd/{__version__}"}
        )
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=1, max_retries=0)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)

    def close(self) -> None:
        self._session.close()

    def fetch_document(self) -> Document:
        if self._document_request is None:
            # Prepared once: re-preparing the same GET every second was a quarter of its CPU.
            self._document_request = self._prepare(
                "GET", self.url, {"api-version": self.api_version}
            )
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
        self._send(self._prepare("POST", self.url, {"api-version": self.api_version}, payload))

    def fetch_vm_name(self) -> str:
        """The name as Resources spells it (`<scaleset>_<id>` on scale sets), not the hostname."""
        parts = urllib.parse.urlsplit(self.url)
        name_url = urllib.parse.urlunsplit(
            (parts.scheme, parts.netloc, "/metadata/instance/compute/name", "", "")
        )
        params = {"api-version": NAME_API_VERSION, "format": "text"}
        body = self._send(self._prepare("GET", name_url, params))
        name = body.decode("utf-8", "replace").strip()
        if not name or any(ch.isspace() or not ch.isprintable() for ch in name):
            raise ImdsError("bad_name", f"unusable VM name {name[:80]!r}")
        return name

    def _prepare(
        self,
        method: str,
        url: str,
        params: dict[str, str],
        payload: Optional[object] = None,
    ) -> requests.PreparedRequest:
        return self._session.prepare_request(
            requests.Request(
                method,
                url,
                params=params,
                data=None if payload is None else json.dumps(payload).encode(),
                headers={"Content-Type": "application/json"} if payload is not None else None,
            )
        )

    def _send(self, request: requests.PreparedRequest) -> bytes:
        read_timeout = self.timeout if self._answered else self.first_call_timeout
        deadline = time.monotonic() + read_timeout
        try:
            response = self._session.send(
                request,
                timeout=(self.timeout, read_timeout),
                allow_redirects=False,
                stream=True,
            )
        except requests.Timeout as e:
            raise ImdsError("timeout", _root(e)) from None
        except requests.ConnectionError as e:
            raise ImdsError("connection", _root(e)) from None
        except requests.RequestException as e:
            raise ImdsError("request", _root(e)) from None
        with response, Deadline(response, deadline - time.monotonic()) as whole:
            try:
                body = _read_capped(response, deadline)
            except requests.RequestException as e:
                if whole.expired:
                    raise ImdsError("timeout", "the response outlived its timeout") from None
                raise ImdsError("connection", f"while reading the body: {_root(e)}") from None
            if whole.expired:
                raise ImdsError("timeout", "the response outlived its timeout")
        self._answered = True
        if response.is_redirect or 300 <= response.status_code < 400:
            location = response.headers.get("Location", "")[:200]
            raise ImdsError(
                "redirect",
                f"HTTP {response.status_code} to {location!r} (not followed)",
                response.status_code,
            )
        if response.status_code != 200:
            snippet = body[:300].decode("utf-8", "replace").strip()
            raise ImdsError(
                "http",
                f"HTTP {response.status_code}: {snippet}",
                response.status_code,
                _retry_after(response.headers.get("Retry-After", "")),
            )
        return body


def _retry_after(value: str) -> Optional[float]:
    """Seconds from a Retry-After header (delta-seconds; an HTTP date is not worth a clock)."""
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if 0 <= seconds < 86400 else None


def _read_capped(response: requests.Response, deadline: float) -> bytes:
    """A huge response must not hold the poll loop hostage (a trickling one is cut by the
    Deadline around this read)."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_content(65536):
        size += len(chunk)
        if size > MAX_BODY:
            raise ImdsError(
                "too_large", f"response larger than {MAX_BODY} bytes", response.status_code
            )
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
