"""What the daemon saw, for the people and probes watching it: the status document, the health
verdict and each event's timeline.

The engine decides; this module only looks at each step (the state before, the message, the
state after) and keeps times and hook results the engine has no need for. No I/O and no clock:
the daemon passes the wall time in, so all of it is tested with made-up states.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import __version__
from ..config import Config, HealthFrom
from ..engine import Boot, DocumentFetched, Message, Phase, PollFailed, State, Tracked
from ..engine.gates.lead import lead
from ..engine.gates.window import Held, hold
from ..model import SCHEDULED, Event, iso_utc
from ..windows import current_or_next
from .status_doc import StatusDocument

BLIND_AFTER = 300.0  # seconds without a successful poll: `status` exits 1, an alert fires
MAX_HOOK_RESULTS = 50  # per event; a long-lived event cannot grow the status without bound

# Phases in which an event of ours is not over: the maintenance is ahead, under way or its
# after-hooks still run.
PENDING = frozenset(Phase) - {Phase.NEW, Phase.NOT_OURS, Phase.OVER, Phase.GONE}
_NOT_STARTED = {Phase.WAITING, Phase.QUEUED, Phase.GATED, Phase.UNHANDLED, Phase.MISSED}
_FROM_HOOKS_STARTED = PENDING - _NOT_STARTED
# A Pacemaker node's drain begins its preparation: its resources are leaving.
_FROM_HOOKS_DONE = _FROM_HOOKS_STARTED - {Phase.DRAINING, Phase.RUNNING, Phase.INTERRUPTED}
UNHEALTHY_PHASES: Mapping[HealthFrom, frozenset[Phase]] = {
    HealthFrom.DETECTED: PENDING,
    HealthFrom.HOOKS_STARTED: _FROM_HOOKS_STARTED,
    HealthFrom.HOOKS_DONE: _FROM_HOOKS_DONE,
}


@dataclass(frozen=True)
class HookResult:
    hook: str
    stage: str
    result: str  # ok | failed | timeout | cancelled
    duration_s: float


@dataclass
class Timeline:
    """One event's moments (wall clock, seconds since the epoch) and hook results."""

    detected: Optional[float] = None
    hooks_started: Optional[float] = None
    hooks_done: Optional[float] = None
    approved: Optional[float] = None
    after_hooks: Optional[float] = None
    hooks: list[HookResult] = field(default_factory=list)


def unhealthy(state: State, since: HealthFrom) -> Optional[Event]:
    """The event that takes this VM out of rotation, if any (the earliest NotBefore first)."""
    phases = UNHEALTHY_PHASES[since]
    found = [t.event for t in state.events.values() if t.phase in phases]
    if not found:
        return None
    far = dt.datetime.max.replace(tzinfo=dt.timezone.utc)
    return min(found, key=lambda e: (e.not_before or far, e.event_id))


def pending(state: State) -> list[Tracked]:
    return [t for t in state.events.values() if t.phase in PENDING]


def next_not_before(state: State) -> Optional[dt.datetime]:
    """The nearest NotBefore of a Scheduled event of ours that is not over."""
    times = [
        t.event.not_before
        for t in pending(state)
        if t.event.status == SCHEDULED and t.event.not_before is not None
    ]
    return min(times) if times else None


