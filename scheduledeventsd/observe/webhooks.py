"""Tell a chat channel or an incident tool what happened, with requests (and retries of our own).

Each webhook has a thread and a bounded queue of its own: delivery (retries with backoff,
a receiver that hangs until its timeout) never holds up polling, hooks, approvals or another
webhook. At least once: a receiver that answered too slowly may get a message twice. What is
sent is chosen by the engine's typed records (`kind_of`), the same records the journal shows.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import queue
import threading
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Optional

import requests

from .. import __version__
from ..config import Webhook, WebhookFormat
from ..host.deadline import Watch
from ..host.watched import WatchedAdapter, read_at_most
from ..providers.imds import _retry_after  # Retry-After read as IMDS' is
from ..records import Cause, Record, What

QUEUE_SIZE = 200  # messages waiting per webhook; beyond it the oldest news is dropped
BACKOFF = 0.5  # 0.5 s, 1 s, 2 s, ... between attempts
BACKOFF_MAX = 60.0  # the longest wait between attempts, whatever Retry-After says
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
MAX_REPLY = 4096  # bytes of a reply's body read at most: only its status is used
_KINDS = {
    What.EVENT_DETECTED: "detected",
    What.EVENT_WAITING: "waiting",
    What.EVENT_APPROVED: "approved",
    What.EVENT_MISSED: "missed",
    What.EVENT_CANCELLED: "cancelled",
    What.EVENT_COMPLETED: "completed",
    What.AFTER_HOOKS_FAILED: "after_hooks_failed",
    What.CLUSTER_DRAINED: "cluster_drained",
    What.CLUSTER_HOLD: "cluster_hold",
    What.CLUSTER_RESTORED: "cluster_restored",
}
_WORDS = {
    "detected": "detected",
    "waiting": "waiting: its hooks are held back (a window, its lead time or a slot)",
    "hooks_failed": "NOT approved: a hook failed; it proceeds at NotBefore",
    "approved": "approved: the maintenance starts now",
    "missed": "missed: first seen already started",
    "cancelled": "cancelled by Azure",
    "completed": "over",
    "after_hooks_failed": "over, but an after-hook failed",
    "cluster_drained": "drained: the cluster moved this node's resources away",
    "cluster_hold": "held: the cluster cannot spare this node; not approved early",
    "cluster_restored": "restored: this node may run resources again",
}
_EVENT_FIELDS = ("event_id", "event_type", "event_status", "not_before", "resources")

Reporter = Callable[[str, Mapping[str, object]], None]  # (log name, fields)


def kind_of(record: Record) -> Optional[str]:
    """The webhook `on` name for an engine record, or None if webhooks do not carry it."""
    if record.what is What.EVENT_NOT_APPROVED:
        cause = record.fields.get("cause")
        return "hooks_failed" if cause == Cause.HOOKS_FAILED.value else None
    return _KINDS.get(record.what)


def payload(hook: Webhook, kind: str, effect: Record, vm_name: str, wall: float) -> dict[str, Any]:
    fields = effect.fields
    if hook.format is WebhookFormat.TEXT:
        when = f", NotBefore {fields['not_before']}" if fields.get("not_before") else ""
        text = (
            f"scheduledeventsd on {vm_name}: {fields.get('event_type')} "
            f"{fields.get('event_id')} {_WORDS[kind]}{when}"
        )
        return {"text": text}
    return {
        "source": "scheduledeventsd",
        "version": __version__,
        "vm_name": vm_name,
        "what": kind,
        "at": dt.datetime.fromtimestamp(wall, dt.timezone.utc).isoformat(timespec="milliseconds"),
        "event": {k: fields.get(k) for k in _EVENT_FIELDS},
        "details": {k: v for k, v in fields.items() if k not in _EVENT_FIELDS},
    }


def where(url: str) -> str:
    """A webhook URL for the log: its path often is the secret (Slack, Teams), so only the host."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{':' + str(parts.port) if parts.port else ''}/..."


