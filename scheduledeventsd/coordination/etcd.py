"""A small client for etcd's v3 JSON gateway (`POST /v3/...` on the client port), with requests.

Knows etcd and HTTP, nothing of events. The gateway is part of every etcd 3.4+ server, so the
daemon needs no gRPC stack (Debian and Fedora package none that fits). Endpoints are tried in
turn until one answers, as etcd's own clients do; an unauthenticated answer (the token expired)
authenticates again once. Never through a proxy, never following a redirect.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import requests

from ..config import Etcd
from ..host.deadline import Watch, abort
from ..host.watched import WatchedAdapter, read_at_most

# gRPC status codes etcd answers with (google.golang.org/grpc/codes)
_UNAUTHENTICATED = 16
_PERMISSION_DENIED = 7
_INVALID_AUTH_TOKEN = "invalid auth token"  # noqa: S105 - an error message etcd sends
_KEY_NOT_FOUND = "key not found"  # a put with ignore_lease on a key that does not exist
# The most read of one answer or one message of a watch stream. Ours are a key per VM of a
# group, a few hundred bytes each (etcd itself refuses requests over 1.5 MiB by default); an
# endless or broken answer must not take the daemon's memory.
MAX_MESSAGE = 4 << 20
# A request's body: one JSON message, or several one after the other (a watch stream's creates)
Body = Union[dict[str, Any], list[dict[str, Any]]]


class EtcdError(Exception):
    """`kind` is a stable label for logs: unreachable, timeout, tls, auth_failed,
    permission_denied, rejected, not_found, watch_cancelled, compacted, bad_answer."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: Optional[bytes]  # None: deleted (in a watch)
    lease: str = ""  # the lease it is under ("" for none, or in a watch)
    revision: int = 0  # its mod_revision, in a read (0 in a watch): which write it is


