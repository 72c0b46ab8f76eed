"""The threads that carry IMDS calls, each with the connection it alone uses.

Polls, approvals and name lookups have a lane each, so a GET hanging for its whole timeout never
holds up an approval. Every call's message goes to the daemon's inbox, even if the call raised.
"""

from __future__ import annotations

import functools
import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Union

from ..engine import (
    ApprovalFailed,
    ApprovalSent,
    DocumentFetched,
    Message,
    NameResolved,
    PollFailed,
    Tick,
)
from ..providers.identity import hostname, resolve
from ..providers.imds import ImdsError, MetadataClient


@dataclass(frozen=True)
class Signalled:
    """A signal the daemon received: its handler only puts this on the inbox."""

    signo: int


# What the daemon's one inbox carries: the lanes' answers, other threads' messages, signals.
Inbound = Union[Message, Signalled]

Job = Callable[[], Message]
Call = Callable[[MetadataClient], Message]
OnError = Callable[[str], Message]


class Lane:
    """Calls in the order they were submitted, on one thread and one connection."""

    def __init__(
        self, name: str, inbox: queue.SimpleQueue[Inbound], client: MetadataClient
    ) -> None:
        self._inbox = inbox
        self._client = client
        self._jobs: queue.SimpleQueue[Optional[tuple[Job, OnError]]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, call: Call, on_error: OnError) -> None:
        client = self._client
        self._jobs.put((lambda: call(client), on_error))

    def use(self, client: MetadataClient) -> None:
        """Switch connection (a reload changed `metadata`); the old one is closed on this
        lane's own thread, after any call it is making now."""
        stale, self._client = self._client, client
        self._jobs.put((functools.partial(_closed, stale), _internal))

    def stop(self) -> None:
        self._jobs.put(None)

    def _loop(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, on_error = item
            self._inbox.put(_carried_out(job, on_error))


class PollLane:
    """The poll's lane: one order at a time, carried out at its instant on the monotonic
    clock, so the loop does not wake to start each poll. A new order replaces one whose instant
    has not come (a reload polls at once, not after the old interval); a new connection is used
    from the next poll on.

    The next order comes from the loop just after this lane's answer. Being woken to learn of it
    would cost a second wake each poll, so the lane sleeps until the instant the last two orders'
    gap predicts and is woken only for an order earlier than that; one that is later it finds
    when it wakes. When an order is carried out is always the order's instant: the prediction
    only saves wakes."""

    def __init__(
        self, name: str, inbox: queue.SimpleQueue[Inbound], client: MetadataClient
    ) -> None:
        self._inbox = inbox
        self._client = client
        self._stale: list[MetadataClient] = []
        self._order: Optional[tuple[float, Call, OnError]] = None
        self._stopped = False
        self._asleep_until = -math.inf  # the lane wakes by itself then; -inf: it is busy
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def order(self, at: float, call: Call, on_error: OnError) -> None:
        with self._ready:
            self._order = (at, call, on_error)
            if at < self._asleep_until:
                self._ready.notify()

    def cancel(self) -> None:
        """The order is dropped unless under way; the lane is not woken for it."""
        with self._ready:
            self._order = None

    def use(self, client: MetadataClient) -> None:
        """The old connection is closed by the lane before its next poll."""
        with self._ready:
            self._stale.append(self._client)
            self._client = client

    def stop(self) -> None:
        with self._ready:
            self._stopped = True
            self._ready.notify()

    def _loop(self) -> None:
        last: Optional[float] = None
        expected = -math.inf  # when the next order should be due: the last gap, once more
        while True:
            with self._ready:
                order = self._next(expected)
                stale, self._stale = self._stale, []
                client = self._client
            for old in stale:
                old.close()
            if order is None:
                return
            at, call, on_error = order
            if last is not None and at > last:
                expected = at + (at - last)
            last = at
            self._inbox.put(_carried_out(functools.partial(call, client), on_error))

    def _next(self, expected: float) -> Optional[tuple[float, Call, OnError]]:
        """Under the condition: the order, once its instant has come; None once stopped.
        Without an order it sleeps until the one `expected`, and then until it is woken."""
        while not self._stopped:
            now = time.monotonic()
            order = self._order
            if order is not None and order[0] <= now:
                self._order = None
                return order
            until = order[0] if order is not None else expected
            self._asleep_until = until if until > now else math.inf
            self._ready.wait(None if until <= now else until - now)
            self._asleep_until = -math.inf
        return None


def _carried_out(job: Job, on_error: OnError) -> Message:
    try:
        return job()
    except Exception as e:  # noqa: BLE001 - any failure must still come back as a message
        return on_error(f"internal error: {e!r}")


def _closed(client: MetadataClient) -> Message:
    client.close()
    return Tick()


def _internal(detail: str) -> Message:
    return PollFailed("internal", detail)


# The IMDS calls the lanes carry, each turned into the message the engine gets.


def fetch(client: MetadataClient) -> Message:
    try:
        return DocumentFetched(client.fetch_document(), time.time())
    except ImdsError as e:
        return PollFailed(e.kind, e.detail, e.status, e.retry_after)


def poll_error(detail: str) -> Message:
    return PollFailed("internal", detail)


class Withdrawn:
    """The approvals the engine no longer wants (WithdrawApproval), marked by the loop and read
    by the approver's lane just before it sends one: a POST still queued is not sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: set[str] = set()

    def add(self, event_id: str) -> None:
        with self._lock:
            self._ids.add(event_id)

    def discard(self, event_id: str) -> None:
        """A new approval of the event is asked for: judged anew, it is wanted."""
        with self._lock:
            self._ids.discard(event_id)

    def take(self, event_id: str) -> bool:
        """Whether it was withdrawn (the mark is used up)."""
        with self._lock:
            found = event_id in self._ids
            self._ids.discard(event_id)
            return found


def approve(
    client: MetadataClient,
    *,
    event_id: str,
    deadline: Optional[float],
    withdrawn: Optional[Withdrawn] = None,
) -> Message:
    """Sent only before its deadline (its slot's lease; it may have queued behind another
    POST) and answered by then, or given up: an answer proves IMDS had it in time. Nor once
    the engine withdrew it while it waited (the event changed type, left, was put back)."""
    started = time.monotonic()
    if deadline is not None and started >= deadline:
        return ApprovalFailed(
            event_id, "deadline", "not sent: its slot's lease could expire before an answer"
        )
    if withdrawn is not None and withdrawn.take(event_id):
        return ApprovalFailed(
            event_id, "withdrawn", "not sent: the event is no longer approving what it was"
        )
    try:
        client.approve([event_id], deadline=deadline)
    except ImdsError as e:
        return ApprovalFailed(event_id, e.kind, e.detail)
    answered = time.monotonic()
    return ApprovalSent(event_id, answered - started, answered)


def resolve_name(client: MetadataClient) -> Message:
    identity = resolve(None, client)
    return NameResolved(identity.name, identity.source, identity.problem)


def name_error(detail: str) -> Message:
    identity = hostname(detail)
    return NameResolved(identity.name, identity.source, identity.problem)
