"""Prometheus metrics with prometheus_client: counted from each engine step and hook result.

Every label value known up front (results, event types, configured hooks and their stages,
IMDS failure kinds) is zero-initialised, so a rate() or an absent() alert works from the first
scrape. Imported only when `http.listen` or `metrics_textfile` is set: a daemon with neither
pays nothing for it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Optional, get_args

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from .. import __version__
from ..config import STAGES, Config
from ..engine import (
    ApprovalFailed,
    ApprovalSent,
    DocumentFetched,
    Drain,
    Faulted,
    Message,
    Phase,
    PollFailed,
    State,
)
from ..host.store import write_atomically
from ..model import EVENT_TYPES
from ..providers.imds import Failure
from ..windows import Window, current_or_next
from .observer import next_not_before, pending

if TYPE_CHECKING:
    from ..coordination.fleet import SlotCounter

HOOK_RESULTS = ("ok", "failed", "timeout", "cancelled")
DRAIN_STATES = tuple(d.value for d in Drain if d is not Drain.NONE)
KNOWN_POLL_ERRORS = (
    *(f for f in get_args(Failure) if f != "http"),
    "http_400",
    "http_404",
    "http_410",
    "http_429",
    "http_500",
    "http_503",
    "internal",
)
_HTTP_KIND = re.compile(r"^http_[1-5][0-9][0-9]$")


class Metrics:
    def __init__(self, config: Config) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, RSS, fds
        PlatformCollector(registry=self.registry)
        r = self.registry
        self.polls = Counter(
            "scheduledeventsd_polls", "Polls of IMDS by result", ["result"], registry=r
        )
        self.poll_errors = Counter(
            "scheduledeventsd_poll_errors", "Failed polls by kind", ["kind"], registry=r
        )
        self.last_ok = Gauge(
            "scheduledeventsd_last_successful_poll_timestamp_seconds",
            "When IMDS last answered a poll (0: not yet)",
            registry=r,
        )
        self.incarnation = Gauge(
            "scheduledeventsd_document_incarnation",
            "DocumentIncarnation of the last document",
            registry=r,
        )
        self.seen = Counter(
            "scheduledeventsd_events_seen",
            "Events seen for the first time, by type and whether they name this VM",
            ["type", "ours"],
            registry=r,
        )
        self.pending = Gauge(
            "scheduledeventsd_events_pending",
            "Events of this VM not yet over, by type",
            ["type"],
            registry=r,
        )
        self.next_not_before = Gauge(
            "scheduledeventsd_next_event_not_before_timestamp_seconds",
            "NotBefore of the nearest Scheduled event of this VM (0: none)",
            registry=r,
        )
        self.hook_runs = Counter(
            "scheduledeventsd_hook_runs",
            "Hook runs by hook, stage and result",
            ["hook", "stage", "result"],
            registry=r,
        )
        self.hook_duration = Histogram(
            "scheduledeventsd_hook_duration_seconds",
            "How long hooks ran",
            ["hook", "stage"],
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
            registry=r,
        )
        self.approvals = Counter(
            "scheduledeventsd_approvals", "Approval POSTs by result", ["result"], registry=r
        )
        self.detection_to_approval = Histogram(
            "scheduledeventsd_detection_to_approval_seconds",
            "From an event's first sight to its approval being accepted",
            buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900, 1800),
            registry=r,
        )
        self.internal_errors = Counter(
            "scheduledeventsd_internal_errors",
            "Exceptions the daemon caught in a step or an effect and survived (a defect)",
            registry=r,
        )
        self.info = Gauge(
            "scheduledeventsd_info",
            "Always 1: the version and VM name",
            ["version", "vm_name"],
            registry=r,
        )
        self.next_window = Gauge(
            "scheduledeventsd_next_window_start_timestamp_seconds",
            "Opening of the maintenance window open now, or else of the next (0: no windows)",
            registry=r,
        )
        self.next_window.set_function(self._next_window)
        self.slot_held = Gauge(
            "scheduledeventsd_slot_held",
            "Concurrency slots this VM holds (1 while any of its events is in early "
            "maintenance: its events share one)",
            registry=r,
        )
        self.cluster_drain = Gauge(
            "scheduledeventsd_cluster_drain",
            "Events for which this Pacemaker node is draining, drained, or held (not spared)",
            ["state"],
            registry=r,
        )
        for drain in DRAIN_STATES:
            self.cluster_drain.labels(drain)
        self.group_held = Gauge(
            "scheduledeventsd_group_slots_held",
            "Slots of the concurrency group held by any VM, as this VM sees them in etcd",
            ["group"],
            registry=r,
        )
        self.group_max = Gauge(
            "scheduledeventsd_group_slots_max",
            "The concurrency group's max (this VM's configuration)",
            ["group"],
            registry=r,
        )
        self._counter: Optional[SlotCounter] = None
        self._counted: tuple[object, ...] = ()
        self._windows: tuple[Window, ...] = ()
        self._vm_name: Optional[str] = None
        self._detected: dict[str, float] = {}
        self.changes = 0  # bumped by everything but routine polls (the textfile is written then)
        for result in ("ok", "error"):
            self.polls.labels(result)
            self.approvals.labels(result)
        for kind in KNOWN_POLL_ERRORS:
            self.poll_errors.labels(kind)
        for event_type in (*EVENT_TYPES, "other"):
            self.pending.labels(event_type)
            for ours in ("true", "false"):
                self.seen.labels(event_type, ours)
        self.use(config)
        self._name("")

    def use(self, config: Config) -> None:
        """Zero-initialise the hooks a (re)loaded config can run, in the stages it runs them."""
        self._windows = config.windows
        self._count_slots(config)
        for hook, stage in _hook_stages(config):
            for result in (*HOOK_RESULTS, "not_yet") if stage == "gate" else HOOK_RESULTS:
                self.hook_runs.labels(hook, stage, result)
            self.hook_duration.labels(hook, stage)
        self.changes += 1

    def _count_slots(self, config: Config) -> None:
        """The groups' held slots, counted by a watch of etcd (a thread of its own) while
        `concurrency` and etcd are configured; a reload that changes them starts it anew."""
        etcd = config.coordination.etcd if config.coordination is not None else None
        groups = (
            {lim.group: lim.max for lim in config.concurrency.limits} if config.concurrency else {}
        )
        wanted = (etcd, tuple(groups.items())) if etcd is not None and groups else ()
        if wanted == self._counted:
            return
        self.close()
        self._counted = wanted
        for gauge in (self.group_held, self.group_max):
            gauge.clear()
        if not wanted:
            return
        from ..coordination.fleet import SlotCounter  # noqa: PLC0415 - etcd's client when used

        for group, most in groups.items():
            self.group_max.labels(group).set(most)
            self.group_held.labels(group)
        assert etcd is not None  # noqa: S101 - wanted says so
        self._counter = SlotCounter(etcd, groups, self._held)
        self._counter.start()

    def _held(self, group: str, held: int) -> None:
        self.group_held.labels(group).set(held)
        self.changes += 1

    def close(self) -> None:
        """Stop counting slots (the daemon stops)."""
        if self._counter is not None:
            self._counter.stop()
            self._counter = None

    def _next_window(self) -> float:
        span = current_or_next(self._windows, time.time())
        return 0.0 if span is None else span[0]

    def observe(self, before: State, message: Message, after: State, now: float) -> None:
        """Count what one engine step shows; `now` is its monotonic time."""
        self._message(message, after, now)
        if after.vm_name != self._vm_name:
            self._name(after.vm_name)
        if after.events is not before.events:
            self._events(before, message, after, now)

    def _message(self, message: Message, after: State, now: float) -> None:
        if isinstance(message, DocumentFetched):
            self.polls.labels("ok").inc()
            if message.wall is not None:
                self.last_ok.set(message.wall)
        elif isinstance(message, PollFailed):
            self.polls.labels("error").inc()
            self.poll_errors.labels(_kind(message.kind)).inc()
            self.changes += 1
        elif isinstance(message, ApprovalSent):
            self._approved(message.event_id, after, now)
        elif isinstance(message, ApprovalFailed):
            self.approvals.labels("error").inc()
            self.changes += 1
        elif isinstance(message, Faulted):
            self.internal_errors.inc()
            self.changes += 1

    def _events(self, before: State, message: Message, after: State, now: float) -> None:
        self.changes += 1
        self.incarnation.set(after.incarnation or 0)
        for event_id, tracked in after.events.items():
            if event_id in before.events or not isinstance(message, DocumentFetched):
                continue
            ours = tracked.phase is not Phase.NOT_OURS
            self.seen.labels(_type(tracked.event.event_type), "true" if ours else "false").inc()
            if ours:
                self._detected[event_id] = now
        for event_id in [e for e in self._detected if e not in after.events]:
            del self._detected[event_id]
        counts = dict.fromkeys((*EVENT_TYPES, "other"), 0)
        for tracked in pending(after):
            counts[_type(tracked.event.event_type)] += 1
        for event_type, count in counts.items():
            self.pending.labels(event_type).set(count)
        self.slot_held.set(int(any(t.slot.value == "held" for t in after.events.values())))
        for drain in DRAIN_STATES:
            self.cluster_drain.labels(drain).set(
                sum(1 for t in after.events.values() if t.drain.value == drain)
            )
        nearest = next_not_before(after)
        self.next_not_before.set(0 if nearest is None else nearest.timestamp())

    def hook_finished(self, hook: str, stage: str, result: str, duration_s: float) -> None:
        self.hook_runs.labels(hook, stage, result).inc()
        self.hook_duration.labels(hook, stage).observe(duration_s)
        self.changes += 1

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def write_textfile(self, path: str) -> None:
        """For node_exporter's textfile collector: only the daemon's own families (its own
        process_* would clash with node_exporter's: "was collected before", and the scrape
        fails), readable by its user (0644: nothing secret), written atomically and safely
        in a directory another user may own."""
        body = generate_latest(_Own(self.registry))
        write_atomically(Path(path), body, durable=False, mode=0o644)

    def _approved(self, event_id: str, after: State, now: float) -> None:
        self.approvals.labels("ok").inc()
        self.changes += 1
        detected = self._detected.pop(event_id, None)
        tracked = after.events.get(event_id)
        if detected is not None and tracked is not None and tracked.phase is Phase.APPROVED:
            self.detection_to_approval.observe(now - detected)

    def _name(self, vm_name: str) -> None:
        if self._vm_name is not None:
            self.info.remove(__version__, self._vm_name)
        self._vm_name = vm_name
        self.info.labels(__version__, vm_name).set(1)
        self.changes += 1


class _Own:
    """The registry's families that are the daemon's own (scheduledeventsd_*)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        return (f for f in self.registry.collect() if f.name.startswith("scheduledeventsd_"))


def _hook_stages(config: Config) -> Iterable[tuple[str, str]]:
    pairs = {
        (hook, stage)
        for rule in config.events.values()
        for stage in STAGES
        for hook in rule.hooks_for(stage)
    }
    if config.coordination is not None and config.coordination.gate is not None:
        pairs.add(("gate", "gate"))
    return sorted(pairs)


def _kind(kind: str) -> str:
    """A bounded label: IMDS' own failure kinds and HTTP status codes, else `other`."""
    if kind in KNOWN_POLL_ERRORS or _HTTP_KIND.match(kind):
        return kind
    return "other"


def _type(event_type: str) -> str:
    return event_type if event_type in EVENT_TYPES else "other"