def redact(text: str, url: str, secrets: Iterable[str] = ()) -> str:
    """`text` without the URL's path and query, its credentials or header values: requests
    names the whole URL in its errors ("Max retries exceeded with url: /services/T000/...")."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    instead = {url: where(url), path: "/...", parts.path: "/..."}
    for secret in (parts.query, parts.password or "", *secrets):
        instead.setdefault(secret, "[redacted]")
    for piece in sorted((p for p in instead if len(p) > 1), key=len, reverse=True):
        text = text.replace(piece, instead[piece])
    return text


class Webhooks:
    def __init__(self, hooks: tuple[Webhook, ...], report: Reporter) -> None:
        self._senders = [_Sender(h, report) for h in hooks]

    def notice(self, effect: Record, vm_name: str, wall: float) -> None:
        kind = kind_of(effect)
        if kind is None:
            return
        for sender in self._senders:
            if kind in sender.hook.on:
                sender.put(payload(sender.hook, kind, effect, vm_name, wall), kind, effect)

    def stop(self) -> None:
        for sender in self._senders:
            sender.stop()


class _Sender:
    def __init__(self, hook: Webhook, report: Reporter) -> None:
        self.hook = hook
        self._report = report
        self._queue: queue.Queue[Optional[tuple[dict[str, Any], str, Record]]] = queue.Queue(
            QUEUE_SIZE
        )
        self._stopping = threading.Event()
        self._session = requests.Session()
        self._session.trust_env = False  # only the configured proxy, never the environment's
        if hook.proxy:
            self._session.proxies = {"http": hook.proxy, "https": hook.proxy}
        self._adapter = WatchedAdapter()
        self._session.mount("http://", self._adapter)
        self._session.mount("https://", self._adapter)
        self._thread = threading.Thread(target=self._loop, name="webhook", daemon=True)
        self._thread.start()

    def put(self, body: dict[str, Any], kind: str, effect: Record) -> None:
        try:
            self._queue.put_nowait((body, kind, effect))
        except queue.Full:
            self._report(
                "webhook_dropped",
                {"url": where(self.hook.url), "what": kind, "reason": "the queue is full"},
            )

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        self._session.close()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            body, kind, effect = item
            self._deliver(body, kind, effect)

    def _deliver(self, body: dict[str, Any], kind: str, effect: Record) -> None:
        """Attempts with backoff until one is answered 2xx, one is answered a status not worth
        retrying, or the retries are spent; logged once."""
        fields: dict[str, object] = {
            "url": where(self.hook.url),
            "what": kind,
            "event_id": effect.fields.get("event_id"),
        }
        for attempt in range(self.hook.retries + 1):
            last = attempt == self.hook.retries or self._stopping.is_set()
            try:
                status, reason, retry_after = self._attempt(body)
            except requests.RequestException as e:
                if last:
                    error = redact(str(e), self.hook.url, self.hook.headers.values())
                    self._report("webhook_failed", {**fields, "error": error[:300]})
                    return
                self._stopping.wait(_backoff(attempt, None))
                continue
            if 200 <= status < 300:
                self._report("webhook_delivered", {**fields, "status": status})
                return
            if last or status not in RETRY_STATUSES:
                self._report("webhook_failed", {**fields, "status": status, "error": reason})
                return
            self._stopping.wait(_backoff(attempt, retry_after))

    def _attempt(self, body: dict[str, Any]) -> tuple[int, str, Optional[float]]:
        """One POST within one deadline (`timeout`) for all of it, connecting to the last byte
        read; of the reply only the status line, its headers and MAX_REPLY bytes of the body
        are read (a receiver answering 200 with an endless body took the daemon to 1.5 GB)."""
        with Watch(self.hook.timeout) as watch:
            self._adapter.watch = watch
            try:
                response = self._session.post(
                    self.hook.url,
                    json=body,
                    headers={"Accept-Encoding": "identity", **self.hook.headers},
                    timeout=watch.left(),
                    allow_redirects=False,
                    stream=True,
                )
                if watch.expired:  # http.client takes headers cut short as ended
                    response.close()
                    raise requests.Timeout("cut at the deadline")
                try:
                    read_at_most(response, MAX_REPLY)  # a short reply lets the link be reused
                except (requests.RequestException, OSError):
                    pass  # the status is what counts; the body is never used
                finally:
                    response.close()
            except requests.RequestException:
                if watch.expired:
                    raise requests.Timeout(
                        f"no whole answer within the timeout of {self.hook.timeout:g}s"
                    ) from None
                raise
            finally:
                self._adapter.watch = None
        retry_after = _retry_after(response.headers.get("Retry-After", ""))
        return response.status_code, (response.reason or "")[:200], retry_after


def _backoff(attempt: int, retry_after: Optional[float]) -> float:
    """Seconds before the next attempt: BACKOFF doubled each time, or what the receiver asked
    (Retry-After), never more than BACKOFF_MAX: a receiver cannot park the thread for a day."""
    wait = BACKOFF * 2**attempt if retry_after is None else retry_after
    return min(wait, BACKOFF_MAX)
