"""The life of one event as one declared table: (phase, what happened) -> next phases.

The engine's handlers decide *which* of the allowed next phases applies (a policy, a configured
hook list) and what to do; every phase change goes through `check`, so a change this table does
not declare is an error in tests and a logged, ignored message in production. The README, the man
page and docs/lifecycle.svg are generated from `TABLE` (engine/phase_docs), so the words
cannot drift from the machine. h11's `_state.py` is the model: the whole machine on one screen.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


class Phase(str, enum.Enum):
    """Where an event stands for this VM; persisted, so values are stable strings."""

    NEW = "new"  # not known yet (never stored: the moment before its first sight)
    NOT_OURS = "not_ours"  # Resources does not name this VM
    UNHANDLED = "unhandled"  # no rule for its type, an unknown status, or user_events: ignore
    MISSED = "missed"  # first seen already Started: no chance to prepare
    WAITING = "waiting"  # ours; its before-hooks start later (start_before, a window)
    QUEUED = "queued"  # ours; its before-hooks wait for a concurrency slot (or its deadline)
    DRAINING = "draining"  # ours; the cluster moves this node's resources away first
    GATED = "gated"  # ours; any other gate holds it (Tracked.gated names it: component.wait_at)
    RUNNING = "running"  # its before-hooks are running
    INTERRUPTED = "interrupted"  # its before-hooks were cut off by a stop: they run again
    REBOOTED = "rebooted"  # prepared, then this VM booted: the next document says if that was it
    ENDING = "ending"  # it left while its before-hooks ran: they are being stopped
    COORDINATING = "coordinating"  # hooks succeeded; a shared event waits for the others
    APPROVING = "approving"  # to be approved: StartRequests not yet accepted
    APPROVED = "approved"
    NOT_APPROVED = "not_approved"  # prepared; it proceeds at NotBefore without our approval
    HOOKS_FAILED = "hooks_failed"
    DONE = "done"  # it Started: nothing left to do until it is over
    AFTER = "after"  # over or cancelled: its after- or cancelled-hooks run, once
    OVER = "over"  # nothing is left to do for it (kept while the document lists it)
    GONE = "gone"  # forgotten (never stored)


class On(str, enum.Enum):
    """What happened to one event: the triggers of the table."""

    SEEN = "first seen"
    LISTED = "listed again"
    STARTED = "listed Started"
    LEFT = "left the document"  # also: its EventType changed (events._retyped: the old one left)
    LEAD_TIME = "its start instant came"
    SLOT = "a concurrency slot is ours"
    SLOT_LOST = "its concurrency slot was lost"
    DRAINED = "the cluster moved this node's resources away"
    DRAIN_HELD = "the cluster cannot spare this node"
    PASSED = "the gate holding it let it on"
    HOOKS_OK = "before-hooks succeeded"
    HOOKS_FAILED = "a before-hook failed"
    HOOKS_CANCELLED = "before-hooks cut off"
    PEERS_READY = "every VM named is ready"
    PEER_FAILED = "another VM failed"
    GATE_YES = "the gate said yes"
    GATE_NEVER = "the gate said never"
    ACCEPTED = "approval accepted"
    STAGE_ENDED = "after/cancelled-hooks ended"
    UNMARKED = "etcd confirmed its ready deleted"
    RESTARTED = "daemon restarted, same boot"
    REBOOTED = "daemon restarted on a new boot"
    RENAMED = "the VM name changed"
    NAMED = "its Resources changed to name this VM"
    TYPE_REMOVED = "a reload (or a restart) removed its type"


class Stage(str, enum.Enum):
    """Which hook list a run carries out (SCHEDULED_EVENT_STAGE)."""

    BEFORE = "before"
    AFTER = "after"
    CANCELLED = "cancelled"
    GATE = "gate"


class Rule(str, enum.Enum):
    """How an event was decided: by its hooks, or at once by a rule (then it was never
    prepared, so it gets no after-hooks either)."""

    HOOKS = ""
    SHORT = "short"  # DurationInSeconds <= short_seconds
    USER = "user"  # EventSource User and user_events approve or ignore
    FAST = "fast"  # only logged: `fast` ran instead of `before` (it was prepared, as by HOOKS)


class Slot(str, enum.Enum):
    """An event's concurrency slot (`concurrency`): held from its before-hooks' start until it
    is over; MISSING means it was prepared without one and is never approved early."""

    NONE = ""  # no slot needed, or given back
    ASKED = "asked"
    HELD = "held"
    MISSING = "missing"


class Drain(str, enum.Enum):
    """This node in its Pacemaker cluster for an event (`cluster.pacemaker`): marked as
    going away until the event is over, when it is restored before the after-hooks run."""

    NONE = ""  # never marked, or restored
    ASKED = "draining"
    DONE = "drained"
    HELD = "hold"  # the cluster could not spare it: never approved early
    RESTORING = "restoring"  # over: RestoreNode asked, its after-hooks wait for the answer


@dataclass(frozen=True)
class Transition:
    source: Phase
    on: On
    targets: tuple[Phase, ...]
    does: str  # one line for the docs: the condition that picks a target, and the effects


P = Phase
# Phases whose before-hooks started (or were decided to need none): they get after- or
# cancelled-hooks once the event is over or cancelled, unless a rule decided them.
PREPARED = frozenset(
    {P.DRAINING, P.RUNNING, P.INTERRUPTED, P.REBOOTED, P.COORDINATING, P.APPROVING, P.APPROVED}
    | {P.NOT_APPROVED, P.HOOKS_FAILED, P.DONE}
)
# What the state file keeps; the rest is rebuilt from the next document.
DURABLE = frozenset(Phase) - {P.NEW, P.NOT_OURS, P.GONE}
# After the daemon restarts, phases that carry on as they were.
_KEPT = (
    *(P.UNHANDLED, P.MISSED, P.COORDINATING, P.APPROVING, P.APPROVED),
    *(P.NOT_APPROVED, P.HOOKS_FAILED, P.DONE, P.OVER),
)
# Its after- or cancelled-hooks run; with none configured it is over (or forgotten if it left).
_ENDS = (P.AFTER, P.OVER, P.GONE)
_DECIDE = (P.APPROVING, P.COORDINATING, P.NOT_APPROVED, P.DONE)
# A new boot proves the maintenance happened only once the event is Started or gone: until the
# first document says which, a prepared event waits in REBOOTED.
_REBOOTS = (P.REBOOTED, *_ENDS)
# A restart queues an event cut off in its before-hooks to take its slot back before they run
# again: it was prepared (its drain hook may have run), so it is owed its stage.
_REQUEUED = "queued again after a restart (prepared before it)"
_UNRUN = "never started, they waited for the node's restore: it is asked again, then they run"
_HELD = "holding a concurrency slot: they run again every after_retry until they succeed"
_UNMARKING = "put back, its ready not yet known deleted: ForgetShared again, its stage still waits"
# Any gate but the slot's and the drain's holds an event in GATED (component.wait_at); what a
# restart or its leaving means for it, its gate declares (component.Gate: restarted, left).
_RESTARTS = (On.RESTARTED, On.REBOOTED)
_INTO_GATED = (
    *((P.NEW, On.SEEN), (P.WAITING, On.LEAD_TIME), (P.QUEUED, On.SLOT), (P.QUEUED, On.LEAD_TIME)),
    *((P.INTERRUPTED, On.LISTED), (P.REBOOTED, On.LISTED), (P.GATED, On.PASSED)),
)
_LET_GO = "its gate lets it go (Gate.left)"
# engine/postponed: a node is not kept prepared for days when NotBefore moves that far away.
_POSTPONED = "NotBefore moved later by more than its lead, and start_before or a window holds it"
_REGATED = f"{_REQUEUED}, then gated"  # granted its slot back, held by a gate after it


def _t(source: Phase, on: On, targets: Iterable[Phase], does: str) -> Transition:
    return Transition(source, on, tuple(targets), does)


_ROWS: list[Transition] = [
    _t(P.NEW, On.SEEN, [P.NOT_OURS], "Resources does not name this VM: event_ignored"),
    _t(P.NEW, On.SEEN, [P.MISSED], "already Started: event_missed, no hooks"),
    _t(P.NEW, On.SEEN, [P.UNHANDLED], "no rule for its type, unknown status, user_events: ignore"),
    _t(P.NEW, On.SEEN, [P.WAITING], "held by start_before or a window: event_waiting"),
    _t(P.NEW, On.SEEN, [P.QUEUED], "concurrency: a slot is asked for (event_waiting reason=slot)"),
    _t(P.NEW, On.SEEN, [P.DRAINING], "pacemaker: this node is marked as going away"),
    _t(P.NEW, On.SEEN, [P.RUNNING], "before-hooks start"),
    _t(P.NEW, On.SEEN, _DECIDE, "no before-hooks, or a rule (short, user): approval per policy"),
    _t(P.NOT_OURS, On.LISTED, [P.NOT_OURS], "nothing"),
    _t(P.NOT_OURS, On.STARTED, [P.NOT_OURS], "nothing"),
    _t(P.NOT_OURS, On.LEFT, [P.GONE], "forgotten"),
    _t(P.NOT_OURS, On.RENAMED, [P.GONE], "forgotten, judged again at the next poll"),
    _t(P.NOT_OURS, On.NAMED, [P.GONE], "judged anew at once, as at first sight"),
    *[_t(p, on, [p], "nothing") for p in (P.UNHANDLED, P.MISSED) for on in (On.LISTED, On.STARTED)],
    *[_t(p, On.LEFT, [P.GONE], "event_completed; forgotten") for p in (P.UNHANDLED, P.MISSED)],
    _t(P.WAITING, On.LISTED, [P.WAITING], "its start instant placed again (NotBefore, clock)"),
    _t(P.WAITING, On.LEAD_TIME, [P.RUNNING], "before-hooks start"),
    _t(P.WAITING, On.LEAD_TIME, [P.QUEUED], "concurrency: a slot is asked for"),
    _t(P.WAITING, On.LEAD_TIME, [P.DRAINING], "pacemaker: this node is marked as going away"),
    _t(P.WAITING, On.LEAD_TIME, _DECIDE, "a reload left it no before-hooks: approval per policy"),
    _t(P.WAITING, On.STARTED, [P.MISSED], "it started before its hooks: event_missed"),
    _t(P.WAITING, On.LEFT, [P.GONE], "never prepared: event_completed; forgotten"),
    _t(P.WAITING, On.TYPE_REMOVED, [P.UNHANDLED], "no rule left for it: event_unhandled"),
    _t(P.WAITING, On.RESTARTED, [P.WAITING], "placed again by the next document"),
    _t(P.WAITING, On.REBOOTED, [P.WAITING], "placed again by the next document"),
    _t(P.QUEUED, On.SLOT, [P.RUNNING], "before-hooks start holding the slot"),
    _t(P.QUEUED, On.SLOT, [P.DRAINING], "pacemaker: the node is drained holding the slot"),
    _t(P.QUEUED, On.SLOT, _DECIDE, "a reload left it no before-hooks: approval per policy"),
    _t(P.QUEUED, On.SLOT, [P.WAITING], "granted after its window: given back, waits again"),
    _t(
        P.QUEUED,
        On.LEAD_TIME,
        [P.RUNNING],
        "no slot by its deadline: slot_unavailable, before-hooks start; never approved early",
    ),
    _t(P.QUEUED, On.LEAD_TIME, [P.NOT_APPROVED], "no slot and no before-hooks: slot_unavailable"),
    _t(
        P.QUEUED,
        On.LEAD_TIME,
        [P.DONE],
        "no before-hooks and no longer Scheduled (an unknown status): after-hooks once it is over",
    ),
    _t(P.QUEUED, On.LEAD_TIME, [P.DRAINING], "no slot by its deadline: drained, not early"),
    _t(P.DRAINING, On.DRAINED, [P.RUNNING], "cluster_drained: before-hooks start"),
    _t(P.DRAINING, On.DRAINED, _DECIDE, "cluster_drained, no before-hooks: approval per policy"),
    _t(
        P.DRAINING,
        On.DRAIN_HELD,
        [P.RUNNING, *_DECIDE],
        "cluster_hold (too few healthy nodes, no quorum, the drain timed out, a tool failed): "
        "before-hooks run, never approved early",
    ),
    _t(P.DRAINING, On.LISTED, [P.DRAINING], "nothing"),
    _t(P.DRAINING, On.STARTED, [P.DONE], "the drain is no longer watched; restored once over"),
    _t(P.DRAINING, On.LEFT, _ENDS, "the node is restored, then its cancelled-hooks run"),
    _t(P.DRAINING, On.RESTARTED, [P.DRAINING], "the drain is watched again (marked once)"),
    _t(P.DRAINING, On.TYPE_REMOVED, [P.UNHANDLED], "event_unhandled; the node is restored"),
    _t(P.DRAINING, On.REBOOTED, _REBOOTS, "judged by the next document (restored once over)"),
    _t(P.QUEUED, On.LISTED, [P.QUEUED], "its deadline placed again (NotBefore, clock)"),
    _t(P.QUEUED, On.STARTED, [P.MISSED], "it started before its hooks: event_missed"),
    _t(P.QUEUED, On.LEFT, [P.GONE], "never prepared: event_completed; forgotten"),
    _t(P.QUEUED, On.STARTED, [P.DONE], f"{_REQUEUED}: after-hooks once it is over"),
    _t(P.QUEUED, On.LEFT, _ENDS, f"{_REQUEUED}: the node restored, then cancelled-hooks"),
    _t(P.QUEUED, On.REBOOTED, [P.REBOOTED], f"{_REQUEUED}: judged by the next document"),
    _t(P.QUEUED, On.TYPE_REMOVED, [P.UNHANDLED], "no rule left for it: event_unhandled"),
    _t(P.QUEUED, On.RESTARTED, [P.QUEUED], "the slot is asked for again"),
    _t(P.QUEUED, On.REBOOTED, [P.QUEUED], "the slot is asked for again"),
    *[_t(p, on, [P.GATED], "a gate holds it: gated (the gate's name)") for p, on in _INTO_GATED],
    _t(P.GATED, On.PASSED, [P.RUNNING, P.DRAINING, *_DECIDE], "on: the next gate, or as ever"),
    _t(P.GATED, On.LISTED, [P.GATED], "nothing: its gate keeps its own timers"),
    _t(P.GATED, On.STARTED, [P.MISSED], f"it started before its hooks: event_missed; {_LET_GO}"),
    _t(P.GATED, On.LEFT, [P.GONE], f"never prepared: event_completed, forgotten; {_LET_GO}"),
    _t(P.GATED, On.STARTED, [P.DONE], f"{_REGATED}: after-hooks once it is over; {_LET_GO}"),
    _t(P.GATED, On.LEFT, _ENDS, f"{_REGATED}: the node restored, then cancelled-hooks; {_LET_GO}"),
    _t(P.GATED, On.REBOOTED, [P.REBOOTED], f"{_REGATED}: judged by the next document; {_LET_GO}"),
    _t(P.GATED, On.TYPE_REMOVED, [P.UNHANDLED], f"no rule left: event_unhandled; {_LET_GO}"),
    *[_t(P.GATED, on, [P.GATED], "its gate asks again (Gate.restarted)") for on in _RESTARTS],
    _t(P.RUNNING, On.LISTED, [P.RUNNING], "nothing"),
    _t(P.RUNNING, On.STARTED, [P.RUNNING], "its hooks go on"),
    _t(P.RUNNING, On.HOOKS_OK, _DECIDE, "approval per policy (DONE if it already started)"),
    _t(P.RUNNING, On.HOOKS_FAILED, [P.HOOKS_FAILED], "event_not_approved: proceeds at NotBefore"),
    _t(P.RUNNING, On.HOOKS_CANCELLED, [P.INTERRUPTED], "cut off by a stop: they run again"),
    _t(P.RUNNING, On.LEFT, [P.ENDING], "its before-hooks are stopped"),
    _t(P.RUNNING, On.RESTARTED, [P.INTERRUPTED], "cut off by a crash: hooks_interrupted"),
    _t(P.RUNNING, On.REBOOTED, _REBOOTS, "cut off by a boot: judged by the next document"),
    _t(P.INTERRUPTED, On.LISTED, [P.RUNNING], "still Scheduled: its before-hooks run again"),
    _t(P.INTERRUPTED, On.LISTED, [P.QUEUED], "still Scheduled: its slot is asked for again"),
    _t(P.INTERRUPTED, On.LISTED, [P.DRAINING], "still Scheduled: the node is drained again"),
    _t(P.INTERRUPTED, On.LISTED, [P.DONE], "it started meanwhile: after-hooks once it is over"),
    _t(P.INTERRUPTED, On.LISTED, [P.UNHANDLED], "a reload removed its type: event_unhandled"),
    _t(P.INTERRUPTED, On.LISTED, _DECIDE, "a reload left it no before-hooks: approval per policy"),
    _t(P.INTERRUPTED, On.STARTED, [P.DONE], "it started: after-hooks once it is over"),
    _t(P.INTERRUPTED, On.LEFT, _ENDS, "cancelled-hooks (after-hooks if it had started)"),
    _t(P.INTERRUPTED, On.RESTARTED, [P.INTERRUPTED], "nothing"),
    _t(P.INTERRUPTED, On.REBOOTED, _REBOOTS, "judged by the next document"),
    _t(
        P.REBOOTED,
        On.LISTED,
        [P.RUNNING, P.QUEUED, P.DRAINING, P.UNHANDLED, *_DECIDE],
        "still Scheduled: this boot was not the maintenance (reboot_detected maintenance=false); "
        "prepared again, approved as usual",
    ),
    _t(P.REBOOTED, On.LISTED, _ENDS, "listed Started: the maintenance happened, after-hooks"),
    _t(P.REBOOTED, On.STARTED, _ENDS, "the maintenance happened: after-hooks"),
    _t(
        P.REBOOTED,
        On.LEFT,
        _ENDS,
        "gone: the maintenance happened, after-hooks; its Resources dropped this VM: "
        "cancelled-hooks (that proves nothing of the boot)",
    ),
    _t(P.REBOOTED, On.RESTARTED, [P.REBOOTED], "still judged by the next document"),
    _t(P.REBOOTED, On.REBOOTED, [P.REBOOTED], "still judged by the next document"),
    *[
        _t(P.ENDING, on, _ENDS, "its cancelled- (or after-) hooks run now")
        for on in (On.HOOKS_OK, On.HOOKS_FAILED, On.HOOKS_CANCELLED, On.RESTARTED)
    ],
    *[
        _t(P.ENDING, on, [P.ENDING], "stopping: its stage runs after the restart")
        for on in (On.HOOKS_OK, On.HOOKS_FAILED, On.HOOKS_CANCELLED)
    ],
    _t(P.ENDING, On.REBOOTED, _ENDS, "the maintenance happened: after-hooks"),
    _t(P.ENDING, On.LISTED, [P.ENDING], "nothing until its stage has run"),
    _t(P.ENDING, On.STARTED, [P.ENDING], "nothing until its stage has run"),
    _t(P.ENDING, On.LEFT, [P.ENDING], "nothing until its stage has run"),
    _t(P.COORDINATING, On.PEERS_READY, [P.APPROVING], "peers_ready"),
    _t(P.COORDINATING, On.GATE_YES, [P.APPROVING], "gate_approved"),
    _t(P.COORDINATING, On.PEER_FAILED, [P.NOT_APPROVED], "event_not_approved cause=peer_failed"),
    _t(P.COORDINATING, On.GATE_NEVER, [P.NOT_APPROVED], "event_not_approved cause=gate_refused"),
    _t(P.COORDINATING, On.STARTED, [P.DONE], "the watch or gate is stopped"),
    _t(P.APPROVING, On.STARTED, [P.DONE], "no approval needed any more"),
    *[
        _t(p, On.SLOT_LOST, [P.NOT_APPROVED], "slot_lost: not approved early (slot_unavailable)")
        for p in (P.COORDINATING, P.APPROVING)
    ],
    _t(P.APPROVING, On.ACCEPTED, [P.APPROVED], "event_approved"),
    *[
        _t(p, On.LISTED, [p], "nothing")
        for p in (P.COORDINATING, P.APPROVING, P.APPROVED, P.NOT_APPROVED, P.HOOKS_FAILED, P.DONE)
    ],
    *[
        _t(p, On.STARTED, [p], "nothing")
        for p in (P.APPROVED, P.NOT_APPROVED, P.HOOKS_FAILED, P.DONE)
    ],
    *[
        _t(p, On.LEFT, _ENDS, "after-hooks if it started or we approved it, else cancelled-hooks")
        for p in (P.COORDINATING, P.APPROVING, P.APPROVED, P.NOT_APPROVED, P.HOOKS_FAILED, P.DONE)
    ],
    *[
        _t(p, On.LISTED, _ENDS, f"{_POSTPONED}: cancelled-hooks, then judged anew (it waits)")
        for p in (P.NOT_APPROVED, P.HOOKS_FAILED)
    ],
    _t(
        P.COORDINATING,
        On.LISTED,
        _ENDS,
        f"{_POSTPONED}: it stops waiting for its peers, its ready taken back, cancelled-hooks, "
        "then judged anew (it waits, and coordinates again once prepared)",
    ),
    *[_t(p, On.RESTARTED, [p], "carries on") for p in _KEPT],
    *[
        _t(p, On.REBOOTED, [p, *_REBOOTS], "judged by the next document if it was prepared")
        for p in (P.COORDINATING, P.APPROVING, P.APPROVED, P.NOT_APPROVED, P.HOOKS_FAILED)
    ],
    _t(P.DONE, On.REBOOTED, [P.DONE, *_ENDS], "it had Started: after-hooks if it was prepared"),
    *[_t(p, On.REBOOTED, [p], "carries on") for p in (P.UNHANDLED, P.MISSED, P.OVER)],
    _t(P.AFTER, On.STAGE_ENDED, [P.OVER], "after_hooks_finished or _failed (never again)"),
    _t(
        P.AFTER,
        On.STAGE_ENDED,
        [P.GONE],
        "forgotten if it left; if it came back (listed again after it left, or Scheduled "
        "again after being cancelled), judged anew at the next poll, as at first sight",
    ),
    _t(P.AFTER, On.STAGE_ENDED, [P.AFTER], f"failed or cut off {_HELD}"),
    _t(
        P.AFTER,
        On.UNMARKED,
        _ENDS,
        "put back while its ready stood in etcd: its cancelled-hooks (the node restored first) "
        "wait until then (SharedForgotten; or a reload or restart removed etcd)",
    ),
    _t(P.AFTER, On.LEAD_TIME, [P.AFTER, P.OVER, P.GONE], "after_retry: again if held, else over"),
    *[
        _t(P.AFTER, on, [P.AFTER], "nothing until its stage has run (back after it left: news)")
        for on in (On.LISTED, On.STARTED)
    ],
    _t(
        P.AFTER,
        On.STARTED,
        [P.DONE],
        "put back while its ready stood in etcd, still prepared: in its maintenance, so not "
        "undone; its after-hooks once it is over",
    ),
    _t(P.AFTER, On.LEFT, [P.AFTER], "forgotten once its hooks end"),
    _t(P.AFTER, On.RESTARTED, [P.OVER], "cut off: after_hooks_interrupted, never run again"),
    _t(P.AFTER, On.REBOOTED, [P.OVER], "cut off: after_hooks_interrupted, never run again"),
    *[_t(P.AFTER, on, [P.AFTER], d) for on in (On.RESTARTED, On.REBOOTED) for d in (_HELD, _UNRUN)],
    *[_t(P.AFTER, on, [P.AFTER], _UNMARKING) for on in (On.RESTARTED, On.REBOOTED)],
    *[_t(P.OVER, on, [P.OVER], "nothing") for on in (On.LISTED, On.STARTED)],
    _t(P.OVER, On.LISTED, [P.GONE], "it left, then came back: a new one, judged anew at once"),
    _t(P.OVER, On.LEFT, [P.GONE], "forgotten"),
    _t(P.OVER, On.NAMED, [P.GONE], "it dropped this VM, then named it again: judged anew"),
]


def _table(rows: list[Transition]) -> Mapping[tuple[Phase, On], frozenset[Phase]]:
    table: dict[tuple[Phase, On], frozenset[Phase]] = {}
    for row in rows:
        key = (row.source, row.on)
        table[key] = table.get(key, frozenset()) | frozenset(row.targets)
    return table


TABLE: Mapping[tuple[Phase, On], frozenset[Phase]] = _table(_ROWS)
ROWS: tuple[Transition, ...] = tuple(_ROWS)


class IllegalTransitionError(Exception):
    """A (phase, trigger) pair, or a target, that the table does not declare."""


def check(source: Phase, on: On, target: Phase) -> None:
    targets = TABLE.get((source, on))
    if targets is None:
        raise IllegalTransitionError(f"{source.value}: nothing is declared for {on.value!r}")
    if target not in targets:
        allowed = ", ".join(sorted(t.value for t in targets))
        raise IllegalTransitionError(
            f"{source.value} --{on.value}--> {target.value}: only to {allowed}"
        )