# A watch's batches of changes; `close()` ends the stream (a generator, read as it comes)
Changes = Generator[list[KeyValue], None, None]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def _b64_bytes(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes:  # noqa: ANN401 - JSON
    if not isinstance(text, str):
        return b""
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        return b""


def prefix_end(prefix: str) -> str:
    """etcd's range end for "every key starting with prefix" (its last byte plus one)."""
    data = prefix.encode("utf-8")
    return base64.b64encode(data[:-1] + bytes([data[-1] + 1])).decode("ascii")


class EtcdClient:
    """One connection pool, for one thread (a `requests.Session` is not thread-safe)."""

    def __init__(self, settings: Etcd) -> None:
        self.settings = settings
        self._session = requests.Session()
        self._session.trust_env = False  # no proxy, no .netrc from a root daemon's environment
        self._session.max_redirects = 0
        self._adapter = WatchedAdapter()  # one deadline for each whole call
        self._session.mount("http://", self._adapter)
        self._session.mount("https://", self._adapter)
        if settings.ca_file is not None:
            self._session.verify = str(settings.ca_file)
        if settings.cert_file is not None and settings.key_file is not None:
            self._session.cert = (str(settings.cert_file), str(settings.key_file))
        self._current = 0
        self._token: Optional[str] = None
        self._stream: Optional[requests.Response] = None
        self._lock = threading.Lock()
        self._closed = False
        self._interrupted = False  # `interrupt`: the watch in progress ends as on `idle`

    # ---- the calls ----------------------------------------------------------------------

    def grant(self, ttl: int) -> str:
        """A lease of `ttl` seconds; keys put under it vanish when it expires."""
        answer = self._call("/v3/lease/grant", {"TTL": ttl})
        lease = answer.get("ID")
        if not isinstance(lease, str) or not re.fullmatch(r"[0-9]+", lease):
            raise EtcdError("bad_answer", f"lease grant without an ID: {answer!r:.200}")
        return lease

    def put(
        self, key: str, value: bytes, lease: Optional[str] = None, *, keep_lease: bool = False
    ) -> int:
        """Returns the revision of the write. `keep_lease`: under the lease the key already
        has (EtcdError `not_found` when there is no such key)."""
        body: dict[str, Any] = {"key": _b64(key), "value": _b64_bytes(value)}
        if lease is not None:
            body["lease"] = lease
        if keep_lease:
            body["ignore_lease"] = True
        return _revision(self._call("/v3/kv/put", body))

    def create(self, key: str, value: bytes, lease: str) -> bool:
        """Put `key` only if it does not exist (one transaction); whether it was put."""
        compare = {"target": "CREATE", "key": _b64(key), "create_revision": "0"}
        return self._txn(compare, {"request_put": self._put_body(key, value, lease)})

    def replace(self, key: str, expected: bytes, value: bytes, lease: str) -> bool:
        """Put `key` (under `lease`) only while it holds exactly `expected`."""
        compare = {"target": "VALUE", "key": _b64(key), "value": _b64_bytes(expected)}
        return self._txn(compare, {"request_put": self._put_body(key, value, lease)})

    def delete(self, key: str, expected: bytes) -> bool:
        """Delete `key` only while it holds exactly `expected` (never another VM's)."""
        compare = {"target": "VALUE", "key": _b64(key), "value": _b64_bytes(expected)}
        return self._txn(compare, {"request_delete_range": {"key": _b64(key)}})

    def put_all(
        self, keys: Sequence[tuple[str, Optional[bytes]]], value: bytes, lease: str
    ) -> bool:
        """Put every key (under `lease`) in one transaction, only while each holds exactly
        what is given with it (None: while it does not exist): all of them, or none."""
        compares = [_holds(key, expected) for key, expected in keys]
        puts = [{"request_put": self._put_body(key, value, lease)} for key, _ in keys]
        return self._txn_all(compares, puts)

    def delete_all(self, keys: Sequence[str], expected: bytes) -> bool:
        """Delete every key in one transaction, only while each holds exactly `expected`."""
        compares = [_holds(key, expected) for key in keys]
        return self._txn_all(compares, [{"request_delete_range": {"key": _b64(k)}} for k in keys])

    def delete_last(self, key: str, prefix: str, also: str) -> bool:
        """Delete `key` (under `prefix`), and `also` with it when no other key is left under
        `prefix`, in one transaction; whether `also` was (the last key under `prefix`)."""
        others = [  # every key under `prefix` but `key`: none (a range compare, etcd >= 3.3)
            {"target": "CREATE", "key": _b64(prefix), "range_end": _b64(key)},
            {"target": "CREATE", "key": _b64(key + "\0"), "range_end": prefix_end(prefix)},
        ]
        mine = {"request_delete_range": {"key": _b64(key)}}
        body = {
            "compare": [{**c, "create_revision": "0"} for c in others],
            "success": [mine, {"request_delete_range": {"key": _b64(also)}}],
            "failure": [mine],
        }
        answer = self._call("/v3/kv/txn", body)
        _revision(answer)  # an answer without a header is no answer
        return answer.get("succeeded") is True

    def keep_alive(self, lease: str) -> int:
        """Renew a lease; its remaining TTL, 0 when it has expired (its keys are gone)."""
        result = self._call("/v3/lease/keepalive", {"ID": lease}).get("result")
        ttl = result.get("TTL", "0") if isinstance(result, dict) else "0"
        return int(ttl) if isinstance(ttl, str) and ttl.isdigit() else 0

    def time_to_live(self, lease: str) -> int:
        """Seconds a lease has left; -1 when it has expired."""
        ttl = self._call("/v3/lease/timetolive", {"ID": lease}).get("TTL", "-1")
        return int(ttl) if isinstance(ttl, (str, int)) and str(ttl).lstrip("-").isdigit() else -1

    def lease_keys(self, lease: str) -> Optional[list[str]]:
        """The keys on a lease; None when it has expired."""
        answer = self._call("/v3/lease/timetolive", {"ID": lease, "keys": True})
        if str(answer.get("TTL", "-1")).startswith("-"):
            return None
        keys = answer.get("keys", [])
        if not isinstance(keys, list):
            raise EtcdError("bad_answer", "timetolive: keys is not a list")
        return [_unb64(k).decode("utf-8", "replace") for k in keys]

    def lease_times(self, lease: str) -> tuple[int, int]:
        """Seconds a lease has left (-1 when it has expired) and the TTL it was granted with:
        a lease kept alive has left about what it was granted; a silent owner's, less."""
        answer = self._call("/v3/lease/timetolive", {"ID": lease})
        left, granted = str(answer.get("TTL", "-1")), str(answer.get("grantedTTL", "0"))
        return _number(left), _number(granted)

    def move_keys(self, keys: Sequence[str], old: str, new: str) -> bool:
        """Put every key, value unchanged, under lease `new`, in one transaction, only while
        each is still on lease `old` (not rewritten by another, not deleted): all, or none."""
        compares = [{"target": "LEASE", "key": _b64(key), "lease": old} for key in keys]
        puts = [{"request_put": {"key": _b64(k), "ignore_value": True, "lease": new}} for k in keys]
        return self._txn_all(compares, puts)

    def revoke(self, lease: str) -> None:
        """End a lease now: its keys go with it."""
        self._call("/v3/lease/revoke", {"ID": lease})

    def _put_body(self, key: str, value: bytes, lease: str) -> dict[str, Any]:
        return {"key": _b64(key), "value": _b64_bytes(value), "lease": lease}

    def _txn(self, compare: dict[str, Any], then: dict[str, Any]) -> bool:
        return self._txn_all([compare], [then])

    def _txn_all(self, compares: list[dict[str, Any]], then: list[dict[str, Any]]) -> bool:
        answer = self._call("/v3/kv/txn", {"compare": compares, "success": then})
        _revision(answer)  # an answer without a header is no answer
        return answer.get("succeeded") is True

    def put_and_range(
        self, key: str, value: bytes, lease: str, prefix: str, also: Optional[str] = None
    ) -> tuple[int, list[KeyValue]]:
        """Put `key` (under `lease`) and read every key under `prefix` in one transaction: what
        the prefix holds just after the write, as of its revision, with no other read. `also`:
        one more key read in it (with the prefix's, if it is there)."""
        put = {"request_put": self._put_body(key, value, lease)}
        return self._ranges([put], prefix, also)

    def range_with(self, prefix: str, also: str) -> tuple[int, list[KeyValue]]:
        """As `range`, and the key `also` read in the same transaction (one revision)."""
        return self._ranges([], prefix, also)

    def _ranges(
        self, before: list[dict[str, Any]], prefix: str, also: Optional[str]
    ) -> tuple[int, list[KeyValue]]:
        reads = [{"request_range": {"key": _b64(prefix), "range_end": prefix_end(prefix)}}]
        if also is not None:
            reads.append({"request_range": {"key": _b64(also)}})
        answer = self._call("/v3/kv/txn", {"compare": [], "success": before + reads})
        responses = answer.get("responses")
        if not isinstance(responses, list) or len(responses) != len(before) + len(reads):
            raise EtcdError("bad_answer", f"txn: no range in {answer!r:.200}")
        kvs: list[KeyValue] = []
        for response in responses[len(before) :]:
            ranged = response.get("response_range") if isinstance(response, dict) else None
            if not isinstance(ranged, dict):
                raise EtcdError("bad_answer", f"txn: no range in {answer!r:.200}")
            kvs += _kvs(ranged)
        return _revision(answer), kvs

    def range(self, prefix: str) -> tuple[int, list[KeyValue]]:
        """Every key under `prefix` and the revision they are as of (a linearizable read: it
        fails without a quorum rather than answering from a stale member)."""
        answer = self._call("/v3/kv/range", {"key": _b64(prefix), "range_end": prefix_end(prefix)})
        return _revision(answer), _kvs(answer)

    def watch(self, prefix: str, start_revision: int, idle: float) -> Changes:
        """The changes under `prefix` from `start_revision` on, a batch per etcd message.

        Ends (returns) when nothing arrived for `idle` seconds, so the caller can check the
        cluster still has a quorum (a member cut off from it keeps a watch open but silent).
        Raises EtcdError when the stream breaks or etcd cancels the watch.
        """
        return self._watch([(prefix, prefix_end(prefix))], start_revision, idle)

    def watch_keys(self, keys: Sequence[str], start_revision: int, idle: float) -> Changes:
        """As `watch`, for each of `keys` alone, all on one stream (one watcher a key)."""
        return self._watch([(key, None) for key in keys], start_revision, idle)

    def _watch(
        self, ranges: Sequence[tuple[str, Optional[str]]], start_revision: int, idle: float
    ) -> Changes:
        creates = [
            {
                "create_request": {
                    "key": _b64(key),
                    **({"range_end": end} if end is not None else {}),
                    "start_revision": str(start_revision),
                }
            }
            for key, end in ranges
        ]
        response = self._open_stream(creates, idle)
        try:
            for line in _messages(response, MAX_MESSAGE):
                if not line.strip():
                    continue
                result = _decode(line).get("result")
                if not isinstance(result, dict):
                    error = _decode(line).get("error")
                    raise EtcdError("rejected", f"watch: {error!r:.300}")
                if result.get("canceled"):
                    reason = str(result.get("cancel_reason", ""))[:300]
                    if _INVALID_AUTH_TOKEN in reason or "user name is empty" in reason:
                        self._token = None
                    compacted = result.get("compact_revision") not in (None, 0, "0")
                    raise EtcdError("compacted" if compacted else "watch_cancelled", reason)
                events = result.get("events", [])
                if not isinstance(events, list) or not events:
                    continue  # the "created" message, or a progress notification
                yield [_change(e) for e in events if isinstance(e, dict)]
        except requests.exceptions.ConnectionError as e:
            if self._closed or self._interrupted:
                return
            if "Read timed out" in str(e):
                return
            raise EtcdError("unreachable", f"watch stream broke: {_short(e)}") from None
        except requests.exceptions.ChunkedEncodingError as e:
            if self._closed or self._interrupted:
                return
            raise EtcdError("unreachable", f"watch stream broke: {_short(e)}") from None
        finally:
            response.close()
            with self._lock:
                self._stream = None
                self._interrupted = False

    def interrupt(self) -> None:
        """From any thread: the watch in progress ends (returns, as after `idle`); the client
        stays open."""
        with self._lock:
            self._interrupted = True
            stream = self._stream
        if stream is not None:
            abort(stream)

    def __enter__(self) -> EtcdClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """From any thread: ends a watch in progress and the connections (and a `with` block)."""
        with self._lock:
            self._closed = True
            stream = self._stream
        if stream is not None:
            abort(stream)
        self._session.close()

    # ---- HTTP ---------------------------------------------------------------------------

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        for attempt in (1, 2):
            response, content = self._post(
                path, body, stream=False, read_timeout=self.settings.timeout
            )
            answer = _decode(content)
            if response.status_code == 200:
                return answer
            if attempt == 1 and self._auth_expired(answer):
                self._token = None
                continue
            raise _error(path, response.status_code, answer)
        raise AssertionError("unreachable")  # pragma: no cover

    def _open_stream(self, body: list[dict[str, Any]], idle: float) -> requests.Response:
        response, _ = self._post("/v3/watch", body, stream=True, read_timeout=idle)
        if response.status_code != 200:
            answer = _decode(_bounded(response) or b"")
            response.close()
            raise _error("/v3/watch", response.status_code, answer)
        with self._lock:
            if self._closed:
                response.close()
                raise EtcdError("unreachable", "client closed")
            self._stream = response
            interrupted = self._interrupted  # while it was being opened
        if interrupted:
            abort(response)  # read as ended
        return response

    def _post(
        self, path: str, body: Body, *, stream: bool, read_timeout: float
    ) -> tuple[requests.Response, bytes]:
        """POST to the endpoint that answered last, else the next ones in turn; the response
        and its body (b"" for a `stream`, of which only the headers are read here). Each
        endpoint has `timeout` for all of it: connecting, the headers, the body unless streamed
        (requests' own timeout is per read: an endpoint dripping bytes kept a call for ever)."""
        endpoints = self.settings.endpoints
        problems: list[str] = []
        kinds: set[str] = set()
        for offset in range(len(endpoints)):
            index = (self._current + offset) % len(endpoints)
            try:
                response, content = self._post_one(
                    endpoints[index], path, body, stream, read_timeout
                )
            except EtcdError as e:
                if e.kind == "auth_failed":
                    raise
                kinds.add(e.kind)
                problems.append(f"{endpoints[index]}: {e.detail}")
                continue
            if 300 <= response.status_code < 400:
                response.close()
                kinds.add("rejected")
                problems.append(f"{endpoints[index]}: redirect refused")
                continue
            self._current = index
            return response, content
        kind = "tls" if "tls" in kinds else "timeout" if "timeout" in kinds else min(kinds)
        raise EtcdError(kind, "; ".join(problems))

    def _post_one(
        self, endpoint: str, path: str, body: Body, stream: bool, read_timeout: float
    ) -> tuple[requests.Response, bytes]:
        """One endpoint, within one deadline; every failure an EtcdError of its kind."""
        with Watch(self.settings.timeout) as watch:
            self._adapter.watch = watch
            try:
                headers = self._headers(endpoint)
                response = self._session.post(
                    endpoint + path,
                    data="\n".join(
                        json.dumps(m) for m in (body if isinstance(body, list) else [body])
                    ),
                    headers={
                        **headers,
                        "Accept-Encoding": "identity",
                        "Content-Type": "application/json",
                    },
                    timeout=(watch.left(), read_timeout),
                    stream=True,
                    allow_redirects=False,
                )
                content = b"" if stream else _bounded(response)
            except requests.exceptions.SSLError as e:
                raise EtcdError("tls", _short(e)) from None
            except (requests.RequestException, OSError) as e:
                if watch.expired:  # its sockets were shut: the deadline, not the network
                    raise EtcdError("timeout", "no whole answer within the timeout") from None
                kind = "timeout" if isinstance(e, requests.exceptions.Timeout) else "unreachable"
                raise EtcdError(kind, _short(e)) from None
            finally:
                self._adapter.watch = None
        if watch.expired:  # http.client takes headers cut short as ended
            response.close()
            raise EtcdError("timeout", "no whole answer within the timeout")
        if content is None:
            raise EtcdError("bad_answer", f"an answer larger than {MAX_MESSAGE} bytes")
        return response, content

    def _headers(self, endpoint: str) -> dict[str, str]:
        if self.settings.username is None:
            return {}
        if self._token is None:
            self._token = self._authenticate(endpoint)
        return {"Authorization": self._token}

    def _authenticate(self, endpoint: str) -> str:
        password_file = self.settings.password_file
        assert password_file is not None  # noqa: S101 - config checks username goes with it
        try:
            password = password_file.read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as e:
            raise EtcdError("auth_failed", f"{password_file}: {e}") from None
        response = self._session.post(
            f"{endpoint}/v3/auth/authenticate",
            json={"name": self.settings.username, "password": password},
            headers={"Accept-Encoding": "identity"},
            timeout=self.settings.timeout,
            allow_redirects=False,
            stream=True,
        )
        answer = _decode(_bounded(response) or b"")
        token = answer.get("token")
        if response.status_code != 200 or not isinstance(token, str):
            raise EtcdError(
                "auth_failed",
                f"as {self.settings.username!r}: {_message(answer) or response.status_code}",
            )
        return token

    def _auth_expired(self, answer: dict[str, Any]) -> bool:
        return self.settings.username is not None and (
            answer.get("code") == _UNAUTHENTICATED or _INVALID_AUTH_TOKEN in _message(answer)
        )


def _bounded(response: requests.Response) -> Optional[bytes]:
    """The body, None when it is larger than MAX_MESSAGE (then the connection is closed)."""
    try:
        return read_at_most(response, MAX_MESSAGE)
    finally:
        response.close()


def _messages(response: requests.Response, limit: int) -> Iterator[bytes]:
    """A stream's lines (etcd's gateway sends a JSON message a line) as they come; a line
    growing past `limit` is an EtcdError, not the daemon's memory (requests' iter_lines keeps
    an unfinished line whole)."""
    pending = b""
    for chunk in response.iter_content(chunk_size=512):  # what iter_lines reads: no later
        *lines, pending = (pending + chunk).split(b"\n")
        yield from lines
        if len(pending) > limit:
            raise EtcdError("bad_answer", f"a watch message larger than {limit} bytes")
    if pending:
        yield pending


def _kvs(answer: dict[str, Any]) -> list[KeyValue]:
    """The keys of a range answer (a range's own, or one inside a transaction's)."""
    kvs = answer.get("kvs", [])
    if not isinstance(kvs, list):
        raise EtcdError("bad_answer", "range: kvs is not a list")
    return [
        KeyValue(
            _unb64(kv.get("key")).decode("utf-8", "replace"),
            _unb64(kv.get("value")),
            _lease_id(kv.get("lease")),
            _number(str(kv.get("mod_revision", "0"))),
        )
        for kv in kvs
        if isinstance(kv, dict)
    ]


def _number(text: str) -> int:
    return int(text) if text.lstrip("-").isdigit() else -1


def _holds(key: str, expected: Optional[bytes]) -> dict[str, Any]:
    """A transaction's compare: `key` holds exactly `expected` (None: it does not exist)."""
    if expected is None:
        return {"target": "CREATE", "key": _b64(key), "create_revision": "0"}
    return {"target": "VALUE", "key": _b64(key), "value": _b64_bytes(expected)}


def _change(event: dict[str, Any]) -> KeyValue:
    kv = event.get("kv") if isinstance(event.get("kv"), dict) else {}
    assert isinstance(kv, dict)  # noqa: S101 - narrowed above
    key = _unb64(kv.get("key")).decode("utf-8", "replace")
    deleted = event.get("type") == "DELETE"
    return KeyValue(key, None if deleted else _unb64(kv.get("value")))


def _decode(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # a hostile or broken answer is not a crash
        return {"message": raw[:300].decode("utf-8", "replace").strip()}
    return value if isinstance(value, dict) else {}


def _message(answer: dict[str, Any]) -> str:
    return str(answer.get("message") or answer.get("error") or "")[:300]


def _error(path: str, status: int, answer: dict[str, Any]) -> EtcdError:
    message = _message(answer)
    if answer.get("code") == _PERMISSION_DENIED:
        return EtcdError("permission_denied", f"{path}: {message}")
    if answer.get("code") == _UNAUTHENTICATED:
        return EtcdError("auth_failed", f"{path}: {message}")
    if _KEY_NOT_FOUND in message:
        return EtcdError("not_found", f"{path}: {message}")
    return EtcdError("rejected", f"{path}: HTTP {status}: {message}")


def _lease_id(lease: Any) -> str:  # noqa: ANN401 - JSON
    """etcd sends int64 as a JSON string; "0" or none is no lease."""
    text = str(lease) if isinstance(lease, (str, int)) and not isinstance(lease, bool) else ""
    return text if text.isdigit() and text != "0" else ""


def _revision(answer: dict[str, Any]) -> int:
    header = answer.get("header")
    revision = header.get("revision") if isinstance(header, dict) else None
    # etcd sends int64 as a JSON string; json.loads also takes Infinity, which int() refuses.
    if isinstance(revision, str) and re.fullmatch(r"[0-9]{1,19}", revision):
        return int(revision)
    if isinstance(revision, int) and not isinstance(revision, bool) and revision >= 0:
        return revision
    raise EtcdError("bad_answer", f"no revision in {answer!r:.200}")


def _short(e: BaseException) -> str:
    return str(e)[:300]
