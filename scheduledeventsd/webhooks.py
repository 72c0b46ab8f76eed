"""Tell a chat channel or an incident tool what happened, with requests and urllib3's Retry.

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
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from . import __version__
from .config import Webhook, WebhookFormat
from .records import Cause, Record, What

QUEUE_SIZE = 200  # messages waiting per webhook; beyond it the oldest news is dropped
BACKOFF = 0.5  # urllib3: 0.5 s, 1 s, 2 s, ... between attempts
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
        self._session = requests.Session()
        self._session.trust_env = False  # only the configured proxy, never the environment's
        if hook.proxy:
            self._session.proxies = {"http": hook.proxy, "https": hook.proxy}
        retry = Retry(
            total=hook.retries,
            backoff_factor=BACKOFF,
            status_forcelist=(408, 425, 429, 500, 502, 503, 504),
            allowed_methods=frozenset({"POST"}),
            raise_on_status=False,
            respect_retry_after_header=True,
        )
        adapter = HTTPAdapter(max_retries=retry)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
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
        fields: dict[str, object] = {
            "url": where(self.hook.url),
            "what": kind,
            "event_id": effect.fields.get("event_id"),
        }
        try:
            response = self._session.post(
                self.hook.url,
                json=body,
                headers=dict(self.hook.headers),
                timeout=self.hook.timeout,
                allow_redirects=False,
            )
        except requests.RequestException as e:
            error = redact(str(e), self.hook.url, self.hook.headers.values())
            self._report("webhook_failed", {**fields, "error": error[:300]})
            return
        response.close()
        if 200 <= response.status_code < 300:
            self._report("webhook_delivered", {**fields, "status": response.status_code})
        else:
            self._report(
                "webhook_failed",
                {**fields, "status": response.status_code, "error": response.reason or ""},
            )