class Observer:
    """Keeps the timelines of the events of ours the engine knows, and the last poll."""

    def __init__(self, started_wall: float) -> None:
        self.started = started_wall
        self.timelines: dict[str, Timeline] = {}
        self.last_ok: Optional[float] = None  # wall time of the last successful poll
        self.last_poll = "not yet"

    def observe(self, before: State, message: Message, after: State, wall: float) -> None:
        if isinstance(message, DocumentFetched):
            self.last_ok = message.wall if message.wall is not None else wall
        if isinstance(message, (DocumentFetched, PollFailed)):
            self.last_poll = after.poll.last
        if after.events is before.events:
            return
        if isinstance(message, Boot):  # known from the state file: when is not known
            self.timelines = {k: Timeline() for k in after.events}
            return
        for event_id, tracked in after.events.items():
            if tracked.phase is Phase.NOT_OURS:
                continue
            old = before.events.get(event_id)
            line = self.timelines.setdefault(event_id, Timeline())
            _advance(line, old.phase if old is not None else None, tracked.phase, wall)
        for event_id in list(self.timelines):
            if event_id not in after.events:
                del self.timelines[event_id]

    def hook_finished(self, event_id: str, result: HookResult) -> None:
        line = self.timelines.get(event_id)
        if line is not None and len(line.hooks) < MAX_HOOK_RESULTS:
            line.hooks.append(result)

    def document(self, state: State, wall: float, since: HealthFrom) -> dict[str, Any]:
        """The status document: what `scheduledeventsd status` and `/status` show."""
        sick = unhealthy(state, since)
        events = [
            _event(t, self.timelines.get(k, Timeline()), wall, state.config)
            for k, t in sorted(state.events.items())
            if t.phase is not Phase.NOT_OURS
        ]
        window = current_or_next(state.config.windows, wall)
        coordination = state.coordination
        return {
            "version": __version__,
            "vm_name": state.vm_name,
            "provider": state.config.provider.value,
            "written_at": _iso(wall),
            "written_at_unix": round(wall, 3),
            "started_at": _iso(self.started),
            "started_at_unix": round(self.started, 3),
            "poll": {
                "last": self.last_poll,
                "last_ok_at": _iso(self.last_ok),
                "last_ok_unix": None if self.last_ok is None else round(self.last_ok, 3),
                "incarnation": state.incarnation,
            },
            "state_file": state.state_problem or "ok",
            "coordination": f"failing: {coordination.kind}" if coordination.count else "ok",
            "health": {
                "ok": sick is None,
                "unhealthy_from": since.value,
                "event_id": None if sick is None else sick.event_id,
                "event_type": None if sick is None else sick.event_type,
            },
            "concurrency": None
            if state.config.concurrency is None
            else {
                "group": state.config.concurrency.group,
                "max": state.config.concurrency.max,
                "groups": [
                    {"group": limit.group, "max": limit.max}
                    for limit in state.config.concurrency.limits
                ],
                "held_for": sorted(k for k, t in state.events.items() if t.slot.value == "held"),
                "last_seen_holders": list(state.slot_holders),
            },
            "pacemaker": _pacemaker(state),
            "windows": {
                "configured": [w.describe() for w in state.config.windows],
                "next_opens_at": None if window is None else _iso(window[0]),
                "next_closes_at": None if window is None else _iso(window[1]),
            },
            "events": events,
        }


def _pacemaker(state: State) -> Optional[dict[str, Any]]:
    settings = state.config.cluster
    mark = state.cluster_mark
    marked = None if mark is None else {"method": mark.method.value, "attribute": mark.attribute}
    if settings is None:
        # Reloaded away while a mark of ours is still on the node: still shown until it is off.
        return None if mark is None else {"marked": marked, "restore_error": state.restore_error}
    checked = state.cluster_problems
    by_drain: dict[str, list[str]] = {}
    for event_id, t in sorted(state.events.items()):
        if t.drain.value:
            by_drain.setdefault(t.drain.value, []).append(event_id)
    return {
        "method": settings.method.value,
        "attribute": settings.attribute if settings.method.value == "health" else None,
        "draining_for": by_drain.get("draining", []),
        "drained_for": by_drain.get("drained", []),
        "held_for": by_drain.get("hold", []),
        # Whether the cluster can drain this node (None: not read yet), and what is wrong.
        "ready": None if checked is None else not checked,
        "problems": list(checked or ()),
        "marked": marked,  # what this daemon set on the node and has not taken off yet
        "restore_error": state.restore_error,  # its restore failed: asked again
    }


def _waiting_for(tracked: Tracked, held: Optional[Held]) -> Optional[str]:
    if tracked.phase is Phase.QUEUED:
        return "slot"
    if tracked.phase is Phase.DRAINING:
        return "cluster"
    if tracked.phase is Phase.GATED:  # any other gate: its name
        return tracked.gated
    if tracked.unmarking:  # put back: its undo waits for etcd to drop its ready (postponed)
        return "etcd"
    return held.reason if held is not None else None


def _advance(line: Timeline, old: Optional[Phase], new: Phase, wall: float) -> None:
    if old is None or old is Phase.NOT_OURS:
        line.detected = line.detected or wall
    if new is Phase.RUNNING and old is not Phase.RUNNING:
        line.hooks_started = wall
    if old is Phase.RUNNING and new is not Phase.RUNNING:
        line.hooks_done = wall
    if new is Phase.APPROVED and old is not Phase.APPROVED:
        line.approved = wall
    if old is Phase.AFTER and new is Phase.OVER:
        line.after_hooks = wall


def _event(tracked: Tracked, line: Timeline, wall: float, config: Config) -> dict[str, Any]:
    event = tracked.event
    not_before = event.not_before.timestamp() if event.not_before is not None else None
    rule = config.events.get(event.event_type)
    held = None
    if tracked.phase is Phase.WAITING and rule is not None:
        held = hold(event, rule, config.windows, wall)
    return {
        "event_id": event.event_id,
        "event_type": event.event_type,
        "status": event.status,
        "phase": tracked.phase.value,
        "resources": list(event.resources),
        "not_before": iso_utc(event.not_before) or None,
        "seconds_to_not_before": None if not_before is None else round(not_before - wall, 1),
        "hooks_start_at": None if held is None else _iso(held.at),
        "waiting_for": _waiting_for(tracked, held),
        # the lead it waits for: start_before's, or the default when that is unset
        "lead_s": None if held is None or rule is None else lead(rule),
        "lead_default": None if held is None or rule is None else rule.start_before is None,
        "slot": tracked.slot.value or None,
        "cluster": tracked.drain.value or None,
        "detected_at": _iso(line.detected),
        "hooks_started_at": _iso(line.hooks_started),
        "hooks_done_at": _iso(line.hooks_done),
        "approved_at": _iso(line.approved),
        "after_hooks_at": _iso(line.after_hooks),
        "hooks": [
            {"hook": h.hook, "stage": h.stage, "result": h.result, "duration_s": h.duration_s}
            for h in line.hooks
        ],
    }


def _iso(wall: Optional[float]) -> Optional[str]:
    if wall is None:
        return None
    when = dt.datetime.fromtimestamp(wall, dt.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def problems(doc: StatusDocument, now: float) -> list[str]:
    """Why a status document is not healthy (`status` exits 1 when this is not empty)."""
    found: list[str] = []
    written = doc.get("written_at_unix")
    if isinstance(written, (int, float)) and now - written > BLIND_AFTER:
        found.append(f"the status is {now - written:.0f} s old: is the daemon running?")
    poll = doc.get("poll")
    last_ok = poll.get("last_ok_unix") if isinstance(poll, dict) else None
    started = doc.get("started_at_unix")
    reference = last_ok if isinstance(last_ok, (int, float)) else started
    if isinstance(reference, (int, float)) and now - reference > BLIND_AFTER:
        what = "the last successful poll" if last_ok is not None else "the start, and no poll yet"
        found.append(f"IMDS unreachable: {now - reference:.0f} s since {what}")
    found += _cluster_problems(doc.get("pacemaker"))
    for event in doc.get("events", []):
        if not isinstance(event, dict):
            continue
        if event.get("phase") == Phase.HOOKS_FAILED.value:
            found.append(
                f"a hook failed for {event.get('event_type')} {event.get('event_id')}, "
                "which is still pending"
            )
    return found


def _cluster_problems(cluster: Any) -> list[str]:  # noqa: ANN401 - a document's field
    """The cluster cannot drain this node, or a mark of ours fails to come off."""
    if not isinstance(cluster, dict):
        return []
    found = [f"cluster_unready: {p}" for p in cluster.get("problems") or []]
    if cluster.get("restore_error"):
        found.append(
            f"cluster_restore_failed: this node is still marked by this daemon "
            f"({cluster.get('marked')}): {cluster['restore_error']}; tried again"
        )
    return found
